"""The Git adapter against real repositories: refs, folders, links, a vanished remote."""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from reconciler.adapters.git import GitSource
from reconciler.core.spec.yaml import UnreadFile
from reconciler.credentials import redact
from reconciler.model.errors import SourceUnavailable
from reconciler.model.settings import Settings
from reconciler.model.source import Source
from reconciler.wiring import ports
from testkit.manifests import ManifestRepo, git


def test_reads_branch_tag_and_commit(manifests: ManifestRepo, tmp_path: Path) -> None:
    manifests.write("a.yaml", "one: 1\n")
    first = manifests.commit("first")
    git(manifests.work, "tag", "v1")
    git(manifests.work, "push", "--quiet", "origin", "v1")
    manifests.write("a.yaml", "one: 2\n")
    manifests.write("notes.txt", "not a manifest\n")
    second = manifests.commit("second")

    source = GitSource(manifests.url, tmp_path / "cache")
    head = source.revision()
    assert head.sha == second
    assert head.files == {"a.yaml": b"one: 2\n"}
    assert source.revision("main").sha == second
    assert source.revision("v1").files == {"a.yaml": b"one: 1\n"}
    assert source.revision(first).sha == first
    with pytest.raises(SourceUnavailable, match="no branch, tag or commit 'nope'"):
        source.revision("nope")


def test_reads_a_folder_and_never_follows_links(manifests: ManifestRepo, tmp_path: Path) -> None:
    manifests.write("deploy/prod/a.yml", "a: 1\n")
    manifests.write("deploy/staging/b.yaml", "b: 1\n")
    manifests.write("other/c.yaml", "c: 1\n")
    (manifests.work / "deploy" / "prod" / "escape.yaml").symlink_to("/etc/passwd")
    manifests.commit("layout")
    revision = GitSource(manifests.url, tmp_path / "cache").revision(path="deploy/prod")
    assert revision.files == {"deploy/prod/a.yml": b"a: 1\n", "deploy/prod/escape.yaml": b""}
    link = revision.files["deploy/prod/escape.yaml"]
    assert isinstance(link, UnreadFile) and "(to '/etc/passwd')" in link.why  # refused by name
    with pytest.raises(SourceUnavailable, match="no folder 'missing'"):
        GitSource(manifests.url, tmp_path / "cache").revision(path="missing")


def test_local_path_reads_commits_not_the_dirty_work_tree(
    manifests: ManifestRepo, tmp_path: Path
) -> None:
    manifests.write("a.yaml", "committed: true\n")
    sha = manifests.commit("committed")
    (manifests.work / "a.yaml").write_text("committed: false\n")  # dirty, never read
    revision = GitSource(str(manifests.work), tmp_path / "cache").revision()
    assert revision.sha == sha
    assert revision.files == {"a.yaml": b"committed: true\n"}


def test_a_named_ref_is_read_from_a_remote_whose_head_dangles(
    manifests: ManifestRepo, tmp_path: Path
) -> None:
    """`git init --bare` leaves HEAD naming `master`; a user pushes `main` and asks for it."""
    manifests.write("a.yaml", "a: 1\n")
    sha = manifests.commit("first")
    git(manifests.bare, "symbolic-ref", "HEAD", "refs/heads/master")  # master never existed
    source = GitSource(manifests.url, tmp_path / "cache")
    assert source.revision("main").sha == sha
    assert source.revision(sha).sha == sha
    # With no ref named, the remote's HEAD is what was asked for: its absence is the error.
    with pytest.raises(SourceUnavailable, match=r"cannot fetch .*HEAD"):
        source.revision()


def test_vanished_remote_is_a_clear_error(manifests: ManifestRepo, tmp_path: Path) -> None:
    manifests.write("a.yaml", "a: 1\n")
    manifests.commit("first")
    source = GitSource(manifests.url, tmp_path / "cache")
    assert source.revision().files
    shutil.rmtree(manifests.bare)
    with pytest.raises(SourceUnavailable, match="cannot fetch"):
        source.revision()


