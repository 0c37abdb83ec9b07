"""Crash consistency: the reconciler killed with SIGKILL at every fault point, then restarted.

One real Triton for the whole module (each test puts the echo model back to version 1), a
bare Git remote and a state file per test, and clients sending unversioned requests all along.
Each test runs ``triton-gitops apply`` as a subprocess with ``TRITON_GITOPS_FAULT`` naming the
point, checks that it died there (SIGKILL), then runs it again without the fault until it has
nothing left to do. After that: Triton serves what Git asks for (or, for a bad version, what
served before), a failed rollout's hold was never lost, the revert commit is in the remote
exactly once, no two rollouts of echo interleaved, and a good swap cost clients nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import tritonclient.grpc as triton_grpc

from reconciler.adapters.state import StateStore
from testkit.cli_run import CliRun, cli
from testkit.loadgen import WITNESS_PAUSE, LoadGenerator
from testkit.local_triton import LocalTriton, shared_between_tests
from testkit.manifests import ManifestRepo, deployment_doc, git, server_doc
from testkit.services import ALERTMANAGER_BINARIES, Alertmanager
from tests.integration.flows import ready_versions, served_factor
from tests.services import find_binary


@pytest.fixture(scope="module")
def triton(
    model_repository: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalTriton]:
    log = tmp_path_factory.mktemp("crash-triton") / "triton.log"
    server = LocalTriton(model_repository, log_file=log).start()
    try:
        # Started again before the next test if Triton aborts: each test loads echo itself.
        with shared_between_tests(server):
            yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def alertmanager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Alertmanager]:
    """One Alertmanager for the module: each bad version's commit is new, and its alert is
    told apart by its revision annotation (the labels, and so the alert, are the same)."""
    binary = find_binary(ALERTMANAGER_BINARIES, "prometheus-alertmanager")
    server = Alertmanager(binary, tmp_path_factory.mktemp("crash-alertmanager"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


def echo(version: int, extra: str = "") -> str:
    # Short analysis so that each kill and restart costs seconds; v4 fails 40% of requests,
    # which the success rate sees at the first evaluation.
    return (
        "apiVersion: triton-gitops/v1alpha1\n"
        "kind: ModelDeployment\n"
        "metadata:\n"
        "  name: echo\n"
        "spec:\n"
        "  servers:\n"
        "    names: [edge-a]\n"
        f"  versions: [{version}]\n"
        "  verify:\n"
        "    analysis:\n"
        "      interval: 400ms\n"
        "      duration: 1200ms\n"
        "      noTraffic: pass\n"
        "      checks:\n"
        "        - name: success-rate\n"
        "          successRate: {min: 0.95}\n"
        f"{extra}"
    )


@dataclass
class Crashable:
    """The CLI against one remote, state file and cache: killed in a process of its own,
    restarted in this one."""

    repo: str
    workdir: Path
    extra: tuple[str, ...] = ()

    @property
    def state_path(self) -> Path:
        return self.workdir / "state.db"

    def options(self) -> list[str]:
        return [
            "--repo", self.repo, "--state", str(self.state_path),
            "--cache-dir", str(self.workdir / "cache"), *self.extra,
        ]  # fmt: skip

    def run(self, command: str = "apply") -> CliRun:
        """In this process: the restart after a kill (it reads what the dead one left)."""
        return cli(command, *self.options())

    def spawn(self, fault: str | None = None) -> CliRun:
        """``apply`` as a process of its own, with the fault point armed if one is named."""
        env = {k: v for k, v in os.environ.items() if k != "TRITON_GITOPS_FAULT"}
        if fault:
            env["TRITON_GITOPS_FAULT"] = fault
        done = subprocess.run(
            [sys.executable, "-m", "reconciler", "apply", *self.options()],
            env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        return CliRun(done.returncode, done.stdout, done.stderr)

    def holds(self) -> dict[str, str]:
        """Held ModelDeployment -> the revision that failed."""
        store = StateStore(self.state_path)
        try:
            return {n: h.revision for n, h in store.history().holds.items()}
        finally:
            store.close()

    def outbox(self) -> list[str]:
        """The kinds of the alerts recorded and not yet handed to the receivers."""
        store = StateStore(self.state_path)
        try:
            return [e.kind for e in store.alert_outbox().values()]
        finally:
            store.close()

    def rollouts(self) -> list[tuple[tuple[int, ...], tuple[int, ...], str, str]]:
        store = StateStore(self.state_path)
        try:
            return [
                (r.from_versions, r.to_versions, r.outcome, r.revision)
                for r in store.rollouts("echo")
            ]
        finally:
            store.close()


def serve_only_version_1(triton: LocalTriton) -> None:
    """Put echo back to version 1 alone, straight through Triton (faster than a rollout);
    the module's first test deploys it from nothing, through the reconciler."""
    if ready_versions(triton, "echo") in ({1}, set()):
        return
    with triton_grpc.InferenceServerClient(triton.grpc_address) as client:
        config = client.get_model_config("echo", as_json=True)["config"]
        config["version_policy"] = {"specific": {"versions": [1]}}
        client.load_model("echo", config=json.dumps(config))
        deadline = time.monotonic() + 60
        while ready_versions(triton, "echo") != {1} and time.monotonic() < deadline:
            time.sleep(0.1)
    assert ready_versions(triton, "echo") == {1}


