"""Dependencies failing during a pass: real Triton, Prometheus, Alertmanager, Git daemon.

Each test breaks one dependency at a chosen point (Triton killed by pid and restarted during a
load, a verify or an analysis; a load that outlasts the load timeout; Prometheus or
Alertmanager down; a Git remote that stalls) and checks three things: nothing that should
serve is left unloaded (Triton's repository index before and after), the error names the
server, model or remote, and the next pass converges once the dependency is back.

Kill points inside a pass come from the pass's own progress callback (called as each step
ends), so they do not depend on timing. Covered elsewhere, not repeated here: a Git remote
that is gone (tests/integration/test_daemon.py::test_git_remote_and_server_down_then_back)
and a force-pushed history (tests/integration/test_review_flow.py::
test_force_push_is_refused_until_accepted).
"""

from __future__ import annotations

import re
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import tritonclient.grpc as triton_grpc

from reconciler.adapters.state import StateStore
from reconciler.loop.reconcile import reconcile
from reconciler.model.plan import Action
from reconciler.model.reports import PassReport
from reconciler.model.results import Outcome, StepResult
from reconciler.model.settings import AnalysisSettings, Settings, TritonSettings
from reconciler.model.source import Source
from reconciler.wiring import ports
from testkit.cli_run import Reconciler
from testkit.loadgen import WITNESS_PAUSE, LoadGenerator
from testkit.local_triton import LocalTriton, end_process_group, free_port
from testkit.manifests import ManifestRepo, deployment_doc, server_doc
from testkit.service_process import wait_until
from testkit.services import Alertmanager, Prometheus
from testkit.tcp_proxy import TcpProxy
from tests.integration.flows import ready_versions
from tests.integration.test_analysis import analysed, wait_for_series
from tests.services import StartPrometheus

SUCCESS_ONLY = """\
      checks:
        - name: success-rate
          successRate: {min: 0.95}
"""


def index(server: LocalTriton) -> dict[str, dict[int, str]]:
    """Triton's repository index: model -> version -> state."""
    with triton_grpc.InferenceServerClient(server.grpc_address) as client:
        entries = client.get_model_repository_index(as_json=True).get("models", [])
    found: dict[str, dict[int, str]] = {}
    for entry in entries:
        if entry.get("version"):
            found.setdefault(entry["name"], {})[int(entry["version"])] = entry.get("state", "")
    return found


def serving(server: LocalTriton) -> dict[str, set[int]]:
    """The READY versions of each model (a version that failed to load stays listed)."""
    ready = {
        m: {v for v, state in vs.items() if state == "READY"} for m, vs in index(server).items()
    }
    return {m: vs for m, vs in ready.items() if vs}


def settings_for(
    workdir: Path, *, prometheus_url: str | None = None, load_timeout: float = 600.0
) -> Settings:
    return Settings(
        cache_dir=workdir / "cache",
        state_path=workdir / "state.db",
        analysis=AnalysisSettings(prometheus_url=prometheus_url),
        triton=TritonSettings(load_timeout=load_timeout),
    )


def run_pass(
    source: Source, settings: Settings, on_step: Callable[[StepResult], None] | None = None
) -> PassReport:
    return reconcile(
        source, settings, ports(settings, source), apply_changes=True, progress=on_step
    )


def the_change(report: PassReport, model: str = "echo") -> tuple[Outcome, str, list[str]]:
    assert report.result is not None
    (change,) = [c for c in report.result.changes if c.change.model == model]
    return change.outcome, change.error or "", [str(r.step.action) for r in change.steps]


def kill_after(
    server: LocalTriton, action: Action, *, restart: bool, model: str = "echo"
) -> Callable[[StepResult], None]:
    """A progress callback: SIGKILL the server as ``action`` on ``model`` ends well, and with
    ``restart`` start it again on the same ports (EXPLICIT mode: it comes back empty)."""
    done: list[bool] = []

    def on_step(result: StepResult) -> None:
        if result.ok and result.step.action is action and result.step.model == model and not done:
            done.append(True)
            server.kill()
            if restart:
                server.start()

    return on_step


