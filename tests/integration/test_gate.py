"""The pre-merge gate end to end: a manifest change in real Git, ``triton-gitops gate`` as CI
runs it, real tritonservers it starts itself (one per deployment), the real load generators.

One change gives five deployments of the gate's test model (testkit/models/scorer) a new
version each: a good one, one three times slower, one that fails every request, one that
holds a large buffer, and one whose config renames the output. One gate run judges them all.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest
from ruamel.yaml import YAML

from testkit.cli_run import CliRun, cli
from testkit.local_triton import LocalTriton
from testkit.manifests import ManifestRepo, git, write_scorer_repository
from testkit.release import current as current_release
from tests.services import perf_analyzer_or_skip

pytestmark = pytest.mark.triton
# The gate measures latency and throughput: on a machine busy with other test files its
# rounds disagree and identical code comes out inconclusive (seen in a run in three
# processes). ./dev test runs the tests of a gate run that measures alone, after the rest;
# those whose gate refuses, errs or is ended before it measures run beside the others.
MEASURES = pytest.mark.alone

SCENARIOS = {  # model -> its version at head (the base serves 1 everywhere)
    "good": 2,
    "slow": 3,
    "failing": 4,
    "heavy": 5,
    "renamed": 6,
}
RENAMED_CONFIG = "  config:\n    output: [{name: SCORE, data_type: TYPE_FP32, dims: [-1, 4]}]\n"
# Short measurements keep the suite's time down; the benchmark runs the defaults.
GATE = (
    "    gate: {maxLatencyIncrease: 0.3, minThroughputRatio: 0.8, maxMemoryIncrease: 30%,\n"
    "           concurrency: [1, 4], rounds: 3, requests: 60}\n"
)
SERVER = """\
apiVersion: triton-gitops/v1alpha1
kind: TritonServer
metadata: {name: prod}
spec: {grpc: "10.0.0.1:8001", modelRepository: /models}
"""


def _deployment(model: str, version: int, config: str = "", gate: str = GATE) -> str:
    return (
        "apiVersion: triton-gitops/v1alpha1\n"
        "kind: ModelDeployment\n"
        f"metadata: {{name: {model}}}\n"
        "spec:\n"
        "  servers: {names: [prod]}\n"
        f"  versions: [{version}]\n" + config + "  verify:\n"
        "    smoke:\n"
        "      - name: doubles\n"
        "        inputs:\n"
        "          INPUT0: {datatype: FP32, shape: [1, 4], data: [1, 2, 3, 4]}\n"
        "        expect:\n"
        "          OUTPUT0: {data: [2, 4, 6, 8], tolerance: 0.0001}\n" + gate
    )


@pytest.fixture(scope="module")
def change(tmp_path_factory: pytest.TempPathFactory) -> tuple[ManifestRepo, Path]:
    """main: every scenario's model at version 1; branch 'change': each at its new version."""
    root = tmp_path_factory.mktemp("gate")
    repository = write_scorer_repository(root / "models", tuple(SCENARIOS))
    manifests = ManifestRepo(root / "git")
    manifests.write("manifests/servers.yaml", SERVER)
    for model in SCENARIOS:
        manifests.write(f"manifests/{model}.yaml", _deployment(model, 1))
    manifests.commit("base")
    git(manifests.work, "checkout", "--quiet", "-b", "change")
    for model, version in SCENARIOS.items():
        config = RENAMED_CONFIG if model == "renamed" else ""
        manifests.write(f"manifests/{model}.yaml", _deployment(model, version, config))
    git(manifests.work, "commit", "--quiet", "--all", "-m", "a new version of every model")
    return manifests, repository


def _gate(manifests: ManifestRepo, repository: Path, tmp: Path, *extra: str) -> CliRun:
    return cli(
        "gate", "--repo", str(manifests.work), "--path", "manifests",
        "--base", "main", "--head", "change", "--model-repository", str(repository),
        "--cache-dir", str(tmp / "cache"), *extra,
    )  # fmt: skip


