"""The Git mirror and the write-back's work tree shared by several users at once, as the
service's pass, an ``undo`` through it and a one-shot ``undo`` on the same cache share them:
real git, real file locks, threads standing for the processes (``flock`` locks an open file,
so two opens in one process exclude each other as two processes do)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from reconciler.adapters import git as git_adapter
from reconciler.adapters.git import GitSource, GitWriter
from reconciler.core.spec.desired import load_desired_state
from reconciler.model.source import RevertEdit
from testkit.manifests import ManifestRepo, git

SERVERS = """\
apiVersion: triton-gitops/v1alpha1
kind: TritonServer
metadata: {name: edge-a}
spec: {grpc: "127.0.0.1:8001", modelRepository: /models}
"""


def _deployment(name: str, version: int) -> str:
    return (
        "apiVersion: triton-gitops/v1alpha1\nkind: ModelDeployment\n"
        f"metadata: {{name: {name}}}\n"
        f"spec:\n  servers: {{names: [edge-a]}}\n  versions: [{version}]\n"
    )


def _all_at_once(count: int, work: Callable[[int], None]) -> list[BaseException]:
    """Run ``work(0..count-1)`` on as many threads, started together; what each raised."""
    errors: list[BaseException] = []
    start = threading.Barrier(count)

    def one(index: int) -> None:
        start.wait()
        try:
            work(index)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    return errors


def test_fetches_into_one_mirror_at_once_all_succeed_while_the_branch_moves(
    manifests: ManifestRepo, tmp_path: Path
) -> None:
    manifests.write("servers.yaml", SERVERS)
    manifests.commit("servers")
    cache = tmp_path / "cache"
    pushed: list[str] = []

    def work(index: int) -> None:
        if index == 0:  # the author, pushing while the others fetch
            for n in range(8):
                manifests.write("README.md", f"change {n}\n")
                pushed.append(manifests.commit(f"change {n}"))
            return
        source = GitSource(manifests.url, cache)  # each its own, as each process has
        for _ in range(6):
            source.fetch("main")

    assert _all_at_once(6, work) == []
    # The mirror is whole afterwards: it resolves the last push.
    assert GitSource(manifests.url, cache).fetch("main").hexsha == pushed[-1]


def test_two_writers_sharing_a_work_tree_both_land_one_on_top_of_the_other(
    manifests: ManifestRepo, tmp_path: Path
) -> None:
    manifests.write("servers.yaml", SERVERS)
    for name in ("echo", "other"):
        manifests.write(f"{name}.yaml", _deployment(name, 2))
    manifests.commit("echo 2, other 2")
    files = {"servers.yaml": SERVERS.encode()}
    files |= {f"{n}.yaml": _deployment(n, 2).encode() for n in ("echo", "other")}
    fingerprints = {n: d.fingerprint for n, d in load_desired_state(files).deployments.items()}
    cache = tmp_path / "cache"
    names = ("echo", "other")

    def work(index: int) -> None:
        name = names[index]
        writer = GitWriter(manifests.url, cache, "bot <bot@triton-gitops.invalid>")
        edit = RevertEdit(name, f"{name}.yaml", fingerprints[name], (1,), None)
        assert writer.push_revert("main", (edit,), f"Revert {name}") is not None

    assert _all_at_once(2, work) == []
    log = git(manifests.bare, "log", "--format=%s", "main").splitlines()
    assert sorted(log[:2]) == ["Revert echo", "Revert other"]  # both, neither forced over
    assert log[2] == "echo 2, other 2"
    for name in names:
        assert "versions: [1]" in git(manifests.bare, "show", f"main:{name}.yaml")


def test_the_mirror_lock_is_what_keeps_them_apart(
    manifests: ManifestRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first test's lock is held: a fetch waits for a holder in another open, and goes
    on when it lets go (so the test above passes because of the lock, not by luck)."""
    manifests.write("servers.yaml", SERVERS)
    head = manifests.commit("servers")
    cache = tmp_path / "cache"
    source = GitSource(manifests.url, cache)
    source.fetch("main")
    fetched = threading.Event()

    def fetch() -> None:
        source.fetch("main")
        fetched.set()

    with git_adapter._exclusive(source.cache.with_name(source.cache.name + ".lock")):
        thread = threading.Thread(target=fetch)
        thread.start()
        assert not fetched.wait(1.0)  # waits for the holder
    assert fetched.wait(30)
    thread.join(30)
    assert source.fetch("main").hexsha == head