@pytest.fixture
def two_models(
    manifests: ManifestRepo, triton: LocalTriton, model_repository: Path
) -> Callable[..., str]:
    """Write servers.yaml and other.yaml (other 1 always serves); returns a committer."""
    manifests.write(
        "servers.yaml",
        server_doc("edge-a", triton.grpc_address, model_repository, metrics=triton.metrics_url),
    )
    manifests.write("other.yaml", deployment_doc("other", [1], ["edge-a"]))

    def commit_echo(text: str, message: str) -> str:
        manifests.write("echo.yaml", text)
        return manifests.commit(message)

    return commit_echo


AnalysedRollout = tuple[Prometheus, Source, Settings]


@pytest.fixture
def analysed_rollout(
    two_models: Callable[..., str],
    manifests: ManifestRepo,
    triton: LocalTriton,
    start_prometheus: StartPrometheus,
    tmp_path: Path,
) -> AnalysedRollout:
    """echo 1 serves; echo 2 committed with a Prometheus-backed analysis, not applied yet."""
    prometheus = start_prometheus([triton.metrics_url.removeprefix("http://").split("/")[0]])
    source = Source(manifests.url)
    settings = settings_for(tmp_path / "r", prometheus_url=prometheus.url)
    two_models(deployment_doc("echo", [1], ["edge-a"]), "echo 1")
    assert run_pass(source, settings).ok
    two_models(analysed([2], checks=SUCCESS_ONLY, duration="5s"), "echo 2, analysed")
    return prometheus, source, settings


# -- Triton killed and restarted --------------------------------------------------------------


def test_triton_killed_during_a_load_names_the_server_and_the_next_pass_converges(
    two_models: Callable[..., str], manifests: ManifestRepo, triton: LocalTriton, tmp_path: Path
) -> None:
    reconciler = Reconciler(manifests.url, tmp_path / "r")
    two_models(deployment_doc("echo", [1], ["edge-a"]), "echo 1")
    assert reconciler.apply().code == 0
    assert serving(triton) == {"echo": {1}, "other": {1}}

    two_models(deployment_doc("echo", [7], ["edge-a"]), "echo 7, 3 s to load")

    def kill_while_loading() -> None:
        wait_until(lambda: index(triton).get("echo", {}).get(7) == "LOADING", 60, "7 loading")
        triton.kill()
        triton.start()

    killer = threading.Thread(target=kill_while_loading)
    killer.start()
    cut = reconciler.apply()
    killer.join()
    assert cut.code == 1
    assert "server edge-a" in cut.out + cut.err and "loading echo" in cut.out + cut.err
    assert index(triton) == {}  # the restart emptied it; nothing else was asked of it

    assert reconciler.apply().code == 0
    assert serving(triton) == {"echo": {7}, "other": {1}}


def test_triton_killed_during_verify_is_transient_and_the_next_pass_converges(
    two_models: Callable[..., str], manifests: ManifestRepo, triton: LocalTriton, tmp_path: Path
) -> None:
    source = Source(manifests.url)
    settings = settings_for(tmp_path / "r")
    two_models(deployment_doc("echo", [1], ["edge-a"]), "echo 1")
    assert run_pass(source, settings).ok
    two_models(deployment_doc("echo", [2], ["edge-a"], expect_factor=2), "echo 2")

    # Killed as the load ends: verify finds no server (restarted only after the pass, so
    # the client's channel cannot race a quick restart).
    report = run_pass(source, settings, kill_after(triton, Action.LOAD, restart=False))
    outcome, error, actions = the_change(report)
    assert (outcome, actions) == (Outcome.FAILED, ["load", "verify"])
    assert error == (
        f"server edge-a: {triton.grpc_address} did not answer (reading the repository index)"
    )
    triton.start()
    assert serving(triton) == {}

    again = run_pass(source, settings)  # not held: the rollout runs again
    assert again.ok, the_change(again)
    assert serving(triton) == {"echo": {2}, "other": {1}}


