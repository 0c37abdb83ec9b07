"""On-call verbs one-shot on the state store (issue 15, first part): suspend, resume and
retry, end to end with real Git and a real tritonserver, each recorded in history with who
asked and when."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from reconciler.adapters.state import StateStore
from testkit.cli_run import Reconciler, cli
from testkit.local_triton import LocalTriton
from testkit.manifests import ManifestRepo, deployment_doc, server_doc
from testkit.release import current as current_release
from testkit.service_process import Service, wait_until
from tests.integration.flows import ready_versions
from tests.integration.test_daemon import service_process

pytestmark = pytest.mark.triton


def _applied(
    manifests: ManifestRepo, triton: LocalTriton, repository: Path, workdir: Path, *models: str
) -> tuple[Reconciler, str]:
    """``echo`` (and ``models``) at version 1, applied: the CLI and its state store's path."""
    reconciler = Reconciler(manifests.url, workdir)
    manifests.write("servers.yaml", server_doc("edge-a", triton.grpc_address, repository))
    manifests.write("echo.yaml", deployment_doc("echo", [1], ["edge-a"], expect_factor=1))
    for model in models:
        manifests.write(f"{model}.yaml", deployment_doc(model, [1], ["edge-a"]))
    manifests.commit("version 1")
    assert reconciler.apply().code == 0
    return reconciler, str(workdir / "state.db")


def test_suspend_leaves_a_model_as_it_is_until_resume(
    manifests: ManifestRepo, triton: LocalTriton, model_repository: Path, tmp_path: Path
) -> None:
    reconciler, state = _applied(manifests, triton, model_repository, tmp_path / "r", "other")

    suspended = cli("suspend", "echo", "--reason", "incident 42", "--as", "alice", "--state", state)
    assert suspended.code == 0, suspended.err
    assert suspended.out.startswith("suspended: echo suspended by alice at ")
    manifests.write("echo.yaml", deployment_doc("echo", [2], ["edge-a"], expect_factor=2))
    manifests.write("other.yaml", deployment_doc("other", [2], ["edge-a"]))
    manifests.commit("echo 2, other 2")
    applied = reconciler.apply()
    assert applied.code == 0, applied.out + applied.err
    assert ready_versions(triton, "echo") == {1}  # suspended: left as it is
    assert ready_versions(triton, "other") == {2}  # the others go on
    status = cli("status", *reconciler.options)
    (line,) = [x for x in status.out.splitlines() if "echo" in x and "suspended" in x]
    assert "suspended by alice at" in line and "incident 42" in line

    # Everything suspended: not even a model the manifests drop is unloaded.
    assert cli("suspend", "--as", "bob", "--state", state).code == 0
    manifests.remove("other.yaml")
    manifests.commit("retire other")
    assert reconciler.apply().code == 0
    assert ready_versions(triton, "other") == {2}

    resumed = cli("resume", "--as", "bob", "--state", state)
    assert resumed.code == 0 and "still suspended: echo suspended by alice" in resumed.out
    assert cli("resume", "echo", "--as", "carol", "--state", state).code == 0
    again = cli("resume", "echo", "--state", state)
    assert again.code == 1 and "ModelDeployment echo is not suspended" in again.err
    assert reconciler.apply().code == 0
    assert ready_versions(triton, "echo") == {2}
    assert ready_versions(triton, "other") == set()

    history = cli("history", "--state", state, "--output", "json").json()
    verbs = [(a["verb"], a["target"], a["by"]) for a in history["operator_actions"]]
    assert verbs == [
        ("resume", "echo", "carol"),
        ("resume", "*", "bob"),
        ("suspend", "*", "bob"),
        ("suspend", "echo", "alice"),
    ]
    assert all(a["at"].endswith("Z") for a in history["operator_actions"])


def test_retry_lifts_a_hold_and_the_same_spec_is_tried_again(
    manifests: ManifestRepo, triton: LocalTriton, model_repository: Path, tmp_path: Path
) -> None:
    reconciler, state = _applied(manifests, triton, model_repository, tmp_path / "r")
    # Version 3 answers x3: its smoke case (x2) fails, the spec is held at version 1.
    manifests.write("echo.yaml", deployment_doc("echo", [3], ["edge-a"], expect_factor=2))
    manifests.commit("echo 3")
    assert reconciler.apply().code == 1
    assert "held" in reconciler.plan().out
    assert reconciler.apply().code == 0  # held: nothing tried
    tried = len(cli("history", "--state", state, "--output", "json").json()["rollouts"])

    retried = cli("retry", "echo", "--as", "alice", "--state", state)
    assert retried.code == 0, retried.err
    assert "the hold on ModelDeployment echo" in retried.out and "is lifted" in retried.out
    assert reconciler.apply().code == 1  # tried again, failed again, held again
    history = cli("history", "--state", state, "--output", "json").json()
    assert len(history["rollouts"]) == tried + 1
    assert history["operator_actions"][0]["verb"] == "retry"
    assert ready_versions(triton, "echo") == {1}
    missing = cli("retry", "nothing", "--state", state)
    assert missing.code == 1 and "ModelDeployment nothing is not held (held: echo)" in missing.err


