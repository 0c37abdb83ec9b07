"""What the service keeps from pass to pass (PassMemory): made by the service, read and
filled by ``loop.reconcile``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from reconciler.core.plan.settle import settle_key
from reconciler.model.history import History
from reconciler.model.plan import Plan
from reconciler.model.servers import TritonServer
from reconciler.model.serving import ServerState
from reconciler.model.spec import DesiredState
from reconciler.ports import TritonClient


class PassMemory:
    """What a long-running reconciler carries from one pass to the next.

    A pass over a large fleet that changes nothing should cost little. The service keeps:
    the manifests of the last revision it read (a pass at the same commit does not parse
    them again), one Triton client per server (a gRPC connection, and the configs it read:
    see ``adapters.triton.TritonServerClient.observe``), and the settle keys of the servers
    whose last plan had nothing to do (``plan``'s ``settled``). And the refusal it alerted
    (``first_refusal``): a revision refused pass after pass is alerted once, not every pass.
    One-shot commands keep nothing.

    Passes never overlap (the scheduler runs one at a time), so no lock.
    """

    def __init__(self) -> None:
        self._desired: tuple[str, str, DesiredState] | None = None
        self._clients: dict[str, tuple[tuple[object, ...], TritonClient]] = {}
        self._settled: dict[str, tuple[object, ...]] = {}
        self._refusal: tuple[str, str] | None = None  # (alert kind, what was refused)
        # Versions the service's probes found no longer answering, per (server, model):
        # version -> the last error; the next pass reloads them in place (core/plan/heal.py).
        self.stopped_answering: dict[tuple[str, str], dict[int, str]] = {}

    def desired(self, revision: str, path: str) -> DesiredState | None:
        if self._desired is not None and self._desired[:2] == (revision, path):
            return self._desired[2]
        return None

    def remember_desired(self, revision: str, path: str, desired: DesiredState) -> None:
        self._desired = (revision, path, desired)

    def clients(
        self, servers: Mapping[str, TritonServer], connect: Callable[[TritonServer], TritonClient]
    ) -> dict[str, TritonClient]:
        """A client per server: the one kept from earlier passes while the server's address
        and repository are the same, else a new one from ``connect`` (the pass's
        ``ports.triton``); clients of servers gone are closed."""
        kept: dict[str, tuple[tuple[object, ...], TritonClient]] = {}
        for name, server in servers.items():
            identity = (server.grpc, server.model_repository)
            previous = self._clients.pop(name, None)
            if previous is not None and previous[0] == identity:
                kept[name] = previous
                continue
            if previous is not None:
                previous[1].close()
            kept[name] = (identity, connect(server))
        self.close()
        self._clients = kept
        return {name: client for name, (_, client) in kept.items()}

    def settled(
        self, desired: DesiredState, serving: Mapping[str, ServerState], history: History
    ) -> tuple[frozenset[str], dict[str, tuple[object, ...]]]:
        """Servers whose settle key is the one of their last plan with nothing to do; and
        this pass's keys, for ``remember_plan``."""
        keys = {
            server: key
            for server in serving
            if (key := settle_key(server, desired, serving.get(server), history)) is not None
        }
        return frozenset(s for s, k in keys.items() if self._settled.get(s) == k), keys

    def drop_unreachable(self, serving: Mapping[str, ServerState]) -> None:
        """Close the clients of servers that did not answer: the next pass connects afresh
        rather than through a channel that may still be backing off from the outage."""
        for name, state in serving.items():
            if not state.reachable and name in self._clients:
                self._clients.pop(name)[1].close()

    @property
    def settled_servers(self) -> frozenset[str]:
        """Servers whose last plan had nothing to do (the next pass may skip them)."""
        return frozenset(self._settled)

    def remember_plan(self, keys: Mapping[str, tuple[object, ...]], plan_: Plan) -> None:
        busy = {c.server for c in plan_.changes} | {p.server for p in plan_.problems}
        self._settled = {s: k for s, k in keys.items() if s not in busy}

    def first_refusal(self, kind: str, what: str) -> bool:
        """Whether this refusal differs from the one alerted last (then it is alerted);
        the same refusal again is not."""
        new = self._refusal != (kind, what)
        self._refusal = (kind, what)
        return new

    def refusal_ended(self) -> str | None:
        """The alert kind of the refusal alerted, now over (a pass got through); None when
        none was alerted."""
        ended, self._refusal = self._refusal, None
        return ended[0] if ended else None

    def close(self) -> None:
        for _, client in self._clients.values():
            client.close()
        self._clients = {}