def test_a_folder_inside_a_work_tree_says_which_repo_and_path_to_give(tmp_path: Path) -> None:
    """Issue 45, point 1: a newcomer's first try, ``plan --repo examples/repo``, names a
    folder of a work tree, not a repository: the error says what to give instead. A folder
    that is in no work tree gets git's complaint alone."""
    work = tmp_path / "work"
    (work / "examples" / "repo").mkdir(parents=True)
    git(work, "init", "--quiet")
    with pytest.raises(SourceUnavailable) as caught:
        GitSource(str(work / "examples" / "repo"), tmp_path / "cache").revision()
    said = str(caught.value)
    assert "does not appear to be a git repository" in said, said
    assert f"give the repository and the folder in it, --repo {work.resolve()} --path " in said
    assert said.rstrip().endswith("not from the files on disk)"), said
    assert "examples/repo" in said.split("--path", 1)[1], said
    alone = tmp_path / "alone"
    alone.mkdir()
    with pytest.raises(SourceUnavailable) as caught:
        GitSource(str(alone), tmp_path / "cache2").revision()
    assert "--path" not in str(caught.value), caught.value


def test_credentials_never_appear_in_errors(tmp_path: Path) -> None:
    url = "https://user:s3cr3t-token@127.0.0.1:9/nothing.git"
    assert redact(url) == "https://***@127.0.0.1:9/nothing.git"
    with pytest.raises(SourceUnavailable) as caught:
        GitSource(url, tmp_path / "cache").revision()
    assert "s3cr3t-token" not in str(caught.value)
    assert "***@127.0.0.1:9" in str(caught.value)


def test_reads_only_what_the_manifest_selection_selects(
    manifests: ManifestRepo, tmp_path: Path
) -> None:
    # The rule validate applies to a folder (core/spec/selection.py), on a commit's tree.
    for name in (
        ".gitlab-ci.yml",
        ".github/workflows/ci.yml",
        "deploy/prod/a.yaml",
        "deploy/prod/.hidden.yaml",
        "deploy/prod/charts/t.yaml",
        "deploy/prod/gen/x.generated.yaml",
        "deploy/prod/gen/keep.generated.yaml",
        "deploy/staging/b.yaml",
    ):
        manifests.write(name, "a: 1\n")
    manifests.write(".sourceignore", "charts/\n*.generated.yaml\n")
    manifests.write("deploy/prod/.sourceignore", "!keep.generated.yaml\n")
    manifests.commit("a repository with other tools' files")

    revision = GitSource(manifests.url, tmp_path / "cache").revision(path="deploy/prod")

    assert sorted(revision.files) == ["deploy/prod/a.yaml", "deploy/prod/gen/keep.generated.yaml"]


def cat_file_processes() -> set[int]:
    """This process's `git cat-file` children: GitPython reads objects through two per
    repository it opened, each with three pipes to this process."""
    found = subprocess.run(
        ["pgrep", "-P", str(os.getpid()), "-f", "git cat-file"], capture_output=True, text=True
    )
    return {int(pid) for pid in found.stdout.split()}


@contextmanager
def collector_off() -> Iterator[None]:
    """No garbage collection meanwhile: it, not the adapter, used to end those processes."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def test_a_passs_git_processes_end_with_its_ports_not_with_the_collector(
    manifests: ManifestRepo, tmp_path: Path
) -> None:
    manifests.write("a.yaml", "one: 1\n")
    manifests.commit("first")
    settings, source = Settings(tmp_path / "cache", tmp_path / "state.db"), Source(manifests.url)
    before = cat_file_processes()
    with collector_off():
        for n in range(3):  # a service's passes, each with the ports wiring builds for it
            with ports(settings, source) as pass_ports:
                sha = pass_ports.manifests.fetch("HEAD")
                assert pass_ports.manifests.read(sha, "").files == {"a.yaml": b"one: 1\n"}
                reading = cat_file_processes() - before
                # The check below could not fail if nothing started them.
                assert reading, "GitPython read the commit without a cat-file process"
            left = cat_file_processes() - before
            assert not left, f"pass {n}: {len(left)} git cat-file process(es) left after it"


def test_a_source_keeps_one_mirror_repository_and_reads_again_after_close(
    manifests: ManifestRepo, tmp_path: Path
) -> None:
    manifests.write("a.yaml", "one: 1\n")
    manifests.commit("first")
    source = GitSource(manifests.url, tmp_path / "cache")
    before = cat_file_processes()
    with collector_off():
        for _ in range(3):
            assert source.revision().files == {"a.yaml": b"one: 1\n"}
        started = cat_file_processes() - before
        # One Repo for the three fetches: its two readers, not six.
        assert len(started) == 2, f"{len(started)} cat-file processes for one mirror"
        source.close()
        assert not cat_file_processes() - before
        assert source.revision().files == {"a.yaml": b"one: 1\n"}  # opened again
        source.close()