def test_a_verb_never_creates_a_state_store(tmp_path: Path) -> None:
    absent = tmp_path / "state.db"
    for verb in (("suspend",), ("resume", "echo"), ("retry", "echo")):
        run = cli(*verb, "--state", str(absent))
        assert run.code == 1 and f"no state store at {absent}" in run.err
    assert not absent.exists()


def test_a_running_service_honours_a_suspend_and_reports_each_models_state(
    manifests: ManifestRepo, triton: LocalTriton, model_repository: Path, tmp_path: Path
) -> None:
    """The one-shot verbs on the state store a running service shares: its next pass (a
    webhook here) leaves the suspended model alone; /metrics says so, per model."""
    manifests.write("servers.yaml", server_doc("edge-a", triton.grpc_address, model_repository))
    manifests.write("echo.yaml", deployment_doc("echo", [1], ["edge-a"]))
    manifests.write("other.yaml", deployment_doc("other", [1], ["edge-a"]))
    manifests.commit("echo 1, other 1")
    tokens = tmp_path / "operator-tokens"
    tokens.write_text("# the on-call rota\noncall-alice: " + "a" * 32 + "\n")
    token_file = tmp_path / "alice-token"
    token_file.write_text("a" * 32 + "\n")
    service = service_process(
        manifests.url, tmp_path / "svc", ("--operator-tokens-file", str(tokens))
    ).start()
    state = str(tmp_path / "svc" / "state.db")
    try:
        wait_until(lambda: ready_versions(triton, "echo") == {1}, 30, "echo deployed")
        # The first pass ended too (other deployed, its record made): else the pass counted
        # below could be that one, which began before the suspend (a CI run saw it).
        service.wait_passes(0, 60, "the first pass")
        assert cli("suspend", "echo", "--as", "oncall", "--state", state).code == 0
        manifests.write("echo.yaml", deployment_doc("echo", [2], ["edge-a"]))
        manifests.write("other.yaml", deployment_doc("other", [2], ["edge-a"]))
        manifests.commit("echo 2, other 2")
        done = service.pass_count()
        assert service.reconcile_now() == 202
        service.wait_passes(done, 60, "a pass after the suspend")
        wait_until(lambda: ready_versions(triton, "other") == {2}, 30, "other on 2")
        assert ready_versions(triton, "echo") == {1}
        metrics = service.metrics()
        state_of = (
            'triton_gitops_model_state{{deployment="{0}",model="{0}",server="edge-a",state="{1}"}}'
        )
        assert metrics[state_of.format("echo", "suspended")] == 1
        assert metrics[state_of.format("echo", "in-sync")] == 0
        assert metrics[state_of.format("other", "in-sync")] == 1

        # The suspension is in the state store: a restarted service keeps it.
        assert service.stop() == 0
        service.start()
        service.wait_passes(0, 60, "the restarted service's first pass")
        assert ready_versions(triton, "echo") == {1}
        assert service.metrics()[state_of.format("echo", "suspended")] == 1

        # The verbs through the service: every one refused without the token or with a wrong
        # one (nothing recorded), and with it, recorded under the token's name; a resume
        # runs a pass at once.
        routes = [f"/v1/{verb}" for verb in ("suspend", "resume", "reconcile")] + [
            f"/v1/deployments/echo/{verb}"
            for verb in ("suspend", "resume", "retry", "abort", "promote", "promote-full", "undo")
        ]
        for headers in ({}, {"Authorization": "Bearer " + "x" * 32}):
            for path in routes:
                assert service.post(path, b"{}", headers) == 401, path
        for path in ("/status", "/v1/passes/last"):
            assert service.get(path)[0] == 401, path
        assert "suspended" in cli("status", "--repo", manifests.url, "--state", state).out
        done = service.pass_count()
        url = f"http://127.0.0.1:{service.port}"
        resumed = cli("resume", "echo", "--service", url, "--token-file", str(token_file))
        assert resumed.code == 0, resumed.err
        assert resumed.out.startswith("resume: echo by token:oncall-alice: echo suspended by")
        service.wait_passes(done, 60, "the pass the resume asked for")
        wait_until(lambda: ready_versions(triton, "echo") == {2}, 30, "echo on 2")
        assert service.metrics()[state_of.format("echo", "in-sync")] == 1
        again = cli("resume", "echo", "--service", url, "--token-file", str(token_file))
        assert again.code == 1 and "the service answered 409: echo is not suspended" in again.err

        # reconcile: a pass now, and its outcome once one that started after the ask ends.
        manifests.write("other.yaml", deployment_doc("other", [3], ["edge-a"]))
        manifests.commit("other 3")
        assert service.get("/v1/passes/last")[0] == 401  # the outcome needs the token too
        now = cli("reconcile", "--service", url, "--token-file", str(token_file))
        assert now.code == 0, now.err
        assert now.out.startswith("pass ") and ": ok (" in now.out
        assert ready_versions(triton, "other") == {3}  # that pass read the new commit
        build = [k for k in service.metrics() if k.startswith("triton_gitops_build_info")]
        assert build and f'version="{current_release().version}"' in build[0]
    finally:
        assert service.stop() == 0
    history = cli("history", "--state", state, "--output", "json").json()["operator_actions"]
    assert [(a["verb"], a["by"]) for a in history] == [
        ("reconcile", "token:oncall-alice"),
        ("resume", "token:oncall-alice"),
        ("suspend", "oncall"),
    ]


