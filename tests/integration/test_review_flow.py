"""Pull requests and approval, end to end: real Git, real gpg, real Triton.

Reviewers get annotations, diffs and Markdown without any server; the reconciler applies only
fast-forward, signed, approved commits, and a saved plan only while nothing moved.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ruamel.yaml import YAML

from testkit.cli_run import Reconciler, cli
from testkit.local_triton import LocalTriton
from testkit.manifests import ManifestRepo, deployment_doc, git, server_doc
from testkit.release import current as current_release
from tests.integration.flows import ready_versions
from tests.signing import Keys, commit

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "ci"


def _base_and_change(manifests: ManifestRepo, repository: Path) -> tuple[str, str]:
    """main: echo 1 and other 1; branch 'change': echo 2 with new inputs, other removed."""
    manifests.write("manifests/servers.yaml", server_doc("edge-a", "127.0.0.1:8001", repository))
    manifests.write("manifests/echo.yaml", deployment_doc("echo", [1], ["edge-a"]))
    manifests.write("manifests/other.yaml", deployment_doc("other", [1], ["edge-a"]))
    base = manifests.commit("base")
    git(manifests.work, "checkout", "--quiet", "-b", "change")
    manifests.write(
        "manifests/echo.yaml",
        deployment_doc("echo", [2], ["edge-a"])
        + "  config:\n    input: [{name: INPUT0, data_type: TYPE_FP16, dims: [-1, 4]}]\n",
    )
    manifests.remove("manifests/other.yaml")
    git(manifests.work, "add", "--all")
    git(manifests.work, "commit", "--quiet", "-m", "echo 2 in half precision; retire other")
    git(manifests.work, "push", "--quiet", "origin", "change")
    return base, git(manifests.work, "rev-parse", "HEAD")


def test_validate_annotations_name_files_as_the_repository_does(
    manifests: ManifestRepo, model_repository: Path
) -> None:
    manifests.write("deploy/prod/servers.yaml", server_doc("edge-a", "127.0.0.1:8001", None))
    manifests.write("deploy/prod/echo.yaml", deployment_doc("echo", [1], ["edge-a", "edge-z"]))
    found = cli("validate", str(manifests.work / "deploy" / "prod"), "--output", "github")
    assert found.code == 1
    lines = found.out.splitlines()
    assert (
        "::error file=deploy/prod/echo.yaml,line=7::ModelDeployment 'echo' names unknown "
        "TritonServer 'edge-z'" in lines
    )
    assert any(line.startswith("::error file=deploy/prod/echo.yaml,line=5::") for line in lines)
    as_json = cli("validate", str(manifests.work / "deploy" / "prod"), "--output", "json")
    assert as_json.code == 1 and as_json.json()["valid"] is False


def test_diff_between_refs_needs_no_server(
    manifests: ManifestRepo, model_repository: Path, tmp_path: Path
) -> None:
    base, head = _base_and_change(manifests, model_repository)
    options = ["--repo", manifests.url, "--path", "manifests", "--cache-dir", str(tmp_path)]
    same = cli("diff", *options, "--base", base, "--head", base)
    assert same.code == 0
    changed = cli("diff", *options, "--base", "main", "--head", "change", "--output", "json")
    assert changed.code == 2, changed.err
    doc = changed.json()
    assert (doc["base"], doc["head"]) == (base, head)
    kinds = {w["kind"] for w in doc["warnings"]}
    assert {"unload", "interface", "no-analysis"} <= kinds
    markdown = cli("diff", *options, "--base", "main", "--head", "change", "--output", "markdown")
    assert markdown.code == 2
    assert markdown.out.startswith("<!-- triton-gitops diff -->")
    assert "other" in markdown.out and "TYPE_FP16" in markdown.out
    # A local checkout is read in place: its remote-tracking refs resolve as there.
    in_place = cli(
        "diff", "--repo", str(manifests.work), "--path", "manifests",
        "--base", "origin/main", "--head", "HEAD", "--cache-dir", str(tmp_path),
    )  # fmt: skip
    assert in_place.code == 2, in_place.err


# What the CI examples install: the release's wheel, whose address they set in
# TRITON_GITOPS_WHEEL (tests/test_release.py installs the built wheel by these lines).
INSTALL_FROM = "$TRITON_GITOPS_WHEEL"

# A model watched by a promql check: validate passes it with no Prometheus (syntax only).
KPI = """\
apiVersion: triton-gitops/v1alpha1
kind: TritonServer
metadata: {name: edge-k}
spec: {grpc: "127.0.0.1:8001", metrics: "http://127.0.0.1:8002/metrics"}
---
apiVersion: triton-gitops/v1alpha1
kind: ModelDeployment
metadata: {name: echo-kpi}
spec:
  model: echo
  servers: {names: [edge-k]}
  versions: [1]
  config: {backend: python}
  verify:
    analysis:
      checks:
        - name: business-kpi
          promql: 'sum(rate(my_kpi_total[1m]))'
          min: 10
