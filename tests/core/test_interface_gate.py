"""The interface gate: a change of the inputs or outputs clients see is refused by the planner,
before anything is loaded, unless ``spec.allowInterfaceChange``.

Triton applies a config to the whole model, so loading [old, new] with a config that renames
an output makes the serving old version answer with the new name at once: the gate must act
on the config about to be sent, not on what the new version shows once loaded.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.core.interface import config_interface
from reconciler.core.plan.planner import plan
from reconciler.core.records import problem_alerts
from reconciler.core.triton_config import merge
from reconciler.engine.apply import apply
from reconciler.engine.context import Timing
from reconciler.model.history import History
from reconciler.model.plan import Action, Plan
from reconciler.model.results import Outcome
from reconciler.model.serving import (
    READY,
    ModelInterface,
    ModelState,
    ServerState,
    TensorSignature,
    VersionState,
)
from reconciler.model.spec import ModelDeployment
from tests.core.fakes import FakeClock, FakeTriton, base_config, deploy, desired_state, observe

# base_config: max_batch_size 4, INPUT0 and OUTPUT0 FP32 dims [1].
SCORES = {"output": [{"name": "SCORES", "data_type": "TYPE_FP32", "dims": [1]}]}


def tensor(name: str, datatype: str = "TYPE_FP32", *dims: int) -> dict[str, Any]:
    return {"name": name, "data_type": datatype, "dims": list(dims or (1,))}


def serving_1(configs: Mapping[str, Mapping[str, Any]] | None = None) -> FakeTriton:
    """A server whose model m serves version 1 with the base config."""
    fake = FakeTriton("s1", {"m": range(1, 4)}, configs=configs)
    fake.serve("m", [1], base_config("m"))
    return fake


def plan_of(
    deployment: ModelDeployment, fake: FakeTriton, *, readable_repository: bool = True
) -> Plan:
    serving = {"s1": observe(fake, readable_repository=readable_repository)}
    return plan(desired_state(deployment), serving, History(managed={"s1": frozenset({"m"})}), "r")


def refusal(p: Plan) -> str:
    """The one problem of ``p``, an interface change, and that nothing was planned."""
    assert not p.changes and not p.in_sync
    (problem,) = p.problems
    assert (problem.server, problem.model, problem.kind) == ("s1", "m", "interface-change")
    return problem.message


def apply_nothing(p: Plan, fake: FakeTriton) -> None:
    """Applying a refused plan sends nothing: version 1 serves with the config it had."""
    before = fake.loaded_config("m")
    calls = len(fake.calls)
    clock = FakeClock()
    result = apply(p, {"s1": fake}, timing=Timing(clock=clock.clock, sleep=clock.sleep))
    assert result.ok and not result.changes
    assert fake.calls[calls:] == []
    assert fake.ready("m") == {1} and fake.loaded_config("m") == before


# -- refused ----------------------------------------------------------------------------------


def test_a_renamed_output_is_refused_before_anything_is_loaded() -> None:
    fake = serving_1()
    p = plan_of(deploy("m", [2], config=SCORES), fake)

    message = refusal(p)
    assert message.startswith(
        "version 2 changes the model's interface: output OUTPUT0 removed; output SCORES added; "
        "refused before anything is loaded (Triton applies a config to the whole model, so "
        "version(s) 1 would answer with it too; set spec.allowInterfaceChange: true to accept)"
    )
    apply_nothing(p, fake)


def test_a_changed_datatype_is_refused() -> None:
    fake = serving_1()
    changed = {"output": [tensor("OUTPUT0", "TYPE_INT64")]}
    message = refusal(plan_of(deploy("m", [2], config=changed), fake))
    assert "output OUTPUT0 datatype FP32 -> INT64" in message


def test_changed_dims_are_refused_with_the_batch_dimension_shown() -> None:
    fake = serving_1()
    wider = {"input": [tensor("INPUT0", "TYPE_FP32", 3)]}
    message = refusal(plan_of(deploy("m", [2, 3], config=wider), fake))
    assert message.startswith(
        "versions 2, 3 change the model's interface: input INPUT0 shape [-1, 1] -> [-1, 3];"
    )


def test_an_added_input_is_refused() -> None:
    fake = serving_1()
    more = {"input": [tensor("INPUT0"), tensor("MASK", "TYPE_BOOL")]}
    message = refusal(plan_of(deploy("m", [2], config=more), fake))
    assert "version 2 changes the model's interface: input MASK added;" in message


def test_a_config_change_alone_that_drops_the_batch_dimension_is_refused() -> None:
    """No new version: reloading version 1 with max_batch_size 0 changes every shape its
    clients send and get."""
    fake = serving_1()
    p = plan_of(deploy("m", [1], config={"max_batch_size": 0}), fake)
    assert refusal(p).startswith(
        "spec.config changes the model's interface: input INPUT0 shape [-1, 1] -> [1]; "
        "output OUTPUT0 shape [-1, 1] -> [1]; refused before anything is loaded"
    )
    apply_nothing(p, fake)


def test_a_refused_change_is_alerted() -> None:
    p = plan_of(deploy("m", [2], config=SCORES), serving_1())
    (alert,) = problem_alerts(p)
    assert (alert.kind, alert.severity, alert.model, alert.server) == (
        "interface-change",
        "warning",
        "m",
        "s1",
    )
    assert "output SCORES added" in alert.summary


# -- the new version's config.pbtxt -----------------------------------------------------------


def renamed_in_repository() -> FakeTriton:
    """config.pbtxt now names the output SCORES (published with version 2, say); version 1
    serves the config it was loaded with, OUTPUT0."""
    return serving_1({"m": merge(base_config("m"), SCORES)})


def test_a_repository_config_that_changes_the_interface_is_refused() -> None:
    fake = renamed_in_repository()
    p = plan_of(deploy("m", [2]), fake)

    assert refusal(p).startswith(
        "version 2 changes the model's interface, as config.pbtxt in the model repository "
        "declares it: output OUTPUT0 removed; output SCORES added; refused before anything is "
        "loaded (the load would send the inputs and outputs version(s) 1 serve"
    )
    apply_nothing(p, fake)


def test_the_repository_config_is_compared_only_where_it_applies() -> None:
    fake = renamed_in_repository()
    # Unreadable: nothing to compare with; the after-load check stays.
    (change,) = plan_of(deploy("m", [2]), fake, readable_repository=False).changes
    assert change.interface_baseline == 1
    # spec.config declares the outputs the serving versions have: those are sent.
    kept = {"output": [tensor("OUTPUT0")]}
    assert plan_of(deploy("m", [2], config=kept), fake).changes
    # No new version: config.pbtxt is no version's to come with.
    instances = {"instance_group": [{"kind": "KIND_CPU", "count": 2}]}
    assert plan_of(deploy("m", [1], config=instances), fake).changes
    # A config.pbtxt that leaves the outputs out (a backend auto-completes them) says nothing.
    partial = {k: v for k, v in base_config("m").items() if k not in ("output", "max_batch_size")}
    assert plan_of(deploy("m", [2]), serving_1({"m": partial})).changes


# -- not gated --------------------------------------------------------------------------------


def test_allow_interface_change_accepts_it() -> None:
    fake = serving_1()
    allowed = replace(deploy("m", [2], config=SCORES), allow_interface_change=True)
    p = plan_of(allowed, fake)

    assert not p.problems
    (change,) = p.changes
    load = change.steps[0]
    assert load.action is Action.LOAD and load.config is not None
    assert [t["name"] for t in load.config["output"]] == ["SCORES"]
    assert change.interface_baseline is None
    # And for config.pbtxt's interface too.
    allowed_repository = replace(deploy("m", [2]), allow_interface_change=True)
    assert plan_of(allowed_repository, renamed_in_repository()).changes


def test_a_first_deployment_is_not_gated() -> None:
    fake = FakeTriton("s1", {"m": range(1, 4)})
    (change,) = plan_of(deploy("m", [1], config=SCORES), fake).changes
    assert change.serving == () and change.desired == (1,)


def test_an_unchanged_interface_is_not_gated() -> None:
    fake = serving_1()
    # A bigger batch keeps the batch dimension; dims written as numbers are Triton's strings.
    same = {
        "max_batch_size": 8,
        "output": [tensor("OUTPUT0")],
        "instance_group": [{"kind": "KIND_CPU", "count": 2}],
    }
    p = plan_of(deploy("m", [2], config=same), fake)
    assert not p.problems
    (change,) = p.changes
    assert change.interface_baseline == 1  # the after-load check stays behind the gate
    clock = FakeClock()
    result = apply(p, {"s1": fake}, timing=Timing(clock=clock.clock, sleep=clock.sleep))
    assert [c.outcome for c in result.changes] == [Outcome.CONVERGED]
    assert fake.ready("m") == {2}


def test_no_loaded_config_leaves_it_to_the_after_load_check() -> None:
    """A server that reports version 1 READY but whose config could not be read: the plan
    cannot compare, the executor reads the old interface before the load."""
    state = ServerState(
        "s1",
        {"m": ModelState("m", (VersionState(1, READY),), None, base_config("m"))},
        frozenset({"m"}),
    )
    p = plan(desired_state(deploy("m", [2], config=SCORES)), {"s1": state}, History(), "r")
    (change,) = p.changes
    assert change.interface_baseline == 1


# -- what a config shows clients --------------------------------------------------------------


def test_config_interface_reads_as_triton_metadata_does() -> None:
    config = {
        "max_batch_size": 8,
        "input": [{"name": "TEXT", "data_type": "TYPE_STRING", "dims": ["-1"]}],
        "output": [tensor("B"), tensor("A", "TYPE_INT64", 2, 3)],
    }
    assert config_interface(config) == ModelInterface(
        (TensorSignature("TEXT", "BYTES", (-1, -1)),),
        (TensorSignature("A", "INT64", (-1, 2, 3)), TensorSignature("B", "FP32", (-1, 1))),
    )
    assert config_interface({}) == ModelInterface()
    assert config_interface({"input": [{"name": "X", "dims": ["many"]}]}) is None


# -- the property -----------------------------------------------------------------------------

# Each changes what clients of base_config see.
INTERFACE_CHANGES: tuple[Mapping[str, Any], ...] = (
    SCORES,
    {"output": [tensor("OUTPUT0", "TYPE_INT64")]},
    {"output": [tensor("OUTPUT0", "TYPE_FP32", 2)]},
    {"input": [tensor("INPUT0", "TYPE_FP32", 1, 1)]},
    {"input": [tensor("INPUT0"), tensor("MASK", "TYPE_BOOL")]},
    {"input": []},
    {"max_batch_size": 0},
)


@settings(max_examples=100, deadline=None)
@given(
    st.frozensets(st.integers(1, 3), min_size=1),
    st.frozensets(st.integers(1, 3), min_size=1),
    st.sampled_from(INTERFACE_CHANGES),
    st.sampled_from(({}, {"instance_group": [{"kind": "KIND_CPU", "count": 2}]})),
    st.booleans(),
)
def test_an_interface_change_is_refused_with_nothing_loaded_unless_allowed(
    ready: frozenset[int],
    versions: frozenset[int],
    change: Mapping[str, Any],
    other: Mapping[str, Any],
    allowed: bool,
) -> None:
    fake = FakeTriton("s1", {"m": range(1, 4)})
    fake.serve("m", ready, base_config("m"))
    before = fake.loaded_config("m")
    deployment = replace(
        deploy("m", sorted(versions), config={**other, **change}), allow_interface_change=allowed
    )
    p = plan_of(deployment, fake)
    clock = FakeClock()
    calls = len(fake.calls)

    result = apply(p, {"s1": fake}, timing=Timing(clock=clock.clock, sleep=clock.sleep))

    if allowed:
        assert not p.problems and p.changes
        assert result.ok and fake.ready("m") == versions
    else:
        (problem,) = p.problems
        assert problem.kind == "interface-change" and not p.changes
        assert not [c for c in fake.calls[calls:] if c in ("load m", "unload m")]
        assert fake.ready("m") == ready and fake.loaded_config("m") == before
