"""Whether a version that serves still answers: the record the service's probes between
rollouts keep per server, model and version (issue 30). Pure: the clock is passed in.

Triton's index can say READY while every request fails (a Python stub that died or hangs:
on 2.51, ``kill -9`` of a loaded model's stub leaves the index, ``/v2/models/m/ready`` and
``/v2/health/ready`` saying ready while each request gets "Stub process 'm_0_0' is not
healthy"). A version that answered a probe and then fails ``failures`` probes in a row has
stopped answering: out of service, and reloaded in place by the next pass. One whose probes
never succeeded is not judged (a model that rejects the synthesized request must not be
reloaded forever), and one reloaded ``HEAL_LIMIT`` times without answering in between is
left out of service rather than reloaded again (its alert says so).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

# Reloads in place of one version without a probe answered in between; then it is left out
# of service, and only an answer (or a new rollout) brings it back.
HEAL_LIMIT = 2


@dataclass(frozen=True)
class Answering:
    """One version's probes between rollouts."""

    answered: bool = False  # a probe succeeded since the service has watched it
    failures: int = 0  # probes failed in a row since the last answer
    last_error: str = ""
    last_probe: float = -math.inf  # when the last probe was sent (monotonic seconds)
    reloads: int = 0  # reloads in place asked since it last answered

    def due(self, now: float, interval: float) -> bool:
        """Whether the next probe is due: ``interval`` after the last, or at once after a
        failure of a version that answered before (the failures in a row that take it out
        come one watch round apart, not an interval apart)."""
        return (self.answered and self.failures > 0) or now - self.last_probe >= interval

    def stopped(self, failures: int) -> bool:
        """Whether it answered before and has failed ``failures`` probes in a row since."""
        return self.answered and self.failures >= failures

    def reload_wanted(self, failures: int) -> bool:
        """Whether the next pass should reload it in place (stopped, and not reloaded
        HEAL_LIMIT times in vain already)."""
        return self.stopped(failures) and self.reloads < HEAL_LIMIT


def after_probe(record: Answering, now: float, error: str | None) -> Answering:
    """``record`` after a probe sent at ``now`` that failed with ``error`` (None: answered)."""
    if error is None:
        return Answering(answered=True, last_probe=now)
    return replace(record, failures=record.failures + 1, last_error=error, last_probe=now)


def after_reload(record: Answering) -> Answering:
    """``record`` once a pass reloaded the version in place: judged afresh from the next
    probes (the failures in a row start again), the reload counted until it answers."""
    return replace(record, failures=0, reloads=record.reloads + 1)