"""


def test_the_example_ci_workflows_run_as_written(
    manifests: ManifestRepo, model_repository: Path, tmp_path: Path
) -> None:
    """The run: steps of examples/ci, executed in a checkout like the CI job's (with the
    package installed already: the install step is checked here and run by
    tests/test_release.py against the built wheel)."""
    _base_and_change(manifests, model_repository)
    manifests.write("manifests/kpi.yaml", KPI)
    git(manifests.work, "add", "--all")
    git(manifests.work, "commit", "--quiet", "-m", "echo on edge-k, watched by a promql check")
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "MANIFESTS": "manifests",
        "GITHUB_BASE_REF": "main",
        "CI_MERGE_REQUEST_TARGET_BRANCH_NAME": "main",
        "TRITON_GITOPS_CACHE_DIR": str(tmp_path / "cache"),
    }
    workflow = YAML(typ="safe").load((EXAMPLES / "github-actions.yml").read_text())
    review = workflow["jobs"]["review"]["steps"]
    installs = [s["run"] for s in review if "pip install" in s.get("run", "")]
    assert installs == [f'pip install "triton-gitops @ {INSTALL_FROM}"']
    assert workflow["env"]["TRITON_GITOPS_WHEEL"] == current_release().wheel_url
    assert (
        f'pip install "triton-gitops @ {current_release().wheel_url}"'
        in (EXAMPLES / "../../README.md").read_text()
    )
    steps = [s for s in review if "triton-gitops " in s.get("run", "") and s["run"] not in installs]
    assert [s["name"] for s in steps] == ["Validate", "Diff against the target branch"]
    for step in steps:
        done = subprocess.run(
            ["bash", "-e", "-c", step["run"]], cwd=manifests.work, env=env, capture_output=True,
            text=True,
        )  # fmt: skip
        assert done.returncode == 0, (step["name"], done.stdout, done.stderr)
        if step["name"] == "Validate":
            assert "::warning file=manifests/kpi.yaml" in done.stdout  # needs --prometheus-url
    comment = (manifests.work / "comment.md").read_text()
    assert comment.startswith("<!-- triton-gitops diff -->")
    gitlab = YAML(typ="safe").load((EXAMPLES / "gitlab-ci.yml").read_text())
    assert gitlab["variables"]["TRITON_GITOPS_WHEEL"] == current_release().wheel_url
    before = gitlab["triton-gitops-review"]["before_script"]
    assert [line for line in before if "pip install" in line] == [
        f'pip install "triton-gitops @ {INSTALL_FROM}"'
    ]
    script = [line for line in gitlab["triton-gitops-review"]["script"] if "triton-gitops" in line]
    for line in script:
        done = subprocess.run(
            ["bash", "-e", "-c", line], cwd=manifests.work, env=env, capture_output=True,
            text=True,
        )  # fmt: skip
        assert done.returncode == 0, (line, done.stdout, done.stderr)


def test_saved_plan_applies_only_while_nothing_moved(
    manifests: ManifestRepo, triton: LocalTriton, model_repository: Path, tmp_path: Path
) -> None:
    reconciler = Reconciler(manifests.url, tmp_path / "r")
    manifests.write("servers.yaml", server_doc("edge-a", triton.grpc_address, model_repository))
    manifests.write("echo.yaml", deployment_doc("echo", [1], ["edge-a"]))
    manifests.commit("echo 1")
    saved = tmp_path / "plan.json"
    planned = reconciler.plan("--out", str(saved), "--output", "markdown")
    assert planned.code == 2
    assert planned.out.startswith("<!-- triton-gitops plan -->")
    applied = reconciler.apply("--plan", str(saved))
    assert applied.code == 0, applied.err
    assert ready_versions(triton, "echo") == {1}

    # The branch moves after the plan: refused.
    manifests.write("echo.yaml", deployment_doc("echo", [2], ["edge-a"]))
    manifests.commit("echo 2")
    assert reconciler.plan("--out", str(saved)).code == 2
    manifests.write("echo.yaml", deployment_doc("echo", [3], ["edge-a"]))
    manifests.commit("echo 3, pushed after the plan")
    stale = reconciler.apply("--plan", str(saved))
    assert stale.code == 1
    assert "stale plan" in stale.err and "make a new plan" in stale.err
    assert ready_versions(triton, "echo") == {1}

    # A server moves after the plan: refused as well.
    assert reconciler.plan("--out", str(saved)).code == 2
    assert reconciler.apply().code == 0  # someone else applied meanwhile
    moved = reconciler.apply("--plan", str(saved))
    assert moved.code == 1 and "server(s) edge-a changed since the plan" in moved.err
    assert ready_versions(triton, "echo") == {3}


def test_force_push_is_refused_until_accepted(
    manifests: ManifestRepo, triton: LocalTriton, model_repository: Path, tmp_path: Path
) -> None:
    reconciler = Reconciler(manifests.url, tmp_path / "r")
    manifests.write("servers.yaml", server_doc("edge-a", triton.grpc_address, model_repository))
    manifests.write("echo.yaml", deployment_doc("echo", [1], ["edge-a"]))
    manifests.commit("echo 1")
    assert reconciler.apply().code == 0
    manifests.write("echo.yaml", deployment_doc("echo", [2], ["edge-a"]))
    git(manifests.work, "commit", "--quiet", "--all", "--amend", "-m", "history rewritten")
    git(manifests.work, "push", "--quiet", "--force", "origin", "HEAD:main")
    rewritten = git(manifests.work, "rev-parse", "HEAD")

    refused = reconciler.apply()
    assert refused.code == 1
    assert "does not descend from the last applied revision" in refused.err
    assert ready_versions(triton, "echo") == {1}
    assert reconciler.apply("--accept-rewrite", "0" * 12).code == 1  # another head: no
    accepted = reconciler.apply("--accept-rewrite", rewritten[:12])
    assert accepted.code == 0, accepted.err
    assert ready_versions(triton, "echo") == {2}
    assert reconciler.apply().code == 0  # from now on it is the applied history


def test_only_commits_signed_by_trusted_keys_are_applied(
    keys: Keys,
    manifests: ManifestRepo,
    triton: LocalTriton,
    model_repository: Path,
    tmp_path: Path,
) -> None:
    reconciler = Reconciler(manifests.url, tmp_path / "r")
    verify = ("--verify-signatures", "all", "--trusted-keys", str(keys.trusted_dir))
    manifests.write("servers.yaml", server_doc("edge-a", triton.grpc_address, model_repository))
    manifests.write("echo.yaml", deployment_doc("echo", [1], ["edge-a"]))
    commit(manifests, keys, "echo 1", key=keys.alice)
    assert reconciler.apply(*verify).code == 0

    manifests.write("echo.yaml", deployment_doc("echo", [2], ["edge-a"]))
    unsigned = commit(manifests, keys, "echo 2, unsigned")
    refused = reconciler.apply(*verify)
    assert refused.code == 1 and f"{unsigned[:12]}: not signed" in refused.err
    assert ready_versions(triton, "echo") == {1}

    # A signed commit on top does not launder the unsigned one under 'all'...
    manifests.write("echo.yaml", deployment_doc("echo", [3], ["edge-a"]))
    commit(manifests, keys, "echo 3", key=keys.alice)
    assert reconciler.apply(*verify).code == 1
    # ...but 'head' checks only the commit applied.
    head_only = ("--verify-signatures", "head", "--trusted-keys", str(keys.trusted_dir))
    assert reconciler.apply(*head_only).code == 0
    assert ready_versions(triton, "echo") == {3}

    manifests.write("echo.yaml", deployment_doc("echo", [2], ["edge-a"]))
    commit(manifests, keys, "echo 2 by mallory", key=keys.mallory)
    by_mallory = reconciler.apply(*head_only)
    assert by_mallory.code == 1 and "refusing revision" in by_mallory.err
    assert ready_versions(triton, "echo") == {3}


def test_approval_trailers(
    manifests: ManifestRepo, triton: LocalTriton, model_repository: Path, tmp_path: Path
) -> None:
    reconciler = Reconciler(manifests.url, tmp_path / "r")
    need = ("--require-trailer", "Approved-by", "--min-approvals", "2")
    manifests.write("servers.yaml", server_doc("edge-a", triton.grpc_address, model_repository))
    manifests.write("echo.yaml", deployment_doc("echo", [1], ["edge-a"]))
    git(manifests.work, "add", "--all")
    message = "echo 1\n\nApproved-by: Ana <ana@example.invalid>\n"
    git(manifests.work, "commit", "--quiet", "-m", message)
    git(manifests.work, "push", "--quiet", "origin", "HEAD:main")
    one = reconciler.apply(*need)
    assert one.code == 1 and "1 distinct Approved-by trailer(s), 2 required" in one.err
    git(
        manifests.work, "commit", "--quiet", "--allow-empty", "-m",
        "echo 1\n\nApproved-by: Ana <ana@example.invalid>\nApproved-by: Bo <bo@example.invalid>",
    )  # fmt: skip
    git(manifests.work, "push", "--quiet", "origin", "HEAD:main")
    assert reconciler.apply(*need).code == 0
    assert ready_versions(triton, "echo") == {1}
