"""The pass (``loop.reconcile``) with plain fakes for every port: what it returns or raises,
what it records and what it alerts, when it converges, has nothing to do, only plans, and
when each of its phases fails. No Git, no Triton, no SQLite (see ``pass_fakes.py``)."""

from __future__ import annotations

import gc
import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pytest

from reconciler.loop.memory import PassMemory
from reconciler.loop.reconcile import reconcile
from reconciler.model.errors import (
    DiscoveryFailed,
    HistoryRewritten,
    SourceUnavailable,
    UnsafeRevision,
    ValidationError,
)
from reconciler.model.history import AlertEvent
from reconciler.model.reports import PassReport
from reconciler.model.results import FailureKind, Outcome
from reconciler.model.settings import RevertMode, RevertSettings, Settings
from reconciler.model.source import Source
from tests.core.pass_fakes import (
    FakeClient,
    PhaseRecorder,
    World,
    deployment_yaml,
    pool_yaml,
    server_yaml,
)

PHASES = [
    "fetch",
    "approve",
    "read",
    "discover",
    "guard",
    "observe",
    "plan",
    "apply",
    "record",
    "alert",
    "revert",
]
SOURCE = Source("fake://manifests")


def deploy(world: World, *versions: int) -> str:
    return world.manifests.commit(
        {
            "servers/s1.yaml": server_yaml("s1"),
            "models/echo.yaml": deployment_yaml("echo", versions, ["s1"]),
        }
    )


def run(
    world: World,
    settings: Settings,
    *,
    apply_changes: bool = True,
    memory: PassMemory | None = None,
) -> PassReport:
    return reconcile(SOURCE, settings, world.ports(), apply_changes=apply_changes, memory=memory)


class FrozenAtPlan(PhaseRecorder):
    """Records how many objects the collector holds frozen as the plan phase starts."""

    def __init__(self) -> None:
        super().__init__()
        self.frozen: list[int] = []

    def phase_started(self, phase: str) -> None:
        super().phase_started(phase)
        if phase == "plan":
            self.frozen.append(gc.get_freeze_count())


def test_only_a_one_shot_pass_keeps_its_values_from_full_collections(
    world: World, settings: Settings
) -> None:
    """A one-shot pass freezes what it read (a full collection walking it again and again
    cost a 1,000 x 100 pass 4 s of 12); the service's passes do not: with a freeze in every
    pass its memory grew about 80 KB a pass (bench.soak, 100 swaps: 8.4 MB against 0.9)."""
    world.hooks = FrozenAtPlan()
    deploy(world, 1)
    run(world, settings)
    run(world, settings, memory=PassMemory())
    one_shot, service = world.hooks.frozen
    assert one_shot > 0 and service == 0, world.hooks.frozen
    assert gc.get_freeze_count() == 0  # unfrozen after the pass


def assert_closed_once_per_pass(world: World, passes: int) -> None:
    """Every pass, whatever happened, saves the alert backlog and closes its store."""
    assert world.state.closed == passes
    assert len(world.alerts.restored) == passes


def test_a_pass_converges_records_and_times_every_phase(world: World, settings: Settings) -> None:
    revision = deploy(world, 1)
    report = run(world, settings)

    assert report.ok and report.revision == revision
    assert report.result is not None
    assert [c.outcome for c in report.result.changes] == [Outcome.CONVERGED]
    assert world.servers["s1"].ready("echo") == {1}
    assert world.servers["s1"].closed == 1  # a one-shot pass closes its clients
    (recorded,) = world.state.passes
    assert recorded["revision"] == revision and recorded["ok"]
    assert world.state.managed == {"s1": frozenset({"echo"})}
    assert world.state.applied["echo"].versions == (1,)
    assert report.expected == {"s1": {"echo": (1,)}}
    assert world.hooks.ended() == PHASES
    assert [w for w, _ in world.hooks.events] == ["started", "ended"] * len(PHASES)
    assert all(s >= 0 for s in world.hooks.seconds.values())
    assert report.reverts == ()
    assert_closed_once_per_pass(world, 1)


