"""When the service tries a failing server or Git remote again: exponential, jittered backoff.

``Daemon`` (service/daemon.py) keeps one ``ServerBackoff``: the pass skips the servers it
lists, the pass's outcome feeds it, and the watch (service/watch.py) asks it which servers to
probe. The daemon counts the Git remote's failures itself and draws its delays from
``backoff_delay`` too. Only counts and times are kept here; bringing the next pass forward is
the scheduler's, in the daemon, since APScheduler is imported by that one module.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

# Seconds to wait before the n-th retry of a failing server or Git remote (then the last).
BACKOFF = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 120.0, 300.0)


def backoff_delay(failures: int, rng: random.Random) -> float:
    """Exponential backoff with full jitter over the upper half: never 0, never in lockstep."""
    base = BACKOFF[min(max(failures, 1), len(BACKOFF)) - 1]
    return base * (0.5 + rng.random() / 2)


class ServerBackoff:
    """Failed passes per server, and when each failing server is next tried.

    ``rng`` is the daemon's (a seeded one makes every delay repeatable); ``clock`` is
    injected so that the retry times can be tested without sleeping.
    """

    def __init__(self, rng: random.Random, clock: Callable[[], float] = time.monotonic) -> None:
        self.rng = rng
        self.clock = clock
        self._server_failures: dict[str, int] = {}
        self._server_retry_at: dict[str, float] = {}

    def skip_list(self) -> dict[str, str]:
        """The servers a pass leaves alone now, each with the reason it reports."""
        now = self.clock()
        return {
            server: (
                f"backing off after {self._server_failures.get(server, 0)} failed pass(es); "
                f"next try in {retry_at - now:.0f}s"
            )
            for server, retry_at in self._server_retry_at.items()
            if retry_at > now
        }

    def server_failed(self, server: str) -> float:
        """Count a pass that found ``server`` unreachable; the seconds until its next try."""
        failures = self._server_failures.get(server, 0) + 1
        self._server_failures[server] = failures
        delay = backoff_delay(failures, self.rng)
        self._server_retry_at[server] = self.clock() + delay
        return delay

    def failed_passes(self, server: str) -> int:
        """How many passes in a row found ``server`` unreachable (0: the last one reached it)."""
        return self._server_failures.get(server, 0)

    def server_answered(self, server: str) -> None:
        """A pass reached ``server``: its failures are forgotten."""
        self._server_failures.pop(server, None)
        self._server_retry_at.pop(server, None)

    def retrying(self, server: str) -> bool:
        """Whether ``server`` failed a pass and no pass has reached it since (its next try may
        already be due): the watch probes it."""
        return server in self._server_retry_at

    def stop_waiting(self, server: str) -> None:
        """``server`` answers the watch: the next pass tries it. Its failure count stays until
        a pass reaches it, so a server that fails again waits longer."""
        self._server_retry_at.pop(server, None)
