"""The test models and the manifests that deploy them: what every scenario starts from.

Used by the test suite (``tests/conftest.py`` fixtures and the tests themselves), the
benchmarks in ``bench/`` and the demo: a Triton model repository of the test models in
``testkit/models`` (see ``models/echo/model.py`` for how each version behaves), a bare Git
remote to commit manifests to (``ManifestRepo``, reached over ``file://``), and the two kinds
of manifest document as text (``server_doc``, ``deployment_doc``).
"""

from __future__ import annotations

import compileall
import shutil
import subprocess
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

MODELS = Path(__file__).resolve().parent / "models"
# Versions written for every test model; see model.py for how 3, 4, 5, 6 and 9 misbehave.
VERSIONS = (1, 2, 3, 4, 5, 6, 7, 9)
# Only echo has the versions that answer with error responses or reject zeros: the other
# models' latest folder stays 9, the broken one, which some tests rely on.
ECHO_ONLY_VERSIONS = (10, 11, 12, 13)
TEST_MODELS = ("echo", "other")
# An ensemble over echo then other (answers INPUT0 * v_echo * v_other); its one version folder
# is empty, as Triton requires.
ENSEMBLE = "chain"
# A sequence model (Python backend, sequence_batching): a running sum per sequence * version.
SEQUENCE_MODEL = "counter"
SEQUENCE_VERSIONS = (1, 2)


def write_model_repository(root: Path) -> Path:
    """A Triton model repository with the test models, compiled ahead of the first load.

    Python models write __pycache__ on first import, which changes mtimes and makes Triton
    fully reload that version on the next load; compiling ahead avoids that.
    """
    for name in TEST_MODELS:
        folder = root / name
        folder.mkdir(parents=True)
        config = (MODELS / "echo" / "config.pbtxt").read_text().replace('"echo"', f'"{name}"')
        (folder / "config.pbtxt").write_text(config)
        for version in VERSIONS + (ECHO_ONLY_VERSIONS if name == "echo" else ()):
            (folder / str(version)).mkdir()
            shutil.copy(MODELS / "echo" / "model.py", folder / str(version) / "model.py")
    (root / ENSEMBLE / "1").mkdir(parents=True)
    shutil.copy(MODELS / ENSEMBLE / "config.pbtxt", root / ENSEMBLE / "config.pbtxt")
    for version in SEQUENCE_VERSIONS:
        (root / SEQUENCE_MODEL / str(version)).mkdir(parents=True)
        shutil.copy(MODELS / SEQUENCE_MODEL / "model.py", root / SEQUENCE_MODEL / str(version))
    shutil.copy(MODELS / SEQUENCE_MODEL / "config.pbtxt", root / SEQUENCE_MODEL / "config.pbtxt")
    compileall.compile_dir(root, quiet=1)
    return root


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


class ManifestRepo:
    """A bare Git remote (reached over file://) and a clone that tests commit and push from."""

    def __init__(self, root: Path) -> None:
        self.bare = root / "remote.git"
        self.work = root / "work"
        root.mkdir(parents=True, exist_ok=True)
        git(root, "init", "--quiet", "--bare", "--initial-branch=main", str(self.bare))
        git(root, "clone", "--quiet", str(self.bare), str(self.work))
        git(self.work, "config", "user.email", "tests@triton-gitops.invalid")
        git(self.work, "config", "user.name", "triton-gitops tests")
        git(self.work, "checkout", "--quiet", "-b", "main")

    @property
    def url(self) -> str:
        return self.bare.as_uri()

    def write(self, path: str, text: str) -> None:
        target = self.work / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(textwrap.dedent(text))

    def remove(self, path: str) -> None:
        git(self.work, "rm", "--quiet", path)

    def commit(self, message: str) -> str:
        git(self.work, "add", "--all")
        git(self.work, "commit", "--quiet", "--allow-empty", "-m", message)
        git(self.work, "push", "--quiet", "origin", "HEAD:main")
        return git(self.work, "rev-parse", "HEAD")


# The gate's test model (models/scorer/model.py): good 1, 2 and 6; slow 3; failing 4; heavy 5.
SCORER = "scorer"
SCORER_VERSIONS = (1, 2, 3, 4, 5, 6)