def test_a_second_pass_has_nothing_to_do(world: World, settings: Settings) -> None:
    deploy(world, 1)
    run(world, settings)
    calls = len(world.servers["s1"].calls)
    second = run(world, settings)

    assert second.ok and not second.plan.changes
    assert second.plan.in_sync == (("s1", "echo"),)
    assert second.result is not None and second.result.changes == ()
    assert world.servers["s1"].calls[calls:] == []  # nothing loaded or unloaded
    assert len(world.state.passes) == 2
    assert_closed_once_per_pass(world, 2)


def test_a_pass_with_memory_keeps_its_clients_and_manifests(
    world: World, settings: Settings
) -> None:
    deploy(world, 1)
    memory = PassMemory()
    run(world, settings, memory=memory)
    reads = len(world.manifests.fetched)
    second = run(world, settings, memory=memory)

    assert second.ok and not second.plan.changes
    assert world.servers["s1"].closed == 0  # kept for the next pass
    assert len(world.manifests.fetched) == reads + 1  # fetched, the revision not read again
    memory.close()
    assert world.servers["s1"].closed == 1


def test_plan_only_changes_and_records_nothing(world: World, settings: Settings) -> None:
    deploy(world, 1)
    world.state.undelivered = {"alertmanager http://am": [{"old": 1}]}
    report = run(world, settings, apply_changes=False)

    assert report.result is None
    assert [(c.server, c.model, c.desired) for c in report.plan.changes] == [("s1", "echo", (1,))]
    assert set(report.served) == {"s1"}  # what a saved plan must find unchanged
    assert world.servers["s1"].ready("echo") == frozenset()
    assert world.state.passes == [] and world.alerts.sent == []
    assert world.hooks.ended() == PHASES[: PHASES.index("plan") + 1]
    # Alerts a receiver did not take are left to the next apply, which records delivery.
    assert world.alerts.restored == [] and world.state.closed == 1
    assert world.state.undelivered == {"alertmanager http://am": [{"old": 1}]}


def test_fetch_failing_raises_source_unavailable_and_records_nothing(
    world: World, settings: Settings
) -> None:
    deploy(world, 1)
    world.manifests.unavailable = "cannot fetch fake://manifests: no answer"
    with pytest.raises(SourceUnavailable, match="no answer"):
        run(world, settings)

    assert world.state.passes == [] and world.alerts.sent == []
    assert world.hooks.ended() == ["fetch"]  # ended, raising
    assert_closed_once_per_pass(world, 1)


def test_an_unapproved_revision_is_refused_and_alerted(world: World, settings: Settings) -> None:
    deploy(world, 1)
    run(world, settings)
    deploy(world, 2)
    world.manifests.fast_forward = False  # a force-push
    with pytest.raises(HistoryRewritten):
        run(world, settings)

    assert world.alerts.kinds()[-1] == "revision-refused"
    assert len(world.state.passes) == 1  # the refused pass records nothing
    assert world.servers["s1"].ready("echo") == {1}  # the last applied revision keeps serving
    assert world.hooks.ended()[-1] == "approve"


def test_a_refused_revision_in_plan_mode_is_not_alerted(world: World, settings: Settings) -> None:
    deploy(world, 1)
    run(world, settings)
    sent = len(world.alerts.sent)
    deploy(world, 2)
    world.manifests.fast_forward = False
    with pytest.raises(UnsafeRevision):
        run(world, settings, apply_changes=False)
    assert len(world.alerts.sent) == sent


def test_invalid_manifests_raise_with_the_revision_and_alert(
    world: World, settings: Settings
) -> None:
    revision = world.manifests.commit({"models/echo.yaml": "kind: ModelDeployment\nspec: 3\n"})
    with pytest.raises(ValidationError) as raised:
        run(world, settings)

    assert raised.value.revision == revision and raised.value.problems
    assert world.alerts.kinds() == ["validation-failed"]
    assert world.state.passes == []
    assert world.hooks.ended()[-1] == "read"