def test_triton_restarted_during_analysis_puts_back_and_is_not_held(
    analysed_rollout: AnalysedRollout, triton: LocalTriton
) -> None:
    prometheus, source, settings = analysed_rollout

    # The analysis counts only windows with requests: clients call throughout.
    with LoadGenerator(triton.grpc_address, "echo", threads=2, pause=WITNESS_PAUSE) as load:
        load.wait_for_samples(50)
        wait_for_series(prometheus.url, 'nv_inference_request_success{model="echo"}')
        # Killed and started again as verify ends: the analysis reads Prometheus, where the
        # new version's series end with the old process.
        report = run_pass(source, settings, kill_after(triton, Action.VERIFY, restart=True))
        outcome, error, actions = the_change(report)
        assert (outcome, actions) == (Outcome.REVERTED, ["load", "verify", "analyze"]), error
        # The probes meet "unknown model" (or the counters are gone): failed or inconclusive,
        # either way blamed on the restart.
        assert error.startswith("server edge-a: analysis of echo version(s) 2 "), error
        assert error.endswith(
            "; server edge-a lost every version of echo meanwhile (restarted?): not held, "
            "the next pass rolls out again"
        )
        # The old version is back; the restart had unloaded other too, the next pass's job.
        assert serving(triton) == {"echo": {1}}

        again = run_pass(source, settings)  # not held: the rollout runs again
        assert again.ok, the_change(again)
    assert serving(triton) == {"echo": {2}, "other": {1}}


# -- Triton answering slowly ------------------------------------------------------------------


@pytest.fixture
def verbose_triton(model_repository: Path, tmp_path: Path) -> Iterator[LocalTriton]:
    """A server whose log names every model-control call (to count the loads)."""
    server = LocalTriton(
        model_repository, log_file=tmp_path / "verbose.log", extra_args=("--log-verbose=1",)
    ).start()
    try:
        yield server
    finally:
        server.stop()


def load_calls(server: LocalTriton) -> int:
    assert server.log_file is not None
    text = server.log_file.read_text(errors="replace")
    return len(re.findall(r"Process for RepositoryModelLoad, rpc_ok=1, \d+ step START", text))


def echo_1_beside_a_slow_7(
    manifests: ManifestRepo,
    triton: LocalTriton,
    model_repository: Path,
    tmp_path: Path,
    init_seconds: int,
) -> tuple[str, Source, Settings]:
    """echo 1 deployed; the config that makes version 7 take ``init_seconds`` to initialise
    (the other versions ignore it); settings with a 2 s load timeout."""
    slow = f"  config:\n    parameters: {{init_seconds: {{string_value: '{init_seconds}'}}}}\n"
    manifests.write("servers.yaml", server_doc("edge-a", triton.grpc_address, model_repository))
    manifests.write("echo.yaml", deployment_doc("echo", [1], ["edge-a"]) + slow)
    manifests.commit("echo 1")
    source = Source(manifests.url)
    assert run_pass(source, settings_for(tmp_path / "r")).ok
    return slow, source, settings_for(tmp_path / "r", load_timeout=2.0)