def start(
    tmp_path: Path, triton: LocalTriton, model_repository: Path, *extra: str, spec: str = ""
) -> tuple[ManifestRepo, Crashable]:
    """A fresh remote and state; echo 1 serving, and the first pass finds it in sync
    (``spec``: more of echo's spec, the same in every version)."""
    serve_only_version_1(triton)
    manifests = ManifestRepo(tmp_path / "git")
    manifests.write(
        "servers.yaml",
        server_doc("edge-a", triton.grpc_address, model_repository, metrics=triton.metrics_url),
    )
    manifests.write("echo.yaml", echo(1, spec))
    manifests.commit("echo 1")
    reconciler = Crashable(manifests.url, tmp_path / "reconciler", extra)
    first = reconciler.run()
    assert first.code == 0, first.err
    assert ready_versions(triton, "echo") == {1}
    return manifests, reconciler


def settle(reconciler: Crashable, runs: int = 3) -> None:
    """Apply again, without a fault, until a pass finds nothing to do (at most ``runs``)."""
    for _ in range(runs):
        reconciler.run()
        if reconciler.run("plan").code == 0:  # 0: in sync; 2: changes left
            return
    raise AssertionError(f"not converged after {runs} passes")


def ended_cleanly(reconciler: Crashable, version: int) -> None:
    """After the rerun: no in-flight record left, ``plan`` empty, ``status`` in sync, and the
    swap to ``version`` in history."""
    store = StateStore(reconciler.state_path)
    try:
        assert store.in_progress() == set(), "the in-flight record was left behind"
    finally:
        store.close()
    planned = reconciler.run("plan")
    assert planned.code == 0, f"plan after the rerun is not empty:\n{planned.out}"
    shown = reconciler.run("status")
    (line,) = [x for x in shown.out.splitlines() if " echo " in f" {x} "]
    assert "in-sync" in line or "in sync" in line, shown.out
    swaps = [r for r in reconciler.rollouts() if r[1] == (version,)]
    assert any(outcome == "converged" for _, _, outcome, _ in swaps), reconciler.rollouts()


def not_interleaved(reconciler: Crashable, old: int, new: int) -> None:
    """Every rollout of echo went from the old version alone to the new one alone: a pass
    after a kill never took the half-done swap (both loaded) as its starting point."""
    for from_versions, to_versions, _, _ in reconciler.rollouts():
        if (from_versions, to_versions) == ((), (old,)):
            continue  # the module's first deployment
        assert (from_versions, to_versions) == ((old,), (new,))