def echo_repository(root: Path, *versions: int) -> Path:
    """A model repository of the test model echo alone (answers INPUT0 * version) in
    ``versions``, its files not executable: as in a bucket, whose objects have no execute
    bit, so that the folder's digest is the bucket's."""
    (root / "echo").mkdir(parents=True)
    shutil.copy(MODELS / "echo" / "config.pbtxt", root / "echo" / "config.pbtxt")
    for version in versions:
        (root / "echo" / str(version)).mkdir()
        shutil.copy(MODELS / "echo" / "model.py", root / "echo" / str(version) / "model.py")
        (root / "echo" / str(version) / "model.py").chmod(0o644)
    return root


# The streaming test model (models/gen/model.py): a decoupled generator, one token a response.
# Good 1 and 2; 3 errors in every stream; 4 fails midway; 5 sends its first token late; 6
# decodes slowly; 7 never sends the final flag; 8 fails one stream in twenty; 9 does not load;
# 10 diverges from token 20 on one prompt in fifty.
GENERATOR = "gen"
GENERATOR_VERSIONS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
# The test model with the vLLM backend's inputs and outputs (models/llm/model.py), for LLM
# benchmark clients: good 1 and 2; 3 errors; 5 sends its first token late.
LLM = "llm"
LLM_VERSIONS = (1, 2, 3, 5)


def write_generator_repository(
    root: Path, names: tuple[str, ...] = (GENERATOR,), parameters: Mapping[str, str] | None = None
) -> Path:
    """A model repository of the streaming test models: ``gen`` under each of ``names`` (one
    model per scenario, so one gate run can judge several), with ``parameters`` added to its
    config (``token_ms``, ``first_ms``...: testkit/models/gen/model.py), and ``llm`` (the
    vLLM backend's interface), compiled ahead."""
    config = (MODELS / GENERATOR / "config.pbtxt").read_text()
    config += "".join(
        f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}\n'
        for key, value in (parameters or {}).items()
    )
    for name in names:
        folder = root / name
        folder.mkdir(parents=True)
        (folder / "config.pbtxt").write_text(config.replace(f'"{GENERATOR}"', f'"{name}"'))
        for version in GENERATOR_VERSIONS:
            (folder / str(version)).mkdir()
            shutil.copy(MODELS / GENERATOR / "model.py", folder / str(version) / "model.py")
    llm = root / LLM
    llm.mkdir(parents=True)
    shutil.copy(MODELS / LLM / "config.pbtxt", llm / "config.pbtxt")
    for version in LLM_VERSIONS:
        (llm / str(version)).mkdir()
        shutil.copy(MODELS / LLM / "model.py", llm / str(version) / "model.py")
    compileall.compile_dir(root, quiet=1)
    return root


def write_scorer_repository(root: Path, names: tuple[str, ...] = (SCORER,)) -> Path:
    """A model repository of the gate's test model, under each of ``names`` (one model per
    scenario, so one gate run can judge several), compiled ahead."""
    for name in names:
        folder = root / name
        folder.mkdir(parents=True)
        config = (MODELS / "echo" / "config.pbtxt").read_text().replace('"echo"', f'"{name}"')
        (folder / "config.pbtxt").write_text(config)
        for version in SCORER_VERSIONS:
            (folder / str(version)).mkdir()
            shutil.copy(MODELS / SCORER / "model.py", folder / str(version) / "model.py")
    compileall.compile_dir(root, quiet=1)
    return root


# The echo model's config in Triton's JSON form (a load's config override), as its
# config.pbtxt declares it.
ECHO_CONFIG = {
    "name": "echo",
    "backend": "python",
    "max_batch_size": 0,
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1, 4]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1, 4]}],
    "instance_group": [{"kind": "KIND_CPU", "count": 1}],
}


def generator_config(
    versions: Sequence[int], parameters: Mapping[str, str], instances: int = 1
) -> dict[str, Any]:
    """The streaming test model's config in Triton's JSON form, whole (a load's config
    replaces config.pbtxt whole: triton-on-cpu.md), with ``parameters`` (``tokens``,
    ``token_ms``...: models/gen/model.py), ``instances`` model instances (a Python generator
    runs one request at a time per instance) and ``versions`` loaded."""
    return {
        "backend": "python",
        "max_batch_size": 0,
        "model_transaction_policy": {"decoupled": True},
        "input": [{"name": "PROMPT", "data_type": "TYPE_INT32", "dims": [-1]}],
        "output": [{"name": "TOKEN", "data_type": "TYPE_INT32", "dims": [1]}],
        "instance_group": [{"kind": "KIND_CPU", "count": instances}],
        "parameters": {k: {"string_value": v} for k, v in parameters.items()},
        "version_policy": {"specific": {"versions": list(versions)}},
    }


