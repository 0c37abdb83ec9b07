"""Git adapter: fetch a manifest repository and read its files at one commit (GitPython).

The repository (a URL or a local path) is mirrored into a bare cache repository, so manifests
are always read from a commit's tree, never from a work tree that may be dirty. Credentials in
URLs never appear in errors.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import git

from reconciler.adapters.signatures import (
    CommitVerifier,
    approvals,
    commits_to_verify,
    has_commit,
    is_fast_forward,
)
from reconciler.core.spec.edit import restore_deployment, restore_spec
from reconciler.core.spec.selection import (
    MAX_SOURCE_IGNORE_BYTES,
    SOURCE_IGNORE,
    ManifestSelection,
    ignore_text,
)
from reconciler.core.spec.shadow import MAX_SHADOW_FILE_BYTES
from reconciler.core.spec.yaml import MAX_MANIFEST_BYTES, UnreadFile
from reconciler.credentials import redact
from reconciler.faults import fault_point
from reconciler.model.errors import SourceUnavailable
from reconciler.model.source import (
    CommitVerdict,
    GitCredentials,
    PushedRevert,
    RevertEdit,
    Revision,
    SignaturePolicy,
)

_REFSPECS = [
    "+refs/heads/*:refs/remotes/origin/*",
    "+refs/tags/*:refs/tags/*",
]
# The remote's HEAD is fetched only when no ref is named: a bare repository made by
# `git init --bare` and pushed a `main` has a HEAD that names a `master` that does not exist,
# and asking for it fails the whole fetch ("couldn't find remote ref HEAD").
_HEAD_REFSPEC = "+HEAD:refs/remotes/origin/HEAD"
_SYMLINK_MODE = 0o120000
_NON_INTERACTIVE = {"GIT_TERMINAL_PROMPT": "0"}


if "GIT_SSH_COMMAND" not in os.environ:
    _NON_INTERACTIVE["GIT_SSH_COMMAND"] = "ssh -o BatchMode=yes"


def git_error(exc: git.GitCommandError) -> str:
    """git's own complaint (its fatal:/error: lines), with credentials hidden."""
    text = str(exc.stderr or "").strip().removeprefix("stderr:").strip().strip("'")
    stopped = re.search(r"did not complete in (\S+) secs", text)
    if stopped:  # GitPython's kill_after_timeout: a remote that accepts and then stalls
        return f"no answer within {stopped.group(1)}s, the fetch was stopped (--fetch-timeout)"
    lines = [line for line in text.splitlines() if line.startswith(("fatal:", "error:"))]
    return redact(" ".join(lines or [text or "git failed"]))


def inside_work_tree(url: str) -> str:
    """For a local folder that is no repository but lies inside one's work tree (the first
    try of many: ``--repo examples/repo``), what to give instead; else nothing."""
    path = Path(url.removeprefix("file://")).expanduser()
    if "://" in url.removeprefix("file://") or not path.is_dir() or (path / ".git").exists():
        return ""
    relative = path_in_work_tree(path)
    if not relative:
        return ""
    root = path.resolve().parents[len(Path(relative).parts) - 1]
    return (
        f"{url} is a folder inside the Git work tree {root}: give the repository and the "
        f"folder in it, --repo {root} --path {relative} (the manifests are read from its "
        "commits, not from the files on disk)"
    )


