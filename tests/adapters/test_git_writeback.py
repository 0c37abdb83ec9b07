"""The revert write-back against real Git: retries when the branch moves, never forces."""

from __future__ import annotations

from pathlib import Path

import git as gitpython
import pytest

from reconciler.adapters.git import GitWriter
from reconciler.core.spec.desired import load_desired_state
from reconciler.model.source import RevertEdit
from testkit.manifests import ManifestRepo, git

SERVERS = """\
apiVersion: triton-gitops/v1alpha1
kind: TritonServer
metadata: {name: edge-a}
spec: {grpc: "127.0.0.1:8001", modelRepository: /models}
"""

ECHO = """\
# echo, as the team wrote it
apiVersion: triton-gitops/v1alpha1
kind: ModelDeployment
metadata:
  name: echo
spec:
  servers: {names: [edge-a]}
  versions: [{version}]  # bumped by the release job
"""


def _fingerprint(text: str) -> str:
    state = load_desired_state({"servers.yaml": SERVERS.encode(), "echo.yaml": text.encode()})
    return state.deployments["echo"].fingerprint


def _setup(manifests: ManifestRepo) -> str:
    manifests.write("servers.yaml", SERVERS)
    manifests.write("echo.yaml", ECHO.replace("{version}", "2"))
    manifests.commit("echo 2")
    return _fingerprint(ECHO.replace("{version}", "2"))


def _someone_pushes(manifests: ManifestRepo, path: str, text: str) -> None:
    other = manifests.work.parent / "other-clone"
    if not other.exists():
        git(manifests.work.parent, "clone", "--quiet", str(manifests.bare), str(other))
        git(other, "config", "user.email", "other@triton-gitops.invalid")
        git(other, "config", "user.name", "someone else")
    git(other, "pull", "--quiet", "origin", "main")
    (other / path).write_text(text)
    git(other, "add", "--all")
    git(other, "commit", "--quiet", "-m", f"someone else changes {path}")
    git(other, "push", "--quiet", "origin", "HEAD:main")


def test_revert_lands_on_top_of_a_branch_that_moved(
    manifests: ManifestRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    failed = _setup(manifests)
    writer = GitWriter(manifests.url, tmp_path / "cache", "bot <bot@triton-gitops.invalid>")
    checkout = GitWriter._checkout
    moves = []

    def checkout_then_race(self: GitWriter, branch: str) -> gitpython.Repo:
        repo = checkout(self, branch)
        if not moves:  # between our checkout and our push, an unrelated commit lands
            moves.append(True)
            _someone_pushes(manifests, "README.md", "unrelated\n")
        return repo

    monkeypatch.setattr(GitWriter, "_checkout", checkout_then_race)
    edit = RevertEdit("echo", "echo.yaml", failed, (1,), None)
    pushed = writer.push_revert("main", (edit,), "Revert echo")
    assert pushed is not None and pushed.deployments == ("echo",)
    log = git(manifests.bare, "log", "--format=%s", "main").splitlines()
    assert log[:2] == ["Revert echo", "someone else changes README.md"]  # on top, not forced
    restored = git(manifests.bare, "show", "main:echo.yaml")
    assert restored == ECHO.replace("{version}", "1").rstrip("\n")
    assert git(manifests.bare, "show", "main:README.md") == "unrelated"


def test_revert_is_dropped_when_someone_changed_the_deployment_meanwhile(
    manifests: ManifestRepo, tmp_path: Path
) -> None:
    failed = _setup(manifests)
    _someone_pushes(manifests, "echo.yaml", ECHO.replace("{version}", "3"))
    writer = GitWriter(manifests.url, tmp_path / "cache", "bot <bot@triton-gitops.invalid>")
    edit = RevertEdit("echo", "echo.yaml", failed, (1,), None)
    assert writer.push_revert("main", (edit,), "Revert echo") is None
    assert "versions: [3]" in git(manifests.bare, "show", "main:echo.yaml")


def test_branch_mode_and_default_branch(manifests: ManifestRepo, tmp_path: Path) -> None:
    failed = _setup(manifests)
    writer = GitWriter(manifests.url, tmp_path / "cache", "bot <bot@triton-gitops.invalid>")
    assert writer.tracked_branch("HEAD") == "main"
    edit = RevertEdit("echo", "echo.yaml", failed, (1,), None)
    pushed = writer.push_revert("main", (edit,), "Revert echo", "triton-gitops/revert-x")
    assert pushed is not None and pushed.branch == "triton-gitops/revert-x"
    assert "versions: [2]" in git(manifests.bare, "show", "main:echo.yaml")
    assert "versions: [1]" in git(manifests.bare, "show", "triton-gitops/revert-x:echo.yaml")
    author = git(manifests.bare, "log", "-1", "--format=%an <%ae>", "triton-gitops/revert-x")
    assert author == "bot <bot@triton-gitops.invalid>"