GOOD_POINTS = [
    "apply.load.requested",
    "apply.load.accepted",
    "apply.verify",
    "apply.analysis",
    "apply.unload",
    "loop.record",
    "state.write",
    "loop.alerts",
]


@pytest.mark.parametrize("point", GOOD_POINTS)
def test_good_swap_killed_at(
    point: str, tmp_path: Path, triton: LocalTriton, model_repository: Path
) -> None:
    manifests, reconciler = start(tmp_path, triton, model_repository)
    manifests.write("echo.yaml", echo(2))
    manifests.commit("echo 2")
    with LoadGenerator(triton.grpc_address, "echo", threads=2, pause=WITNESS_PAUSE) as load:
        load.wait_for_samples(50)
        killed = reconciler.spawn(point)
        assert killed.code == -9, (killed.code, killed.out, killed.err)  # it died at the point
        rerun = reconciler.run()
        load.wait_for_samples(len(load.samples) + 50)
    # One rerun finishes the interrupted swap, and leaves a true record.
    assert rerun.code == 0, rerun.out + rerun.err
    ended_cleanly(reconciler, 2)
    assert ready_versions(triton, "echo") == {2}
    assert served_factor(triton, "echo") == 2.0
    assert load.failures == []
    assert load.versions_seen() <= {1, 2}
    assert reconciler.holds() == {}
    not_interleaved(reconciler, 1, 2)


@dataclass(frozen=True)
class BadCase:
    point: str
    mode: str = "commit"
    held_at_kill: bool = False  # the kill comes after the failure: the hold must be there


BAD_CASES = [
    BadCase("apply.load.accepted"),
    BadCase("apply.analysis"),
    BadCase("apply.revert", held_at_kill=True),
    BadCase("apply.load.requested:2", held_at_kill=True),  # the revert's load
    BadCase("apply.verify:2", held_at_kill=True),  # the revert's verify
    BadCase("loop.record", held_at_kill=True),
    BadCase("state.write", held_at_kill=True),
    BadCase("git.push.before", held_at_kill=True),
    BadCase("git.push.after", held_at_kill=True),
    BadCase("loop.alerts", held_at_kill=True),
    BadCase("git.push.before", "branch", held_at_kill=True),
    BadCase("git.push.after", "branch", held_at_kill=True),
]


def revert_commits(manifests: ManifestRepo, ref: str, bad: str) -> list[str]:
    found = git(manifests.bare, "log", "--format=%H", f"--grep=Reverted-revision: {bad}", ref)
    return found.split()


