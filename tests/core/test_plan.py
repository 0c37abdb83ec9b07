"""The planner, driven against the in-memory Triton fake: examples, then invariants."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from reconciler.core.plan.planner import plan
from reconciler.core.plan.settle import emptied_servers
from reconciler.core.triton_config import merge
from reconciler.engine.apply import apply
from reconciler.engine.context import Timing
from reconciler.model.history import History, StagedRecord
from reconciler.model.plan import Action, Plan, PlanProblem
from reconciler.model.results import ApplyResult, Outcome
from reconciler.model.serving import ServerState
from reconciler.model.spec import DesiredState, Expectation, ModelDeployment, SmokeCase, Tensor
from tests.core.fakes import (
    FakeClock,
    FakeTriton,
    as_reported,
    base_config,
    deploy,
    desired_state,
    observe,
)

ALL_VERSIONS = range(1, 7)


def times(factor: float) -> SmokeCase:
    """A smoke case that passes only on the version that multiplies by ``factor``."""
    return SmokeCase(
        f"times-{factor:g}",
        (Tensor("INPUT0", "FP32", (1, 2), (1.5, -2.0)),),
        (Expectation("OUTPUT0", (1.5 * factor, -2.0 * factor), (1, 2)),),
    )


def fake_timing() -> Timing:
    clock = FakeClock()
    return Timing(clock=clock.clock, sleep=clock.sleep)


def plan_for(
    desired: DesiredState,
    fakes: Mapping[str, FakeTriton],
    history: History | None = None,
    **observe_options: bool,
) -> Plan:
    serving = {name: observe(fake, **observe_options) for name, fake in fakes.items()}
    return plan(desired, serving, history or History(), "rev-1")


def run(plan_: Plan, fakes: Mapping[str, FakeTriton]) -> ApplyResult:
    return apply(plan_, fakes, timing=fake_timing())


def server(name: str = "s1", models: Sequence[str] = ("m",)) -> FakeTriton:
    return FakeTriton(name, {m: ALL_VERSIONS for m in models})


# -- examples --------------------------------------------------------------------------------


def test_first_deploy_loads_verifies_and_reverts_by_unloading() -> None:
    fake = server()
    desired = desired_state(deploy("m", [1], config={"max_batch_size": 8}))

    p = plan_for(desired, {"s1": fake})

    (change,) = p.changes
    assert (change.serving, change.desired, change.deployment) == ((), (1,), "m")
    assert [(s.action, s.versions) for s in change.steps] == [
        (Action.LOAD, (1,)),
        (Action.VERIFY, (1,)),
    ]
    load = change.steps[0]
    assert load.config == {
        **base_config("m"),
        "max_batch_size": 8,
        "version_policy": {"specific": {"versions": [1]}},
    }
    assert [(s.action, s.versions) for s in change.revert] == [(Action.UNLOAD, ())]
    assert not p.problems and not p.in_sync

    result = run(p, {"s1": fake})

    assert result.ok
    assert fake.ready("m") == {1}
    again = plan_for(desired, {"s1": fake})
    assert not again.has_changes and again.in_sync == (("s1", "m"),)


def test_a_change_from_nothing_left_by_a_stopped_in_place_swap_reverts_to_what_served() -> None:
    """An in-place swap of this spec was stopped after its unload (its in-flight record says
    1 served): the rerun loads 2 from nothing, and its revert puts 1 back, not nothing."""
    fake = server()
    desired = desired_state(deploy("m", [2]))
    spec = desired.deployments["m"]
    stopped = History(staged={"m": StagedRecord(spec.fingerprint, frozenset(), {"s1": (1,)})})

    (change,) = plan_for(desired, {"s1": fake}, stopped).changes

    assert change.serving == ()
    assert [(s.action, s.versions) for s in change.revert] == [
        (Action.LOAD, (1,)),
        (Action.VERIFY, (1,)),
    ]
    assert change.revert[0].config is not None
    assert change.revert[0].config["version_policy"] == {"specific": {"versions": [1]}}
    # Another spec's record (a newer commit since): nothing is known about what served.
    other = History(staged={"m": StagedRecord("older", frozenset(), {"s1": (1,)})})
    (change,) = plan_for(desired, {"s1": fake}, other).changes
    assert [(s.action, s.versions) for s in change.revert] == [(Action.UNLOAD, ())]


def test_bump_loads_beside_the_old_version_then_drops_it() -> None:
    fake = server()
    fake.serve("m", [1])
    desired = desired_state(deploy("m", [2], smoke=[times(2)]))

    p = plan_for(desired, {"s1": fake})

    (change,) = p.changes
    load, verify, unload = change.steps
    assert (load.action, load.versions) == (Action.LOAD, (1, 2))
    assert load.config is not None
    assert load.config["version_policy"] == {"specific": {"versions": [1, 2]}}
    assert (verify.action, verify.versions, verify.smoke_versions) == (Action.VERIFY, (2,), (2,))
    assert (unload.action, unload.versions, unload.dropped) == (Action.UNLOAD, (2,), (1,))
    assert unload.config is not None
    assert unload.config["version_policy"] == {"specific": {"versions": [2]}}
    revert_load = change.revert[0]
    assert (revert_load.action, revert_load.versions) == (Action.LOAD, (1,))

    start = len(fake.timeline)
    result = run(p, {"s1": fake})

    assert [c.outcome for c in result.changes] == [Outcome.CONVERGED]
    assert fake.ready("m") == {2}
    # 1 kept serving until 2 was READY and had answered its smoke case.
    history = fake.history("m")[start:]
    assert history[0] == {1, 2} and history[-1] == {2}
    assert all(history)
    infer_at = fake.calls.index("infer m 2")
    unload_at = max(i for i, c in enumerate(fake.calls) if c == "load m")
    assert infer_at < unload_at
    assert not plan_for(desired, {"s1": fake}).has_changes


def test_rollback_is_the_same_shape_as_a_bump() -> None:
    fake = server()
    fake.serve("m", [2])
    desired = desired_state(deploy("m", [1], smoke=[times(1)]))

    p = plan_for(desired, {"s1": fake})

    (change,) = p.changes
    assert [(s.action, s.versions) for s in change.steps] == [
        (Action.LOAD, (1, 2)),
        (Action.VERIFY, (1,)),
        (Action.UNLOAD, (1,)),
    ]
    assert change.steps[2].dropped == (2,)
    assert change.steps[1].smoke_versions == (1,)
    start = len(fake.timeline)
    result = run(p, {"s1": fake})
    assert result.ok and fake.ready("m") == {1}
    assert all(fake.history("m")[start:])


def test_removal_only_of_models_history_says_are_ours() -> None:
    fake = server(models=("m", "gone", "theirs"))
    fake.serve("m", [1])
    fake.serve("gone", [1, 2])
    fake.serve("theirs", [3])
    desired = desired_state(deploy("m", [1]))
    history = History("rev-0", {"s1": frozenset({"m", "gone"})})

    p = plan_for(desired, {"s1": fake}, history)

    (change,) = p.changes
    assert (change.model, change.deployment, change.serving, change.desired) == (
        "gone",
        None,
        (1, 2),
        (),
    )
    (step,) = change.steps
    assert (step.action, step.versions, step.dropped) == (Action.UNLOAD, (), (1, 2))
    assert p.in_sync == (("s1", "m"),)

    assert run(p, {"s1": fake}).ok
    assert fake.ready("gone") == frozenset()
    assert fake.ready("theirs") == {3}
    assert "unload theirs" not in fake.calls and "load theirs" not in fake.calls


def test_removal_of_a_model_that_serves_nothing_plans_nothing() -> None:
    fake = server(models=("m", "gone"))
    desired = desired_state(deploy("m", [1]))
    fake.serve("m", [1])

    p = plan_for(desired, {"s1": fake}, History(managed={"s1": frozenset({"m", "gone"})}))

    assert not p.has_changes


def test_config_drift_reloads_the_same_versions_and_smokes_them_all() -> None:
    fake = server()
    fake.serve("m", [1, 2])
    desired = desired_state(deploy("m", [1, 2], config={"max_batch_size": 8}, smoke=[times(1)]))

    p = plan_for(desired, {"s1": fake})

    (change,) = p.changes
    load, verify = change.steps
    assert (load.action, load.versions) == (Action.LOAD, (1, 2))
    assert load.config is not None and load.config["max_batch_size"] == 8
    assert "config changed (max_batch_size)" in load.reason
    assert verify.smoke_versions == (1, 2)
    # The revert puts the config that was loaded back.
    assert change.revert[0].config is not None
    assert change.revert[0].config["max_batch_size"] == 4

    result = run(p, {"s1": fake})

    # times(1) fails on version 2 (it answers input * 2): the old config comes back.
    (outcome,) = result.changes
    assert outcome.outcome is Outcome.REVERTED
    assert outcome.error is not None and "version 2" in outcome.error
    assert fake.ready("m") == {1, 2}
    assert fake.loaded_config("m")["max_batch_size"] == 4  # type: ignore[index]


def test_config_written_as_triton_renders_it_is_not_drift() -> None:
    # Triton's JSON renders int64 fields as strings; the manifest writes numbers.
    fake = server()
    fake.serve("m", [1])
    output = [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [1]}]
    desired = desired_state(deploy("m", [1], config={"output": output, "max_batch_size": 4}))

    p = plan_for(desired, {"s1": fake})

    assert not p.has_changes and p.in_sync == (("s1", "m"),)


def test_config_drift_and_a_new_version_at_once() -> None:
    fake = server()
    fake.serve("m", [1])
    desired = desired_state(deploy("m", [2], config={"max_batch_size": 2}, smoke=[times(2)]))

    (change,) = plan_for(desired, {"s1": fake}).changes

    assert [s.action for s in change.steps] == [Action.LOAD, Action.VERIFY, Action.UNLOAD]
    assert change.steps[1].smoke_versions == (2,)
    assert change.steps[2].config is not None
    assert change.steps[2].config["max_batch_size"] == 2


def test_missing_version_in_repository_stops_only_that_model() -> None:
    fake = FakeTriton("s1", {"m": [1, 2], "other": [1]})
    desired = desired_state(deploy("m", [2, 3, 5]), deploy("other", [1]))

    p = plan_for(desired, {"s1": fake})

    (problem,) = p.problems
    assert (problem.server, problem.model) == ("s1", "m")
    assert "3, 5 not in the model repository" in problem.message
    assert "holds 1, 2" in problem.message
    assert [c.model for c in p.changes] == ["other"]


def test_a_missing_version_names_the_repository_the_server_reads() -> None:
    """The bucket (or folder) named, so that the engineer looks where the server reads: an
    upload to another prefix or another environment's bucket shows at once."""
    fake = FakeTriton("s1", {"m": [1, 2]})
    url = "s3://http://127.0.0.1:9000/models-bucket/models"
    observed = replace(observe(fake), repository_url=url)

    p = plan(desired_state(deploy("m", [9])), {"s1": observed}, History(), "rev-1")

    (problem,) = p.problems
    assert problem.message == f"version(s) 9 not in the model repository {url} (it holds 1, 2)", (
        problem.message
    )


