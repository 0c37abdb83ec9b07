"""The command line's contract: options, output formats, sources, config changes."""

from __future__ import annotations

import json
import logging
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from reconciler.cli.passes import ApplyLines
from reconciler.model.plan import Action, Step
from reconciler.model.results import StepResult
from testkit.cli_run import Reconciler, cli
from testkit.local_triton import LocalTriton, free_port
from testkit.manifests import ManifestRepo, deployment_doc, git, server_doc
from tests.integration.flows import ready_versions


@pytest.mark.parametrize("command", ["validate", "plan", "apply"])
def test_help_is_complete(command: str) -> None:
    shown = cli(command, "--help")
    assert shown.code == 0
    if command != "validate":
        for option in ("--repo", "--ref", "--path", "--output", "--state", "--allow-empty"):
            assert option in shown.out


def test_module_and_script_entry_points() -> None:
    module = subprocess.run(
        [sys.executable, "-m", "reconciler", "--help"], capture_output=True, text=True
    )
    assert module.returncode == 0
    assert "validate" in module.stdout and "apply" in module.stdout
    script = shutil.which("triton-gitops", path=str(Path(sys.executable).parent))
    assert script is not None
    version = subprocess.run([script, "--version"], capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.startswith("triton-gitops ")


def test_apply_logs_what_failed_as_json_lines_or_text(
    manifests: ManifestRepo, tmp_path: Path
) -> None:
    # Nothing listens on this port: the pass's one failure is the server, no tritonserver needed.
    address = f"127.0.0.1:{free_port()}"
    manifests.write("servers.yaml", server_doc("edge-z", address, tmp_path / "models"))
    manifests.write("echo.yaml", deployment_doc("echo", [1], ["edge-z"]))
    revision = manifests.commit("deploy echo on a server that is down")
    command = [
        sys.executable, "-m", "reconciler", "apply",
        "--repo", manifests.url,
        "--state", str(tmp_path / "state.db"),
        "--cache-dir", str(tmp_path / "cache"),
        "--call-timeout", "2",
    ]  # fmt: skip

    logged = subprocess.run([*command, "--log-format", "json"], capture_output=True, text=True)

    assert logged.returncode == 1, logged.stderr
    assert "problems:" in logged.stdout  # the report itself is the same text as ever
    lines = logged.stderr.splitlines()
    entries = [json.loads(line) for line in lines]  # every line of stderr is one JSON object
    assert lines and all({"time", "level", "logger", "message"} <= set(e) for e in entries)
    (failure,) = [e for e in entries if e["message"] == "failure"]
    assert failure["level"] == "warning"  # unreachable: the next pass tries again
    assert (failure["server"], failure["kind"], failure["revision"]) == (
        "edge-z",
        "unreachable",
        revision,
    )
    assert address in failure["reason"] and "model" not in failure

    text = subprocess.run(command, capture_output=True, text=True)  # --log-format text

    assert text.returncode == 1
    assert f"failure revision={revision} server=edge-z kind=unreachable reason=" in text.stderr
    assert "{" not in text.stderr


def test_apply_progress_is_log_records_with_log_format_json(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = ApplyLines(60.0, as_records=True)
    load = Step("edge-a", "echo", Action.LOAD, (2,), "new")
    with caplog.at_level(logging.INFO):
        lines.started(load, reverting=False)
        lines.ended(StepResult(load, False, 0.5, "initialize failed"))
    lines.close()

    assert capsys.readouterr().err == ""  # nothing printed past the log's formatter
    started, ended = [(r.getMessage(), vars(r)["fields"]) for r in caplog.records]
    assert started == (
        "edge-a/echo: load [2] ...",
        {"server": "edge-a", "model": "echo", "step": "load"},
    )
    assert ended[0] == "step"  # the event the service logs for each step
    assert (ended[1]["outcome"], ended[1]["error"], ended[1]["versions"]) == (
        "failed",
        "initialize failed",
        [2],
    )


def test_ref_and_path_select_what_is_reconciled(
    manifests: ManifestRepo, triton: LocalTriton, model_repository: Path, tmp_path: Path
) -> None:
    reconciler = Reconciler(manifests.url, tmp_path / "r")
    server = server_doc("edge-a", triton.grpc_address, model_repository)
    manifests.write("prod/servers.yaml", server)
    manifests.write("prod/echo.yaml", deployment_doc("echo", [1], ["edge-a"]))
    manifests.write("staging/servers.yaml", server)
    manifests.write("staging/echo.yaml", deployment_doc("echo", [3], ["edge-a"]))
    release = manifests.commit("release")
    git(manifests.work, "tag", "release-1")
    git(manifests.work, "push", "--quiet", "origin", "release-1")
    manifests.write("prod/echo.yaml", deployment_doc("echo", [2], ["edge-a"]))
    manifests.commit("next")

    staged = reconciler.plan("--path", "staging", "--output", "json")
    assert staged.code == 2
    assert staged.json()["steps"][0]["versions"] == [3]
    tagged = reconciler.apply("--path", "prod", "--ref", "release-1", "--output", "json")
    assert tagged.code == 0, tagged.out
    doc = tagged.json()
    assert doc["revision"] == release
    assert doc["result"]["changes"][0]["outcome"] == "converged"
    assert [s["action"] for s in doc["result"]["changes"][0]["steps"]] == ["load", "verify"]
    assert ready_versions(triton, "echo") == {1}
    assert reconciler.apply("--path", "prod").code == 0
    assert ready_versions(triton, "echo") == {2}


def test_config_change_reloads_and_then_matches(
    manifests: ManifestRepo, triton: LocalTriton, model_repository: Path, tmp_path: Path
) -> None:
    reconciler = Reconciler(manifests.url, tmp_path / "r")
    manifests.write("servers.yaml", server_doc("edge-a", triton.grpc_address, model_repository))
    config = "  config:\n    max_batch_size: 0\n    instance_group: [{kind: KIND_CPU, count: %d}]\n"
    manifests.write("echo.yaml", deployment_doc("echo", [1], ["edge-a"]) + config % 1)
    manifests.commit("one instance")
    assert reconciler.apply().code == 0
    assert reconciler.plan().code == 0  # the server-filled instance name is not drift

    manifests.write("echo.yaml", deployment_doc("echo", [1], ["edge-a"]) + config % 2)
    manifests.commit("two instances")
    planned = reconciler.plan("--output", "json")
    assert planned.code == 2
    steps = planned.json()["steps"]
    assert [(s["action"], s["versions"]) for s in steps] == [("load", [1]), ("verify", [1])]
    assert "config changed (instance_group)" in steps[0]["reason"]
    assert reconciler.apply().code == 0
    assert ready_versions(triton, "echo") == {1}
    assert reconciler.plan().code == 0


def test_unknown_config_field_is_a_validation_error(tmp_path: Path) -> None:
    (tmp_path / "m.yaml").write_text(
        server_doc("edge-a", "127.0.0.1:8001", tmp_path)
        + "---\n"
        + deployment_doc("echo", [1], ["edge-a"])
        + "  config:\n    max_batch_sise: 4\n"
    )
    result = cli("validate", str(tmp_path))
    assert result.code == 1
    assert 'm.yaml:18: spec.config: Message type "inference.ModelConfig" has no field named' in (
        result.err
    )


def test_vanished_repository_changes_nothing(
    manifests: ManifestRepo, triton: LocalTriton, model_repository: Path, tmp_path: Path
) -> None:
    reconciler = Reconciler(manifests.url, tmp_path / "r")
    manifests.write("servers.yaml", server_doc("edge-a", triton.grpc_address, model_repository))
    manifests.write("echo.yaml", deployment_doc("echo", [2], ["edge-a"]))
    manifests.commit("deploy")
    assert reconciler.apply().code == 0
    shutil.rmtree(manifests.bare)
    result = reconciler.apply()
    assert result.code == 1
    assert f"error: cannot fetch {manifests.url}: fatal: " in result.err
    assert ready_versions(triton, "echo") == {2}


def test_status_shows_desired_served_held_and_unreachable(
    manifests: ManifestRepo, triton: LocalTriton, model_repository: Path, tmp_path: Path
) -> None:
    reconciler = Reconciler(manifests.url, tmp_path / "r")
    dead = f"127.0.0.1:{free_port()}"
    manifests.write(
        "servers.yaml",
        server_doc("edge-a", triton.grpc_address, model_repository)
        + "---\n"
        + server_doc("edge-b", dead, model_repository),
    )
    manifests.write("echo.yaml", deployment_doc("echo", [1], ["edge-a"]))
    manifests.write("other.yaml", deployment_doc("other", [2], ["edge-a", "edge-b"]))
    manifests.commit("two models, edge-b down")
    assert reconciler.apply("--call-timeout", "2").code == 1  # edge-b is unreachable
    manifests.write("echo.yaml", deployment_doc("echo", [9], ["edge-a"]))
    bad = manifests.commit("echo 9 fails to load")
    assert reconciler.apply("--call-timeout", "2").code == 1
    manifests.write("other.yaml", deployment_doc("other", [3], ["edge-a", "edge-b"]))
    manifests.commit("other 3, not applied yet")

    shown = cli("status", *reconciler.options, "--call-timeout", "2", "--output", "json")
    assert shown.code == 0, shown.err
    doc = shown.json()
    models = {(m["server"], m["model"]): m for m in doc["models"]}
    echo = models[("edge-a", "echo")]
    assert (echo["desired"], echo["serving"], echo["state"]) == ([9], [1], "held")
    assert bad[:12] in echo["detail"]
    assert echo["last_rollout"]["outcome"] == "reverted"
    other = models[("edge-a", "other")]
    assert (other["desired"], other["serving"], other["state"]) == ([3], [2], "pending")
    assert models[("edge-b", "other")]["state"] == "unreachable"
    assert "edge-b" in doc["unreachable"]
    conditions = {d["name"]: {c["type"]: c for c in d["conditions"]} for d in doc["deployments"]}
    held = conditions["echo"]
    assert [(t, c["status"], c["reason"]) for t, c in held.items()] == [
        ("Ready", "False", "Held"),
        ("Reconciling", "False", "Held"),
        ("Stalled", "True", "RolloutFailed"),  # it failed to load: no analysis ran
    ]
    assert held["Ready"]["message"].startswith(f"edge-a: revision {bad[:12]} failed")
    # The pass that held echo recorded when Ready turned False; status shows that time.
    with sqlite3.connect(reconciler.options[3]) as db:
        (since,) = db.execute(
            "SELECT since FROM condition_transitions WHERE deployment = 'echo' AND type = 'Ready'"
        ).fetchone()
    db.close()
    assert held["Ready"]["lastTransitionTime"] == since
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", since)
    pending = conditions["other"]
    assert (pending["Ready"]["status"], pending["Ready"]["reason"]) == ("False", "Progressing")
    assert pending["Reconciling"]["status"] == "True"
    assert doc["last_pass"]["finished_at"].endswith("Z")
    assert echo["last_rollout"]["finished_at"].endswith("Z")
    text = cli("status", *reconciler.options, "--call-timeout", "2")
    assert "server edge-b: UNREACHABLE" in text.out
    assert "echo" in text.out and "held" in text.out
    # Narrowed to a model, or to a server: the rows, conditions and unreachable servers of
    # that model or server only (every server is still observed).
    one = cli("status", *reconciler.options, "--call-timeout", "2", "--output", "json",
              "--model", "other", "--server", "edge-b")  # fmt: skip
    assert one.code == 0, one.err
    narrowed = one.json()
    assert [(m["server"], m["model"]) for m in narrowed["models"]] == [("edge-b", "other")]
    assert [d["name"] for d in narrowed["deployments"]] == ["other"]
    assert list(narrowed["unreachable"]) == ["edge-b"]
    on_a = cli("status", *reconciler.options, "--call-timeout", "2", "--server", "edge-a")
    assert "server edge-a" in on_a.out and "edge-b" not in on_a.out, on_a.out
    watching = cli("status", "--watch", "--model", "echo")
    assert watching.code == 1 and "--watch shows them all" in watching.err


def test_options_from_environment_and_config_file(
    manifests: ManifestRepo,
    triton: LocalTriton,
    model_repository: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    manifests.write(
        "prod/servers.yaml", server_doc("edge-a", triton.grpc_address, model_repository)
    )
    manifests.write("prod/echo.yaml", deployment_doc("echo", [2], ["edge-a"]))
    manifests.commit("prod")
    config = tmp_path / "config.yaml"
    config.write_text(
        f"repo: {manifests.url}\npath: staging\nstate: {tmp_path / 'state.db'}\n"
        f"cache-dir: {tmp_path / 'cache'}\noutput: json\n"
    )
    # The environment wins over the file; a flag wins over both.
    monkeypatch.setenv("TRITON_GITOPS_PATH", "prod")
    planned = cli("--config", str(config), "plan")
    assert planned.code == 2, planned.err
    assert planned.json()["steps"][0]["versions"] == [2]
    flagged = cli("--config", str(config), "plan", "--path", "nowhere")
    assert flagged.code == 1 and "no folder 'nowhere'" in flagged.err
    monkeypatch.setenv("TRITON_GITOPS_REVERT_MODE", "sideways")
    refused = cli("--config", str(config), "plan")
    assert refused.code == 1
    assert "$TRITON_GITOPS_REVERT_MODE: 'sideways' is not one of" in refused.err
    assert cli("plan", "--no-such-option").code == 1  # usage errors are not "changes"


def test_status_with_a_service_but_no_watch_says_what_to_add() -> None:
    """--service is the live view's source: without --watch status says so, instead of
    asking for a --repo the user did not mean to give."""
    shown = cli("status", "--service", "http://127.0.0.1:9")
    assert shown.code == 1
    assert "status --service reads a running service's rollouts in progress: add --watch" in (
        shown.err
    ), shown.err
    assert "needs --repo" in cli("status").err