def _checks(model: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for check in model["checks"]:
        found.setdefault(check["name"], []).append(check)
    return found


@pytest.fixture(scope="module")
def built_in(
    change: tuple[ManifestRepo, Path], tmp_path_factory: pytest.TempPathFactory
) -> tuple[CliRun, Path, Path]:
    manifests, repository = change
    reports = tmp_path_factory.mktemp("reports")
    # One run for every report: annotations on stdout, the JSON and Markdown beside them.
    run = _gate(
        manifests, repository, reports, "--load-generator", "built-in", "--output", "github",
        "--report-dir", str(reports),
    )  # fmt: skip
    return run, reports, manifests.work


def _report(reports: Path) -> dict[str, Any]:
    """The JSON report the run wrote (gate.json)."""
    return json.loads((reports / "gate.json").read_text())


def _model(report: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [m for m in report["models"] if m["model"] == name]
    return found


@MEASURES
def test_the_gate_fails_the_change_and_names_every_bad_version(
    built_in: tuple[CliRun, Path, Path],
) -> None:
    run, reports, _ = built_in
    assert run.code == 3, run.err  # failed the gate (not an error: every model was judged)
    verdicts = {m["model"]: m["verdict"] for m in _report(reports)["models"]}
    assert verdicts == {
        "good": "pass",
        "slow": "fail",
        "failing": "fail",
        "heavy": "fail",
        "renamed": "fail",
    }


@MEASURES
def test_a_good_version_passes_with_figures_close_to_the_old_ones(
    built_in: tuple[CliRun, Path, Path],
) -> None:
    _run, reports, _ = built_in
    good = _model(_report(reports), "good")
    assert (good["old_version"], good["new_version"]) == (1, 2)
    checks = _checks(good)
    assert {c["verdict"] for cs in checks.values() for c in cs} == {"pass"}
    for check in checks["latency"]:
        assert abs(check["value"]) < 0.3, check  # p95 within the bound of the old's
    for check in checks["throughput"]:
        assert 0.8 <= check["value"] <= 1.25, check
    # Every round of both versions measured, interleaved: 3 rounds x 2 levels each.
    assert len(good["old_figures"]) == len(good["new_figures"]) == 6
    assert all(f["errors"] == 0 and f["requests"] == 60 for f in good["new_figures"])
    (memory,) = checks["memory"]
    assert memory["old"] > 10 << 20 and abs(memory["value"]) < 0.1  # a stub's RSS, alike


@MEASURES
def test_a_three_times_slower_version_fails_on_latency_and_throughput(
    built_in: tuple[CliRun, Path, Path],
) -> None:
    _run, reports, _ = built_in
    checks = _checks(_model(_report(reports), "slow"))
    for check in checks["latency"] + checks["throughput"]:
        assert check["verdict"] == "fail", check
        low, high = check["spread"]
        # Every round on the same side of the bound: the verdict does not ride on noise.
        if check["name"] == "latency":
            assert low > 0.3, check
        else:
            assert high < 0.8, check
    assert all(c["verdict"] == "pass" for c in checks["errors"] + checks["memory"])


@MEASURES
def test_a_version_that_fails_every_request_fails_in_verify(
    built_in: tuple[CliRun, Path, Path],
) -> None:
    _run, reports, _ = built_in
    failing = _model(_report(reports), "failing")
    (finding,) = failing["findings"]
    assert finding["name"] == "verify" and finding["verdict"] == "fail"
    assert "version 4 fails every request" in finding["message"]
    assert failing["checks"] == []  # not load-tested: apply would never get that far


@MEASURES
def test_a_version_that_holds_a_large_buffer_fails_on_memory(
    built_in: tuple[CliRun, Path, Path],
) -> None:
    _run, reports, _ = built_in
    checks = _checks(_model(_report(reports), "heavy"))
    (memory,) = checks["memory"]
    assert memory["verdict"] == "fail"
    assert memory["new"] - memory["old"] > 200 << 20, memory  # the 256 MiB buffer
    assert all(c["verdict"] == "pass" for c in checks["latency"] + checks["errors"])


@MEASURES
def test_a_renamed_output_is_refused_before_the_load_and_annotated_on_its_line(
    built_in: tuple[CliRun, Path, Path],
) -> None:
    run, reports, work = built_in
    renamed = _model(_report(reports), "renamed")
    (finding,) = renamed["findings"]
    assert finding["name"] == "interface"
    assert "output OUTPUT0 removed; output SCORE added" in finding["message"]
    lines = (work / "manifests" / "renamed.yaml").read_text().splitlines()
    assert lines[finding["line"] - 1].strip().startswith("output:")
    # The run's annotations: each on the manifest line that failed, named from the
    # repository's root as GitHub wants it.
    found = run.out.splitlines()
    assert any(
        line.startswith(
            f"::error file=manifests/renamed.yaml,line={finding['line']}::gate: renamed"
        )
        for line in found
    ), found
    heavy = (work / "manifests" / "heavy.yaml").read_text().splitlines()
    memory_line = next(i for i, text in enumerate(heavy, 1) if "maxMemoryIncrease" in text)
    assert any(
        line.startswith(
            f"::error file=manifests/heavy.yaml,line={memory_line}::gate: heavy version 5: memory"
        )
        for line in found
    ), found
    assert not any("manifests/good.yaml" in line for line in found)  # it passed


@MEASURES
def test_the_reports_a_reviewer_reads(built_in: tuple[CliRun, Path, Path]) -> None:
    _run, reports, _ = built_in
    markdown = (reports / "gate.md").read_text()
    assert markdown.startswith("<!-- triton-gitops gate -->")
    assert "#### ❌ slow: version 3 against 1" in markdown
    assert "| latency | 1 |" in markdown and "p95 increase &lt;= 0.3" in markdown
    assert _report(reports)["format_version"] == "1"
    chart = reports / "slow-v3-latency.svg"
    root = ElementTree.parse(chart).getroot()
    assert root.tag.endswith("svg")
    assert "slow-v3-latency.svg" in markdown
    # No chart for a version that was never load-tested.
    assert not (reports / "failing-v4-latency.svg").exists()


def test_a_version_missing_from_the_model_repository_is_a_clear_error(
    change: tuple[ManifestRepo, Path], tmp_path: Path
) -> None:
    manifests, repository = change
    git(manifests.work, "checkout", "--quiet", "-b", "missing", "main")
    manifests.write("manifests/good.yaml", _deployment("good", 8))
    git(manifests.work, "commit", "--quiet", "--all", "-m", "a version nobody built")
    try:
        run = cli(
            "gate", "--repo", str(manifests.work), "--path", "manifests", "--base", "main",
            "--head", "missing", "--model-repository", str(repository),
            "--cache-dir", str(tmp_path / "cache"),
        )  # fmt: skip
    finally:
        git(manifests.work, "checkout", "--quiet", "change")
    assert run.code == 1, (run.out, run.err)
    assert (
        "good.yaml:1: ModelDeployment 'good': version(s) 8 not in the model repository "
        f"{repository.resolve()} (it holds 1, 2, 3, 4, 5, 6)"
    ) in run.err, run.err


def test_a_config_pbtxt_changing_an_output_datatype_fails_as_apply_refuses_it(
    tmp_path: Path,
) -> None:
    """The model repository in the manifests' repository, as in a CI checkout of the head: the
    head's config.pbtxt makes OUTPUT0 FP64. The gate serves the old version with the base
    ref's config.pbtxt (as production serves it), so the planner refuses the change with the
    words apply uses against a server that serves the base."""
    manifests = ManifestRepo(tmp_path / "git")
    models = write_scorer_repository(manifests.work / "models", ("typed",))
    with LocalTriton(models, log_file=tmp_path / "triton.log") as production:
        server = SERVER.replace("10.0.0.1:8001", production.grpc_address).replace(
            "/models", str(models)
        )
        manifests.write("manifests/servers.yaml", server)
        manifests.write("manifests/typed.yaml", _deployment("typed", 1))
        manifests.commit("base: typed 1")
        state = ["--state", str(tmp_path / "state.db"), "--cache-dir", str(tmp_path / "cache")]
        applied = cli("apply", "--repo", manifests.url, "--path", "manifests", *state)
        assert applied.code == 0, applied.err
        git(manifests.work, "checkout", "--quiet", "-b", "change")
        config = models / "typed" / "config.pbtxt"
        config.write_text(
            config.read_text().replace(
                'output [ { name: "OUTPUT0" data_type: TYPE_FP32',
                'output [ { name: "OUTPUT0" data_type: TYPE_FP64',
            )
        )
        manifests.write("manifests/typed.yaml", _deployment("typed", 2))
        git(manifests.work, "commit", "--quiet", "--all", "-m", "typed 2 answers FP64")
        run = cli(
            "gate", "--repo", str(manifests.work), "--path", "manifests", "--base", "main",
            "--head", "change", "--model-repository", str(models), "--output", "json",
            "--cache-dir", str(tmp_path / "cache"),
        )  # fmt: skip
        assert run.code == 3, (run.out, run.err)
        (finding,) = _model(run.json(), "typed")["findings"]
        assert finding["name"] == "interface" and finding["verdict"] == "fail"
        assert (
            "version 2 changes the model's interface, as config.pbtxt in the model repository "
            "declares it: output OUTPUT0 datatype FP32 -> FP64; refused before anything is loaded"
        ) in finding["message"]
        # apply, on the server that serves the base, refuses it in the same words.
        git(manifests.work, "push", "--quiet", "origin", "change:main")
        planned = cli("plan", "--repo", manifests.url, "--path", "manifests", *state)
        assert finding["message"] in planned.out + planned.err, (planned.out, planned.err)


@MEASURES
def test_perf_analyzer_gives_the_same_verdicts(
    change: tuple[ManifestRepo, Path], tmp_path: Path
) -> None:
    binary = perf_analyzer_or_skip()
    manifests, repository = change
    # One round at one level: perf_analyzer measures three windows of about 1 s per call.
    quick = GATE.replace("concurrency: [1, 4], rounds: 3", "concurrency: [2], rounds: 1")
    git(manifests.work, "checkout", "--quiet", "-b", "perf", "main")
    manifests.write("manifests/good.yaml", _deployment("good", 2, gate=quick))
    manifests.write("manifests/slow.yaml", _deployment("slow", 3, gate=quick))
    git(manifests.work, "commit", "--quiet", "--all", "-m", "good 2 and slow 3, measured once")
    git(manifests.work, "checkout", "--quiet", "change")
    run = cli(
        "gate", "--repo", str(manifests.work), "--path", "manifests", "--base", "main",
        "--head", "perf", "--model-repository", str(repository), "--perf-analyzer", binary,
        "--output", "json", "--cache-dir", str(tmp_path / "cache"),
    )  # fmt: skip
    assert run.code == 3, run.err
    good, slow = _model(run.json(), "good"), _model(run.json(), "slow")
    assert good["load_generator"] == slow["load_generator"] == "perf_analyzer"
    assert good["verdict"] == "pass", good["checks"]
    assert {c["name"] for c in slow["checks"] if c["verdict"] == "fail"} == {
        "latency",
        "throughput",
    }
    figures = good["new_figures"][0]
    assert figures["requests"] >= 3 * 60 and figures["errors"] == 0  # three windows, merged
    assert [q[0] for q in figures["quantiles"]] == [50, 90, 95, 99]
    assert figures["throughput"] > 0 and figures["p95_ms"] is not None


def test_without_perf_analyzer_auto_uses_the_built_in_generator(
    change: tuple[ManifestRepo, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TRITON_GITOPS_PERF_ANALYZER", raising=False)  # --perf-analyzer's
    monkeypatch.setenv("PATH", os.pathsep.join(
        p for p in os.environ["PATH"].split(os.pathsep) if not (Path(p) / "perf_analyzer").exists()
    ))  # fmt: skip
    manifests, repository = change
    run = _gate(manifests, repository, tmp_path, "--output", "json", "--deployment", "renamed")
    assert run.code == 3
    refused = _model(run.json(), "renamed")
    assert refused["load_generator"] is None  # refused before any load: nothing measured
    missing = _gate(
        manifests, repository, tmp_path, "--load-generator", "perf_analyzer",
        "--deployment", "good",
    )  # fmt: skip
    assert missing.code == 1
    assert "perf_analyzer (on PATH) not found" in missing.err


def _process(pid: int) -> tuple[int, int, list[str]] | None:
    """(parent pid, process group, argv) of a live process; None once it has ended (a zombie
    has ended: it holds nothing but its exit status)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        group = os.getpgid(pid)
    except (OSError, ProcessLookupError):
        return None
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    if fields.get("State", "").startswith(("Z", "X")):
        return None
    return int(fields["PPid"]), group, [a.decode(errors="replace") for a in argv if a]


def _server_of(gate: int, timeout: float = 120.0) -> tuple[int, list[int], str]:
    """The gate's tritonserver (its child), once its Python stubs run: (pid, the stubs'
    pids, the server's shared-memory prefix)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = {int(p.name): _process(int(p.name)) for p in Path("/proc").glob("[0-9]*")}
        live = {pid: info for pid, info in found.items() if info is not None}
        for pid, (parent, _group, argv) in live.items():
            if parent == gate and argv and argv[0].endswith("tritonserver"):
                stubs = [
                    p
                    for p, (_, group, args) in live.items()
                    if group == pid and args[0].endswith("triton_python_backend_stub")
                ]
                prefix = next(a for a in argv if "shm-region-prefix-name=" in a)
                if stubs:
                    return pid, stubs, prefix.split("shm-region-prefix-name=")[1]
        time.sleep(0.1)
    raise AssertionError(f"the gate ({gate}) started no tritonserver with stubs in {timeout}s")


@contextlib.contextmanager
def _sigint_delivered() -> Iterator[None]:
    """While the gate's process starts: SIGINT handled here, so that it starts with SIGINT
    at its default. A test run started as a background job of a shell without job control
    inherits SIGINT ignored, and the gate keeps a SIGINT it was started ignoring ignored (as
    a background job must): on one clean-clone run so started, the gate ran to its end
    through the SIGINT. (A handler, unlike SIG_IGN, is not inherited across exec.)"""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_gate_ended_by_a_signal_leaves_no_server_stub_shared_memory_or_temp_folder(
    change: tuple[ManifestRepo, Path], tmp_path: Path, signum: signal.Signals
) -> None:
    manifests, repository = change
    scratch = tmp_path / "tmp"  # the gate's temp folder is made here
    scratch.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "TRITON_GITOPS_PERF_ANALYZER"}
    with _sigint_delivered():
        gate = subprocess.Popen(
            [
                sys.executable, "-m", "reconciler", "gate", "--repo", str(manifests.work),
                "--path", "manifests", "--base", "main", "--head", "change",
                "--model-repository", str(repository), "--deployment", "good",
                "--load-generator", "built-in", "--cache-dir", str(tmp_path / "cache"),
            ],
            env={**env, "TMPDIR": str(scratch)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
    try:
        server, stubs, prefix = _server_of(gate.pid)
        assert list(Path("/dev/shm").glob(f"{prefix}*"))  # the stubs' regions, while it runs
        gate.send_signal(signum)
        _out, err = gate.communicate(timeout=60)
    finally:
        if gate.poll() is None:
            gate.kill()
            gate.wait()
    assert gate.returncode == 128 + signum, err
    assert f"interrupted by {signum.name}" in err
    assert _process(server) is None
    assert [pid for pid in stubs if _process(pid) is not None] == []
    assert list(Path("/dev/shm").glob(f"{prefix}*")) == []
    assert list(scratch.iterdir()) == []


EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "ci"
INSTALL_FROM = "$TRITON_GITOPS_WHEEL"  # the release's wheel (tests/test_release.py)


@MEASURES
def test_the_example_ci_gate_jobs_run_as_written(tmp_path: Path) -> None:
    """The gate steps of examples/ci, run in a checkout like the CI job's: a pull request
    that moves one model from version 1 to the good version 2 passes, with its report."""
    manifests = ManifestRepo(tmp_path / "git")
    write_scorer_repository(manifests.work / "models", ("good",))
    manifests.write("manifests/servers.yaml", SERVER)
    manifests.write("manifests/good.yaml", _deployment("good", 1))
    manifests.commit("base")
    git(manifests.work, "checkout", "--quiet", "-b", "change")
    manifests.write("manifests/good.yaml", _deployment("good", 2))
    git(manifests.work, "commit", "--quiet", "--all", "-m", "good 2")
    summary = tmp_path / "summary.md"
    # A CI runner as the examples assume has no perf_analyzer: the built-in generator (this
    # suite's perf_analyzer, which ./dev test exports, would triple the time for nothing).
    outside = {k: v for k, v in os.environ.items() if k != "TRITON_GITOPS_PERF_ANALYZER"}
    env = {
        **outside,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "GITHUB_BASE_REF": "main",
        "GITHUB_STEP_SUMMARY": str(summary),
        "CI_MERGE_REQUEST_TARGET_BRANCH_NAME": "main",
        "TRITON_GITOPS_CACHE_DIR": str(tmp_path / "cache"),
    }
    workflow = YAML(typ="safe").load((EXAMPLES / "github-actions.yml").read_text())
    job = workflow["jobs"]["gate"]
    # The release's wheel: checked here, resolved against the built wheel by test_release.
    installs = [s["run"] for s in job["steps"] if "pip install" in s.get("run", "")]
    assert installs == [f'pip install "triton-gitops[local,chart] @ {INSTALL_FROM}"']
    assert workflow["env"]["TRITON_GITOPS_WHEEL"] == current_release().wheel_url
    steps = [
        s for s in job["steps"] if "triton-gitops " in s.get("run", "") and s["run"] not in installs
    ]
    assert [s["name"] for s in steps] == ["Quality gate"]
    done = subprocess.run(
        ["bash", "-e", "-c", steps[0]["run"]], cwd=manifests.work, env={**env, **job["env"]},
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert summary.read_text().startswith("<!-- triton-gitops gate -->")
    assert "#### ✅ good: version 2 against 1" in summary.read_text()
    assert (manifests.work / "gate-report" / "good-v2-latency.svg").exists()
    gitlab = YAML(typ="safe").load((EXAMPLES / "gitlab-ci.yml").read_text())
    job = gitlab["triton-gitops-gate"]
    assert [line for line in job["before_script"] if "pip install" in line] == installs
    script = [line for line in job["script"] if "triton-gitops" in line]
    assert len(script) == 1
    done = subprocess.run(
        ["bash", "-e", "-c", script[0]], cwd=manifests.work, env={**env, **job["variables"]},
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "PASS good: version 2 against 1" in done.stdout