def test_a_config_pbtxt_that_does_not_parse_stops_new_versions_of_that_model_only() -> None:
    fake = server(models=("m", "n", "other"))
    fake.serve("n", [1])
    desired = desired_state(deploy("m", [2]), deploy("n", [1]), deploy("other", [1]))
    broken = "s3://bucket/models/{}/config.pbtxt does not parse: line 2: expected '}}'"
    observed = observe(fake)
    observed = replace(
        observed,
        models={
            **observed.models,
            **{
                name: replace(observed.model(name), repository_config_error=broken.format(name))
                for name in ("m", "n")
            },
        },
    )

    p = plan(desired, {"s1": observed}, History(), "rev-1")

    # m: a new version to load, refused, naming the file; n serves what it should and is
    # left alone; other is planned as ever.
    assert [(q.model, q.message) for q in p.problems] == [
        (
            "m",
            broken.format("m") + "; refused before anything is loaded: fix config.pbtxt in "
            "the model repository",
        )
    ]
    assert [c.model for c in p.changes] == ["other"]


def test_model_missing_from_repository_index_is_a_problem() -> None:
    fake = FakeTriton("s1", {"other": [1]})
    complete = {"backend": "python"}
    desired = desired_state(
        deploy("m", [1], config=complete), deploy("other", [1], config=complete)
    )

    p = plan_for(desired, {"s1": fake}, readable_repository=False)

    assert [(q.server, q.model) for q in p.problems] == [("s1", "m")]
    assert "not in the server's model repository" in p.problems[0].message
    assert [c.model for c in p.changes] == ["other"]