def test_reconcile_through_the_service_fails_while_a_deployment_is_held(
    manifests: ManifestRepo, triton: LocalTriton, model_repository: Path, tmp_path: Path
) -> None:
    """``reconcile --service`` exits 1 while a ModelDeployment is held (Stalled), naming it,
    its server and the failed revision, as ``flux reconcile`` fails on a stalled object: after
    the pass that held it and after a later pass with nothing to do. The metric says held
    from the pass that held it (the shipped ModelHeld alert reads it)."""
    manifests.write("servers.yaml", server_doc("edge-a", triton.grpc_address, model_repository))
    manifests.write("echo.yaml", deployment_doc("echo", [1], ["edge-a"]))
    manifests.commit("echo 1")
    tokens = tmp_path / "operator-tokens"
    tokens.write_text("oncall-alice: " + "a" * 32 + "\n")
    token_file = tmp_path / "alice-token"
    token_file.write_text("a" * 32 + "\n")
    service = service_process(
        manifests.url, tmp_path / "svc", ("--operator-tokens-file", str(tokens))
    ).start()
    url = f"http://127.0.0.1:{service.port}"
    state_of = (
        'triton_gitops_model_state{{deployment="echo",model="echo",server="edge-a",state="{}"}}'
    )
    try:
        wait_until(lambda: ready_versions(triton, "echo") == {1}, 30, "echo deployed")
        service.wait_passes(0, 60, "the first pass")
        manifests.write("echo.yaml", deployment_doc("echo", [9], ["edge-a"]))
        bad = manifests.commit("echo 9 fails to load")
        held = f"held: echo on edge-a: revision {bad[:12]} failed: "

        failed = cli("reconcile", "--service", url, "--token-file", str(token_file))
        assert failed.code == 1, failed.out + failed.err
        assert held in failed.out and "triton-gitops retry echo" in failed.out
        assert ready_versions(triton, "echo") == {1}
        metrics = service.metrics()
        assert metrics[state_of.format("held")] == 1 and metrics[state_of.format("failed")] == 0

        # Nothing to do while held: the pass is ok, the deployment still stalled.
        again = cli("reconcile", "--service", url, "--token-file", str(token_file))
        assert again.code == 1, again.out + again.err
        assert ": ok (" in again.out and held in again.out

        manifests.write("echo.yaml", deployment_doc("echo", [2], ["edge-a"]))
        manifests.commit("echo 2")  # a new spec: the hold is over
        fixed = cli("reconcile", "--service", url, "--token-file", str(token_file))
        assert fixed.code == 0, fixed.out + fixed.err
        assert "held" not in fixed.out and ready_versions(triton, "echo") == {2}
    finally:
        assert service.stop() == 0


WATCHED_A_MINUTE = (
    "  verify:\n    analysis:\n      interval: 1s\n      duration: 60s\n"
    "      noTraffic: pass\n      checks: [{name: success-rate, successRate: {min: 0.5}}]\n"
)


