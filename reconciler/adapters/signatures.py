"""Which commits may be applied: OpenPGP signatures, fast-forward only, approval trailers.

The reconciler applies a commit only if it is signed by a key the operator trusts
(``--verify-signatures head|all``, ``--trusted-keys DIR``), reached from the last applied
commit by fast-forward, and (optionally) carries enough ``Approved-by`` trailers. The loop calls
this module on the bare mirror that ``adapters/git.py`` fetches into, before it reads the
manifests of a new revision.

Signatures are checked by real ``git`` and ``gpg`` against a keyring the reconciler owns:
``CommitVerifier`` builds a fresh GNUPGHOME under its ``home`` from the public key files of the
trusted-keys folder, gives each key ultimate ownertrust, and runs every git and gpg process with
that GNUPGHOME and without the user's or the system's git config, so nothing from ``~/.gnupg``
or ``~/.gitconfig`` (a ``gpg.program``, an SSH allowed-signers file, ``log.showSignature``) is
trusted or changes an answer. A signature is good only if git says so (``%G?`` = ``G``) and its
primary key is one this verifier imported itself.

Errors: a trusted-keys folder that yields no key is ``TrustedKeysError`` (configuration, not
transient); git failing on the repository (unknown commit, not a repository) is
``SourceUnavailable``. An unsigned or badly signed commit is not an error but a verdict; the
loop refuses it with ``UnverifiedRevision``, and a rewritten branch with ``HistoryRewritten``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from reconciler.model.errors import SourceUnavailable, TrustedKeysError
from reconciler.model.source import CommitVerdict, SignaturePolicy, SignatureStatus

# Without a last applied commit, ``all`` would check the whole history; this many commits back
# from the new one is where it stops.
DEFAULT_HISTORY_LIMIT = 100
KEY_SUFFIXES = (".asc", ".gpg")
_TIMEOUT = 120.0
_TRAILER_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]*$")
# gpg.conf of the reconciler's keyring: never reach out for keys, never start an agent
# (verifying needs no secret key).
_GPG_CONF = "no-autostart\nno-auto-key-retrieve\nno-auto-key-import\n"


# git's %G? letters (git-log(1), "PRETTY FORMATS").
_STATUS_BY_LETTER = {
    "G": SignatureStatus.GOOD,
    "B": SignatureStatus.BAD,
    "U": SignatureStatus.UNTRUSTED_KEY,
    "X": SignatureStatus.EXPIRED_SIGNATURE,
    "Y": SignatureStatus.EXPIRED_KEY,
    "R": SignatureStatus.REVOKED_KEY,
    "E": SignatureStatus.UNKNOWN_KEY,
    "N": SignatureStatus.UNSIGNED,
}


def _clean_env(gnupg_home: Path | None = None) -> dict[str, str]:
    """The environment for git and gpg: no GIT_* redirection, no user or system git config,
    no inherited GnuPG settings; our own GNUPGHOME when verifying (the other git commands
    here never run gpg)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GIT_", "GNUPG", "GPG_")) and k not in ("LANG", "LANGUAGE")
    }
    env.update(
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_CONFIG_NOSYSTEM="1",
        GIT_TERMINAL_PROMPT="0",
        LC_ALL="C",
    )
    if gnupg_home is not None:
        env["GNUPGHOME"] = str(gnupg_home)
    return env