def test_no_base_config_is_a_problem_and_a_complete_config_is_enough() -> None:
    fake = server(models=("m", "n"))
    desired = desired_state(
        deploy("m", [1], config={"max_batch_size": 8}),
        deploy("n", [1], config={"backend": "python"}),
    )

    p = plan_for(desired, {"s1": fake}, readable_repository=False)

    assert [(q.server, q.model) for q in p.problems] == [("s1", "m")]
    assert "no base config" in p.problems[0].message
    (change,) = p.changes
    assert change.model == "n"
    assert change.steps[0].config == {
        "backend": "python",
        "name": "n",
        "version_policy": {"specific": {"versions": [1]}},
    }


def test_unreachable_server_is_one_problem_and_the_others_are_planned() -> None:
    s1, s2 = server("s1"), server("s2")
    s2.unreachable = True
    everywhere = ["s1", "s2", "s3"]
    desired = desired_state(deploy("m", [1], servers=everywhere), servers=everywhere)

    p = plan_for(desired, {"s1": s1, "s2": s2})

    assert [(q.server, q.model) for q in p.problems] == [("s2", None), ("s3", None)]
    assert "did not answer" in p.problems[0].message
    assert p.problems[1].message == "not observed"
    assert str(p.problems[0]).startswith("server s2: ")
    assert [(c.server, c.model) for c in p.changes] == [("s1", "m")]