def _analysing(service: Service, token: str, version: int) -> dict[str, Any]:
    """GET /status once ``version`` of echo is being analysed on edge-a and has been
    evaluated at least once: that server's entry."""
    found: dict[str, Any] = {}

    def evaluated() -> bool:
        request = urllib.request.Request(
            service.url + "/status", headers={"Authorization": f"Bearer {token}"}
        )
        with urllib.request.urlopen(request, timeout=5) as answer:
            live = json.load(answer)["in_progress"]
        for rollout in live["rollouts"]:
            entry = rollout["servers"].get("edge-a", {})
            analysing = entry.get("state") == "analyzing" and entry.get("versions") == [version]
            if analysing and entry.get("evaluation"):
                found.update(entry)
                return True
        return False

    wait_until(evaluated, 60, f"echo {version} analysed once")
    return found


def test_abort_and_promote_through_the_service_act_within_a_second_and_status_watch_shows_it(
    manifests: ManifestRepo, triton: LocalTriton, model_repository: Path, tmp_path: Path
) -> None:
    """A rollout analysed for a minute, aborted after its first evaluation: the old version
    serves again at once, the spec is held and an alert is open; the next one, promoted, is
    through at once. ``status --watch`` follows it from the service's GET /status."""
    manifests.write(
        "servers.yaml",
        server_doc("edge-a", triton.grpc_address, model_repository, metrics=triton.metrics_url),
    )
    manifests.write("echo.yaml", deployment_doc("echo", [1], ["edge-a"]))
    manifests.commit("echo 1")
    token = "t" * 32
    tokens = tmp_path / "operator-tokens"
    tokens.write_text(f"oncall-alice: {token}\n")
    token_file = tmp_path / "alice-token"
    token_file.write_text(token + "\n")
    service = service_process(
        manifests.url, tmp_path / "svc", ("--operator-tokens-file", str(tokens))
    ).start()
    state = tmp_path / "svc" / "state.db"
    url = f"http://127.0.0.1:{service.port}"
    verb = ("--service", url, "--token-file", str(token_file))
    watcher = None
    try:
        wait_until(lambda: ready_versions(triton, "echo") == {1}, 30, "echo deployed")
        # The pass that loaded it has recorded it: until then its rollout is in progress, and
        # an abort would be taken (clean-clone run 21).
        service.wait_passes(0, 30, "the first pass finished")
        early = cli("abort", "echo", *verb)
        assert early.code == 1 and "409: no rollout of echo is in progress" in early.err

        manifests.write("echo.yaml", deployment_doc("echo", [2], ["edge-a"]) + WATCHED_A_MINUTE)
        manifests.commit("echo 2, watched for a minute")
        done = service.pass_count()
        assert service.reconcile_now() == 202
        watched = tmp_path / "status-watch.out"
        with watched.open("w") as out:
            watcher = subprocess.Popen(
                [sys.executable, "-m", "reconciler", "status", "--watch", *verb, "--every", "0.2"],
                stdout=out,
            )
        entry = _analysing(service, token, 2)
        assert 0 < entry["seconds_left"] < 60
        assert entry["evaluation"]["checks"][0]["check"] == "success-rate"
        wait_until(
            lambda: "success-rate=" in watched.read_text(), 10, "status --watch shows it too"
        )
        # Refused without the token, and nothing recorded.
        assert service.post("/v1/deployments/echo/abort", b"{}", {}) == 401
        aborted = cli("abort", "echo", *verb, "--reason", "pager: error budget")
        asked = time.monotonic()
        assert aborted.code == 0, aborted.err
        assert aborted.out.startswith("abort: echo by token:oncall-alice: abort by token:")
        assert "obeys within 0.25 s" in aborted.out
        wait_until(lambda: ready_versions(triton, "echo") == {1}, 30, "echo 1 alone again")
        back = time.monotonic() - asked
        assert back < 10, f"the old version served alone {back:.1f}s after the abort"
        service.wait_passes(done, 60, "the aborted pass")
        wait_until(
            lambda: watched.read_text().rstrip().endswith("no rollout in progress"),
            10,
            "status --watch sees the rollout end",
        )
        watcher.terminate()  # SIGTERM: as a script would (SIGINT is ignored in background)
        assert watcher.wait(30) == 0
        shown = watched.read_text()
        assert "echo (model echo)" in shown and "edge-a: analyzing [2] for " in shown
        assert "s left" in shown and "success-rate=" in shown

        store = StateStore(state)
        try:
            hold = store.history().holds["echo"]
            assert "aborted by token:oncall-alice" in hold.reason and "error budget" in hold.reason
            assert any(model == "echo" for model, _, _ in store.open_alerts())
        finally:
            store.close()
        assert cli("abort", "echo", *verb).code == 1  # over: nothing in progress

        manifests.write("echo.yaml", deployment_doc("echo", [3], ["edge-a"]) + WATCHED_A_MINUTE)
        manifests.commit("echo 3, watched for a minute")
        done = service.pass_count()
        assert service.reconcile_now() == 202
        _analysing(service, token, 3)
        promoted = cli("promote", "echo", *verb)
        asked = time.monotonic()
        assert promoted.code == 0, promoted.err
        wait_until(lambda: ready_versions(triton, "echo") == {3}, 30, "echo 3 promoted")
        assert time.monotonic() - asked < 10
        service.wait_passes(done, 60, "the promoted pass")
    finally:
        if watcher is not None and watcher.poll() is None:
            watcher.kill()
            watcher.wait()
        assert service.stop() == 0
    history = cli("history", "--state", str(state), "--output", "json").json()
    verdicts = [(r["to_versions"], r["outcome"], r["verdict"]) for r in history["rollouts"][:2]]
    assert verdicts == [([3], "converged", "promoted"), ([2], "reverted", "aborted")]
    actions = [(a["verb"], a["by"]) for a in history["operator_actions"][:2]]
    assert actions == [("promote", "token:oncall-alice"), ("abort", "token:oncall-alice")]


