"""The release as users get it (``./dev release``, docs/releasing.md): the sdist and the wheel
built by PyPA's build from this tree and checked by twine; the wheel installed in a fresh
virtualenv by the CI examples' own install lines, running the demo's commands against a real
tritonserver from outside the checkout; and every reference to the release in the docs and
examples checked against pyproject.toml, the one setting (testkit/release.py)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from reconciler.cli import parse_arguments
from testkit.local_triton import LocalTriton
from testkit.manifests import git
from testkit.release import (
    ROOT,
    build,
    current,
    notes,
    problems,
    stale_references,
    twine_check,
)
from tests.integration.flows import ready_versions

EXAMPLES = ROOT / "examples"


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return build(tmp_path_factory.mktemp("dist"))


def test_the_sdist_and_the_wheel_hold_what_a_user_needs(artifacts: tuple[Path, Path]) -> None:
    sdist, wheel = artifacts
    assert problems(sdist, wheel) == []
    assert twine_check(sdist, wheel) == []
    assert wheel.name == f"triton_gitops-{current().version}-py3-none-any.whl"


def test_the_notes_are_the_changelog_section_of_the_version() -> None:
    release = current()
    text = notes(release)
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert text.startswith("### ") and text in changelog, text[:200]
    after = changelog[changelog.index(text) + len(text) :].lstrip()
    assert after.startswith("## [") or after == "", after[:80]  # the whole section, no more


def test_every_reference_to_the_release_is_the_one_pyproject_gives() -> None:
    """The CI examples' wheel address, the Kubernetes example's image and tag, the runbook
    links, the Dockerfile's source label and the CHANGELOG's section: none a placeholder."""
    assert stale_references(current()) == []


def test_a_stale_reference_is_named_by_its_file_and_line(tmp_path: Path) -> None:
    """The check above can fail: a copy of the tree with an old wheel, an old tag and a
    placeholder, each named where it is."""
    for name in ("pyproject.toml", "CHANGELOG.md", "README.md", "Dockerfile"):
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / "docs").mkdir()
    kube = tmp_path / "examples/deploy/kubernetes"
    kube.mkdir(parents=True)
    shutil.copy(EXAMPLES / "deploy/kubernetes/deployment.yaml", kube)
    release = current()
    (kube / "kustomization.yaml").write_text(
        (EXAMPLES / "deploy/kubernetes/kustomization.yaml")
        .read_text()
        .replace(f"newTag: {release.version}", "newTag: 0.0.9")
    )
    old = release.wheel_url.replace(release.version, "0.0.9")
    (tmp_path / "docs/install.md").write_text(
        f"# Install\n\npip install 'triton-gitops @ {old}'\n"
        "or from git+https://github.com/YOUR-ORG/triton-gitops\n"
        f"podman run {release.image}:latest\n"
    )

    found = stale_references(release, tmp_path)

    assert found == [
        f"docs/install.md:3: {old}; the release's wheel is {release.wheel_url}",
        "docs/install.md:4: placeholder 'YOUR-ORG'; pyproject.toml has the release",
        "docs/install.md:4: https://github.com/YOUR-ORG/triton-gitops; "
        f"the project's home is {release.source}",
        f"docs/install.md:5: image {release.image}:latest; the release's is {release.image_ref}",
        f"examples/deploy/kubernetes/kustomization.yaml: images sets {release.image}:0.0.9; "
        f"the release's is {release.image_ref}",
    ]


def test_an_image_on_the_releases_own_registry_is_checked_too(tmp_path: Path) -> None:
    """Not only the usual registries: wherever pyproject.toml puts the image."""
    release = replace(current(), image="registry.example.com/ml/triton-gitops")
    shutil.copy(ROOT / "CHANGELOG.md", tmp_path / "CHANGELOG.md")
    (tmp_path / "Dockerfile").write_text("")
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(f"podman pull {release.image}:0.0.1\n")
    kube = tmp_path / "examples/deploy/kubernetes"
    kube.mkdir(parents=True)
    shutil.copy(EXAMPLES / "deploy/kubernetes/deployment.yaml", kube)
    (kube / "kustomization.yaml").write_text(
        "images:\n"
        f"  - {{name: triton-gitops, newName: {release.image}, newTag: '{release.version}'}}\n"
    )
    assert stale_references(release, tmp_path) == [
        f"README.md:1: image {release.image}:0.0.1; the release's is {release.image_ref}"
    ]


@pytest.fixture
def fresh_venv(tmp_path: Path) -> Path:
    """A new virtualenv with nothing of this checkout's: only pip."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    return venv


def ci_install_lines() -> tuple[str, str]:
    """The review job's and the gate job's install lines of examples/ci/github-actions.yml."""
    workflow = YAML(typ="safe").load((EXAMPLES / "ci/github-actions.yml").read_text())
    review, gate = (
        [s["run"] for s in workflow["jobs"][job]["steps"] if "pip install" in s.get("run", "")]
        for job in ("review", "gate")
    )
    assert len(review) == 1 and len(gate) == 1, (review, gate)
    return review[0], gate[0]