@pytest.mark.parametrize("case", BAD_CASES, ids=lambda c: f"{c.point}-{c.mode}")
def test_bad_version_killed_at(
    case: BadCase,
    tmp_path: Path,
    triton: LocalTriton,
    model_repository: Path,
    alertmanager: Alertmanager,
) -> None:
    options = ("--revert-mode", case.mode, "--alertmanager-url", alertmanager.url)
    manifests, reconciler = start(tmp_path, triton, model_repository, *options)
    manifests.write("echo.yaml", echo(4))
    bad = manifests.commit("echo 4")
    with LoadGenerator(triton.grpc_address, "echo", threads=2, pause=WITNESS_PAUSE) as load:
        load.wait_for_samples(50)
        killed = reconciler.spawn(case.point)
        assert killed.code == -9, (killed.code, killed.out, killed.err)
        held = [reconciler.holds()]
        if case.held_at_kill:
            # Durable from the moment of the failure: its row, and its alert in the outbox
            # (or, once the alert phase ran, in Alertmanager).
            rows = [r[:3] for r in reconciler.rollouts() if r[1] == (4,)]
            assert rows == [((1,), (4,), "reverted")], reconciler.rollouts()
            told = "rollout-failed" in reconciler.outbox() or failure_alerts(alertmanager, bad)
            assert told, "the failure alert is neither in the outbox nor in Alertmanager"
        if case.point == "loop.alerts":  # recorded, not sent: the outbox keeps it
            assert "rollout-failed" in reconciler.outbox()
            assert failure_alerts(alertmanager, bad) == []
        reconciler.run()
        held.append(reconciler.holds())
        settle(reconciler)
        load.wait_for_samples(len(load.samples) + 50)
    assert ready_versions(triton, "echo") == {1}
    assert served_factor(triton, "echo") == 1.0
    if case.held_at_kill:
        assert held[0] == {"echo": bad}  # the kill did not lose the failed rollout
    assert {"echo": bad} in held  # recorded before the revert in Git released it
    if case.mode == "commit":
        assert len(revert_commits(manifests, "main", bad)) == 1
        assert "versions: [1]" in git(manifests.bare, "show", "main:echo.yaml")
        assert reconciler.holds() == {}  # released: Git says version 1 now
    else:
        branch = f"triton-gitops/revert-{bad[:12]}"
        assert git(manifests.bare, "rev-parse", "main") == bad  # the tracked branch untouched
        assert len(revert_commits(manifests, branch, bad)) == 1
        assert reconciler.holds() == {"echo": bad}  # held until Git changes echo
        store = StateStore(reconciler.state_path)
        assert store.unreverted() == set()  # the push is on record: no pass pushes it again
        store.close()
    again = reconciler.run()
    assert again.code == 0 and "write-back" not in again.out + again.err, again.out
    store = StateStore(reconciler.state_path)
    try:
        assert store.in_progress() == set(), "the in-flight record was left behind"
    finally:
        store.close()
    # The failed rollout's row, exactly one, whether the kill came before the failure (the
    # rerun fails again), after it (the row written with the hold) or after the record.
    failed = [r for r in reconciler.rollouts() if r[1] == (4,)]
    assert [(f, outcome) for f, _, outcome, _ in failed] == [((1,), "reverted")], failed
    not_interleaved(reconciler, 1, 4)
    assert load.versions_seen() <= {1, 4}
    # And its alert reached Alertmanager (at least once: the same labels are one alert there).
    assert failure_alerts(alertmanager, bad) == ["TritonGitopsRolloutFailed"]


def test_a_resolve_killed_before_its_alert_phase_is_sent_by_the_rerun(
    tmp_path: Path, triton: LocalTriton, model_repository: Path, alertmanager: Alertmanager
) -> None:
    # echo 4 fails and is held (its revert on a branch): its failure alert is active. echo 2
    # then converges, which resolves it; that pass is killed after its record, before its
    # alerts went.
    options = ("--revert-mode", "branch", "--alertmanager-url", alertmanager.url)
    manifests, reconciler = start(tmp_path, triton, model_repository, *options)
    manifests.write("echo.yaml", echo(4))
    bad = manifests.commit("echo 4")
    settle(reconciler)
    assert failure_alerts(alertmanager, bad) == ["TritonGitopsRolloutFailed"]
    manifests.write("echo.yaml", echo(2))
    manifests.commit("echo 2")
    killed = reconciler.spawn("loop.alerts")
    assert killed.code == -9, (killed.code, killed.out, killed.err)
    assert ready_versions(triton, "echo") == {2}
    assert reconciler.outbox() == ["rollout-succeeded"]  # the resolve, recorded, not sent
    assert failure_alerts(alertmanager, bad) == ["TritonGitopsRolloutFailed"]
    rerun = reconciler.run()
    assert rerun.code == 0, rerun.out + rerun.err
    assert reconciler.outbox() == []
    assert failure_alerts(alertmanager, bad) == []  # resolved at last
    ended_cleanly(reconciler, 2)


def failure_alerts(alertmanager: Alertmanager, revision: str) -> list[str]:
    """The alertnames of echo's active alerts about ``revision``."""
    return [
        a["labels"]["alertname"]
        for a in alertmanager.alerts(active="true")
        if a["labels"].get("model") == "echo" and a["annotations"].get("revision") == revision
    ]