def _run(
    args: Sequence[str],
    *,
    env: Mapping[str, str],
    stdin: str | None = None,
    ok_codes: tuple[int, ...] = (0,),
) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(
            list(args),
            env=dict(env),
            input=stdin,
            capture_output=True,
            text=True,
            timeout=_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SourceUnavailable(f"cannot run {args[0]}: {exc}") from exc
    if done.returncode not in ok_codes:
        lines = done.stderr.strip().splitlines()
        said = [line for line in lines if line.startswith(("fatal:", "error:"))] or lines
        raise SourceUnavailable(
            f"{Path(args[0]).name} failed (exit {done.returncode}): {' '.join(said) or 'no output'}"
        )
    return done


def _revision(name: str) -> str:
    # Revisions come from refs and the state store; one that looks like an option is refused
    # rather than handed to git.
    if not name or name.startswith("-"):
        raise ValueError(f"not a revision: {name!r}")
    return name


def _git(
    repo_dir: Path,
    *args: str,
    stdin: str | None = None,
    ok_codes: tuple[int, ...] = (0,),
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    return _run(
        ["git", "-C", str(repo_dir), "-c", "log.showSignature=false", *args],
        env=env if env is not None else _clean_env(),
        stdin=stdin,
        ok_codes=ok_codes,
    )


class CommitVerifier:
    """Verifies commit signatures against the keys in ``trusted_keys_dir`` and no others.

    The keyring (``home/gnupg``) is rebuilt from the folder every time a verifier is made, so
    a key removed from the folder stops being trusted at the next start. One verifier per
    ``home`` at a time: a second one would rebuild the keyring under the first.
    """

    def __init__(self, trusted_keys_dir: Path, home: Path, *, gpg: str = "gpg") -> None:
        found = shutil.which(gpg)
        if found is None:
            raise TrustedKeysError(f"{gpg} is not installed: signatures cannot be verified")
        self.gpg = found
        self.gnupg_home = home / "gnupg"
        key_files = (
            sorted(
                p for p in trusted_keys_dir.iterdir() if p.suffix in KEY_SUFFIXES and p.is_file()
            )
            if trusted_keys_dir.is_dir()
            else []
        )
        if not key_files:
            raise TrustedKeysError(
                f"no public key files (*.asc, *.gpg) in {trusted_keys_dir}: nothing could be "
                "trusted"
            )
        if self.gnupg_home.exists():
            shutil.rmtree(self.gnupg_home)
        home.mkdir(parents=True, exist_ok=True)
        self.gnupg_home.mkdir(mode=0o700)
        os.chmod(self.gnupg_home, 0o700)  # mkdir's mode is masked by the umask
        (self.gnupg_home / "gpg.conf").write_text(_GPG_CONF)
        self._env = _clean_env(self.gnupg_home)
        for path in key_files:
            try:
                self._gpg("--import", str(path))
            except SourceUnavailable as exc:
                raise TrustedKeysError(f"cannot import trusted key {path}: {exc}") from exc
        self.fingerprints = self._primary_fingerprints()
        if not self.fingerprints:
            raise TrustedKeysError(f"the files in {trusted_keys_dir} hold no public key")
        self._gpg(
            "--import-ownertrust",
            stdin="".join(f"{fpr}:6:\n" for fpr in sorted(self.fingerprints)),
        )

    def _gpg(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return _run([self.gpg, "--batch", "--no-tty", *args], env=self._env, stdin=stdin)

    def _primary_fingerprints(self) -> frozenset[str]:
        listing = self._gpg("--with-colons", "--fixed-list-mode", "--list-keys").stdout
        fingerprints, primary = set(), False
        for line in listing.splitlines():
            fields = line.split(":")
            if fields[0] in ("pub", "sub"):
                primary = fields[0] == "pub"
            elif fields[0] == "fpr" and primary:
                fingerprints.add(fields[9])
                primary = False
        return frozenset(fingerprints)

    def verify(self, repo_dir: Path, commits: Iterable[str]) -> list[CommitVerdict]:
        """One verdict per distinct commit, in the order given."""
        wanted = list(dict.fromkeys(_revision(c) for c in commits))
        if not wanted:
            return []
        # One git process for all commits; git runs gpg once per signed commit.
        # Our gpg, whatever the repository's config names; only ultimately trusted keys (ours)
        # count as good.
        config = [f"gpg.program={self.gpg}", f"gpg.openpgp.program={self.gpg}"]
        config.append("gpg.minTrustLevel=ultimate")
        done = _git(
            repo_dir,
            *(arg for setting in config for arg in ("-c", setting)),
            "log",
            "--no-walk=unsorted",
            "--stdin",
            "--format=%H%x1f%G?%x1f%GP%x1f%GF%x1f%GK%x1f%GS%x1e",
            stdin="".join(f"{c}\n" for c in wanted),
            env=self._env,
        )
        verdicts = []
        for record in done.stdout.split("\x1e"):
            record = record.strip("\n")
            if not record:
                continue
            sha, letter, primary, signing, key_id, name = record.split("\x1f")
            status = _STATUS_BY_LETTER.get(letter, SignatureStatus.BAD)
            signer = primary or signing or key_id or None
            if status is SignatureStatus.GOOD and primary not in self.fingerprints:
                # git trusted it, our keyring did not import it: never happens with our
                # GNUPGHOME, and must not pass if it ever does.
                status = SignatureStatus.UNKNOWN_KEY
            verdicts.append(CommitVerdict(sha, status, signer, name))
        return verdicts


def commits_between(
    repo_dir: Path, old: str | None, new: str, *, limit: int = DEFAULT_HISTORY_LIMIT
) -> list[str]:
    """The commits ``new`` brings since ``old`` (``git rev-list old..new``), oldest first.

    Without ``old`` (nothing applied yet): ``new`` and its ancestors, at most ``limit`` of
    them, the newest. With ``old``, every commit is listed: under ``--verify-signatures all``
    none may be skipped.
    """
    args = ["rev-list", "--topo-order", "--reverse"]
    if old is None:
        args += [f"--max-count={limit}", _revision(new)]
    else:
        args += [f"{_revision(old)}..{_revision(new)}"]
    return _git(repo_dir, *args, "--").stdout.split()


def commits_to_verify(
    repo_dir: Path, policy: SignaturePolicy, old: str | None, new: str
) -> list[str]:
    """The commits ``policy`` says must be signed before ``new`` is applied after ``old``."""
    if policy is SignaturePolicy.HEAD:
        return [
            _git(repo_dir, "rev-parse", "--verify", f"{_revision(new)}^{{commit}}").stdout.strip()
        ]
    return commits_between(repo_dir, old, new)


def has_commit(repo_dir: Path, sha: str) -> bool:
    """Whether ``repo_dir`` holds the commit ``sha`` (a mirror fetched after a force-push
    into a fresh cache never got the old history)."""
    commit = f"{_revision(sha)}^{{commit}}"
    done = _git(repo_dir, "rev-parse", "--verify", "--quiet", commit, ok_codes=(0, 1))
    return done.returncode == 0


def is_fast_forward(repo_dir: Path, old: str, new: str) -> bool:
    """Whether ``new`` descends from ``old`` (a commit descends from itself)."""
    done = _git(
        repo_dir, "merge-base", "--is-ancestor", _revision(old), _revision(new), ok_codes=(0, 1)
    )
    return done.returncode == 0


def approvals(repo_dir: Path, commit: str, trailer: str = "Approved-by") -> list[str]:
    """The distinct values of ``trailer`` in ``commit``'s message, in order.

    Trailer keys match case-insensitively (as git matches them); values are compared with
    their whitespace collapsed. A trailer says only what the commit's author wrote: it means
    an approval only on a commit whose signature is verified.
    """
    if not _TRAILER_KEY.match(trailer):
        raise ValueError(f"not a trailer key: {trailer!r}")
    done = _git(
        repo_dir,
        "log",
        "-1",
        f"--format=%(trailers:key={trailer},valueonly,unfold,separator=%x1f)",
        _revision(commit),
        "--",
    )
    values = (" ".join(v.split()) for v in done.stdout.strip("\n").split("\x1f"))
    return list(dict.fromkeys(v for v in values if v))
