"""Signature, fast-forward and trailer checks against real git and gpg.

Keys are generated here (ed25519, no passphrase) in a keyring of the test's own: Alice and Olga
are trusted (their public keys are in the trusted-keys folder; Olga's key expired in 2020, so
her commits are signed with gpg's clock set back), Mallory is not. Commits are pushed to a bare
remote and verified in the reconciler's bare mirror, as the loop will.
"""

from __future__ import annotations

import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from reconciler.adapters.git import GitSource
from reconciler.adapters.signatures import (
    CommitVerifier,
    approvals,
    commits_between,
    commits_to_verify,
    is_fast_forward,
)
from reconciler.model.errors import (
    HistoryRewritten,
    SourceUnavailable,
    TrustedKeysError,
    UnsafeRevision,
    UnverifiedRevision,
)
from reconciler.model.source import SignaturePolicy, SignatureStatus
from testkit.manifests import ManifestRepo, git
from tests.signing import Keys, commit


def mirror(repo: ManifestRepo, cache: Path) -> Path:
    """The reconciler's bare mirror of ``repo``, fetched now."""
    source = GitSource(repo.url, cache)
    source.fetch("main")
    return source.cache


def forge(repo_dir: Path, signed: str, old: str, new: str) -> str:
    """``signed`` with its message edited and its gpgsig header kept: a forged commit."""
    original = subprocess.run(
        ["git", "cat-file", "commit", signed], cwd=repo_dir, check=True, capture_output=True
    ).stdout
    assert b"\ngpgsig -----BEGIN PGP SIGNATURE-----" in original
    altered = original.replace(old.encode(), new.encode())
    assert altered != original
    return (
        subprocess.run(
            ["git", "hash-object", "-t", "commit", "-w", "--stdin"],
            cwd=repo_dir,
            input=altered,
            check=True,
            capture_output=True,
        )
        .stdout.decode()
        .strip()
    )


@pytest.fixture
def verifier(keys: Keys, tmp_path: Path) -> CommitVerifier:
    return CommitVerifier(keys.trusted_dir, tmp_path / "reconciler")


# -- signatures ----------------------------------------------------------------------------


def test_verdicts_for_trusted_unsigned_unknown_and_expired_keys(
    keys: Keys, verifier: CommitVerifier, manifests: ManifestRepo, tmp_path: Path
) -> None:
    by_alice = commit(manifests, keys, "bump echo to 2", key=keys.alice)
    unsigned = commit(manifests, keys, "bump echo to 3")
    by_mallory = commit(manifests, keys, "bump echo to 4", key=keys.mallory)
    by_olga = commit(manifests, keys, "bump echo to 5", key=keys.olga, gpg=str(keys.olga_gpg))
    cache = mirror(manifests, tmp_path / "cache")

    verdicts = verifier.verify(cache, [by_alice, unsigned, by_mallory, by_olga, by_alice])

    assert [(v.commit, v.status, v.ok) for v in verdicts] == [
        (by_alice, SignatureStatus.GOOD, True),
        (unsigned, SignatureStatus.UNSIGNED, False),
        (by_mallory, SignatureStatus.UNKNOWN_KEY, False),
        (by_olga, SignatureStatus.EXPIRED_KEY, False),
    ]
    good, none, unknown, expired = verdicts
    assert (good.signer, good.signer_name) == (keys.alice, "Alice <alice@example.invalid>")
    assert none.signer is None and none.reason == "not signed"
    # gpg knows only the key id of a key it does not hold: the fingerprint's last 16 digits.
    assert unknown.signer is not None and keys.mallory.endswith(unknown.signer)
    assert unknown.reason == f"signed by key {unknown.signer}, which is not a trusted key"
    assert expired.signer == keys.olga
    assert (
        expired.reason
        == f"signed by key {keys.olga} (Olga <olga@example.invalid>), which has expired"
    )
    assert verifier.verify(cache, []) == []

    refusal = UnverifiedRevision(verdicts)
    assert isinstance(refusal, UnsafeRevision)
    assert str(refusal).startswith("refusing revision: 3 commit(s) not signed by a trusted key: ")
    assert f"{unsigned[:12]}: not signed" in str(refusal)
    assert by_alice[:12] not in str(refusal)


