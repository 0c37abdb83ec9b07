"""Where a TritonServer's model repository is (``spec.modelRepository``), in Triton's own
spellings, so that one string works in the manifest and on Triton's command line:

- a local path (``/models``): a folder the reconciler can open;
- ``s3://bucket/prefix`` (AWS), or ``s3://http://host:port/bucket/prefix`` (``https://`` too)
  for an S3-compatible store (MinIO, Ceph): Triton takes a custom host only in that form
  (its pattern: ``s3://(http://|https://|)host:port/bucket(/segment)*``);
- ``gs://bucket/prefix`` (Google Cloud Storage);
- ``as://account/container/prefix`` (Azure Blob Storage).

Names are held to what Triton's S3 pattern accepts: a bucket (or container) of ``0-9 a-z . -``
(3 to 63 characters), path segments of ``0-9 A-Z a-z . _ -``, and no ``.`` or ``..`` segment.
A string Triton would read otherwise (an S3 path that misses its pattern goes to AWS itself)
is refused here, with what to write instead. Parsing only: nothing is contacted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, NamedTuple

SCHEMES = ("s3", "gs", "as")
_HOST = re.compile(r"^(http://|https://)([0-9a-zA-Z.-]+):([0-9]+)/(.*)$")
_BUCKET = re.compile(r"^[0-9a-z][0-9a-z.-]{1,61}[0-9a-z]$")
_ACCOUNT = re.compile(r"^[0-9a-z]{3,24}$")
_SEGMENT = re.compile(r"^[0-9A-Za-z._-]+$")


@dataclass(frozen=True)
class RepositoryLocation:
    """A parsed ``spec.modelRepository``. ``scheme`` is ``"file"`` for a local path (then
    ``path`` is it), else ``s3``, ``gs`` or ``as`` with ``bucket`` (Azure: the container),
    ``prefix`` (the key prefix under it, without slashes at either end; may be empty),
    ``endpoint`` (an S3-compatible store's ``http(s)://host:port``; None: the store's own)
    and ``account`` (Azure's storage account)."""

    text: str
    scheme: str
    path: str = ""
    bucket: str = ""
    prefix: str = ""
    endpoint: str | None = None
    account: str = ""

    @property
    def remote(self) -> bool:
        return self.scheme != "file"

    @property
    def root(self) -> str:
        """The repository's root as fsspec names it: ``bucket/prefix`` (a local path as is)."""
        if not self.remote:
            return self.path
        return "/".join(p for p in (self.bucket, self.prefix) if p)

    def model_url(self, model: str, *parts: str) -> str:
        """The URL of ``model`` (or of a file under it) for a message: the manifest's
        spelling, then the model's path."""
        return "/".join((self.text.rstrip("/"), model, *parts))


def parse_repository(text: str) -> RepositoryLocation:
    """``text`` as a location; ValueError saying what is wrong and what to write instead."""
    if not text or text != text.strip():
        raise ValueError(f"{text!r} is empty or has spaces around it")
    scheme, found, rest = text.partition("://")
    if not found:
        return RepositoryLocation(text, "file", path=text)
    if scheme not in SCHEMES:
        raise ValueError(
            f"{text!r}: Triton reads model repositories from a local path, s3://, gs:// or "
            f"as://, not {scheme}://"
        )
    endpoint = None
    if scheme == "s3" and rest.startswith(("http://", "https://")):
        custom = _HOST.match(rest)
        if custom is None:
            raise ValueError(
                f"{text!r}: an S3-compatible store is written "
                "s3://http://HOST:PORT/BUCKET/PREFIX (or https://), as Triton reads it"
            )
        protocol, host, port, rest = custom.groups()
        endpoint = f"{protocol}{host}:{port}"
    parts = rest.strip("/").split("/")
    if scheme == "as":
        if len(parts) < 2:
            raise ValueError(f"{text!r}: Azure is written as://ACCOUNT/CONTAINER/PREFIX")
        account, *parts = parts
        if not _ACCOUNT.match(account):
            raise ValueError(
                f"{text!r}: storage account {account!r} is not 3-24 lowercase letters or digits"
            )
    else:
        account = ""
    bucket, *segments = parts
    if not _BUCKET.match(bucket):
        raise ValueError(
            f"{text!r}: bucket {bucket!r} is not 3-63 characters of 0-9 a-z . - (starting and "
            "ending with a letter or digit), which Triton needs to read it"
        )
    for segment in segments:
        if segment in (".", "..") or not _SEGMENT.match(segment):
            raise ValueError(
                f"{text!r}: path segment {segment!r} is not a name of 0-9 A-Z a-z . _ - "
                "(nor . or ..), which Triton needs to read it"
            )
    return RepositoryLocation(
        text, scheme, bucket=bucket, prefix="/".join(segments), endpoint=endpoint, account=account
    )


class RepositoryModel(NamedTuple):
    """What a model repository holds of one model: its ``config.pbtxt`` as JSON (None: there
    is none, or it does not parse), its version numbers (None: no such model), and why its
    ``config.pbtxt`` does not parse, naming the file (None: it parses, or there is none)."""

    config: dict[str, Any] | None
    versions: frozenset[int] | None
    config_error: str | None = None
