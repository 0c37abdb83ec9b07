"""The watch between passes: what would make a pass worth running before its interval.

Every few seconds ``Daemon.watch`` (service/daemon.py) hands ``Watch`` the last pass's report;
``Watch`` answers with the reason a pass is needed now, or None:

    discovery   a discovered server's DNS name resolves to other instances than the pass found
    recovery    a server the backoff is waiting on answers again
    drift       a server's repository index no longer shows what the pass left serving
                (a restarted server, a model unloaded by hand)

It only reads (DNS, each server's index, over the connections it keeps to them:
service/connections.py); the daemon triggers the pass, and hands the indexes it read
(``readings``) to the serving board (service/serving.py), which says from them whether each
server serves what it should.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from reconciler.model.errors import ReconcileError, ServerUnavailable, StepFailed
from reconciler.model.reports import PassReport
from reconciler.model.serving import ready_in
from reconciler.model.settings import Settings
from reconciler.service.backoff import ServerBackoff
from reconciler.service.connections import ServerConnections
from reconciler.wiring import resolver

# One server's index as the watch read it: the versions READY per model, or why it could
# not be read.
Reading = Mapping[str, frozenset[int]] | str


class Watch:
    def __init__(
        self,
        settings: Settings,
        backoff: ServerBackoff,
        connections: ServerConnections | None = None,
    ) -> None:
        self.settings = settings
        self.backoff = backoff
        self.connections = connections or ServerConnections()
        self._resolved_at: dict[str, float] = {}
        # (server, model, version) UNLOADING at the last reading (service/unloading.py).
        self.unloading: frozenset[tuple[str, str, int]] = frozenset()

    def reason_for_a_pass(self, report: PassReport, readings: Mapping[str, Reading]) -> str | None:
        """Why a pass should run now, judged against ``report`` (the last pass) and
        ``readings`` (each server's index as ``readings`` read it); None if not.

        The first reason found is enough: the pass it triggers looks at everything.
        """
        return self._instances_changed(report) or self._serving_changed(report, readings)

    def readings(self, report: PassReport) -> dict[str, Reading]:
        """Each server of the last pass: its versions READY per model, or why it did not
        answer. The versions UNLOADING in the same index calls are kept in ``unloading``."""
        found: dict[str, Reading] = {}
        unloading: set[tuple[str, str, int]] = set()
        for server, address in report.servers.items():
            connection = self.connections.to(server, address)
            # Asked before the call, which would connect again and leave the board's last
            # reading of a restarted server looking current: a drop the client library's
            # event missed is told now (the server stays out until the next reading).
            connection.connected()
            try:
                states = connection.version_states()
            except (ServerUnavailable, StepFailed) as exc:
                found[server] = str(exc)
                continue
            found[server] = ready_in(states)
            unloading |= {
                (server, model, version)
                for model, versions in states.items()
                for version, state in versions.items()
                if state == "UNLOADING"
            }
        self.unloading = frozenset(unloading)
        self.connections.keep_only(report.servers)
        return found

    def _instances_changed(self, report: PassReport) -> str | None:
        """Each discovered server's DNS name against the instances the last pass found, at
        most once per its refresh interval."""
        now = time.monotonic()
        names = resolver(self.settings)
        for server, (dns, refresh, addresses) in report.discovered.items():
            if now - self._resolved_at.get(server, 0.0) < refresh:
                continue
            self._resolved_at[server] = now
            try:
                found = tuple(names.resolve(dns))
            except ReconcileError:
                continue  # the pass reports it
            if found != addresses:
                return f"instances of {server} changed: {len(found)} address(es)"
        return None

    def _serving_changed(self, report: PassReport, readings: Mapping[str, Reading]) -> str | None:
        """Each server's index against what the last pass left serving; a server the backoff
        waits on is only asked whether it answers."""
        for server in report.servers:
            expected = report.expected.get(server, {})
            ready = readings.get(server)
            if ready is None or isinstance(ready, str):
                continue  # still down: the backoff handles it
            if self.backoff.retrying(server):
                self.backoff.stop_waiting(server)
                return f"server {server} answers again"
            drifted = sorted(m for m, v in expected.items() if ready.get(m, set()) != set(v))
            if drifted:
                return f"server {server} drifted: {', '.join(drifted)}"
        return None