def test_forged_signature_is_bad(
    keys: Keys, verifier: CommitVerifier, manifests: ManifestRepo, tmp_path: Path
) -> None:
    signed = commit(manifests, keys, "bump echo to 2", key=keys.alice)
    cache = mirror(manifests, tmp_path / "cache")
    forged = forge(cache, signed, "bump echo to 2", "bump echo to 6")

    good, bad = verifier.verify(cache, [signed, forged])

    assert good.ok
    assert (bad.commit, bad.status, bad.ok) == (forged, SignatureStatus.BAD, False)
    assert "does not match its signature" in bad.reason


def test_the_users_own_keyring_and_git_config_are_not_trusted(
    keys: Keys,
    verifier: CommitVerifier,
    manifests: ManifestRepo,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    by_mallory = commit(manifests, keys, "bump echo to 4", key=keys.mallory)
    cache = mirror(manifests, tmp_path / "cache")
    # The signers' keyring trusts Mallory ultimately, and a global git config points gpg at a
    # program that says every signature is good: neither may reach the verifier.
    liar = tmp_path / "liar"
    fpr = "A" * 40
    liar.write_text(
        "#!/bin/sh\n"  # git reads gpg's status lines from its stdout (--status-fd=1)
        "echo '[GNUPG:] NEWSIG'\n"
        "echo '[GNUPG:] GOODSIG AAAAAAAAAAAAAAAA Anyone'\n"
        f"echo '[GNUPG:] VALIDSIG {fpr} 2020-01-01 0 0 4 0 22 8 00 {fpr}'\n"
        "echo '[GNUPG:] TRUST_ULTIMATE 0 pgp'\n"
    )
    liar.chmod(0o755)
    user_config = tmp_path / "gitconfig"
    user_config.write_text(f"[gpg]\n\tprogram = {liar}\n")
    monkeypatch.setenv("GNUPGHOME", str(keys.home))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(user_config))
    # What a verifier that used the caller's environment would see, by either route:
    assert git(cache, "log", "-1", "--format=%G?", by_mallory) == "G"
    assert git(cache, "-c", "gpg.program=gpg", "log", "-1", "--format=%G?", by_mallory) == "G"

    (verdict,) = verifier.verify(cache, [by_mallory])

    assert verdict.status is SignatureStatus.UNKNOWN_KEY
    keyring = tmp_path / "reconciler" / "gnupg"
    assert stat.S_IMODE(keyring.stat().st_mode) == 0o700
    assert verifier.fingerprints == {keys.alice, keys.olga}


def test_a_key_removed_from_the_folder_is_no_longer_trusted(
    keys: Keys, manifests: ManifestRepo, tmp_path: Path
) -> None:
    by_alice = commit(manifests, keys, "bump echo to 2", key=keys.alice)
    cache = mirror(manifests, tmp_path / "cache")
    home = tmp_path / "reconciler"
    assert CommitVerifier(keys.trusted_dir, home).verify(cache, [by_alice])[0].ok

    only_olga = tmp_path / "trusted"
    only_olga.mkdir()
    shutil.copy(keys.trusted_dir / "olga.gpg", only_olga)
    (verdict,) = CommitVerifier(only_olga, home).verify(cache, [by_alice])

    assert verdict.status is SignatureStatus.UNKNOWN_KEY


def test_trusted_keys_that_are_not_keys_are_refused(keys: Keys, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(TrustedKeysError, match=r"no public key files \(\*\.asc, \*\.gpg\)"):
        CommitVerifier(empty, tmp_path / "home")
    with pytest.raises(TrustedKeysError, match="no public key files"):
        CommitVerifier(tmp_path / "missing", tmp_path / "home")
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "team.asc").write_text("-----BEGIN PGP PUBLIC KEY BLOCK-----\nnonsense\n")
    with pytest.raises(TrustedKeysError, match=r"cannot import trusted key .*team\.asc"):
        CommitVerifier(garbage, tmp_path / "home")


