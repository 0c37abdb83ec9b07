"""Versions stuck UNLOADING, found by the watch between passes and alerted: the record is
``core.unloading``; this keeps it, sends an ``unload-stuck`` alert (warning) naming the
server, model and version once one has been UNLOADING ``--unload-deadline`` seconds, sends
it again every RESEND seconds while it lasts (Alertmanager ends an alert not sent again
within its resolve_timeout, 5 minutes by default), and a resolving event once it is gone.
The memory such a version holds is not freed: the alert says so.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from reconciler.core.unloading import Key, Unloads, after_reading
from reconciler.model.history import AlertEvent
from reconciler.ports import Alerts
from reconciler.service.telemetry import ReconcilerMetrics, log_event

RESEND = 240.0  # seconds between two sends of an alert that lasts


class StuckUnloads:
    def __init__(
        self,
        deadline: float,
        alerts: Alerts,
        metrics: ReconcilerMetrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.deadline, self.alerts, self.metrics, self.clock = deadline, alerts, metrics, clock
        self._record = Unloads({})
        self._sent: dict[Key, float] = {}

    def read(self, unloading: Iterable[Key], revision: str) -> None:
        """A reading of every server's index found ``unloading``."""
        now = self.clock()
        self._record, stuck, gone = after_reading(self._record, unloading, now, self.deadline)
        for key in sorted(stuck):
            log_event("version stuck unloading", logging.WARNING, server=key[0], model=key[1],
                      version=key[2], seconds=round(now - self._record.since[key]))  # fmt: skip
        due = [k for k in self._record.stuck if now - self._sent.get(k, -RESEND) >= RESEND]
        for server, model, version in sorted(due):
            seconds = now - self._record.since[(server, model, version)]
            self.alerts.send(
                AlertEvent(
                    "unload-stuck",
                    "warning",
                    f"{model} version {version} on {server} has been UNLOADING for "
                    f"{seconds / 60:.0f} min: Triton waits for requests that never end, and "
                    "its memory is not given back until it is gone (or the server restarts)",
                    revision,
                    model,
                    server,
                    {"version": version, "seconds": round(seconds)},
                )
            )
            self._sent[(server, model, version)] = now
        for server, model, version in sorted(gone):
            self._sent.pop((server, model, version), None)
            self.alerts.send(
                AlertEvent(
                    "unload-stuck",
                    "info",
                    f"{model} version {version} on {server} is unloaded",
                    revision,
                    model,
                    server,
                    {"version": version},
                    resolved=True,
                )
            )
        if due or gone:
            self.alerts.flush()
        counts: dict[tuple[str, str], int] = {}
        for server, model, _ in self._record.stuck:
            counts[(server, model)] = counts.get((server, model), 0) + 1
        self.metrics.set_stuck_unloads(counts)
