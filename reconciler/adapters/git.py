"""Git adapter: fetch a manifest repository and read its files at one commit (GitPython).

The repository (a URL or a local path) is mirrored into a bare cache repository, so manifests
are always read from a commit's tree, never from a work tree that may be dirty. Credentials in
URLs never appear in errors.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

import git

from reconciler.errors import SourceUnavailable
from reconciler.spec.load import MANIFEST_SUFFIXES

_REFSPECS = [
    "+refs/heads/*:refs/remotes/origin/*",
    "+refs/tags/*:refs/tags/*",
    "+HEAD:refs/remotes/origin/HEAD",
]
_SYMLINK_MODE = 0o120000
_NON_INTERACTIVE = {"GIT_TERMINAL_PROMPT": "0"}
if "GIT_SSH_COMMAND" not in os.environ:
    _NON_INTERACTIVE["GIT_SSH_COMMAND"] = "ssh -o BatchMode=yes"


def redact(url: str) -> str:
    """``url`` with any user:password@ part hidden."""
    return re.sub(r"(?<=://)[^/@]+@", "***@", url)


@dataclass(frozen=True)
class Revision:
    """The manifest files at one commit."""

    sha: str
    files: dict[str, bytes]
    skipped: tuple[str, ...] = ()  # paths passed over (symbolic links), for the report


class GitSource:
    def __init__(self, url: str, cache_dir: Path, fetch_timeout: float = 120.0) -> None:
        self.fetch_timeout = fetch_timeout
        local = Path(url)
        self.url = str(local.resolve()) if "://" not in url and local.exists() else url
        key = hashlib.sha256(self.url.encode()).hexdigest()[:16]
        self.cache = cache_dir / "repos" / key

    def _repo(self) -> git.Repo:
        if (self.cache / "HEAD").exists():
            return git.Repo(self.cache)
        self.cache.mkdir(parents=True, exist_ok=True)
        return git.Repo.init(self.cache, bare=True)

    def _git_error(self, exc: git.GitCommandError) -> str:
        """git's own complaint (its fatal:/error: lines), with credentials hidden."""
        text = str(exc.stderr or "").strip().removeprefix("stderr:").strip().strip("'")
        lines = [line for line in text.splitlines() if line.startswith(("fatal:", "error:"))]
        return redact(" ".join(lines or [text or "git fetch failed"]))

    def fetch(self, ref: str = "HEAD") -> git.Commit:
        """Bring the cache up to date with the remote and resolve ``ref`` to a commit."""
        repo = self._repo()
        try:
            # Never wait for a password prompt; never wait forever for a remote.
            repo.git.fetch(
                "--prune",
                "--no-tags",
                "--quiet",
                self.url,
                *_REFSPECS,
                env=_NON_INTERACTIVE,
                kill_after_timeout=self.fetch_timeout,
            )
        except git.GitCommandError as exc:
            raise SourceUnavailable(
                f"cannot fetch {redact(self.url)}: {self._git_error(exc)}"
            ) from exc
        for candidate in (f"refs/remotes/origin/{ref}", f"refs/tags/{ref}", ref):
            try:
                return repo.commit(candidate)
            except (git.BadName, ValueError, git.GitCommandError):
                continue
        raise SourceUnavailable(f"{redact(self.url)} has no branch, tag or commit {ref!r}")

    def read(self, commit: git.Commit, path: str = "") -> Revision:
        """Manifest files under ``path`` in ``commit``'s tree, by their path in the repository."""
        tree = commit.tree
        prefix = path.strip("/")
        if prefix:
            try:
                tree = tree / prefix
            except KeyError as exc:
                raise SourceUnavailable(
                    f"{redact(self.url)} has no folder {prefix!r} at {commit.hexsha}"
                ) from exc
        files: dict[str, bytes] = {}
        skipped: list[str] = []
        for item in tree.traverse():
            if not isinstance(item, git.Blob):
                continue
            name = str(item.path)
            if not name.endswith(MANIFEST_SUFFIXES):
                continue
            if item.mode == _SYMLINK_MODE:
                # A link could point anywhere, outside the repository included: never follow.
                skipped.append(name)
                continue
            files[name] = item.data_stream.read()
        return Revision(commit.hexsha, files, tuple(skipped))

    def revision(self, ref: str = "HEAD", path: str = "") -> Revision:
        return self.read(self.fetch(ref), path)