@contextlib.contextmanager
def _exclusive(lock_file: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``lock_file`` (made if missing) while the block runs."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with lock_file.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def path_in_work_tree(path: Path) -> str:
    """``path`` relative to the top of the Git work tree holding it ('' outside one), so
    reports can name files as the repository does (GitHub annotations need that)."""
    try:
        repo = git.Repo(path, search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        return ""
    top = repo.working_tree_dir
    if top is None:
        return ""
    relative = path.resolve().relative_to(Path(top).resolve()).as_posix()
    return "" if relative == "." else relative


def folder_in_repository(repo: str, folder: Path) -> str | None:
    """``folder``'s path in the local repository ``repo`` ('' for its top), to read what it
    held at another commit; None when ``repo`` is no local checkout or ``folder`` is not in
    its work tree."""
    if "://" in repo or not Path(repo).exists():
        return None
    try:
        top = git.Repo(repo, search_parent_directories=True).working_tree_dir
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        return None
    if top is None:
        return None
    try:
        relative = folder.resolve().relative_to(Path(top).resolve()).as_posix()
    except ValueError:
        return None
    return "" if relative == "." else relative


class GitSource:
    def __init__(
        self,
        url: str,
        cache_dir: Path,
        fetch_timeout: float = 120.0,
        credentials: GitCredentials | None = None,
    ) -> None:
        self.fetch_timeout = fetch_timeout
        self.env = (credentials or GitCredentials()).env(_NON_INTERACTIVE)
        local = Path(url)
        self.url = str(local.resolve()) if "://" not in url and local.exists() else url
        key = hashlib.sha256(self.url.encode()).hexdigest()[:16]
        self.cache = cache_dir / "repos" / key
        # The repositories this source opened, closed together by ``close``. GitPython reads
        # objects through two `git cat-file` processes per Repo (six pipes to this process)
        # that end only when the Repo is closed or the garbage collector breaks its reference
        # cycles: a Repo per pass, left to the collector, kept a test process at 399 pipes
        # and 132 cat-file processes.
        self._opened: list[git.Repo] = []
        self._mirror: git.Repo | None = None  # one per source: its cat-file processes reused

    def _open(self, path: Path | str, search_parent_directories: bool = False) -> git.Repo:
        repo = git.Repo(path, search_parent_directories=search_parent_directories)
        self._opened.append(repo)
        return repo

    def close(self) -> None:
        """End the git processes of every repository this source opened. The commits it
        gave can still be read: GitPython starts their processes again."""
        opened, self._opened, self._mirror = self._opened, [], None
        for repo in opened:
            repo.close()

    def _repo(self) -> git.Repo:
        if (self.cache / "HEAD").exists():
            if self._mirror is None:
                self._mirror = self._open(self.cache)
            return self._mirror
        # Made once, by whoever comes first: two `git init`s into one directory fail on each
        # other's files, and one still running looks made (HEAD) to a reader. So the mirror
        # is made beside it, under the mirror's lock, and renamed into place whole.
        with _exclusive(self._lock_file):
            if not (self.cache / "HEAD").exists():
                making = self.cache.with_name(self.cache.name + ".making")
                shutil.rmtree(making, ignore_errors=True)  # left by a process killed here
                git.Repo.init(making, bare=True)
                shutil.rmtree(self.cache, ignore_errors=True)  # an empty or broken one
                making.rename(self.cache)
        self._mirror = self._open(self.cache)
        return self._mirror

    @property
    def _lock_file(self) -> Path:
        """The mirror's lock: one writer (a fetch, its making) at a time."""
        return self.cache.with_name(self.cache.name + ".lock")

    def fetch(self, ref: str = "HEAD") -> git.Commit:
        """Bring the cache up to date with the remote and resolve ``ref`` to a commit."""
        repo = self._repo()
        try:
            # Never wait for a password prompt; never wait forever for a remote. One fetch at
            # a time into the mirror: two would fail on each other's ref locks (the service's
            # pass and an undo through it share it).
            with _exclusive(self._lock_file):
                repo.git.fetch(
                    "--prune",
                    "--no-tags",
                    "--quiet",
                    self.url,
                    *_REFSPECS,
                    *([_HEAD_REFSPEC] if ref == "HEAD" else []),
                    env=self.env,
                    kill_after_timeout=self.fetch_timeout,
                )
        except git.GitCommandError as exc:
            said, hint = git_error(exc), inside_work_tree(self.url)
            said = f"{said.rstrip('.')}. {hint}" if hint else said
            raise SourceUnavailable(f"cannot fetch {redact(self.url)}: {said}") from exc
        for candidate in (f"refs/remotes/origin/{ref}", f"refs/tags/{ref}", ref):
            try:
                return repo.commit(candidate)
            except (git.BadName, ValueError, git.GitCommandError):
                continue
        raise SourceUnavailable(f"{redact(self.url)} has no branch, tag or commit {ref!r}")

    def resolve_in_place(self, ref: str) -> git.Commit:
        """``ref`` resolved in the local repository itself, as git there would (origin/main,
        HEAD, a branch or a SHA), without mirroring: for reviews in a CI checkout."""
        try:
            return self._open(self.url, search_parent_directories=True).commit(ref)
        except (git.InvalidGitRepositoryError, git.NoSuchPathError) as exc:
            raise SourceUnavailable(f"{redact(self.url)} is not a Git repository") from exc
        except (git.BadName, ValueError, git.GitCommandError) as exc:
            raise SourceUnavailable(f"{redact(self.url)} has no commit {ref!r}") from exc

    def read(self, commit: git.Commit, path: str = "") -> Revision:
        """The manifests under ``path`` in ``commit``'s tree (core/spec/selection.py says
        which files are), by their path in the repository."""
        tree = commit.tree
        prefix = path.strip("/")
        selection = ManifestSelection(
            prefix,
            ignore_text(self.read_file(commit, SOURCE_IGNORE, MAX_SOURCE_IGNORE_BYTES)),
            ignore_text(
                self.read_file(commit, f"{prefix}/{SOURCE_IGNORE}", MAX_SOURCE_IGNORE_BYTES)
            )
            if prefix
            else None,
        )
        if prefix:
            try:
                tree = tree / prefix
            except KeyError as exc:
                raise SourceUnavailable(
                    f"{redact(self.url)} has no folder {prefix!r} at {commit.hexsha}"
                ) from exc
        files: dict[str, bytes] = {}
        for item in tree.traverse():
            if not isinstance(item, git.Blob):
                continue
            name = str(item.path)
            if not selection.selects(name):
                continue
            if item.mode == _SYMLINK_MODE:
                # A link could point anywhere, outside the repository included: never follow.
                files[name] = UnreadFile.link(item.data_stream.read().decode(errors="replace"))
            elif item.size > MAX_MANIFEST_BYTES:
                files[name] = UnreadFile.too_large()  # never read: a huge blob stays on disk
            else:
                files[name] = item.data_stream.read()
        return Revision(commit.hexsha, files)

    def read_file(
        self, commit: git.Commit, path: str, limit: int = MAX_SHADOW_FILE_BYTES
    ) -> bytes | None:
        """One regular file of ``commit`` (None when it is absent, a link or too large)."""
        try:
            blob = commit.tree / path.strip("/")
        except KeyError:
            return None
        if not isinstance(blob, git.Blob) or blob.mode == _SYMLINK_MODE or blob.size > limit:
            return None
        return bytes(blob.data_stream.read())

    def revision(self, ref: str = "HEAD", path: str = "") -> Revision:
        return self.read(self.fetch(ref), path)


class GitManifests:
    """The manifest repository as the pass sees it (``ports.ManifestSource`` and
    ``ports.CommitChecks``): commits named by their sha, and the mirror's commit checks for
    the approval phase. Built by ``wiring``.

    The commits it resolved are kept by sha, so reading one after its fetch reuses the
    commit object (and the git processes of its repository) as a direct call would.
    ``in_place``: resolve refs in the local repository itself instead of mirroring it (a
    review in a CI checkout, see ``GitSource.resolve_in_place``).
    """

    def __init__(self, source: GitSource, keyring_home: Path, *, in_place: bool = False) -> None:
        self.source = source
        self.keyring_home = keyring_home
        self.in_place = in_place
        self.location = redact(source.url)
        self._commits: dict[str, git.Commit] = {}

    def close(self) -> None:
        """End the mirror's git processes (``GitSource.close``); a pass closes its manifests
        when it ends."""
        self._commits = {}
        self.source.close()

    def fetch(self, ref: str) -> str:
        commit = self.source.resolve_in_place(ref) if self.in_place else self.source.fetch(ref)
        self._commits = {commit.hexsha: commit}  # only the newest: a long service keeps one
        return str(commit.hexsha)

    def _commit(self, revision: str) -> git.Commit:
        found = self._commits.get(revision)
        if found is not None:
            return found
        try:
            return self.source._repo().commit(revision)
        except ValueError as exc:  # GitPython's answer for a sha the mirror does not have
            raise SourceUnavailable(
                f"{redact(self.source.url)} has no commit {revision[:12]} (rewritten away?)"
            ) from exc

    def read(self, revision: str, path: str) -> Revision:
        return self.source.read(self._commit(revision), path)

    def read_file(self, revision: str, path: str) -> bytes | None:
        return self.source.read_file(self._commit(revision), path)

    def is_fast_forward(self, old: str, new: str) -> bool:
        return is_fast_forward(self.source.cache, old, new)

    def has_commit(self, sha: str) -> bool:
        return has_commit(self.source.cache, sha)

    def signature_verdicts(
        self, trusted_keys: Path, policy: SignaturePolicy, old: str | None, new: str
    ) -> list[CommitVerdict]:
        # A verifier per check: it rebuilds its keyring from the folder each time, so a key
        # removed from the folder stops being trusted at the next pass.
        verifier = CommitVerifier(trusted_keys, self.keyring_home)
        mirror = self.source.cache
        return verifier.verify(mirror, commits_to_verify(mirror, policy, old, new))

    def approvals(self, revision: str, trailer: str) -> list[str]:
        return approvals(self.source.cache, revision, trailer)


class GitWriter:
    """Commits to the manifest repository: the revert write-back. Never force-pushes."""

    def __init__(
        self,
        url: str,
        cache_dir: Path,
        author: str,
        fetch_timeout: float = 120.0,
        credentials: GitCredentials | None = None,
    ) -> None:
        self.source = GitSource(url, cache_dir, fetch_timeout, credentials)
        self.url = self.source.url
        self.workdir = cache_dir / "worktrees" / self.source.cache.name
        name, _, email = author.partition("<")
        self.author = git.Actor(name.strip() or "triton-gitops", email.rstrip(">").strip())

    def tracked_branch(self, ref: str) -> str:
        """The branch ``ref`` names; HEAD resolves to the remote's default branch."""
        if ref != "HEAD":
            return ref.removeprefix("refs/heads/")
        try:
            answer = git.Git().ls_remote("--symref", self.url, "HEAD", env=self.source.env)
        except git.GitCommandError as exc:
            raise SourceUnavailable(f"cannot read {redact(self.url)}: {git_error(exc)}") from exc
        match = re.search(r"ref: refs/heads/(\S+)\s+HEAD", str(answer))
        if match is None:
            raise SourceUnavailable(f"{redact(self.url)} has no default branch")
        return match.group(1)

    def _fetch(self, repo: git.Repo, branch: str) -> None:
        repo.git.fetch(
            "--quiet",
            self.url,
            f"+refs/heads/{branch}:refs/remotes/origin/{branch}",
            env=self.source.env,
            kill_after_timeout=self.source.fetch_timeout,
        )

    def _checkout(self, branch: str) -> git.Repo:
        if (self.workdir / ".git").exists():
            repo = git.Repo(self.workdir)
        else:
            self.workdir.mkdir(parents=True, exist_ok=True)
            repo = git.Repo.init(self.workdir)
        # The URL is given to each fetch and push, never saved as a remote: a remote would
        # write any user:password@ in it to .git/config on disk.
        if any(remote.name == "origin" for remote in repo.remotes):
            repo.delete_remote(repo.remote("origin"))  # left by an older version
        try:
            self._fetch(repo, branch)
        except git.GitCommandError as exc:
            raise SourceUnavailable(f"cannot fetch {redact(self.url)}: {git_error(exc)}") from exc
        repo.git.checkout("--quiet", "--force", "-B", "triton-gitops-writeback", f"origin/{branch}")
        repo.git.clean("-fdq")
        return repo

    def _pushed_before(
        self, repo: git.Repo, branch: str, target: str, reverted: str | None
    ) -> str | None:
        """The commit on ``target`` (since ``reverted``) whose trailer reverts ``reverted``."""
        if reverted is None:
            return None
        if target != branch:
            try:
                self._fetch(repo, target)
            except git.GitCommandError:
                return None  # no such branch yet: nothing was pushed to it
        try:
            found = repo.git.log(
                "--format=%H",
                "--fixed-strings",
                f"--grep=Reverted-revision: {reverted}",
                f"{reverted}..origin/{target}",
            )
        except git.GitCommandError:
            return None  # the reverted revision is not in the branch's history
        return found.split()[0] if found.strip() else None

    def push_revert(
        self,
        branch: str,
        edits: tuple[RevertEdit, ...],
        message: str,
        target_branch: str | None = None,
        attempts: int = 5,
        reverted: str | None = None,
    ) -> PushedRevert | None:
        """Commit ``edits`` on top of ``branch`` and push to ``target_branch`` (default: the
        same branch). If the branch moved meanwhile, fetch, re-check and retry. None when every
        edit was overtaken by someone else's change (nothing to revert any more).

        ``reverted``: the revision the commit reverts. When ``target_branch`` already holds a
        commit with its ``Reverted-revision:`` trailer (a reconciler killed after its push, before
        recording it), that commit is the answer and nothing is pushed again.

        One writer at a time per work tree (a file lock): the service's revert write-back and
        an ``undo`` through it, or a one-shot undo sharing its cache, never check out over
        each other's commit."""
        with _exclusive(self.workdir.with_name(self.workdir.name + ".lock")):
            target = target_branch or branch
            for _ in range(attempts):
                # Closed after each attempt: its git processes end with it (GitSource).
                with self._checkout(branch) as repo:
                    earlier = self._pushed_before(repo, branch, target, reverted)
                    if earlier is not None:
                        return PushedRevert(target, earlier, tuple(e.deployment for e in edits), ())
                    done, skipped = [], []
                    for edit in edits:
                        path = self.workdir / edit.file
                        text = path.read_text() if path.is_file() else ""
                        restored = (
                            restore_deployment(
                                text,
                                edit.deployment,
                                edit.failed_fingerprint,
                                edit.versions,
                                edit.config,
                            )
                            if edit.spec is None
                            else restore_spec(
                                text, edit.deployment, edit.failed_fingerprint, edit.spec
                            )
                        )
                        if restored is None:
                            skipped.append(edit.deployment)
                            continue
                        path.write_text(restored)
                        repo.index.add([edit.file])
                        done.append(edit.deployment)
                    if not done:
                        return None
                    commit = repo.index.commit(message, author=self.author, committer=self.author)
                    fault_point("git.push.before")
                    try:
                        repo.git.push(
                            "--quiet",
                            self.url,
                            f"HEAD:refs/heads/{target}",
                            env=self.source.env,
                            kill_after_timeout=self.source.fetch_timeout,
                        )
                    except git.GitCommandError as exc:
                        if "rejected" in str(exc.stderr) or "non-fast-forward" in str(exc.stderr):
                            continue  # the branch moved: start again from its new head
                        raise SourceUnavailable(
                            f"cannot push to {redact(self.url)}: {git_error(exc)}"
                        ) from exc
                    fault_point("git.push.after")
                    return PushedRevert(target, commit.hexsha, tuple(done), tuple(skipped))
            raise SourceUnavailable(
                f"{redact(self.url)} branch {target} kept moving; gave up after {attempts} attempts"
            )