def test_plan_problem_renders_its_place() -> None:
    assert str(PlanProblem("s1", "m", "broken")) == "server s1, model m: broken"
    assert str(PlanProblem("s1", None, "down")) == "server s1: down"


def test_emptied_servers() -> None:
    desired = desired_state(deploy("m", [1], servers=["a"]), servers=["a", "b"])
    history = History(
        "rev-0",
        {
            "a": frozenset({"m"}),  # still has m
            "b": frozenset({"m"}),  # declared, but gets nothing now
            "c": frozenset({"m"}),  # no longer declared at all
            "d": frozenset(),  # never served anything of ours
        },
    )

    assert emptied_servers(desired, history) == ["b", "c"]
    assert emptied_servers(desired, History()) == []


# -- properties ------------------------------------------------------------------------------

SERVERS = ("s1", "s2")
MODELS = ("m0", "m1", "m2")
# Over base_config (batched, OUTPUT0 dims [1]). Two change the interface clients see:
# max_batch_size 0 drops the batch dimension, dims [2] widens OUTPUT0.
CONFIGS: tuple[Mapping[str, Any], ...] = (
    {},
    {"max_batch_size": 8},
    {"max_batch_size": 0},  # the default: Triton's report leaves it out
    {"instance_group": [{"kind": "KIND_CPU", "count": 2}]},
    # int64 dims as numbers, where Triton reports strings
    {"output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [2]}]},
)
# Zeros in, zeros out, whatever the version: passes on every version that answers right.
ZEROS = SmokeCase(
    "zeros", (Tensor("INPUT0", "FP32", (1, 1), (0.0,)),), (Expectation("OUTPUT0", (0.0,)),)
)
version_sets = st.frozensets(st.integers(1, 6), max_size=4)


def seen_by_clients(config: Mapping[str, Any]) -> tuple[bool, frozenset[tuple[str, ...]]]:
    """What a client of a whole config meets: whether requests are batched, and each tensor
    (input or output, name, datatype, dims in Triton's string form)."""
    return (
        int(config.get("max_batch_size", 0)) > 0,
        frozenset(
            (key, t["name"], t["data_type"], *(str(d) for d in t["dims"]))
            for key in ("input", "output")
            for t in config.get(key, [])
        ),
    )


@dataclass(frozen=True)
class Scenario:
    servers: tuple[str, ...]
    # (server, model) -> (READY versions, index in CONFIGS of the config they run with)
    observed: Mapping[tuple[str, str], tuple[frozenset[int], int]]
    deployments: tuple[ModelDeployment, ...]
    managed: Mapping[str, frozenset[str]]
    # (server, model, version) -> polls of model_state a newly loaded version stays LOADING
    loading: Mapping[tuple[str, str, int], int]

    def fakes(self) -> dict[str, FakeTriton]:
        fakes = {
            s: FakeTriton(
                s,
                {m: ALL_VERSIONS for m in MODELS},
                loading_polls={(m, v): n for (t, m, v), n in self.loading.items() if t == s},
            )
            for s in self.servers
        }
        for (s, m), (ready, config) in self.observed.items():
            if ready:
                fakes[s].serve(m, ready, merge(base_config(m), CONFIGS[config]))
        return fakes

    def desired(self) -> DesiredState:
        return desired_state(*self.deployments, servers=self.servers)

    def history(self) -> History:
        return History("rev-0", self.managed)

    def initial(self, s: str, m: str) -> frozenset[int]:
        return self.observed[(s, m)][0]

    def deployment(self, s: str, m: str) -> ModelDeployment | None:
        for d in self.deployments:
            if d.model == m and d.server_names is not None and s in d.server_names:
                return d
        return None

    def wanted(self, s: str, m: str) -> frozenset[int] | None:
        d = self.deployment(s, m)
        return frozenset(d.versions) if d is not None else None

    def refused(self, s: str, m: str) -> bool:
        """Whether the interface gate refuses the model here: something serves, the config to
        be sent (spec.config over the served one) or the one the new versions come with
        (spec.config over config.pbtxt, the fake's base_config) changes what clients see, and
        spec.allowInterfaceChange is not set."""
        d = self.deployment(s, m)
        ready, config = self.observed[(s, m)]
        if d is None or d.allow_interface_change or not ready:
            return False
        served = merge(base_config(m), CONFIGS[config])
        if seen_by_clients(merge(served, d.config)) != seen_by_clients(served):
            return True
        new = frozenset(d.versions) - ready
        return bool(new) and seen_by_clients(merge(base_config(m), d.config)) != seen_by_clients(
            served
        )

    def expected(self, s: str, m: str) -> frozenset[int]:
        if self.refused(s, m):
            return self.initial(s, m)
        wanted = self.wanted(s, m)
        if wanted is not None:
            return wanted
        if m in self.managed.get(s, frozenset()):
            return frozenset()
        return self.initial(s, m)


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    servers = SERVERS[: draw(st.integers(1, len(SERVERS)))]
    observed = {
        (s, m): (draw(version_sets), draw(st.integers(0, len(CONFIGS) - 1)))
        for s in servers
        for m in MODELS
    }
    deployments = []
    for m in MODELS:
        targets = draw(st.lists(st.sampled_from(servers), unique=True, max_size=len(servers)))
        if targets:
            versions = draw(st.frozensets(st.integers(1, 6), min_size=1, max_size=4))
            config = CONFIGS[draw(st.integers(0, len(CONFIGS) - 1))]
            smoke = [ZEROS] if draw(st.booleans()) else []
            d = deploy(m, sorted(versions), servers=sorted(targets), config=config, smoke=smoke)
            deployments.append(replace(d, allow_interface_change=draw(st.booleans())))
    managed = {s: draw(st.frozensets(st.sampled_from(MODELS))) for s in servers}
    loading = draw(
        st.dictionaries(
            st.tuples(st.sampled_from(servers), st.sampled_from(MODELS), st.integers(1, 6)),
            st.integers(1, 3),
            max_size=6,
        )
    )
    return Scenario(servers, observed, tuple(deployments), managed, loading)


def holds(actual: Any, wanted: Any) -> bool:
    """``actual`` is ``wanted``, give or take keys the server added to objects."""
    if isinstance(wanted, dict):
        return isinstance(actual, dict) and all(holds(actual.get(k), v) for k, v in wanted.items())
    if isinstance(wanted, list):
        return (
            isinstance(actual, list)
            and len(actual) == len(wanted)
            and all(holds(a, w) for a, w in zip(actual, wanted, strict=True))
        )
    return bool(actual == wanted)


def observe_all(fakes: Mapping[str, FakeTriton]) -> dict[str, ServerState]:
    return {name: observe(fake) for name, fake in fakes.items()}


def assert_never_dropped_before_verified(
    scenario: Scenario, fakes: Mapping[str, FakeTriton], starts: Mapping[str, int]
) -> None:
    """Every snapshot of a kept model holds all it served before, or all it must serve (a
    refused one serves what it served before throughout)."""
    for s, fake in fakes.items():
        for m in MODELS:
            before, wanted = scenario.initial(s, m), scenario.wanted(s, m)
            if wanted is None:
                continue
            for snapshot in fake.timeline[starts[s] :]:
                now = snapshot.of(m)
                if scenario.refused(s, m):
                    assert now == before, (s, m, snapshot, fake.calls)
                assert before <= now or wanted <= now, (s, m, snapshot, fake.calls)
                if before:
                    assert now, f"{s}/{m} served nothing after {snapshot.call}"


def refusals(scenario: Scenario) -> set[tuple[str, str]]:
    return {
        (s, d.model)
        for d in scenario.deployments
        for s in d.server_names or ()
        if scenario.refused(s, d.model)
    }


def interface_problems(p: Plan) -> set[tuple[str, str | None]]:
    return {(q.server, q.model) for q in p.problems if q.kind == "interface-change"}


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_apply_of_plan_converges_without_a_gap_and_replans_empty(scenario: Scenario) -> None:
    """Every model converges, except those whose change of interface the gate refuses: they
    are the plan's only problems, and nothing of them is loaded or unloaded."""
    fakes = scenario.fakes()
    starts = {s: len(f.timeline) for s, f in fakes.items()}
    refused = refusals(scenario)
    loaded_before = {(s, m): fake.loaded_config(m) for s, fake in fakes.items() for m in MODELS}

    p = plan(scenario.desired(), observe_all(fakes), scenario.history(), "rev-1")
    assert interface_problems(p) == refused and len(p.problems) == len(refused)
    result = apply(p, fakes, timing=fake_timing())

    assert result.ok, [(c.change.model, c.outcome, c.error) for c in result.changes]
    for s, fake in fakes.items():
        for m in MODELS:
            assert fake.ready(m) == scenario.expected(s, m), (s, m)
            d = scenario.deployment(s, m)
            if (s, m) in refused:
                # The old config stays, and nothing was sent to the server for it.
                assert fake.loaded_config(m) == loaded_before[(s, m)], (s, m)
                touched = [c for c in fake.calls if c in (f"load {m}", f"unload {m}")]
                assert not touched, (s, m)
            elif d is not None:
                # spec.config's keys run as asked, in the form Triton reports them.
                loaded = fake.loaded_config(m)
                asked = as_reported(merge(base_config(m), d.config))
                assert loaded is not None
                for key in d.config:
                    assert holds(loaded.get(key), asked.get(key)), (s, m, key, loaded)
            elif m not in scenario.managed[s]:
                # Neither declared nor ours: never touched.
                touched = [c for c in fake.calls if c in (f"load {m}", f"unload {m}")]
                assert not touched, (s, m)
    assert_never_dropped_before_verified(scenario, fakes, starts)

    again = plan(scenario.desired(), observe_all(fakes), scenario.history(), "rev-1")
    assert not again.has_changes
    assert interface_problems(again) == refused and len(again.problems) == len(refused)
    assert (
        set(again.in_sync)
        == {(s, d.model) for d in scenario.deployments for s in d.server_names or ()} - refused
    )


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.data())
def test_a_failed_version_reverts_that_model_and_others_converge(
    scenario: Scenario, data: st.DataObject
) -> None:
    # A new version either fails its load (LoadFailed) or loads and fails its smoke case.
    candidates = sorted(
        (s, d.model, v, how)
        for d in scenario.deployments
        for s in d.server_names or ()
        for v in frozenset(d.versions) - scenario.initial(s, d.model)
        for how in (("load", "answer") if d.smoke else ("load",))
        if not scenario.refused(s, d.model)  # refused: nothing of it is loaded to fail
    )
    assume(candidates)
    broken = data.draw(st.lists(st.sampled_from(candidates), min_size=1, max_size=3, unique=True))
    fakes = scenario.fakes()
    for s, m, v, how in broken:
        (fakes[s].failing if how == "load" else fakes[s].wrong_answers).add((m, v))
    starts = {s: len(f.timeline) for s, f in fakes.items()}
    failed = {(s, m) for s, m, _, _ in broken}

    p = plan(scenario.desired(), observe_all(fakes), scenario.history(), "rev-1")
    result = apply(p, fakes, timing=fake_timing())

    for change in result.changes:
        key = (change.change.server, change.change.model)
        if key in failed:
            assert change.outcome is Outcome.REVERTED, change
            assert change.revert and all(r.ok for r in change.revert)
        else:
            assert change.outcome is Outcome.CONVERGED, change
    assert failed <= {(c.change.server, c.change.model) for c in result.changes}
    assert not result.ok
    for s, fake in fakes.items():
        for m in MODELS:
            want = scenario.initial(s, m) if (s, m) in failed else scenario.expected(s, m)
            assert fake.ready(m) == want, (s, m)
    assert_never_dropped_before_verified(scenario, fakes, starts)


@pytest.mark.parametrize("ready", [frozenset(), frozenset({1}), frozenset({1, 2})])
def test_in_sync_model_is_not_replanned(ready: frozenset[int]) -> None:
    fake = server()
    if ready:
        fake.serve("m", ready)
    desired = desired_state(deploy("m", sorted(ready or {1})))

    p = plan_for(desired, {"s1": fake})

    assert p.has_changes is (not ready)
    assert (("s1", "m") in p.in_sync) is bool(ready)