def test_a_load_past_the_load_timeout_is_waited_for_and_not_started_again(
    manifests: ManifestRepo, verbose_triton: LocalTriton, model_repository: Path, tmp_path: Path
) -> None:
    triton = verbose_triton
    slow, source, settings = echo_1_beside_a_slow_7(
        manifests, triton, model_repository, tmp_path, 20
    )

    manifests.write("echo.yaml", deployment_doc("echo", [7], ["edge-a"]) + slow)
    manifests.commit("echo 7, 20 s to initialize")
    cut = run_pass(source, settings)
    outcome, error, _ = the_change(cut)
    assert outcome is Outcome.FAILED
    assert error == (
        "server edge-a: load of echo not finished after 2s (--load-timeout); Triton goes on "
        "loading it, the next pass waits for it"
    )
    # The old version serves on; the cut-off load goes on on the server.
    assert index(triton)["echo"] == {1: "READY", 7: "LOADING"}
    loads = load_calls(triton)

    waited = run_pass(source, settings)
    outcome, error, actions = the_change(waited)
    assert (outcome, actions) == (Outcome.CONVERGED, ["verify", "unload"]), error
    assert load_calls(triton) == loads + 1  # the unload's (policy [7]); no second load of 7
    assert index(triton)["echo"][7] == "READY" and ready_versions(triton, "echo") == {7}


def test_a_load_cut_off_that_ends_before_the_next_pass_is_still_verified(
    manifests: ManifestRepo, verbose_triton: LocalTriton, model_repository: Path, tmp_path: Path
) -> None:
    """The cut-off load finishes between two passes: the next pass finds 1 and 7 READY, and
    must still verify 7 (its smoke case) before dropping 1, not only unload 1."""
    triton = verbose_triton
    slow, source, settings = echo_1_beside_a_slow_7(
        manifests, triton, model_repository, tmp_path, 6
    )

    manifests.write("echo.yaml", deployment_doc("echo", [7], ["edge-a"], expect_factor=7) + slow)
    manifests.commit("echo 7, 6 s to initialize")
    outcome, _, _ = the_change(run_pass(source, settings))
    assert outcome is Outcome.FAILED
    deadline = time.monotonic() + 60
    while index(triton)["echo"] != {1: "READY", 7: "READY"}:
        assert time.monotonic() < deadline, index(triton)
        time.sleep(0.2)

    # Seen as a rollout stopped midway (plan._as_before): the load of what is loaded already
    # changes nothing, then 7's verify runs its smoke case, and only then 1 goes. Without
    # the journal entry kept, this pass was a bare unload of 1.
    verified = run_pass(source, settings)
    outcome, error, actions = the_change(verified)
    assert (outcome, actions) == (Outcome.CONVERGED, ["load", "verify", "unload"]), error
    assert ready_versions(triton, "echo") == {7}


# -- Prometheus and Alertmanager down ---------------------------------------------------------


def test_prometheus_down_during_analysis_is_explicit_puts_back_and_retries(
    analysed_rollout: AnalysedRollout, triton: LocalTriton
) -> None:
    prometheus, source, settings = analysed_rollout

    with LoadGenerator(triton.grpc_address, "echo", threads=2, pause=WITNESS_PAUSE) as load:
        load.wait_for_samples(50)
        prometheus.stop()
        report = run_pass(source, settings)  # returns: the analysis has a duration
        outcome, error, actions = the_change(report)
        assert (outcome, actions[-1]) == (Outcome.REVERTED, "analyze")
        assert error.startswith(
            "server edge-a: analysis of echo version(s) 2 inconclusive: metrics unavailable "
            f"(cannot query Prometheus at {prometheus.url}"
        )
        assert serving(triton) == {"echo": {1}, "other": {1}}

        prometheus.start()  # same port
        wait_for_series(prometheus.url, 'nv_inference_request_success{model="echo"}')
        again = run_pass(source, settings)  # not held: analysed again, now with figures
        assert again.ok, the_change(again)
    assert serving(triton) == {"echo": {2}, "other": {1}}


