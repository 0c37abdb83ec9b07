"""The serving board: whether each server serves what it should, for the load balancers in
front of the fleet (issue 30). Triton's own ``/v2/health/ready`` answers 400 while a model
loads beside a serving one and 200 on a restarted, empty server; the reconciler knows what
each server must serve, and says so here.

Fed by the watch between passes (service/watch.py: each server's index every few seconds),
which hands over what it read and what its probes found (service/serving_probes.py: a
version that stopped answering is out until it answers again); the truth itself is
``core.serving_truth``. Between readings, a restart is heard as it happens: the watch's
connection to the server drops (service/connections.py), and the server is out until a
reading begun after the drop says what it serves (issue 41, point 3: a restarted Triton
answers, empty, about 0.1 s after its old process ended; the watch reads every few
seconds). A pass in
progress tells the board, through apply's step events, when it takes a model out of service
(a sequence model drained for its swap, a backend library replaced); the pass's end puts it
back, and the next reading decides. Published three ways:

    GET /serving, /serving/<server>   200 when serving, 503 with the reasons when not (a
                                      load balancer's health check, any ecosystem)
    triton_gitops_server_serving      1 or 0 per server (/metrics)
    the readiness gate                with --readiness-gate NAMESPACE, the pod condition
                                      triton-gitops.dev/serving (adapters/pod_readiness.py),
                                      written when a server's truth changes

A problem setting the condition (a pod without the gate, a 403) is logged and counted per
server (``triton_gitops_readiness_gate_errors_total``, which the shipped rules alert on);
the other servers are unaffected.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from reconciler.core.records import rfc3339
from reconciler.core.serving_truth import ServingTruth, serving_truth, wanted_from
from reconciler.loop.live import FanOut
from reconciler.loop.memory import PassMemory
from reconciler.model.analysis import Evaluation
from reconciler.model.plan import Action, Step
from reconciler.model.reports import PassReport
from reconciler.model.results import Draining
from reconciler.model.settings import RunSettings, Settings
from reconciler.service.connections import ServerConnections
from reconciler.service.rollout_metrics import RolloutGauges
from reconciler.service.serving_probes import ServingProbes
from reconciler.service.telemetry import ReconcilerMetrics, log_event
from reconciler.service.unloading import StuckUnloads
from reconciler.service.watch import Reading, Watch
from reconciler.wiring import alerter, readiness_gate

# Why a step takes its model out of service while it runs.
OUT_OF_SERVICE = {
    Action.DRAIN: "drained for its swap (a sequence model: Triton restarts its sequence batcher)",
    Action.REPLACE_LIBRARY: "its backend library is being replaced",
}
# Why a server whose connection dropped is out, until a reading begun after the drop.
DROPPED = (
    "its connection dropped (the server ended or restarted, and a restarted Triton holds "
    "nothing): out until its index is read again"
)


class ReadinessPublisher(Protocol):
    """Where a server's truth goes besides the board (``adapters.pod_readiness``)."""

    def publish(self, truth: ServingTruth, address: str) -> str | None: ...


