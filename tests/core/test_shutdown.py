"""Shutdown between the stages of a staged rollout, or between the phases of a traffic
rollout: every server touched goes back, the spec is not held, nothing is alerted as a failed
rollout, and the next pass rolls out again (README, **Shutdown**: "put back, not held"). The
same as a shutdown during an analysis (``Interrupted``), on the fakes, with ``Timing.stopping``
turning true mid-rollout."""

from __future__ import annotations

from reconciler.core.failures import pass_failures
from reconciler.core.records import alerts_from, holds_from
from reconciler.engine.apply import apply
from reconciler.engine.context import Timing
from reconciler.loop.reconcile import reconcile
from reconciler.model.history import History
from reconciler.model.plan import Action
from reconciler.model.results import FailureKind, Outcome, StepResult
from reconciler.model.settings import Settings
from reconciler.model.source import Source
from tests.core.fakes import observe
from tests.core.pass_fakes import FakeClient, World, server_yaml
from tests.core.test_traffic import CANARY, Counters, Pass, at_rest, desired, fakes

SERVERS = ("s1", "s2")


def staged_doc(*versions: int) -> str:
    """``m`` on s1 and s2 at ``versions``, rolled out one server, then the rest."""
    return (
        "apiVersion: triton-gitops/v1alpha1\nkind: ModelDeployment\n"
        "metadata:\n  name: m\nspec:\n"
        f"  servers:\n    names: [{', '.join(SERVERS)}]\n"
        f"  versions: [{', '.join(map(str, versions))}]\n"
        "  rollout:\n    steps: [{servers: 1}, {servers: 100%}]\n"
    )


def commit(world: World, *versions: int) -> str:
    return world.manifests.commit(
        {
            **{f"servers/{s}.yaml": server_yaml(s) for s in SERVERS},
            "models/m.yaml": staged_doc(*versions),
        }
    )


class StopAfter:
    """Shutdown asked for once ``server`` finished a step of ``action`` forward: ``progress``
    watches the steps, ``stopping`` is what the executor is given."""

    def __init__(self, server: str, action: Action) -> None:
        self.server, self.action = server, action
        self.asked = False

    def progress(self, result: StepResult) -> None:
        watched = (result.step.server, result.step.action) == (self.server, self.action)
        if watched and result.ok and not result.reverting:
            self.asked = True

    def stopping(self) -> bool:
        return self.asked


def test_a_shutdown_between_stages_puts_every_server_back_and_holds_nothing(
    settings: Settings,
) -> None:
    world = World()
    for name in SERVERS:
        world.servers[name] = FakeClient(name, {"m": [1, 2]})
    source = Source("fake://manifests")
    commit(world, 1)
    assert reconcile(source, settings, world.ports(), apply_changes=True).ok
    commit(world, 2)

    # s1's stage (its load and verify) passes; the shutdown comes before s2's stage.
    stop = StopAfter("s1", Action.VERIFY)
    report = reconcile(
        source,
        settings,
        world.ports(),
        apply_changes=True,
        progress=stop.progress,
        stopping=stop.stopping,
    )

    assert report.result is not None
    outcomes = {c.change.server: c.outcome for c in report.result.changes}
    # s1 passed its stage and is put back; s2 was never touched.
    assert outcomes == {"s1": Outcome.INTERRUPTED, "s2": Outcome.SKIPPED}
    assert all(c.failure is FailureKind.INTERRUPTED for c in report.result.changes)
    assert all(world.servers[s].ready("m") == {1} for s in SERVERS)
    assert world.state.early_holds == [] and world.state.holds == {}
    assert world.state.passes[-1]["holds"] == ()
    # As after an analysis cut short by a shutdown: nothing failed, nothing alerted, nothing
    # a person must see to.
    assert world.alerts.kinds() == [] and world.state.open == set()
    assert not any(f.severe for f in pass_failures(report))

    # The next pass rolls the same spec out again, to the end.
    again = reconcile(source, settings, world.ports(), apply_changes=True)
    assert again.ok and again.plan.held == ()
    assert {c.server for c in again.plan.changes} == set(SERVERS)
    assert all(world.servers[s].ready("m") == {2} for s in SERVERS)


def test_a_shutdown_between_traffic_phases_switches_back_and_holds_nothing() -> None:
    run = Pass(desired(), fakes(), at_rest())
    planned = run.plan()
    # The route's phases: the mirror phase, 1%, 50%. The shutdown comes once the canary's
    # analysis under the mirror phase passed, before the 1% share is set.
    stop = StopAfter("c", Action.ANALYZE)
    result = apply(
        planned,
        run.fakes,
        timing=Timing(clock=run.clock.clock, sleep=run.clock.sleep, stopping=stop.stopping),
        progress=stop.progress,
        metrics={name: Counters() for name in run.fakes},
        routers={"edge": run.router},
    )

    outcomes = {c.change.server: c.outcome for c in result.changes}
    assert outcomes == {"a": Outcome.SKIPPED, "b": Outcome.SKIPPED, "c": Outcome.INTERRUPTED}
    assert all(c.failure is FailureKind.INTERRUPTED for c in result.changes)
    # At rest, the mirror phase, then straight back to the stable pool; c serves 1 alone.
    canary = [(w["canary"], m.get("canary", 0)) for w, m in run.router.updates]
    assert canary == [(0, 0), (0, CANARY.mirror), (0, 0)]
    assert observe(run.fakes["c"]).model("m").ready == {1}
    assert holds_from(result, run.desired, History()) == ()
    assert alerts_from(result, "hold") == ()

    # The next plan rolls out again (the router is at rest, every server on 1).
    (rollout,) = run.plan().rollouts
    assert rollout.stages == planned.rollouts[0].stages
