"""A swap in place for want of memory (rollout.whenNoHeadroom: replace) counts the old
versions' memory as freed only when the index says they are gone and the memory figure shows
the room the new versions need (engine/steps.py ``_wait_for_room``), on the in-memory fake
and a scripted memory figure."""

from __future__ import annotations

from dataclasses import replace

from reconciler.core.plan.planner import plan
from reconciler.core.readings import footprint
from reconciler.core.records import footprints_from, holds_from
from reconciler.engine.apply import apply
from reconciler.engine.context import Timing
from reconciler.loop.observation import with_free_memory
from reconciler.model.analysis import Figures
from reconciler.model.history import History
from reconciler.model.plan import Action, Plan
from reconciler.model.results import ApplyResult, Outcome
from reconciler.model.serving import DeviceMemory
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


class TwoGpus:
    """A GPU server's figures: GPU-a with 6 GiB free, GPU-b with 1 GiB (of 8 each)."""

    def __init__(self, b_used: float = 7) -> None:
        self.b_used = b_used

    def figures(self, model: str, versions: tuple[int, ...], queries: object = {}) -> Figures:
        used = {"GPU-a": 2 * GIB, "GPU-b": self.b_used * GIB}
        total = {"GPU-a": 8 * GIB, "GPU-b": 8 * GIB}
        return Figures(memory_bytes=sum(used.values()), memory_total_bytes=16 * GIB,
                       gpu_used=used, gpu_total=total)  # fmt: skip


def test_room_is_judged_on_the_fullest_gpu_not_the_sum_and_the_message_names_it() -> None:
    fake = FakeTriton("s1", {"m": range(1, 4)})
    fake.serve("m", [1])
    (state,) = with_free_memory({"s1": observe(fake)}, {"s1": TwoGpus()}, 1).values()
    # The sum says 7 GiB free; GPU-b, where the version's instance runs too, has 1 GiB.
    assert state.memory_free == 1 * GIB
    assert state.memory_free_on == "on GPU-b, the fullest of 2 GPU(s)"
    wanted = replace(deploy("m", [2]), memory_per_version=3 * GIB)
    p = plan(desired_state(wanted), {"s1": state}, History(), "rev-1")
    (problem,) = p.problems
    assert problem.kind == "no-headroom"
    assert "3072 MiB beside the old, 1024 MiB free (on GPU-b, the fullest of 2 GPU(s))" in (
        problem.message
    )


def test_a_load_costs_what_its_fullest_device_grew() -> None:
    before, after = TwoGpus(b_used=5).figures("m", ()), TwoGpus(b_used=7).figures("m", ())
    assert footprint(before, after) == 2 * GIB  # GPU-b grew 2 GiB, GPU-a not at all
    host = Figures(memory_bytes=1 * GIB, memory_total_bytes=8 * GIB)
    assert footprint(host, replace(host, memory_bytes=3 * GIB)) == 2 * GIB
    assert footprint(Figures(), host) is None


def test_a_footprint_is_tritons_statistics_where_the_backend_reports_them() -> None:
    fake = FakeTriton("s1", {"m": range(1, 4)})
    fake.serve("m", [1])
    fake.reported_memory[("m", 2)] = (
        DeviceMemory("GPU", 0, 3 * GIB), DeviceMemory("GPU", 1, 3 * GIB),
    )  # fmt: skip
    fake.reported_memory[("m", 1)] = (DeviceMemory("GPU", 0, 5 * GIB),)  # the old: not counted
    p = plan(desired_state(deploy("m", [2])), {"s1": observe(fake)}, History(), "rev-1")
    clock = FakeClock()
    timing = Timing(clock=clock.clock, sleep=clock.sleep)
    # The figures grew 1 GiB per device meanwhile (another process): not what decides.
    result = apply(p, {"s1": fake}, timing=timing, metrics={"s1": TwoGpus(b_used=7)})
    assert result.ok
    assert footprints_from(result) == {("s1", "m"): 3 * GIB}
    # A backend that reports nothing: the figures' growth, as before.
    fake.reported_memory.clear()
    p = plan(desired_state(deploy("m", [3])), {"s1": observe(fake)}, History(), "rev-1")
    growing = iter((5, 7, 7, 7, 7, 7, 7, 7))

    class Growing(TwoGpus):
        def figures(self, model: str, versions: tuple[int, ...], queries: object = {}) -> Figures:
            self.b_used = next(growing)
            return super().figures(model, versions, queries)

    result = apply(p, {"s1": fake}, timing=timing, metrics={"s1": Growing()})
    assert result.ok and footprints_from(result) == {("s1", "m"): 2 * GIB}


def test_a_need_beyond_the_servers_memory_in_all_is_not_waited_for() -> None:
    # resources.memory larger than the server has in all (8 GiB): no unload makes that room,
    # so the swap loads at once rather than failing after the unload wait.
    fake = FakeTriton("s1", {"m": range(1, 4)})
    fake.serve("m", [1])
    huge = replace(deploy("m", [2]), memory_per_version=64 * GIB, when_no_headroom="replace")
    observed = replace(observe(fake), memory_free=1 * GIB)
    p = plan(desired_state(huge), {"s1": observed}, History(), "rev-1")
    clock = FakeClock()
    figure = MemoryFigure(free=1)
    result = apply(p, {"s1": fake}, timing=Timing(clock=clock.clock, sleep=clock.sleep),
                   metrics={"s1": figure})  # fmt: skip
    assert result.ok and fake.ready("m") == {2}
    assert clock.clock() - 1000.0 < 5.0, "waited for room that cannot come"