class ServingBoard:
    """Every server's serving truth as last read. Thread-safe: the watch writes, apply's
    worker threads take models out, the HTTP threads read."""

    def __init__(
        self,
        metrics: ReconcilerMetrics,
        publisher: ReadinessPublisher | None = None,
        connections: ServerConnections | None = None,
    ) -> None:
        self.metrics = metrics
        self.publisher = publisher
        # The watch's connections, asked before saying that a server serves; None: not
        # asked (the board fed by hand).
        self.connections = connections
        self._lock = threading.Lock()
        self._truths: dict[str, ServingTruth] = {}
        self._since: dict[str, float] = {}
        self._addresses: dict[str, str] = {}
        self._out: dict[tuple[str, str], str] = {}  # a pass's drains
        self._stopped: dict[tuple[str, str], str] = {}  # versions that stopped answering
        self._dropped: dict[str, float] = {}  # when each server's connection dropped
        self._report: PassReport | None = None
        self._ready: Mapping[str, Reading] = {}
        self._published: dict[str, ServingTruth] = {}

    # -- what feeds it -----------------------------------------------------------------

    def read(
        self,
        report: PassReport,
        ready: Mapping[str, Reading],
        stopped: Mapping[tuple[str, str], str] | None = None,
        began: float | None = None,
    ) -> None:
        """The watch's reading of every server, against the last pass's intent; ``stopped``:
        the models with versions that stopped answering (service/serving_probes.py), when
        the probes ran; ``began``: when the reading began (``time.monotonic()``; None: just
        now). A drop heard after it began is newer than what it read: the server stays out."""
        with self._lock:
            self._report, self._ready = report, dict(ready)
            self._addresses = dict(report.servers)
            if stopped is not None:
                self._stopped = dict(stopped)
            self._dropped = {
                server: at
                for server, at in self._dropped.items()
                if server in report.servers and began is not None and at >= began
            }
        self._refresh()

    def connection_dropped(self, server: str) -> None:
        """The watch's connection to ``server`` dropped: its last reading no longer holds."""
        with self._lock:
            # The latest drop counts: a reading begun before it does not bring it back.
            self._dropped[server] = time.monotonic()
        self._refresh()

    def pass_ended(self) -> None:
        """A pass has ended: what it took out of service is back; the next reading says
        whether it serves."""
        with self._lock:
            self._out.clear()
        self._refresh()

    def started(self, step: Step, reverting: bool) -> None:
        """Apply's step event: a drain or a library replacement takes its model out."""
        why = OUT_OF_SERVICE.get(step.action)
        if why is None:
            return
        with self._lock:
            self._out[(step.server, step.model)] = why
        self._refresh()

    def evaluated(self, step: Step, evaluation: Evaluation, seconds_left: float) -> None:
        pass  # an analysis changes nothing about what serves

    def routed(self, router: str, weights: Mapping[str, int], mirror: Mapping[str, int]) -> None:
        pass  # a route changes where clients go, not what a server serves

    def draining(self, step: Step, draining: Draining) -> None:
        pass  # the drain step's start said the model is out of service here

    # -- what it says ------------------------------------------------------------------

    def answer(self, server: str | None) -> tuple[int, dict[str, Any]]:
        """``GET /serving`` (every server: 200 when all serve) or ``/serving/<server>``."""
        self._confirm_connections(server)
        with self._lock:
            truths, since = dict(self._truths), dict(self._since)
        if server is not None:
            truth = truths.get(server)
            if truth is None:
                return 404, {"error": f"no server {server} in the last pass"}
            return (200 if truth.serving else 503), _view(truth, since[server])
        body = {"servers": {name: _view(t, since[name]) for name, t in sorted(truths.items())}}
        serving = bool(truths) and all(t.serving for t in truths.values())
        return (200 if serving else 503), body

    # -- how it changes ----------------------------------------------------------------

    def _confirm_connections(self, server: str | None) -> None:
        """Before an answer says serving: is the connection its reading went over still up?
        The drop event comes from a thread of the client library, a few milliseconds after
        the socket closed (more on a busy host); asking the library directly is a local
        question, no call to the server, so it is asked at every answer, once per server
        that would be said serving."""
        if self.connections is None:
            return
        with self._lock:
            serving = [
                name
                for name, truth in self._truths.items()
                if truth.serving and (server is None or name == server)
            ]
        dropped = [name for name in serving if not self.connections.up(name)]
        if dropped:
            now = time.monotonic()
            with self._lock:
                for name in dropped:
                    self._dropped.setdefault(name, now)
            self._refresh()

    def _refresh(self) -> None:
        with self._lock:
            if self._report is None:
                return
            out = {**self._stopped, **self._out}
            stale = {server: DROPPED for server in self._dropped}
            truths = serving_truth(wanted_from(self._report), self._ready, out, stale)
            now = time.time()
            for name, truth in truths.items():
                before = self._truths.get(name)
                if before is None or before.serving != truth.serving:
                    self._since[name] = now
                    if before is not None:
                        log_event(
                            "server serving" if truth.serving else "server not serving",
                            logging.INFO if truth.serving else logging.WARNING,
                            server=name,
                            reasons=list(truth.reasons),
                        )
            for gone in set(self._truths) - set(truths):
                self.metrics.serving.remove(gone)
                self._since.pop(gone, None)
                self._published.pop(gone, None)
            self._truths = truths
            changed = [t for n, t in truths.items() if self._published.get(n) != t]
            addresses = dict(self._addresses)
        for truth in truths.values():
            self.metrics.serving.labels(truth.server).set(1 if truth.serving else 0)
        for truth in changed:
            self._publish(truth, addresses.get(truth.server))

    def _publish(self, truth: ServingTruth, address: str | None) -> None:
        if self.publisher is None or address is None:
            return
        problem = self.publisher.publish(truth, address)
        if problem is None:
            with self._lock:
                self._published[truth.server] = truth
            return
        # Left unpublished: tried again at the next reading.
        self.metrics.readiness_gate_errors.labels(truth.server).inc()
        log_event("readiness gate not set", logging.WARNING, server=truth.server, error=problem)


