"""The desired-state diff and the warnings a reviewer must see: examples, then invariants."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from reconciler.core.interface import interface_changes
from reconciler.core.plan.planner import plan
from reconciler.core.review_diff import (
    Change,
    DesiredDiff,
    FieldChange,
    ReviewWarning,
    WarningKind,
    diff,
    plan_warnings,
)
from reconciler.core.triton_config import merge
from reconciler.model.analysis import AnalysisSpec, Check
from reconciler.model.history import History
from reconciler.model.servers import TritonServer
from reconciler.model.spec import DesiredState, ModelDeployment, SmokeCase, Tensor
from tests.core.fakes import FakeTriton, deploy, desired_state, observe

ANALYSIS = AnalysisSpec(interval=5.0, duration=60.0, checks=(Check("ok", "successRate", min=0.99),))
SMOKE = SmokeCase("ones", (Tensor("INPUT0", "FP32", (1, 1), (1.0,)),))


def watched(model: str, versions: list[int], **options: Any) -> ModelDeployment:
    """A deployment with an analysis, so no no-analysis warning muddies the example."""
    return replace(deploy(model, versions, **options), analysis=ANALYSIS)


def tensor(name: str, datatype: str, *dims: int | str) -> dict[str, Any]:
    return {"name": name, "data_type": f"TYPE_{datatype}", "dims": list(dims)}


def kinds(d: DesiredDiff) -> list[tuple[WarningKind, str | None, tuple[str, ...]]]:
    return [(w.kind, w.model, w.servers) for w in d.warnings]


# -- what changes ---------------------------------------------------------------------------


def test_same_state_has_no_changes() -> None:
    state = desired_state(watched("m", [1], config={"max_batch_size": 4}))
    d = diff(state, state)
    assert d == DesiredDiff()
    assert not d.has_changes


def test_version_bump_adds_and_removes_versions() -> None:
    base = desired_state(watched("m", [1, 2]), servers=("s1", "s2"))
    head = desired_state(watched("m", [2, 3], servers=("s1", "s2")), servers=("s1", "s2"))

    d = diff(base, head)

    added, changed = (next(c for c in d.models if c.server == s) for s in ("s2", "s1"))
    assert (changed.change, changed.versions_added, changed.versions_removed) == (
        Change.CHANGED,
        (3,),
        (1,),
    )
    assert (added.change, added.old_versions, added.new_versions) == (Change.ADDED, (), (2, 3))
    assert d.warnings == ()
    assert d.has_changes


def test_a_model_no_longer_placed_is_unloaded() -> None:
    base = desired_state(watched("m", [1]), watched("gone", [1, 2]))
    head = desired_state(watched("m", [1]))

    d = diff(base, head)

    (removed,) = d.models
    assert (removed.server, removed.model, removed.change) == ("s1", "gone", Change.REMOVED)
    assert removed.versions_removed == (1, 2)
    assert d.deployments_removed == ("gone",)
    assert d.warnings == (
        ReviewWarning(
            WarningKind.UNLOAD,
            "gone",
            "gone",
            ("s1",),
            "unloaded (serving 1, 2): no ModelDeployment places it there any more",
        ),
    )


def test_servers_added_changed_removed_and_emptied() -> None:
    servers = [TritonServer(s, f"{s}:8001") for s in ("a", "b", "c")]
    base = DesiredState.build(servers, [watched("m", [1], servers=("a", "b", "c"))])
    head = DesiredState.build(
        [replace(servers[0], grpc="a.internal:8001"), servers[1], TritonServer("d", "d:8001")],
        [watched("m", [1], servers=("a", "d"))],
    )

    d = diff(base, head)

    assert [(s.server, s.change, s.models) for s in d.servers] == [
        ("a", Change.CHANGED, ()),
        ("c", Change.REMOVED, ("m",)),
        ("d", Change.ADDED, ("m",)),
    ]
    assert d.servers[0].fields == (FieldChange("grpc", "a:8001", "a.internal:8001"),)
    assert (d.servers_added, d.servers_removed) == (("d",), ("c",))
    # c is left alone (not unloaded); b loses its only model.
    assert [(c.server, c.change) for c in d.models] == [
        ("b", Change.REMOVED),
        ("d", Change.ADDED),
    ]
    assert kinds(d) == [
        (WarningKind.UNLOAD, "m", ("b",)),
        (WarningKind.SERVER_EMPTIED, None, ("b",)),
        (WarningKind.SERVER_EMPTIED, None, ("c",)),
    ]
    assert "apply refuses this revision unless --allow-empty" in d.warnings[1].message
    assert "removed from the manifests while it serves m" in d.warnings[2].message


def test_verify_only_change_is_a_change_without_warnings() -> None:
    base = desired_state(watched("m", [1]))
    head = desired_state(replace(watched("m", [1]), smoke=(SMOKE,), verify_timeout=30.0))
    (change,) = diff(base, head).models
    assert (change.change, change.verify, change.config) == (
        Change.CHANGED,
        ("smoke", "timeout"),
        (),
    )
    assert diff(base, head).warnings == ()


# -- config: in place, full reload, kept ----------------------------------------------------


def test_instance_group_changes_in_place() -> None:
    base = desired_state(watched("m", [1], config={"instance_group": [{"count": 1}]}))
    head = desired_state(watched("m", [1], config={"instance_group": [{"count": 2}]}))
    d = diff(base, head)
    assert d.models[0].config == (FieldChange("instance_group", [{"count": 1}], [{"count": 2}]),)
    assert d.warnings == ()


def test_other_config_changes_reload_fully() -> None:
    base = desired_state(watched("m", [1], config={"max_batch_size": 4}))
    head = desired_state(
        watched(
            "m",
            [1],
            config={"max_batch_size": 8, "dynamic_batching": {}, "instance_group": [{}]},
        )
    )
    (warning,) = diff(base, head).warnings
    assert warning.kind is WarningKind.FULL_RELOAD
    assert warning.message.startswith(
        "a change of dynamic_batching, max_batch_size reloads every version fully"
    )


def test_the_same_value_written_differently_is_no_change() -> None:
    base = desired_state(watched("m", [1], config={"input": [tensor("X", "FP32", 4)]}))
    head = desired_state(watched("m", [1], config={"input": [tensor("X", "FP32", "4")]}))
    assert not diff(base, head).has_changes


def test_a_key_removed_from_spec_config_stays_as_loaded() -> None:
    base = desired_state(watched("m", [1], config={"max_batch_size": 8}))
    head = desired_state(watched("m", [1]))
    d = diff(base, head)
    assert d.models[0].config == (FieldChange("max_batch_size", 8, None),)
    assert kinds(d) == [(WarningKind.KEPT_CONFIG, "m", ("s1",))]
    assert "where the model is loaded it keeps 8" in d.warnings[0].message


# -- interface ------------------------------------------------------------------------------


def test_interface_changes_name_datatype_and_dims() -> None:
    old = {
        "input": [tensor("A", "FP32", 4), tensor("B", "INT64", 1)],
        "output": [tensor("Y", "FP32", 1)],
    }
    new = {
        "input": [tensor("A", "FP16", 4), tensor("C", "INT64", 1)],
        "output": [tensor("Y", "FP32", -1, 2)],
    }
    assert interface_changes(old, new, whole=False) == (
        "input A FP32 [4] -> FP16 [4]",
        "input B INT64 [1] removed",
        "input C INT64 [1] added",
        "output Y FP32 [1] -> FP32 [-1, 2]",
    )
    assert interface_changes(old, dict(old), whole=False) == ()


def test_interface_declared_on_one_side_only() -> None:
    declared = {"output": [tensor("Y", "FP32", 1)]}
    assert interface_changes({}, declared, whole=False) == (
        "output now declared in spec.config (Y FP32 [1]); before, it came from the base "
        "config, which this diff does not see",
    )
    assert interface_changes(declared, {}, whole=False) == (
        "output no longer declared in spec.config (was Y FP32 [1]): where the model is loaded "
        "it keeps these; a first load takes config.pbtxt's",
    )
    # Whole configs: a missing list is no tensors at all.
    assert interface_changes({}, declared, whole=True) == ("output Y FP32 [1] added",)


def test_batching_switched_on_or_off_changes_every_shape() -> None:
    assert interface_changes({"max_batch_size": 0}, {"max_batch_size": 8}, whole=False) == (
        "max_batch_size becomes non-zero: every input and output gains a batch dimension",
    )
    assert interface_changes({"max_batch_size": 4}, {}, whole=True) == (
        "max_batch_size becomes 0: inputs and outputs lose their batch dimension",
    )
    # In a spec.config, a missing key is the base's value, which a diff cannot see.
    assert interface_changes({}, {"max_batch_size": 8}, whole=False) == ()
    assert interface_changes({"max_batch_size": 4}, {"max_batch_size": 8}, whole=True) == ()


def test_interface_warning_is_merged_across_servers() -> None:
    servers = ("s1", "s2")
    old = {"input": [tensor("A", "FP32", 4)]}
    new = {"input": [tensor("A", "FP32", 8)]}
    base = desired_state(watched("m", [1], servers=servers, config=old), servers=servers)
    head = desired_state(watched("m", [1], servers=servers, config=new), servers=servers)
    assert [(w.kind, w.servers, w.message) for w in diff(base, head).warnings] == [
        (WarningKind.INTERFACE, ("s1", "s2"), "input A FP32 [4] -> FP32 [8]"),
        (
            WarningKind.FULL_RELOAD,
            ("s1", "s2"),
            "a change of input reloads every version fully (Triton applies only "
            "version_policy and instance_group in place): each is loaded again beside the "
            "serving instance, which costs memory and load time",
        ),
    ]


# -- analysis -------------------------------------------------------------------------------


def test_new_versions_without_analysis_are_flagged_once_per_deployment() -> None:
    servers = ("s1", "s2")
    base = desired_state(deploy("m", [1], servers=("s1",)), servers=servers)
    head = desired_state(deploy("m", [2], servers=servers, smoke=[SMOKE]), servers=servers)
    (warning,) = diff(base, head).warnings
    assert (warning.kind, warning.deployment, warning.servers) == (
        WarningKind.NO_ANALYSIS,
        "m",
        ("s1", "s2"),
    )
    assert warning.message == (
        "no spec.verify.analysis: new version(s) 2 are judged only by readiness and 1 smoke "
        "case; no metrics are watched once they take traffic"
    )
    # Dropping versions loads nothing new: nothing to analyse.
    assert diff(desired_state(deploy("m", [1, 2])), desired_state(deploy("m", [2]))).warnings == ()


# -- the same warnings from a plan ------------------------------------------------------------


def test_plan_warnings_see_the_loaded_config() -> None:
    """spec.config declares the input config.pbtxt has, but the loaded one differs: only a
    plan, which sees the loaded config, can tell that the reload changes the interface. Not
    allowed, the plan refuses it (the interface gate); allowed, it warns the reviewer."""
    fake = FakeTriton("s1", {"m": range(1, 4)})
    loaded = merge(fake.configs["m"], {"input": [tensor("INPUT0", "FP32", 2)]})
    fake.serve("m", [1], loaded)
    narrower = deploy("m", [2], config={"input": [tensor("INPUT0", "FP32", 1)]})
    history = History(managed={"s1": frozenset({"m"})})

    refused = plan(desired_state(narrower), {"s1": observe(fake)}, history, "rev")
    assert not refused.changes and plan_warnings(refused) == ()
    (problem,) = refused.problems
    assert problem.kind == "interface-change"
    assert "input INPUT0 shape [-1, 2] -> [-1, 1]" in problem.message

    head = desired_state(replace(narrower, allow_interface_change=True))
    p = plan(head, {"s1": observe(fake)}, history, "rev")

    assert [(w.kind, w.message) for w in plan_warnings(p)] == [
        (WarningKind.INTERFACE, "input INPUT0 FP32 [2] -> FP32 [1]"),
        (
            WarningKind.FULL_RELOAD,
            "a change of input reloads every version fully (Triton applies only version_policy "
            "and instance_group in place): each is loaded again beside the serving instance, "
            "which costs memory and load time",
        ),
        (
            WarningKind.NO_ANALYSIS,
            "no spec.verify.analysis: new version(s) 2 are judged only by readiness (no smoke "
            "case); no metrics are watched once they take traffic",
        ),
    ]


def test_plan_warnings_for_an_unload_and_an_in_place_change() -> None:
    fake = FakeTriton("s1", {"m": range(1, 4), "old": range(1, 3)})
    fake.serve("m", [1])
    fake.serve("old", [1, 2])
    head = desired_state(watched("m", [2], config={"instance_group": [{"count": 3}]}))

    p = plan(head, {"s1": observe(fake)}, History(managed={"s1": frozenset({"m", "old"})}), "r")

    assert [(w.kind, w.model) for w in plan_warnings(p)] == [(WarningKind.UNLOAD, "old")]


# -- invariants -----------------------------------------------------------------------------

SERVERS = ("s1", "s2", "s3")
deployments = st.dictionaries(
    st.sampled_from(("m", "n", "o")),
    st.tuples(
        st.frozensets(st.integers(1, 4), min_size=1),
        st.frozensets(st.sampled_from(SERVERS), min_size=1),
        st.sampled_from(({}, {"max_batch_size": 4}, {"max_batch_size": 8})),
    ),
)


def state_of(spec: dict[str, Any]) -> DesiredState:
    return desired_state(
        *(
            watched(model, sorted(versions), servers=sorted(servers), config=config)
            for model, (versions, servers, config) in sorted(spec.items())
        ),
        servers=SERVERS,
    )


@given(deployments, deployments)
def test_diff_both_ways_mirrors_versions(a: dict[str, Any], b: dict[str, Any]) -> None:
    forward, backward = diff(state_of(a), state_of(b)), diff(state_of(b), state_of(a))
    assert not diff(state_of(a), state_of(a)).has_changes
    assert forward.has_changes == backward.has_changes == (state_of(a) != state_of(b))
    mirrored = {
        (c.server, c.model): (c.versions_removed, c.versions_added) for c in backward.models
    }
    assert {
        (c.server, c.model): (c.versions_added, c.versions_removed) for c in forward.models
    } == mirrored
    # Every model placed at base and not at head is unloaded, with a warning saying so.
    unloaded = {(c.server, c.model) for c in forward.models if c.change is Change.REMOVED}
    warned = {
        (s, w.model) for w in forward.warnings if w.kind is WarningKind.UNLOAD for s in w.servers
    }
    assert unloaded == warned
