"""A swap in place for want of memory (rollout.whenNoHeadroom: replace) counts the old
versions' memory as freed only when the index says they are gone and the memory figure shows
the room the new versions need (engine/steps.py ``_wait_for_room``), on the in-memory fake
and a scripted memory figure."""

from __future__ import annotations

from dataclasses import replace

from reconciler.core.plan.planner import plan
from reconciler.core.records import holds_from
from reconciler.engine.apply import apply
from reconciler.engine.context import Timing
from reconciler.model.analysis import Figures
from reconciler.model.history import History
from reconciler.model.plan import Action, Plan
from reconciler.model.results import ApplyResult, Outcome
from reconciler.model.spec import DesiredState
from tests.core.fakes import FakeClock, FakeTriton, deploy, desired_state, observe

GIB = 2**30


class MemoryFigure:
    """A server's memory figure: 8 GiB in all, ``free`` GiB free, the rest in use; ``after``
    readings later it shows ``then`` GiB free (the old version's stub has exited)."""

    def __init__(self, free: float, then: float | None = None, after: int = 0) -> None:
        self.free, self.then, self.after, self.reads = free, then, after, 0

    def figures(self, model: str, versions: tuple[int, ...], queries: object = {}) -> Figures:
        self.reads += 1
        free = self.then if self.then is not None and self.reads > self.after else self.free
        return Figures(memory_bytes=(8 - free) * GIB, memory_total_bytes=8 * GIB)


def swap_for_want_of_room(
    figure: MemoryFigure,
) -> tuple[FakeTriton, Plan, ApplyResult, DesiredState]:
    fake = FakeTriton("s1", {"m": range(1, 4)})
    fake.serve("m", [1])
    wanted = replace(deploy("m", [2]), memory_per_version=3 * GIB, when_no_headroom="replace")
    desired = desired_state(wanted)
    observed = replace(observe(fake), memory_free=1 * GIB)  # no room for 3 GiB beside
    p = plan(desired, {"s1": observed}, History(), "rev-1")
    clock = FakeClock()
    timing = Timing(clock=clock.clock, sleep=clock.sleep)
    result = apply(p, {"s1": fake}, timing=timing, metrics={"s1": figure})
    return fake, p, result, desired


def test_the_new_version_loads_once_the_memory_figure_shows_the_room() -> None:
    figure = MemoryFigure(free=1, then=4, after=3)  # the figure catches up 3 readings later
    fake, p, result, _ = swap_for_want_of_room(figure)
    (change,) = p.changes
    unload = next(s for s in change.steps if s.action is Action.UNLOAD)
    assert unload.needs_free == 3 * GIB and "3072 MiB show free" in unload.reason
    assert result.ok, result
    assert fake.ready("m") == {2} and figure.reads > 3


def test_memory_never_given_back_fails_the_unload_and_puts_the_old_version_back() -> None:
    figure = MemoryFigure(free=1)  # gone from the index, but the figure never moves
    fake, _, result, desired = swap_for_want_of_room(figure)
    (change,) = result.changes
    assert change.outcome is Outcome.REVERTED
    assert "1024 MiB free after 30s, 3072 MiB needed" in (change.error or "")
    assert fake.ready("m") == {1}  # put back
    assert not holds_from(result, desired, History())