def test_git_failures_are_source_unavailable(
    verifier: CommitVerifier, manifests: ManifestRepo, tmp_path: Path
) -> None:
    manifests.commit("first")
    cache = mirror(manifests, tmp_path / "cache")
    with pytest.raises(SourceUnavailable, match="git failed"):
        verifier.verify(cache, ["0" * 40])
    with pytest.raises(SourceUnavailable, match="git failed"):
        verifier.verify(tmp_path / "not-a-repository", ["HEAD"])
    with pytest.raises(ValueError, match="not a revision"):
        verifier.verify(cache, ["--output=/tmp/x"])


# -- history -------------------------------------------------------------------------------


def test_commits_between_on_a_linear_history(
    keys: Keys, manifests: ManifestRepo, tmp_path: Path
) -> None:
    first, second, third, fourth = (commit(manifests, keys, f"change {n}") for n in range(4))
    cache = mirror(manifests, tmp_path / "cache")

    assert commits_between(cache, first, fourth) == [second, third, fourth]
    assert commits_between(cache, fourth, fourth) == []
    assert commits_between(cache, None, fourth) == [first, second, third, fourth]
    assert commits_between(cache, None, fourth, limit=2) == [third, fourth]
    assert commits_between(cache, None, "origin/main") == [first, second, third, fourth]
    assert commits_to_verify(cache, SignaturePolicy.HEAD, first, "origin/main") == [fourth]
    assert commits_to_verify(cache, SignaturePolicy.ALL, second, fourth) == [third, fourth]


def test_a_force_push_is_not_a_fast_forward(
    keys: Keys, manifests: ManifestRepo, tmp_path: Path
) -> None:
    first = commit(manifests, keys, "first")
    applied = commit(manifests, keys, "bump echo to 2")
    cache = mirror(manifests, tmp_path / "cache")
    later = commit(manifests, keys, "bump echo to 3")
    mirror(manifests, tmp_path / "cache")
    assert is_fast_forward(cache, applied, later)
    assert is_fast_forward(cache, applied, applied)

    git(manifests.work, "reset", "--quiet", "--hard", first)
    rewritten = commit(manifests, keys, "bump echo to 3, again", push=False)
    git(manifests.work, "push", "--quiet", "--force", "origin", "HEAD:main")
    mirror(manifests, tmp_path / "cache")

    assert not is_fast_forward(cache, applied, rewritten)
    assert is_fast_forward(cache, first, rewritten)
    # What the rewritten branch brings since the applied commit: only its own new commit.
    assert commits_between(cache, applied, rewritten) == [rewritten]
    refusal = HistoryRewritten(applied, rewritten)
    assert isinstance(refusal, UnsafeRevision)
    assert f"does not descend from the last applied revision {applied}" in str(refusal)
    with pytest.raises(SourceUnavailable):
        is_fast_forward(cache, "0" * 40, rewritten)


# -- approvals -----------------------------------------------------------------------------


def test_approvals_counts_distinct_trailer_values(
    keys: Keys, manifests: ManifestRepo, tmp_path: Path
) -> None:
    merged = commit(
        manifests,
        keys,
        "Merge pull request #42: bump echo to 2\n\n"
        "Approved-by: A. Reviewer <a@example.invalid> in the body is not a trailer.\n\n"
        "Reviewed-on: https://git.example.invalid/ml/models/pull/42\n"
        "Approved-by: Alice <alice@example.invalid>\n"
        "approved-by: Bob  <bob@example.invalid>\n"
        "Approved-by: Alice <alice@example.invalid>\n"
        "Signed-off-by: Carol <carol@example.invalid>",
    )
    plain = commit(manifests, keys, "bump echo to 3")
    cache = mirror(manifests, tmp_path / "cache")

    assert approvals(cache, merged) == [
        "Alice <alice@example.invalid>",
        "Bob <bob@example.invalid>",
    ]
    assert approvals(cache, merged, "Signed-off-by") == ["Carol <carol@example.invalid>"]
    assert approvals(cache, plain) == []
    with pytest.raises(ValueError, match="not a trailer key"):
        approvals(cache, merged, "Approved-by,valueonly")