def test_an_abort_given_while_no_reconciler_runs_is_obeyed_by_the_pass_that_resumes_it(
    manifests: ManifestRepo, triton: LocalTriton, model_repository: Path, tmp_path: Path
) -> None:
    """``apply`` killed (SIGKILL) while it analyses echo 2; the on-call person aborts while
    nothing runs; the next ``apply`` resumes that rollout and obeys the abort at once."""
    reconciler = Reconciler(manifests.url, tmp_path / "r")
    state = str(tmp_path / "r" / "state.db")
    manifests.write(
        "servers.yaml",
        server_doc("edge-a", triton.grpc_address, model_repository, metrics=triton.metrics_url),
    )
    manifests.write("echo.yaml", deployment_doc("echo", [1], ["edge-a"]))
    manifests.commit("echo 1")
    assert reconciler.apply().code == 0
    manifests.write("echo.yaml", deployment_doc("echo", [2], ["edge-a"]) + WATCHED_A_MINUTE)
    manifests.commit("echo 2, watched for a minute")
    command = [sys.executable, "-m", "reconciler", "apply", *reconciler.options]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # Loaded beside 1: the analysis runs (or is about to).
        wait_until(lambda: ready_versions(triton, "echo") == {1, 2}, 30, "echo 2 beside 1")
    finally:
        process.kill()
        process.wait()

    # The live view it left says that nothing runs (nobody holds the reconciler lock).
    shown = tmp_path / "status-watch.out"
    with shown.open("w") as out:
        watcher = subprocess.Popen(
            [sys.executable, "-m", "reconciler", "status", "--watch", "--state", state],
            stdout=out,
        )
    try:
        wait_until(lambda: "not running: " in shown.read_text(), 20, "the view says so")
    finally:
        watcher.terminate()
        watcher.wait(30)
    assert "echo (model echo)" in shown.read_text()
    assert "  edge-a: last seen " in shown.read_text()

    aborted = cli("abort", "echo", "--as", "alice", "--reason", "bad canary", "--state", state)
    assert aborted.code == 0, aborted.err
    started = time.monotonic()
    resumed = reconciler.apply()
    took = time.monotonic() - started
    assert resumed.code == 1, resumed.out + resumed.err
    assert ready_versions(triton, "echo") == {1}
    assert took < 30, f"the resumed pass took {took:.1f}s: it ran the minute's analysis"
    store = StateStore(Path(state))
    try:
        hold = store.history().holds["echo"]
        assert "aborted by alice" in hold.reason and "bad canary" in hold.reason
    finally:
        store.close()
    (rollout, *_) = cli("history", "--state", state, "--output", "json").json()["rollouts"]
    assert (rollout["to_versions"], rollout["outcome"], rollout["verdict"]) == (
        [2],
        "reverted",
        "aborted",
    )
    # Over: the hold stands, and a later abort finds nothing in progress.
    assert cli("abort", "echo", "--state", state).code == 1
