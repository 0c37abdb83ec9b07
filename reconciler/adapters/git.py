"""Git adapter: fetch a manifest repository and read its files at one commit (GitPython).

The repository (a URL or a local path) is mirrored into a bare cache repository, so manifests
are always read from a commit's tree, never from a work tree that may be dirty. Credentials in
URLs never appear in errors.
"""

from __future__ import annotations

import hashlib
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
    def __init__(self, url: str, cache_dir: Path) -> None:
        local = Path(url)
        self.url = str(local.resolve()) if "://" not in url and local.exists() else url
        key = hashlib.sha256(self.url.encode()).hexdigest()[:16]
        self.cache = cache_dir / "repos" / key

    def _repo(self) -> git.Repo:
        if (self.cache / "HEAD").exists():
            return git.Repo(self.cache)
        self.cache.mkdir(parents=True, exist_ok=True)
        return git.Repo.init(self.cache, bare=True)

    def fetch(self, ref: str = "HEAD") -> git.Commit:
        """Bring the cache up to date with the remote and resolve ``ref`` to a commit."""
        repo = self._repo()
        try:
            repo.git.fetch("--prune", "--no-tags", "--quiet", self.url, *_REFSPECS)
        except git.GitCommandError as exc:
            detail = (exc.stderr or "").strip().replace(self.url, redact(self.url))
            raise SourceUnavailable(
                f"cannot fetch {redact(self.url)}: {detail or 'git fetch failed'}"
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