class ServingWatch:
    """The board and the probes between rollouts, as the daemon drives them: a round of the
    watch, and the end of a pass. Tells the next pass (``PassMemory.stopped_answering``)
    which versions to reload in place."""

    def __init__(
        self,
        board: ServingBoard,
        memory: PassMemory,
        unloads: StuckUnloads,
        probes: ServingProbes | None = None,
        read_soon: Callable[[], None] = lambda: None,
    ) -> None:
        self.board, self.memory, self.unloads = board, memory, unloads
        # The watch's connections to the servers (service/connections.py), which the board
        # asks before it says a server serves; ``read_soon`` asks the watch for a round now.
        self.connections = board.connections = ServerConnections(self._connection_dropped)
        self._read_soon = read_soon
        self.probes = probes or ServingProbes()
        self.rollouts = RolloutGauges(board.metrics)
        # What apply's step events go to: the board (a drain takes a model out) and the
        # rollout metrics.
        self.events = FanOut(board, self.rollouts)

    def pass_ended(self) -> None:
        """A pass has ended: its drains are over, and nothing is in progress any more."""
        self.board.pass_ended()
        self.rollouts.pass_ended()

    @classmethod
    def of_service(
        cls,
        settings: Settings,
        run: RunSettings,
        metrics: ReconcilerMetrics,
        memory: PassMemory,
        read_soon: Callable[[], None] = lambda: None,
    ) -> ServingWatch:
        """The service's: the readiness gate with ``--readiness-gate``, alerts where the
        passes send theirs; ``read_soon`` brings the watch's next round forward."""
        gate = readiness_gate(settings, run.readiness_gate) if run.readiness_gate else None
        unloads = StuckUnloads(run.unload_deadline, alerter(settings), metrics)
        probes = ServingProbes(metrics=metrics)
        return cls(ServingBoard(metrics, gate), memory, unloads, probes, read_soon)

    def round(self, report: PassReport, watch: Watch) -> str | None:
        """Read every server's index (``watch``), probe what is due, read the truth and the
        versions UNLOADING; why a pass should run now (the watch's reason: a restart, drift,
        other instances; else versions found no longer answering since the last pass was
        told), or None."""
        began = time.monotonic()  # a drop heard after this keeps its server out
        ready = watch.readings(report)
        self.unloads.read(watch.unloading, report.revision)
        # Out of service and reloads wanted are what the probes found up to now; a round of
        # them that changes that asks for the next reading at once.
        self.probes.round_aside(report, ready, self._read_soon)
        self.board.read(report, ready, self.probes.out_of_service(report), began)
        stopped = self._stopped_answering(report)
        return watch.reason_for_a_pass(report, ready) or stopped

    def _stopped_answering(self, report: PassReport) -> str | None:
        """Why a pass should reload versions in place now (found no longer answering since
        the last pass was told), or None."""
        wanted = self.probes.reloads_wanted(report)
        new = {key: found for key, found in wanted.items()
               if self.memory.stopped_answering.get(key) != found}  # fmt: skip
        self.memory.stopped_answering = wanted
        if not new:
            return None
        (server, model), versions = next(iter(sorted(new.items())))
        listed = ", ".join(map(str, sorted(versions)))
        log_event("version stopped answering", logging.WARNING, server=server, model=model,
                  versions=sorted(versions), error=next(iter(versions.values())))  # fmt: skip
        return f"{model} {listed} on {server} stopped answering: reload in place"

    def after_pass(self, report: PassReport, watch: Watch) -> None:
        """A pass ended: what serves now is read (``watch``); versions it reloaded in place
        are judged afresh."""
        began = time.monotonic()
        ready = watch.readings(report)
        self.probes.reloaded(report)
        self.memory.stopped_answering = self.probes.reloads_wanted(report)
        self.board.read(report, ready, self.probes.out_of_service(report), began)

    def _connection_dropped(self, server: str) -> None:
        """The watch's connection to ``server`` dropped (a thread of the client library
        tells): out of service now, and read again at once rather than at the next round,
        so that a connection merely closed by the server (no restart) is back in service
        as soon as a reading says so."""
        self.board.connection_dropped(server)
        self._read_soon()


def _view(truth: ServingTruth, since: float) -> dict[str, Any]:
    return {
        "serving": truth.serving,
        "reasons": list(truth.reasons),
        "message": truth.message,
        "since": rfc3339(since),
    }
