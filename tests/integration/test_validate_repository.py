"""``validate`` (and the commands that read a commit) on a real repository, as the usability
review met it (review-usability.md §1 rows 6 and 7): CI files, Kubernetes manifests, a
``.sourceignore``, an empty folder, four problems at once, the old apiVersion. No Triton.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.core.spec.schema import API_VERSION, LEGACY_API_VERSION
from testkit.cli_run import Reconciler, cli
from testkit.local_triton import free_port
from testkit.manifests import ManifestRepo, deployment_doc, server_doc

GITLAB_CI = """\
stages: [validate]
validate:
  image: python:3.11
  script: [triton-gitops validate]
"""
PRE_COMMIT = "repos:\n  - repo: local\n    hooks: []\n"
KUBERNETES = """\
apiVersion: apps/v1
kind: Deployment
metadata: {name: triton}
spec:
  replicas: 1
---
apiVersion: v1
kind: Service
metadata: {name: triton}
"""
HELM_TEMPLATE = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}\n"


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def ours() -> dict[str, str]:
    return {
        "servers/edge.yaml": server_doc("edge-a", "127.0.0.1:8001", Path("/models")),
        "models/echo.yaml": deployment_doc("echo", [1], ["edge-a"]),
    }


def a_real_repository() -> dict[str, str]:
    return {
        **ours(),
        ".gitlab-ci.yml": GITLAB_CI,
        ".pre-commit-config.yaml": PRE_COMMIT,
        ".github/workflows/ci.yml": "on: push\njobs: {}\n",
        "deploy/kubernetes/triton.yaml": KUBERNETES,
        "charts/triton/templates/cm.yaml": HELM_TEMPLATE,  # not YAML until Helm renders it
        ".sourceignore": "# Helm renders these; they are not manifests\ncharts/\n",
    }


def test_a_repository_with_ci_files_and_kubernetes_manifests_validates(tmp_path: Path) -> None:
    write(tmp_path, a_real_repository())

    result = cli("validate", str(tmp_path))

    assert result.code == 0, result.err
    assert result.out.splitlines() == [
        "valid: 1 server(s), 1 model deployment(s)",
        "deploy/kubernetes/triton.yaml: ignored 2 document(s) of other tools (apps/v1, v1)",
    ]
    assert result.err == ""
    as_json = cli("validate", str(tmp_path), "--output", "json").json()
    assert as_json["valid"] is True and as_json["empty"] is False
    assert as_json["ignored"] == {"deploy/kubernetes/triton.yaml": 2}
    assert as_json["problems"] == [] and as_json["warnings"] == []


def test_without_the_sourceignore_the_template_is_a_problem_by_name(tmp_path: Path) -> None:
    files = a_real_repository()
    del files[".sourceignore"]
    write(tmp_path, files)

    result = cli("validate", str(tmp_path))

    assert result.code == 1
    assert result.err.splitlines() == [
        "charts/triton/templates/cm.yaml:4: YAML refused: a list or mapping used as a key",
        "1 problem(s)",
    ]
    assert ".gitlab-ci.yml" not in result.err and "apps/v1" not in result.err


def test_the_sourceignore_of_the_root_and_of_the_folder_apply(manifests: ManifestRepo) -> None:
    # validate DIR inside a Git work tree: the root's .sourceignore and DIR's own both count.
    write(manifests.work, {f"deploy/prod/{name}": text for name, text in ours().items()})
    write(
        manifests.work,
        {
            ".sourceignore": "drafts/\n",
            "deploy/prod/drafts/next.yaml": "apiVersion: triton-gitops.dev/v1alpha1\nkind: Nope\n",
            "deploy/prod/.sourceignore": "*.generated.yaml\n",
            "deploy/prod/models/big.generated.yaml": "{{ not yaml }}\n",
        },
    )

    result = cli("validate", str(manifests.work / "deploy" / "prod"))

    assert (result.code, result.err) == (0, "")
    assert result.out == "valid: 1 server(s), 1 model deployment(s)\n"


def test_a_commit_is_read_with_the_same_selection(manifests: ManifestRepo, tmp_path: Path) -> None:
    # plan, apply, diff and gate read a commit's tree: diff needs no server.
    write(manifests.work, a_real_repository())
    base = manifests.commit("a repository as teams have them")
    manifests.write("models/echo.yaml", deployment_doc("echo", [2], ["edge-a"]))
    head = manifests.commit("echo 2")

    result = cli(
        "diff", "--repo", manifests.url, "--base", base, "--head", head,
        "--cache-dir", str(tmp_path / "cache"),
    )  # fmt: skip

    assert result.code == 2, result.err  # changes, and no problem
    assert "echo" in result.out


def test_an_empty_repository_is_a_warning_not_valid(tmp_path: Path) -> None:
    write(tmp_path, {".gitlab-ci.yml": GITLAB_CI, "k8s.yaml": KUBERNETES})

    result = cli("validate", str(tmp_path))

    assert result.code == 0
    assert "valid" not in result.out
    assert result.err == (
        f"warning: {tmp_path}: no {API_VERSION} manifest here (2 document(s) of other tools "
        "ignored): nothing to validate (wrong folder or --path? a .sourceignore excluding too "
        "much?)\n"
    )
    as_json = cli("validate", str(tmp_path), "--output", "json").json()
    assert (as_json["valid"], as_json["empty"], as_json["ignored"]) == (
        False,
        True,
        {"k8s.yaml": 2},
    )
    annotations = cli("validate", str(tmp_path), "--output", "github")
    assert annotations.out.startswith(f"::warning file={tmp_path}::no {API_VERSION} manifest")


def test_four_problems_come_out_in_one_run_in_words(tmp_path: Path) -> None:
    # One problem per stage: schema (two), cross-document reference, analysis source. On
    # main before this change, each fix revealed the next batch.
    write(
        tmp_path,
        {
            "servers.yaml": server_doc("edge-a", "localhost", Path("/models"))
            + "---\n" + server_doc("edge-b", "edge-b:8001", Path("/models")),
            "models/echo.yaml": deployment_doc("echo", [1], ["edge-a", "edge-c"]).replace(
                "spec:\n", "spec:\n  verify:\n    timeout: 2h\n    analysis:\n      interval: 5\n"
                "      checks: [{name: ok, successRate: {min: 0.99}}]\n",
            ),
            "models/kpi.yaml": deployment_doc("kpi", [1], ["edge-b"]).replace(
                "spec:\n", "spec:\n  verify:\n    analysis:\n      checks: "
                "[{name: kpi, promql: 'sum(rate(kpi_total[1m]))', min: 1}]\n",
            ),
        },
    )  # fmt: skip

    result = cli("validate", str(tmp_path))

    assert result.code == 1
    assert result.err.splitlines() == [
        "models/kpi.yaml:7: warning: promql check(s) kpi need --prometheus-url where the "
        "reconciler runs them (validate checked their syntax only)",
        "models/echo.yaml:9: spec.verify.analysis.interval: 5 is not a duration "
        "(e.g. 500ms, 30s, 1m30s, 2h)",
        "models/echo.yaml:12: ModelDeployment 'echo' names unknown TritonServer 'edge-c'",
        "models/kpi.yaml:7: the analysis of 'kpi' needs metrics: set spec.metrics on "
        "TritonServer(s) edge-b",
        "servers.yaml:6: spec.grpc: 'localhost' is not host:port (e.g. triton-0.triton:8001)",
        "4 problem(s)",
    ]


def test_the_old_api_version_validates_with_a_deprecation_warning(tmp_path: Path) -> None:
    write(tmp_path, {n: t.replace(API_VERSION, LEGACY_API_VERSION) for n, t in ours().items()})

    result = cli("validate", str(tmp_path))

    assert result.code == 0
    assert result.out == "valid: 1 server(s), 1 model deployment(s)\n"
    assert result.err.splitlines() == [
        f"{name}:1: warning: apiVersion '{LEGACY_API_VERSION}' is deprecated: write "
        f"apiVersion: {API_VERSION} (a Kubernetes API group needs a DNS name)"
        for name in ("models/echo.yaml", "servers/edge.yaml")
    ]


def test_plan_warns_of_the_old_api_version_in_its_log(
    manifests: ManifestRepo, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # No Triton listens there: the plan has that problem, and reads the manifests all the same.
    server = server_doc("edge-a", f"127.0.0.1:{free_port()}", None)
    manifests.write("servers.yaml", server.replace(API_VERSION, LEGACY_API_VERSION))
    manifests.write(".gitlab-ci.yml", GITLAB_CI)
    sha = manifests.commit("the first spelling")

    planned = Reconciler(manifests.url, tmp_path).plan()

    assert planned.out.startswith(f"revision {sha}\n"), planned.err  # read, not refused
    assert "did not answer" in planned.out and ".gitlab-ci.yml" not in planned.out
    (warning,) = [r for r in caplog.records if r.getMessage() == "manifest warning"]
    assert warning.levelname == "WARNING"
    assert warning.fields == {  # type: ignore[attr-defined]
        "revision": sha,
        "file": "servers.yaml",
        "line": 1,
        "reason": f"apiVersion '{LEGACY_API_VERSION}' is deprecated: write apiVersion: "
        f"{API_VERSION} (a Kubernetes API group needs a DNS name)",
    }


def test_the_example_repository_is_valid_as_it_is_written() -> None:
    examples = Path(__file__).resolve().parents[2] / "examples" / "repo"
    result = cli("validate", str(examples))
    assert (result.code, result.err) == (0, "")
    assert result.out.startswith("valid: ")


def test_a_stream_expected_of_a_model_spec_config_says_does_not_stream_is_refused(
    tmp_path: Path,
) -> None:
    """Issue 42, bad input: the file and the line of the case's ``stream``."""
    files = ours()
    files["models/echo.yaml"] += (
        "  config: {model_transaction_policy: {decoupled: false}}\n"
        "  verify:\n"
        "    smoke:\n"
        "      - name: counts\n"
        "        inputs: {INPUT0: {datatype: FP32, shape: [1], data: [1]}}\n"
        "        stream: {responses: 3}\n"
    )
    write(tmp_path, files)
    line = files["models/echo.yaml"].splitlines().index("        stream: {responses: 3}") + 1

    result = cli("validate", str(tmp_path))

    assert result.code == 1, f"validate passed a stream: on a unary model: {result.out}"
    assert result.err.startswith(
        f"models/echo.yaml:{line}: ModelDeployment 'echo': smoke case 'counts' expects a stream"
    ), f"the problem must name the file and the line of stream: ({line}): {result.err}"
