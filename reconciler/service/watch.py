"""The watch between passes: what would make a pass worth running before its interval.

Every few seconds ``Daemon.watch`` (service/daemon.py) hands ``Watch`` the last pass's report;
``Watch`` answers with the reason a pass is needed now, or None:

    discovery   a discovered server's DNS name resolves to other instances than the pass found
    recovery    a server the backoff is waiting on answers again
    drift       a server's repository index no longer shows what the pass left serving
                (a restarted server, a model unloaded by hand)

It only reads (DNS, each server's index); the daemon triggers the pass.
"""

from __future__ import annotations

import time

from reconciler.model.errors import ReconcileError, ServerUnavailable, StepFailed
from reconciler.model.reports import PassReport
from reconciler.model.settings import Settings
from reconciler.service.backoff import ServerBackoff
from reconciler.wiring import resolver, watch_client


class Watch:
    def __init__(self, settings: Settings, backoff: ServerBackoff) -> None:
        self.settings = settings
        self.backoff = backoff
        self._resolved_at: dict[str, float] = {}

    def reason_for_a_pass(self, report: PassReport) -> str | None:
        """Why a pass should run now, judged against ``report`` (the last pass); None if not.

        The first reason found is enough: the pass it triggers looks at everything.
        """
        return self._instances_changed(report) or self._serving_changed(report)

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

    def _serving_changed(self, report: PassReport) -> str | None:
        """Each server's index against what the last pass left serving; a server the backoff
        waits on is only asked whether it answers."""
        for server, address in report.servers.items():
            expected = report.expected.get(server, {})
            retrying = self.backoff.retrying(server)
            if not expected and not retrying:
                continue
            try:
                with watch_client(server, address) as client:
                    ready = client.ready_versions()
            except (ServerUnavailable, StepFailed):
                continue  # still down: the backoff handles it
            if retrying:
                self.backoff.stop_waiting(server)
                return f"server {server} answers again"
            drifted = sorted(m for m, v in expected.items() if ready.get(m, set()) != set(v))
            if drifted:
                return f"server {server} drifted: {', '.join(drifted)}"
        return None