def router_doc(
    admin_url: str,
    pools: dict[str, list[str]],
    comparator: str | None = None,
    routes_file: Path | None = None,
    sequence_header: str | None = None,
) -> str:
    """A Router manifest ``edge`` for an Envoy at ``admin_url``: each pool by server names,
    the cluster of the comparator, if any, and where the route is read from a file by RDS,
    that file and the header of ``spec.sequenceAffinity``."""
    pool_lines = "".join(
        f"    - {{name: {pool}, servers: {{names: [{', '.join(servers)}]}}}}\n"
        for pool, servers in pools.items()
    )
    routes = f", routesFile: '{routes_file}'" if routes_file is not None else ""
    return (
        "apiVersion: triton-gitops/v1alpha1\n"
        "kind: Router\n"
        "metadata: {name: edge}\n"
        "spec:\n"
        f"  envoy: {{admin: '{admin_url}'{routes}}}\n"
        + (f"  comparator: {{name: {comparator}}}\n" if comparator else "")
        + (f"  sequenceAffinity: {{header: {sequence_header}}}\n" if sequence_header else "")
        + "  pools:\n"
        + pool_lines
    )


def sequence_deployment_doc(
    version: int, traffic: str, fail_later: str = "", duration: str = "2s", drain: str = "60s"
) -> str:
    """The ModelDeployment ``counter`` (the sequence test model) on servers ``a`` and ``c``:
    ``version``, the given ``rollout.traffic`` (a flow mapping), an analysis that checks the
    success rate for ``duration`` (its probes ask whole sequences), and with ``fail_later``
    the model's parameter that breaks sequences midway (``testkit/models/counter``)."""
    parameters = f"  config: {{parameters: {{fail_later: {{string_value: '{fail_later}'}}}}}}\n"
    return (
        "apiVersion: triton-gitops.dev/v1alpha1\n"
        "kind: ModelDeployment\n"
        f"metadata: {{name: {SEQUENCE_MODEL}}}\n"
        "spec:\n"
        "  servers: {names: [a, c]}\n"
        f"  versions: [{version}]\n"
        f"  sequence: {{idle: 1s, drainTimeout: {drain}}}\n"
        + (parameters if fail_later else "")
        + f"  verify: {{analysis: {{interval: 1s, duration: {duration}, checks: [\n"
        "    {name: success-rate, successRate: {min: 0.99}}]}}\n"
        f"  rollout: {{traffic: {traffic}}}\n"
    )


def server_doc(
    name: str,
    address: str,
    repository: Path | str | None,
    labels: str = "",
    metrics: str | None = None,
    http: str | None = None,
) -> str:
    lines = [
        "apiVersion: triton-gitops.dev/v1alpha1",
        "kind: TritonServer",
        "metadata:",
        f"  name: {name}",
    ]
    if labels:
        lines.append(f"  labels: {labels}")
    lines += ["spec:", f"  grpc: {address}"]
    if http is not None:
        lines.append(f"  http: {http}")  # Triton's HTTP endpoint: SSE shadow copies
    if metrics is not None:
        lines.append(f"  metrics: {metrics}")
    if repository is not None:
        lines.append(f"  modelRepository: {repository}")
    return "\n".join(lines) + "\n"


def deployment_doc(
    name: str,
    versions: list[int],
    servers: list[str],
    *,
    model: str | None = None,
    expect_factor: float | None = None,
    extra: str = "",
) -> str:
    lines = [
        "apiVersion: triton-gitops.dev/v1alpha1",
        "kind: ModelDeployment",
        "metadata:",
        f"  name: {name}",
        "spec:",
    ]
    if model:
        lines.append(f"  model: {model}")
    lines += [
        "  servers:",
        f"    names: [{', '.join(servers)}]",
        f"  versions: [{', '.join(map(str, versions))}]",
    ]
    if expect_factor is not None:
        lines += ["  verify:", "    smoke:", echo_smoke_case("doubles", expect_factor)]
    return "\n".join(lines) + "\n" + extra


def echo_smoke_case(name: str, factor: float) -> str:
    """One item of ``spec.verify.smoke`` (indented for it): the echo models' input
    [1, 2, 3, 4], expected back times ``factor``."""
    return "\n".join(
        [
            f"      - name: {name}",
            "        inputs:",
            "          INPUT0: {datatype: FP32, shape: [1, 4], data: [1, 2, 3, 4]}",
            "        expect:",
            f"          OUTPUT0: {{data: {[x * factor for x in (1, 2, 3, 4)]}, tolerance: 0.0001}}",
        ]
    )