# An in-place swap (no memory beside the old: whenNoHeadroom replace) unloads echo 1 and only
# then loads 2: the points that differ from a swap beside are those of that window.
IN_PLACE = "  resources: {memory: 64Ti}\n  rollout: {whenNoHeadroom: replace}\n"
IN_PLACE_POINTS = ["apply.unload", "apply.load.requested", "apply.load.accepted", "apply.verify"]


@pytest.mark.parametrize("point", IN_PLACE_POINTS)
def test_in_place_swap_killed_at(
    point: str, tmp_path: Path, triton: LocalTriton, model_repository: Path
) -> None:
    manifests, reconciler = start(tmp_path, triton, model_repository, spec=IN_PLACE)
    manifests.write("echo.yaml", echo(2, IN_PLACE))
    manifests.commit("echo 2, in place")
    planned = reconciler.run("plan")
    assert "unload here and wait until it is gone" in planned.out, planned.out
    killed = reconciler.spawn(point)
    assert killed.code == -9, (killed.code, killed.out, killed.err)
    rerun = reconciler.run()
    # Clients are not watched: in place, echo serves nothing on edge-a for a moment.
    assert rerun.code == 0, rerun.out + rerun.err
    ended_cleanly(reconciler, 2)
    assert ready_versions(triton, "echo") == {2}
    assert served_factor(triton, "echo") == 2.0
    assert reconciler.holds() == {}
    not_interleaved(reconciler, 1, 2)


def backend(revision: str, hook: Path) -> str:
    """echo on the Python backend at ``revision``: a change of it is swapped in place, with
    ``hook`` (which notes each revision it installs) as its library replacement."""
    return (
        f"  backend:\n    name: python\n    revision: '{revision}'\n"
        f"    replaceLibrary: {{command: ['{sys.executable}', '{hook}']}}\n"
    )


def installed_revisions(noted: Path) -> list[str]:
    return noted.read_text().splitlines() if noted.exists() else []


# A backend change unloads echo, replaces the library, then loads: the window in between.
BACKEND_POINTS = ["apply.unload", "apply.library.replaced", "apply.load.requested"]


@pytest.mark.parametrize("point", BACKEND_POINTS)
def test_backend_swap_killed_at(
    point: str, tmp_path: Path, triton: LocalTriton, model_repository: Path
) -> None:
    installed = tmp_path / "installed.txt"
    hook = tmp_path / "replace.py"
    hook.write_text(
        "import os\n"
        f"with open({str(installed)!r}, 'a') as f:\n"
        "    f.write(os.environ['TRITON_GITOPS_REVISION'] + '\\n')\n"
    )
    manifests, reconciler = start(tmp_path, triton, model_repository, spec=backend("2026.10", hook))
    manifests.write("echo.yaml", echo(1, backend("2026.11", hook)))
    change = manifests.commit("python backend 2026.11")
    planned = cli("plan", *reconciler.options(), "--output", "json")
    assert "replace-library" in [s["action"] for s in planned.json()["steps"]], planned.out
    killed = reconciler.spawn(point)
    assert killed.code == -9, (killed.code, killed.out, killed.err)
    # Where it died: before the unload (echo 1 serves on the old library), or in the window
    # where echo serves nothing, before or after the new library went in.
    if point == "apply.unload":
        assert ready_versions(triton, "echo") == {1}
    else:
        assert ready_versions(triton, "echo") == set()
    # (The first pass found echo serving and recorded 2026.10 without replacing anything.)
    assert installed_revisions(installed) == ([] if point == "apply.unload" else ["2026.11"]), (
        killed.out,
        killed.err,
    )
    rerun = reconciler.run()
    assert rerun.code == 0, rerun.out + rerun.err
    ended_cleanly(reconciler, 1)
    assert ready_versions(triton, "echo") == {1}
    # The new library is what echo serves on (installed again by the rerun when the kill
    # came before it was recorded: the command must be safe to run twice).
    assert installed_revisions(installed)[-1:] == ["2026.11"], installed_revisions(installed)
    rows = [r for r in reconciler.rollouts() if r[3] == change]
    assert [r[2] for r in rows] == ["converged"], reconciler.rollouts()
    not_interleaved(reconciler, 1, 1)