@pytest.fixture
def demo_triton(tmp_path: Path) -> Iterator[tuple[LocalTriton, Path]]:
    """A real tritonserver over a copy of the demo's model repository."""
    models = tmp_path / "model-repository"
    shutil.copytree(EXAMPLES / "model-repository", models)
    server = LocalTriton(models, log_file=tmp_path / "tritonserver.log").start()
    try:
        yield server, models
    finally:
        server.stop()


@pytest.mark.triton
def test_the_wheel_installed_by_the_ci_examples_runs_the_demo_commands(
    artifacts: tuple[Path, Path],
    fresh_venv: Path,
    demo_triton: tuple[LocalTriton, Path],
    tmp_path: Path,
) -> None:
    _, wheel = artifacts
    release = current()
    # The examples' lines as written, with the wheel's address pointed at the one just built:
    # the same file name, here instead of on the release's page.
    env = {
        **os.environ,
        "PATH": f"{fresh_venv / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "TRITON_GITOPS_WHEEL": wheel.as_uri(),
        "VIRTUAL_ENV": str(fresh_venv),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    env.pop("PYTHONPATH", None)
    assert wheel.name == release.wheel_url.rsplit("/", 1)[1]
    review, gate = ci_install_lines()

    def shell(line: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-e", "-c", line], cwd=tmp_path, env=env, capture_output=True, text=True
        )

    installed = shell(review)
    assert installed.returncode == 0, installed.stderr
    # The gate job's extras resolve (pip only warns of an extra a package lacks).
    resolved = shell(gate.replace("pip install", "pip install --dry-run", 1))
    assert resolved.returncode == 0, resolved.stderr
    assert "does not provide the extra" not in resolved.stderr, resolved.stderr
    assert "nvidia-pytriton" in resolved.stdout and "matplotlib" in resolved.stdout

    command = fresh_venv / "bin" / "triton-gitops"

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(command), *args], cwd=tmp_path, env=env, capture_output=True, text=True
        )

    version = run("--version")
    assert version.stdout.strip() == f"triton-gitops {release.version}", version
    where = subprocess.run(
        [str(fresh_venv / "bin" / "python"), "-c", "import reconciler; print(reconciler.__file__)"],
        cwd=tmp_path, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert Path(where.stdout.strip()).is_relative_to(fresh_venv), where

    # The demo's commands, as examples/demo.py runs them: its manifests in a Git remote, the
    # server rewritten to the running tritonserver, then validate, plan, apply and history.
    triton, models = demo_triton
    remote, work = tmp_path / "manifests.git", tmp_path / "manifests"
    git(tmp_path, "init", "--quiet", "--bare", "--initial-branch=main", str(remote))
    shutil.copytree(EXAMPLES / "repo", work)
    yaml = YAML()
    server_file = work / "servers" / "local.yaml"
    server = yaml.load(server_file)
    server["spec"].update(
        grpc=triton.grpc_address, metrics=triton.metrics_url, modelRepository=str(models)
    )
    yaml.dump(server, server_file)
    git(work, "init", "--quiet", "--initial-branch=main")
    git(work, "add", "--all")
    git(work, "config", "user.name", "demo")
    git(work, "config", "user.email", "demo@triton-gitops.invalid")
    git(work, "commit", "--quiet", "-m", "Serve echo version 1 on the edge pool")
    git(work, "push", "--quiet", remote.as_uri(), "HEAD:main")
    options = [
        "--repo", remote.as_uri(),
        "--state", str(tmp_path / "state.db"),
        "--cache-dir", str(tmp_path / "cache"),
    ]  # fmt: skip

    validated = run("validate", str(work))
    assert validated.returncode == 0, validated.stdout + validated.stderr
    planned = run("plan", *options)
    assert planned.returncode == 2, planned.stdout + planned.stderr  # 2: there are changes
    assert "load" in planned.stdout and "echo" in planned.stdout, planned.stdout
    applied = run("apply", *options)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert ready_versions(triton, "echo") == {1}
    history = run("history", "--state", str(tmp_path / "state.db"))
    assert history.returncode == 0 and "echo" in history.stdout, history


def test_the_demos_try_it_commands_are_what_the_command_line_takes(tmp_path: Path) -> None:
    """Issue 45, point 1: ``./dev demo --stay`` prints the commands to explore what it left
    up; each ``triton-gitops`` line parses as given (the options belong to its command),
    and the first puts the virtualenv's triton-gitops on the PATH."""
    spec = importlib.util.spec_from_file_location(
        "demo", Path(__file__).resolve().parents[1] / "examples" / "demo.py"
    )
    assert spec is not None and spec.loader is not None
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    options = ["--repo", (tmp_path / "m.git").as_uri(), "--state", str(tmp_path / "state.db")]
    lines = demo.try_it(tmp_path, [*options, "--cache-dir", str(tmp_path / "c")], tmp_path / "w")
    assert lines[0].startswith(f"source {Path(sys.executable).parent / 'activate'}"), lines
    commands = [line.split("#")[0].split() for line in lines if line.startswith("triton-gitops")]
    assert [c[1] for c in commands] == ["status", "plan", "history", "apply"], commands
    for words in commands:
        args = parse_arguments(words[1:], {})
        assert args.state == tmp_path / "state.db", words