def test_alerts_wait_in_the_state_store_until_alertmanager_returns(
    two_models: Callable[..., str],
    manifests: ManifestRepo,
    triton: LocalTriton,
    alertmanager: Alertmanager,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    reconciler = Reconciler(manifests.url, tmp_path / "r")
    alerting = ("--alertmanager-url", alertmanager.url)
    two_models(deployment_doc("echo", [1], ["edge-a"]), "echo 1")
    assert reconciler.apply(*alerting).code == 0
    alertmanager.stop()

    two_models(deployment_doc("echo", [9], ["edge-a"]), "echo 9, which fails to load")
    caplog.clear()
    failed = reconciler.apply(*alerting)
    assert failed.code == 1
    assert re.search(
        rf"alert not delivered, \d+ queued for retry: POST {alertmanager.url}/api/v2/alerts",
        caplog.text,
    )
    assert serving(triton) == {"echo": {1}, "other": {1}}
    state = StateStore(tmp_path / "r" / "state.db")
    try:
        (queued,) = state.undelivered_alerts().values()
    finally:
        state.close()
    assert queued and alertmanager.url not in str(queued)
    assert all(q["fire"][0]["labels"]["model"] == "echo" for q in queued)

    # Every CLI pass is a new reconciler: the alerts survive it, still queued.
    caplog.clear()
    assert reconciler.apply(*alerting).code == 0  # held at 1: in sync
    assert f"queued for retry: POST {alertmanager.url}/api/v2/alerts" in caplog.text

    alertmanager.start()  # same port
    assert reconciler.apply(*alerting).code == 0  # the stored alerts go out
    alerts = [a for a in alertmanager.alerts() if a["labels"].get("model") == "echo"]
    assert len(alerts) == len(queued)
    assert {a["labels"]["server"] for a in alerts} == {"edge-a"}
    assert all("echo" in a["annotations"]["summary"] for a in alerts)
    state = StateStore(tmp_path / "r" / "state.db")
    try:
        assert state.undelivered_alerts() == {}
    finally:
        state.close()
    assert serving(triton) == {"echo": {1}, "other": {1}}


# -- a Git remote that stalls -----------------------------------------------------------------


@pytest.fixture
def git_daemon(manifests: ManifestRepo) -> Iterator[TcpProxy]:
    """``git daemon`` serving the manifests' bare remote, behind a proxy that can stall."""
    port = free_port()
    process = subprocess.Popen(
        ["git", "daemon", "--export-all", "--reuseaddr", "--listen=127.0.0.1",
         f"--port={port}", f"--base-path={manifests.bare.parent}", str(manifests.bare.parent)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:

        def answers() -> bool:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True

        wait_until(answers, 30, "git daemon listens")
        with TcpProxy(f"127.0.0.1:{port}") as proxy:
            yield proxy
    finally:
        end_process_group(process, 10)


def test_a_stalling_git_remote_times_out_with_its_name_and_recovers(
    manifests: ManifestRepo,
    git_daemon: TcpProxy,
    triton: LocalTriton,
    model_repository: Path,
    tmp_path: Path,
) -> None:
    url = f"git://127.0.0.1:{git_daemon.port}/{manifests.bare.name}"
    reconciler = Reconciler(url, tmp_path / "r")
    manifests.write("servers.yaml", server_doc("edge-a", triton.grpc_address, model_repository))
    manifests.write("echo.yaml", deployment_doc("echo", [1], ["edge-a"]))
    manifests.commit("echo 1")
    assert reconciler.apply("--fetch-timeout", "3").code == 0

    git_daemon.stalled.set()
    manifests.write("echo.yaml", deployment_doc("echo", [2], ["edge-a"]))
    manifests.commit("echo 2 while the remote stalls")
    stalled = reconciler.apply("--fetch-timeout", "3")
    assert stalled.code == 1
    assert (
        f"error: cannot fetch {url}: no answer within 3s, the fetch was stopped "
        "(--fetch-timeout)" in stalled.err
    )
    assert serving(triton) == {"echo": {1}}

    git_daemon.stalled.clear()
    assert reconciler.apply("--fetch-timeout", "3").code == 0
    assert serving(triton) == {"echo": {2}}