@pytest.mark.parametrize("damage", ["missing", "garbage"])
def test_lost_state_file_is_explained_and_prunes_nothing(
    damage: str, tmp_path: Path, triton: LocalTriton, model_repository: Path
) -> None:
    manifests, reconciler = start(tmp_path, triton, model_repository)
    manifests.write("other.yaml", deployment_doc("other", [1], ["edge-a"]))
    manifests.commit("other 1")
    assert reconciler.run().code == 0
    assert ready_versions(triton, "other") == {1}
    # Git stops declaring other; the state file, which says that other is ours, is lost.
    manifests.remove("other.yaml")
    manifests.commit("drop other")
    path = reconciler.state_path
    for side in path.parent.glob(path.name + "*"):
        side.unlink()
    if damage == "garbage":
        path.write_bytes(os.urandom(64 << 10))
    with LoadGenerator(triton.grpc_address, "other", threads=2, pause=WITNESS_PAUSE) as load:
        load.wait_for_samples(50)
        result = reconciler.spawn()  # its stderr, as an operator sees it
        load.wait_for_samples(len(load.samples) + 50)
    assert result.code == 0, result.err
    assert "Traceback" not in result.err
    if damage == "missing":
        assert f"state file {path} does not exist" in result.err
    else:
        (aside,) = path.parent.glob("state.db.corrupt-*")
        assert f"state file {path} is unreadable" in result.err
        assert f"moved aside to {aside}" in result.err
        assert len(aside.read_bytes()) == 64 << 10  # kept for a post-mortem
    assert "left alone (not unloaded)" in result.err
    # Not provably ours any more: other keeps serving, its clients saw nothing.
    assert ready_versions(triton, "other") == {1}
    assert load.failures == []
    assert ready_versions(triton, "echo") == {1}
    assert reconciler.run("plan").code == 0  # and later passes leave it alone too
    unload_other(triton)


def unload_other(triton: LocalTriton) -> None:
    with triton_grpc.InferenceServerClient(triton.grpc_address) as client:
        client.unload_model("other")


def test_bad_in_place_version_killed_after_the_unload_is_put_back(
    tmp_path: Path, triton: LocalTriton, model_repository: Path
) -> None:
    """The rerun finds nothing serving and loads 9 from nothing; when 9 fails, the revert
    puts back what served before the killed pass's unload (version 1), not nothing, and the
    hold keeps it there."""
    manifests, reconciler = start(tmp_path, triton, model_repository, spec=IN_PLACE)
    manifests.write("echo.yaml", echo(9, IN_PLACE))  # version 9 fails in initialize
    bad = manifests.commit("echo 9, in place")
    killed = reconciler.spawn("apply.load.requested")  # echo 1 unloaded, 9 not loaded yet
    assert killed.code == -9, (killed.code, killed.out, killed.err)
    assert ready_versions(triton, "echo") == set()
    rerun = reconciler.run()
    assert rerun.code == 1, rerun.out + rerun.err  # 9 failed to load, and was put back
    assert ready_versions(triton, "echo") == {1}
    assert reconciler.holds() == {"echo": bad}
    assert [r[:3] for r in reconciler.rollouts()] == [((1,), (9,), "reverted")]
    store = StateStore(reconciler.state_path)
    try:
        assert store.in_progress() == set()
        assert store.history().holds["echo"].previous == {"edge-a": (1,)}
    finally:
        store.close()
    assert reconciler.run().code == 0  # held: nothing to do, and 1 keeps serving
    assert ready_versions(triton, "echo") == {1}
