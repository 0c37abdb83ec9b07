"""Errors that say what to do, through the real command line over real bare Git remotes.

A state file reused for another repository, a force-push met with a fresh cache (a pod
restarted on an emptyDir), a server that does not answer, and ``validate`` of a repository
whose analysis has promql checks with no Prometheus: each answered in words, naming what to
give next. No tritonserver: the servers named here do not listen (a closed loopback port).
"""

from __future__ import annotations

from pathlib import Path

from testkit.cli_run import cli
from testkit.local_triton import free_port
from testkit.manifests import ManifestRepo, deployment_doc, git, server_doc
from testkit.service_process import Service, ServiceOptions, wait_until

# A complete config, so the plan needs no model repository; nothing listens on the port.
_CONFIG = "  config: {backend: python}\n"


def _repo(root: Path, address: str, message: str) -> ManifestRepo:
    repo = ManifestRepo(root)
    repo.write("servers.yaml", server_doc("local", address, None))
    repo.write("echo.yaml", deployment_doc("echo", [1], ["local"]) + _CONFIG)
    repo.commit(message)
    return repo


def _options(workdir: Path, cache: str = "cache") -> list[str]:
    return ["--state", str(workdir / "state.db"), "--cache-dir", str(workdir / cache)]


def test_a_state_file_of_another_repository_is_refused_naming_both(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    first = _repo(tmp_path / "first", address, "first repository")
    other = _repo(tmp_path / "other", address, "another repository")
    options = _options(tmp_path)
    made = cli("apply", "--repo", first.url, *options, "--call-timeout", "1")
    assert made.code == 1  # the server does not answer: recorded all the same
    assert "git failed" not in made.err

    for command in ("plan", "apply", "status"):
        refused = cli(command, "--repo", other.url, *options, "--call-timeout", "1")
        assert refused.code == 1
        assert "git failed" not in refused.err and "exit 128" not in refused.err
        said = refused.err
        assert f"state file {tmp_path / 'state.db'}" in said
        assert first.url in said and other.url in said
        assert "--state" in said and "new state file" in said
    # The same repository under another manifest folder is another desired state too.
    elsewhere = cli("plan", "--repo", first.url, "--path", "deploy", *options)
    assert elsewhere.code == 1 and "folder 'deploy'" in elsewhere.err
    # The repository it was made for still works with it.
    again = cli("plan", "--repo", first.url, *options, "--call-timeout", "1")
    assert "state file" not in again.err, again.err


def test_a_force_push_with_a_fresh_cache_names_accept_rewrite(tmp_path: Path) -> None:
    repo = _repo(tmp_path / "git", f"127.0.0.1:{free_port()}", "echo 1")
    applied = git(repo.work, "rev-parse", "HEAD")
    options = _options(tmp_path)
    assert cli("apply", "--repo", repo.url, *options, "--call-timeout", "1").code == 1
    repo.write("echo.yaml", deployment_doc("echo", [2], ["local"]) + _CONFIG)
    git(repo.work, "commit", "--quiet", "--all", "--amend", "-m", "history rewritten")
    git(repo.work, "push", "--quiet", "--force", "origin", "HEAD:main")
    head = git(repo.work, "rev-parse", "HEAD")

    # The cache still has the old commit: refused, naming the option and the sha to give.
    warm = cli("apply", "--repo", repo.url, *options)
    assert warm.code == 1
    assert "does not descend from the last applied revision" in warm.err
    assert f"--accept-rewrite {head[:12]}" in warm.err

    # A restarted reconciler with an empty cache never saw the old commit.
    fresh = _options(tmp_path, "fresh-cache")
    refused = cli("apply", "--repo", repo.url, *fresh)
    assert refused.code == 1
    assert "exit 128" not in refused.err and "Not a valid commit name" not in refused.err
    assert f"the last applied revision {applied} is not in {repo.url}" in refused.err
    assert f"--accept-rewrite {head[:12]}" in refused.err
    accepted = cli("apply", "--repo", repo.url, *fresh, "--accept-rewrite", head[:12])
    assert "refusing" not in accepted.err, accepted.err
    assert accepted.code == 1  # the server still does not answer; the revision is applied
    assert "refusing" not in cli("plan", "--repo", repo.url, *fresh).err  # it is history now


def test_an_unreachable_server_is_named_once(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    repo = _repo(tmp_path / "git", address, "echo 1")
    planned = cli("plan", "--repo", repo.url, *_options(tmp_path), "--call-timeout", "1")
    assert f"server local: {address} did not answer" in planned.out
    assert "server local: server local:" not in planned.out + planned.err
    as_json = cli("plan", "--repo", repo.url, *_options(tmp_path), "--output", "json")
    problem = as_json.json()["problems"][0]
    assert problem["server"] == "local"
    assert problem["message"].startswith(f"{address} did not answer")


_PROMQL_ANALYSIS = """\
  verify:
    analysis:
      interval: 5s
      duration: 30s
      checks:
        - name: business-kpi
          promql: {query}
          min: 10
"""


def test_validate_checks_promql_syntax_without_prometheus(tmp_path: Path) -> None:
    folder = tmp_path / "manifests"
    folder.mkdir()
    server = server_doc("local", "127.0.0.1:8001", None, metrics="http://127.0.0.1:8002/metrics")
    (folder / "servers.yaml").write_text(server)
    good = _PROMQL_ANALYSIS.format(query="'sum(rate(my_kpi_total[1m]))'")
    echo = folder / "echo.yaml"
    echo.write_text(deployment_doc("echo", [1], ["local"]) + _CONFIG + good)
    valid = cli("validate", str(folder))
    assert valid.code == 0, valid.err
    assert valid.out.startswith("valid: 1 server(s), 1 model deployment(s)")
    # What the reconciler needs is said, not failed: validate never asks a Prometheus.
    assert "warning: promql check(s) business-kpi need --prometheus-url" in valid.err
    annotated = cli("validate", str(folder), "--output", "github")
    assert annotated.code == 0
    assert annotated.out.startswith("::warning file=echo.yaml,line=")
    as_json = cli("validate", str(folder), "--output", "json").json()
    assert as_json["valid"] is True
    assert "need --prometheus-url" in as_json["warnings"][0]["message"]
    with_url = cli("validate", str(folder), "--prometheus-url", "http://127.0.0.1:9")
    assert with_url.code == 0 and with_url.err == ""

    bad = _PROMQL_ANALYSIS.format(query="'sum(rate(my_kpi_total[1m])'")
    echo.write_text(deployment_doc("echo", [1], ["local"]) + _CONFIG + bad)
    invalid = cli("validate", str(folder), "--prometheus-url", "http://127.0.0.1:9")
    assert invalid.code == 1
    line = 1 + (deployment_doc("echo", [1], ["local"]) + _CONFIG + bad).splitlines().index(
        "          promql: 'sum(rate(my_kpi_total[1m])'"
    )
    assert (
        f"echo.yaml:{line}: check business-kpi: promql is not valid PromQL: "
        "unclosed left parenthesis" in invalid.err
    )


def test_validate_help_says_what_needs_prometheus() -> None:
    shown = cli("validate", "--help").out
    words = " ".join(shown.split())
    assert "never queries" in words
    assert "syntax only" in words
    assert "spec.metrics" in words


def test_the_service_alerts_a_refusal_once_and_retries_on_the_git_backoff(
    tmp_path: Path,
) -> None:
    """A pod restarted on an empty cache after a force-push: every pass is refused, in
    words; one alert, not one per pass; passes come again on the Git backoff (1 s, 2 s,
    ...), not only at the interval (five minutes here)."""
    repo = _repo(tmp_path / "git", f"127.0.0.1:{free_port()}", "echo 1")
    workdir = tmp_path / "service"
    assert cli("apply", "--repo", repo.url, *_options(workdir, "old-cache")).code == 1
    repo.write("echo.yaml", deployment_doc("echo", [2], ["local"]) + _CONFIG)
    git(repo.work, "commit", "--quiet", "--all", "--amend", "-m", "history rewritten")
    git(repo.work, "push", "--quiet", "--force", "origin", "HEAD:main")
    head = git(repo.work, "rev-parse", "HEAD")

    options = ServiceOptions(secret="webhook-secret", token="reconcile-token", call_timeout=1)
    service = Service(repo.url, workdir, options).start()  # --cache-dir workdir/cache: empty
    try:
        wait_until(
            lambda: service.passes_by_result().get("refused", 0) >= 3,
            15,
            "three refused passes",
        )
        events = service.events()
    finally:
        assert service.stop() == 0
    refused = [e for e in events if e.get("message") == "revision refused"]
    assert len(refused) >= 3
    assert all(e["retry_in_seconds"] > 0 for e in refused)
    assert f"--accept-rewrite {head[:12]}" in refused[0]["error"]
    assert "exit 128" not in refused[0]["error"]
    alerts = [e for e in events if e.get("message") == "alert"]
    assert [a["kind"] for a in alerts] == ["revision-refused"]