def test_a_discovery_name_that_does_not_resolve_fails_the_pass(
    world: World, settings: Settings
) -> None:
    world.manifests.commit(
        {
            "servers/pool.yaml": pool_yaml("pool", "nowhere.invalid"),
            "models/echo.yaml": deployment_yaml("echo", [1], ["pool"]),
        }
    )
    with pytest.raises(DiscoveryFailed, match=r"nowhere\.invalid"):
        run(world, settings)
    assert world.state.passes == []
    assert world.hooks.ended()[-1] == "discover"
    assert_closed_once_per_pass(world, 1)


def test_discovered_instances_are_servers_of_the_pass(world: World, settings: Settings) -> None:
    world.manifests.commit(
        {
            "servers/pool.yaml": pool_yaml("pool", "pool.local"),
            "models/echo.yaml": deployment_yaml("echo", [1], ["pool"]),
        }
    )
    world.resolver.names["pool.local"] = ["10.0.0.1"]
    seen: list[str] = []

    def client(server: object) -> FakeClient:
        name = getattr(server, "name", "")
        seen.append(name)
        return world.servers.setdefault(name, FakeClient(name, {"echo": [1]}))

    world.client = client  # type: ignore[method-assign]
    report = run(world, settings)
    assert report.ok and len(seen) == 1
    assert report.discovered == {"pool": ("pool.local", 10.0, ("10.0.0.1",))}
    assert world.servers[seen[0]].ready("echo") == {1}


def test_the_guard_refuses_a_revision_that_empties_a_server(
    world: World, settings: Settings
) -> None:
    deploy(world, 1)
    run(world, settings)
    world.manifests.commit({"servers/s1.yaml": server_yaml("s1")})  # every model gone
    with pytest.raises(UnsafeRevision, match="--allow-empty"):
        run(world, settings)

    assert len(world.state.passes) == 1
    assert world.servers["s1"].ready("echo") == {1}
    assert world.hooks.ended()[-1] == "guard"


def test_an_unreachable_server_is_a_problem_of_the_report_not_an_error(
    world: World, settings: Settings
) -> None:
    deploy(world, 1)
    world.servers["s1"].unreachable = True
    report = run(world, settings)

    assert not report.ok
    assert [(p.server, p.model) for p in report.plan.problems] == [("s1", None)]
    (recorded,) = world.state.passes
    assert not recorded["ok"]
    assert world.state.managed == {"s1": frozenset({"echo"})}  # not observed: kept as ours
    assert world.hooks.ended() == PHASES


def test_a_failing_load_is_reverted_held_and_alerted(world: World, settings: Settings) -> None:
    deploy(world, 1)
    run(world, settings)
    world.servers["s1"].failing.add(("echo", 2))
    revision = deploy(world, 2)
    report = run(world, settings)

    assert not report.ok and report.result is not None
    (change,) = report.result.changes
    assert change.outcome is Outcome.REVERTED
    assert world.servers["s1"].ready("echo") == {1}  # the old version serves again
    (early,) = world.state.early_holds  # the journal wrote it before the revert ran
    assert early.deployment == "echo" and early.revision == revision
    assert [h.deployment for h in world.state.passes[-1]["holds"]] == ["echo"]
    assert world.alerts.kinds() == ["load-failed"]
    assert world.state.open == {("echo", "s1", "load-failed")}
    assert report.reverts == ()  # --revert-mode hold: nothing pushed
    assert world.writer.pushed == []


class LostOnVerify(FakeClient):
    """Stops answering once, after the first load of version 2: the verify's call is the
    first to meet it (a network drop; the server keeps what it loaded)."""

    lost = False

    def load(self, model: str, config: Mapping[str, Any]) -> None:
        super().load(model, config)
        if 2 in self.ready(model) and not self.lost:
            self.unreachable = self.lost = True


