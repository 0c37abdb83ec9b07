"""Test keys and signed commits, shared by the signature tests and the review-flow tests.

Keys are generated once per session (ed25519, no passphrase) in a keyring of the tests' own:
Alice and Olga are trusted (their public keys are in the trusted-keys folder; Olga's key
expired in 2020, so her commits are signed with gpg's clock set back), Mallory is not.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from testkit.manifests import ManifestRepo, git
from tests.services import find_binary

# Olga's key lives one day from this moment on; her commits are signed at noon that day.
OLGA_EPOCH = "20200101T000000"
OLGA_SIGNS_AT = "20200101T120000"


@dataclass(frozen=True)
class Keys:
    home: Path  # the signers' GNUPGHOME: holds every secret key, trusts them all
    trusted_dir: Path  # what the operator hands the reconciler: Alice's and Olga's public keys
    alice: str
    olga: str
    mallory: str
    olga_gpg: Path  # a gpg that signs as if it were noon on Olga's only day


def _gpg(home: Path, *args: str) -> str:
    env = {**os.environ, "GNUPGHOME": str(home)}
    return subprocess.run(
        ["gpg", "--batch", *args], env=env, check=True, capture_output=True, text=True
    ).stdout


def _new_key(home: Path, uid: str, expire: str = "never", *extra: str) -> str:
    _gpg(
        home,
        *extra,
        "--passphrase",
        "",
        "--pinentry-mode",
        "loopback",
        "--quick-generate-key",
        uid,
        "ed25519",
        "sign",
        expire,
    )
    listing = _gpg(home, "--with-colons", "--list-keys", uid)
    return next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))


@pytest.fixture(scope="session")
def keys() -> Iterator[Keys]:
    find_binary(("gpg",), "gnupg")
    # A short path: gpg-agent's socket lives in GNUPGHOME when /run/user is missing.
    root = Path(tempfile.mkdtemp(prefix="tg-gpg-"))
    home = root / "signers"
    home.mkdir(mode=0o700)
    try:
        alice = _new_key(home, "Alice <alice@example.invalid>")
        mallory = _new_key(home, "Mallory <mallory@example.invalid>")
        olga = _new_key(
            home, "Olga <olga@example.invalid>", "1d", "--faked-system-time", OLGA_EPOCH
        )
        trusted = root / "trusted"
        trusted.mkdir()
        (trusted / "alice.asc").write_text(_gpg(home, "--armor", "--export", alice))
        (trusted / "olga.gpg").write_bytes(
            subprocess.run(
                ["gpg", "--batch", "--export", olga],
                env={**os.environ, "GNUPGHOME": str(home)},
                check=True,
                capture_output=True,
            ).stdout
        )
        (trusted / "README.md").write_text("not a key, not read\n")
        olga_gpg = root / "olga-gpg"
        olga_gpg.write_text(f'#!/bin/sh\nexec gpg --faked-system-time {OLGA_SIGNS_AT} "$@"\n')
        olga_gpg.chmod(0o755)
        yield Keys(home, trusted, alice, olga, mallory, olga_gpg)
    finally:
        subprocess.run(
            ["gpgconf", "--kill", "gpg-agent"],
            env={**os.environ, "GNUPGHOME": str(home)},
            check=False,
            capture_output=True,
        )
        shutil.rmtree(root, ignore_errors=True)


def commit(
    repo: ManifestRepo,
    keys: Keys,
    message: str,
    *,
    key: str | None = None,
    gpg: str = "gpg",
    push: bool = True,
) -> str:
    """A commit in the work clone, signed with ``key`` (unsigned without), pushed to main."""
    (repo.work / "log.txt").open("a").write(message + "\n")
    git(repo.work, "add", "--all")
    signing = ["-c", f"user.signingkey={key}", "-c", f"gpg.program={gpg}"] if key else []
    subprocess.run(
        ["git", *signing, "commit", "--quiet", *(["-S"] if key else []), "-m", message],
        cwd=repo.work,
        env={**os.environ, "GNUPGHOME": str(keys.home)},
        check=True,
        capture_output=True,
    )
    if push:
        git(repo.work, "push", "--quiet", "origin", "HEAD:main")
    return git(repo.work, "rev-parse", "HEAD")
