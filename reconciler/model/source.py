"""Where manifests come from and who may change them: the Git source,
a revision's files, credentials, revert edits, commit signature verdicts.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class GitCredentials:
    """Credentials for the manifest repository, from the environment or mounted files, never
    from the repository. They reach git through its environment only: never argv, never a
    URL, never a message."""

    token: str | None = None  # HTTPS: sent as basic auth with ``username``
    username: str = "x-access-token"
    ssh_key: Path | None = None

    def env(self, base: Mapping[str, str]) -> dict[str, str]:
        """``base`` (git's non-interactive settings) with these credentials added."""
        env = dict(base)
        if self.token:
            basic = base64.b64encode(f"{self.username}:{self.token}".encode()).decode()
            env.update(
                {
                    "GIT_CONFIG_COUNT": "1",
                    "GIT_CONFIG_KEY_0": "http.extraHeader",
                    "GIT_CONFIG_VALUE_0": f"Authorization: Basic {basic}",
                }
            )
        if self.ssh_key is not None:
            env["GIT_SSH_COMMAND"] = (
                f"ssh -i {self.ssh_key} -o IdentitiesOnly=yes -o BatchMode=yes "
                "-o StrictHostKeyChecking=accept-new"
            )
        return env


@dataclass(frozen=True)
class Revision:
    """The manifest files at one commit."""

    sha: str
    files: dict[str, bytes]  # links and files too large stand as UnreadFile: refused by name


@dataclass(frozen=True)
class RevertEdit:
    """Put one ModelDeployment (in ``file``) back to ``versions`` and ``config``, or, given
    ``spec`` (``undo``), back to that whole spec. Left alone when its spec is no longer the
    one of ``failed_fingerprint``."""

    deployment: str
    file: str
    failed_fingerprint: str
    versions: tuple[int, ...]
    config: Mapping[str, Any] | None
    spec: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class PushedRevert:
    branch: str
    sha: str
    deployments: tuple[str, ...]  # the ModelDeployments the commit restores
    skipped: tuple[str, ...]  # changed by someone else meanwhile: left alone


class SignaturePolicy(StrEnum):
    """``--verify-signatures``: which commits must be signed."""

    HEAD = "head"  # the commit being applied
    ALL = "all"  # every commit since the last applied one


class SignatureStatus(StrEnum):
    GOOD = "good"
    UNSIGNED = "unsigned"
    BAD = "bad-signature"  # the commit was altered after signing, or the signature is forged
    UNKNOWN_KEY = "unknown-key"  # signed by a key that is not among the trusted keys
    UNTRUSTED_KEY = "untrusted-key"  # a known key whose validity gpg does not accept
    EXPIRED_KEY = "expired-key"
    EXPIRED_SIGNATURE = "expired-signature"
    REVOKED_KEY = "revoked-key"


@dataclass(frozen=True)
class CommitVerdict:
    """Whether one commit may be applied, as far as its signature goes."""

    commit: str  # full SHA
    status: SignatureStatus
    signer: str | None = None  # primary key fingerprint (or, if unknown, the signing key id)
    signer_name: str = ""  # the key's user id, as gpg reports it

    @property
    def ok(self) -> bool:
        return self.status is SignatureStatus.GOOD

    @property
    def reason(self) -> str:
        key = f" {self.signer}" if self.signer else ""
        who = f" ({self.signer_name})" if self.signer_name else ""
        return {
            SignatureStatus.GOOD: f"good signature by trusted key{key}{who}",
            SignatureStatus.UNSIGNED: "not signed",
            SignatureStatus.BAD: f"bad signature{key}: the commit does not match its signature",
            SignatureStatus.UNKNOWN_KEY: f"signed by key{key}, which is not a trusted key",
            SignatureStatus.UNTRUSTED_KEY: f"signed by key{key}{who}, which is not trusted",
            SignatureStatus.EXPIRED_KEY: f"signed by key{key}{who}, which has expired",
            SignatureStatus.EXPIRED_SIGNATURE: f"signature by key{key}{who} has expired",
            SignatureStatus.REVOKED_KEY: f"signed by key{key}{who}, which is revoked",
        }[self.status]

    def __str__(self) -> str:
        return f"{self.commit[:12]}: {self.reason}"


@dataclass(frozen=True)
class Source:
    repo: str
    ref: str = "HEAD"
    path: str = ""