def test_a_version_whose_verify_lost_the_server_is_verified_by_the_next_pass(
    world: World, settings: Settings
) -> None:
    server = world.servers["s1"] = LostOnVerify("s1", {"echo": [1, 2]})
    deploy(world, 1)
    run(world, settings)
    deploy(world, 2)

    report = run(world, settings)

    assert report.result is not None
    (change,) = report.result.changes
    assert (change.outcome, change.failure) == (Outcome.FAILED, FailureKind.SERVER_LOST)
    assert server.ready("echo") == {1, 2}  # nothing could be put back: 2 stays, unverified
    server.unreachable = False
    again = run(world, settings)
    # Not "unload 1" alone, which promoted 2 without a verify: 2 is verified first.
    (planned,) = again.plan.changes
    assert [str(s.action) for s in planned.steps] == ["load", "verify", "unload"], [
        s.reason for s in planned.steps
    ]
    assert again.result is not None and again.ok, [c.error for c in again.result.changes]
    assert server.ready("echo") == {2}


def test_a_pass_that_fails_logs_one_event_per_failed_server_or_model(
    world: World, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    world.servers["s1"].failing.add(("echo", 2))
    world.servers["s2"] = FakeClient("s2", {"echo": [2]})
    world.servers["s2"].unreachable = True
    revision = world.manifests.commit(
        {
            "servers/s1.yaml": server_yaml("s1"),
            "servers/s2.yaml": server_yaml("s2"),
            "models/echo.yaml": deployment_yaml("echo", [2], ["s1", "s2"]),
        }
    )
    with caplog.at_level(logging.INFO, logger="triton_gitops.pass"):
        report = run(world, settings)

    assert not report.ok
    events = [(r.levelno, vars(r)["fields"]) for r in caplog.records if r.getMessage() == "failure"]
    assert [(level, f["server"], f.get("model")) for level, f in events] == [
        (logging.WARNING, "s2", None),  # unreachable: retried by the next pass
        (logging.ERROR, "s1", "echo"),  # failed against its versions: held
    ]
    (_, unreachable), (_, load) = events
    assert unreachable["kind"] == "unreachable" and unreachable["revision"] == revision
    assert (load["deployment"], load["step"], load["kind"], load["outcome"]) == (
        "echo",
        "load",
        "against-versions",
        "reverted",
    )
    assert load["reason"] == "server s1: failed to load 'echo' version 2: initialize failed"


def test_a_pass_that_succeeds_logs_no_failure(
    world: World, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    deploy(world, 1)
    with caplog.at_level(logging.INFO, logger="triton_gitops.pass"):
        assert run(world, settings).ok
    assert [r for r in caplog.records if r.getMessage() == "failure"] == []


def test_the_revert_is_pushed_in_commit_mode(world: World, settings: Settings) -> None:
    committing = replace(settings, revert=RevertSettings(mode=RevertMode.COMMIT))
    deploy(world, 1)
    run(world, committing)
    world.servers["s1"].failing.add(("echo", 2))
    deploy(world, 2)
    report = run(world, committing)

    ((branch, edits, message, target),) = world.writer.pushed
    assert branch == "main" and target == "main"
    assert [(e.deployment, e.versions) for e in edits] == [("echo", (1,))]
    assert "Reverted-revision:" in message
    assert report.reverts and report.reverts[0].startswith("pushed revert ")
    assert world.state.reverted == {"echo": "f" * 40}


def test_the_revert_restores_the_whole_spec_that_last_converged(
    world: World, settings: Settings
) -> None:
    """A failed commit that bumped the versions also bumped what goes with them (here a
    verify timeout, in the demo a smoke case's expected answer): the revert restores the
    spec as written at the revision that last converged, not its versions alone, which left
    a manifest whose smoke case fails the version it serves."""
    committing = replace(settings, revert=RevertSettings(mode=RevertMode.COMMIT))
    deploy(world, 1)
    run(world, committing)
    world.servers["s1"].failing.add(("echo", 2))
    bumped = deployment_yaml("echo", [2], ["s1"]) + "  verify: {timeout: 90s}\n"
    world.manifests.commit({"servers/s1.yaml": server_yaml("s1"), "models/echo.yaml": bumped})
    run(world, committing)
    ((_, (edit,), _, _),) = world.writer.pushed
    assert edit.spec == {"servers": {"names": ["s1"]}, "versions": [1]}, edit


def test_a_revert_whose_converged_revision_is_gone_restores_versions_and_config(
    world: World, settings: Settings
) -> None:
    committing = replace(settings, revert=RevertSettings(mode=RevertMode.COMMIT))
    first = deploy(world, 1)
    run(world, committing)
    world.manifests.unreadable.add(first)  # its files no longer readable
    world.servers["s1"].failing.add(("echo", 2))
    deploy(world, 2)
    run(world, committing)
    ((_, (edit,), _, _),) = world.writer.pushed
    assert (edit.versions, edit.spec) == ((1,), None), edit


def test_a_failing_revert_write_back_is_a_note_not_an_error(
    world: World, settings: Settings
) -> None:
    committing = replace(settings, revert=RevertSettings(mode=RevertMode.COMMIT))
    deploy(world, 1)
    run(world, committing)
    world.servers["s1"].failing.add(("echo", 2))
    deploy(world, 2)
    world.writer.error = SourceUnavailable("cannot push to fake://manifests: rejected")
    report = run(world, committing)

    assert report.reverts == (
        "revert write-back failed: cannot push to fake://manifests: rejected",
    )
    assert [h.deployment for h in world.state.passes[-1]["holds"]] == ["echo"]  # still held
    assert world.hooks.ended()[-1] == "revert"


def test_a_failing_record_raises_after_apply_and_sends_no_pass_alerts(
    world: World, settings: Settings
) -> None:
    deploy(world, 1)
    world.state.fail_record = OSError("disk full")
    with pytest.raises(OSError, match="disk full"):
        run(world, settings)

    assert world.servers["s1"].ready("echo") == {1}  # applied before the record failed
    assert world.state.passes == []
    assert world.alerts.sent == []
    assert world.hooks.ended()[-1] == "record"
    assert_closed_once_per_pass(world, 1)


def test_alerts_undelivered_are_restored_flushed_and_kept(world: World, settings: Settings) -> None:
    deploy(world, 1)
    world.state.undelivered = {"alertmanager http://am": [{"old": 1}]}
    world.alerts.pending = {"alertmanager http://am": [{"still": 2}]}
    run(world, settings)

    assert world.alerts.restored == [{"alertmanager http://am": [{"old": 1}]}]
    assert world.alerts.flushes >= 1
    assert world.state.undelivered == {"alertmanager http://am": [{"still": 2}]}


def test_a_leftover_alert_outbox_is_sent_first_and_every_sent_alert_leaves_it(
    world: World, settings: Settings
) -> None:
    """A pass killed after its record left its failure alert in the outbox: the next pass
    sends it first, even one that then fails to fetch; a pass's own failure alert (written
    first by the journal, with the hold) is sent once, and leaves the outbox too."""
    deploy(world, 1)
    run(world, settings)
    leftover = AlertEvent("rollout-failed", "critical", "echo 9 failed", "r0", "echo", "s1")
    world.state.outbox = {leftover.identity: leftover}
    world.manifests.unavailable = "the Git host is down"
    with pytest.raises(SourceUnavailable):
        run(world, settings)
    assert world.alerts.sent == [leftover]
    assert world.state.outbox == {}

    world.manifests.unavailable = None
    world.servers["s1"].failing.add(("echo", 2))
    deploy(world, 2)
    run(world, settings)
    assert world.alerts.kinds() == ["rollout-failed", "load-failed"]
    assert world.state.outbox == {}


def test_a_failure_alert_opened_is_resolved_by_a_later_success(
    world: World, settings: Settings
) -> None:
    deploy(world, 1)
    run(world, settings)
    world.servers["s1"].failing.add(("echo", 2))
    deploy(world, 2)
    run(world, settings)
    assert world.state.open  # the failed rollout's alert is open
    world.servers["s1"].failing.clear()
    deploy(world, 1, 2)  # a new commit lifts the hold
    report = run(world, settings)

    assert report.ok
    assert world.alerts.kinds() == ["load-failed", "rollout-succeeded"]
    assert world.alerts.sent[-1].resolved
    assert world.state.open == set()
