"""A real S3-protocol object store on loopback, for model repositories in a bucket.

``LocalObjectStore`` runs moto's server (PyPI ``moto[server]``: ``python -m moto.server``
with this interpreter), in memory only, on a free 127.0.0.1 port, in its own process group,
and ends it by its pid (SIGTERM, then SIGKILL). Tests and benchmarks fill buckets through it
(boto3, with explicit credentials, region and endpoint, so the SDK looks nothing up) and
hand a tritonserver or the reconciler ``triton_url(...)`` and ``environment()``.

What a client needs (checked with tritonserver 2.51, /work/shared/object-storage.md):
- the bucket exists before tritonserver starts, or it exits 1 with "Unable to create S3
  filesystem client";
- Triton spells a custom S3 host ``s3://http://HOST:PORT/BUCKET/PATH``, bucket ``[0-9a-z.-]``,
  path segments ``[0-9a-zA-Z._-]``; a path outside that pattern is not taken as a custom host
  (it would go to AWS itself), so ``triton_url`` refuses one;
- ``AWS_EC2_METADATA_DISABLED=true`` and a region in its environment, so that the AWS SDK
  never asks the EC2 metadata address (169.254.169.254).

``requests()`` reads moto's access log (one werkzeug line per request, written when the
response starts), so a benchmark can count what a client asked of the store.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config

from testkit.local_triton import end_process_group, free_port

# Triton's pattern for a custom S3 host (triton core, s3 filesystem), cut into its parts.
_BUCKET = re.compile(r"[0-9a-z.\-]{3,63}")
_SEGMENT = re.compile(r"[0-9a-zA-Z.\-_]+")
# One werkzeug access-log line: 127.0.0.1 - - [date] "GET /path HTTP/1.1" 200 -
_ACCESS = re.compile(r'"(?P<method>[A-Z]+) (?P<path>\S*) HTTP/[0-9.]+" (?P<status>\d{3}) ')
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# moto's own API (the readiness check uses it): not a request to the store.
_MOTO_API = "/moto-api/"


class ObjectStoreError(RuntimeError):
    """The store could not be started, or a URL cannot be spelled for Triton."""


@dataclass(frozen=True)
class StoreRequest:
    """One request the store answered, from its access log."""

    method: str
    path: str  # with the query, e.g. "/models?list-type=2&prefix=echo%2F"
    status: int


@dataclass
class LocalObjectStore:
    """moto's S3-protocol server in its own process group on a loopback port."""

    host: str = "127.0.0.1"
    port: int = 0
    # Where the server's output goes; None: a temporary file of its own (kept after stop,
    # for a failing test to show).
    log_file: Path | None = None
    access_key: str = "testing"  # moto accepts any credentials
    secret_key: str = "testing"
    region: str = "us-east-1"
    # moto's IAM authentication on from the first request: every key is unknown to it, so
    # each request is refused (InvalidAccessKeyId), as a store refuses wrong credentials.
    refuse_credentials: bool = False
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _client: Any = field(default=None, init=False, repr=False)
    # Where this run's lines start in a log file given (and perhaps written before).
    _log_offset: int = field(default=0, init=False, repr=False)

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def environment(self) -> dict[str, str]:
        """What a client of this store (tritonserver, the reconciler) needs in its
        environment: dummy credentials, a region, and the EC2 metadata lookup off."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def start(self, ready_timeout: float = 30.0) -> LocalObjectStore:
        """Start the server and wait until it answers (about 0.4 s here)."""
        if self.process is not None:
            return self
        if not self.port:
            self.port = free_port(self.host)
        if self.log_file is None:
            self.log_file = Path(tempfile.mkstemp(prefix="moto-", suffix=".log")[1])
        self._log_offset = self.log_file.stat().st_size if self.log_file.exists() else 0
        command = [sys.executable, "-m", "moto.server", "-H", self.host, "-p", str(self.port)]
        env = {**_base_environment(), **self.environment()}
        if self.refuse_credentials:
            env["INITIAL_NO_AUTH_ACTION_COUNT"] = "0"
        with open(self.log_file, "ab") as log:
            self.process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        self._wait_ready(ready_timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                code = self.process.returncode
                self.process = None
                raise ObjectStoreError(
                    f"moto server exited with {code}; log: {self.log_file}\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(self.endpoint + _MOTO_API, timeout=1) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.05)
        self.stop()
        raise ObjectStoreError(
            f"moto server not ready after {timeout}s; log: {self.log_file}\n{self.log_tail()}"
        )

    def stop(self, timeout: float = 10.0) -> None:
        """End the server and its process group by its pid: SIGTERM, then SIGKILL. Every
        bucket is gone with it (moto keeps them in memory)."""
        process, self.process = self.process, None
        self._client = None
        end_process_group(process, timeout)

    def __enter__(self) -> LocalObjectStore:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def log_tail(self, lines: int = 20) -> str:
        if self.log_file is None or not self.log_file.exists():
            return ""
        return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])

    # -- the buckets -----------------------------------------------------------------------

    def client(self) -> Any:
        """A boto3 S3 client of this store (explicit endpoint, credentials and region: it
        reads no AWS configuration and asks no metadata service)."""
        if self.process is None:
            raise ObjectStoreError("the object store is not running")
        if self._client is None:
            self._client = boto3.client(
                "s3",
                endpoint_url=self.endpoint,
                aws_access_key_id=self.access_key,
                aws_secret_access_key=self.secret_key,
                region_name=self.region,
                config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2}),
            )
        return self._client

    def create_bucket(self, name: str) -> None:
        self.client().create_bucket(Bucket=name)

    def upload_folder(self, local_folder: Path, bucket: str, prefix: str = "") -> list[str]:
        """Upload every file under ``local_folder`` to ``bucket`` as ``prefix/<relative
        path>``; the keys written, sorted."""
        base = prefix.strip("/")
        keys = []
        for path in sorted(Path(local_folder).rglob("*")):
            if path.is_file():
                relative = path.relative_to(local_folder).as_posix()
                key = f"{base}/{relative}" if base else relative
                self.client().upload_file(str(path), bucket, key)
                keys.append(key)
        return keys

    def put(self, bucket: str, key: str, data: bytes | str) -> None:
        body = data.encode() if isinstance(data, str) else data
        self.client().put_object(Bucket=bucket, Key=key, Body=body)

    def delete(self, bucket: str, key: str) -> list[str]:
        """Delete ``key``; a key ending in "/" deletes everything under it (a folder). The
        keys deleted."""
        keys = self.keys(bucket, key) if key.endswith("/") else [key]
        for found in keys:
            self.client().delete_object(Bucket=bucket, Key=found)
        return keys

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        """Every key in ``bucket`` under ``prefix``, sorted."""
        pages = (
            self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        )
        return sorted(item["Key"] for page in pages for item in page.get("Contents", []))

    def triton_url(self, bucket: str, prefix: str = "") -> str:
        """The model repository ``bucket/prefix`` in Triton's spelling for a custom S3 host:
        ``s3://http://127.0.0.1:PORT/BUCKET/PREFIX``."""
        if not _BUCKET.fullmatch(bucket):
            raise ObjectStoreError(
                f"bucket {bucket!r}: Triton takes 3 to 63 of [0-9a-z.-] for a custom S3 host"
            )
        segments = [s for s in prefix.split("/") if s]
        for segment in segments:
            if not _SEGMENT.fullmatch(segment):
                raise ObjectStoreError(
                    f"path segment {segment!r}: Triton takes only [0-9a-zA-Z._-] there"
                )
        return "/".join([f"s3://{self.endpoint}", bucket, *segments])

    # -- what it was asked -----------------------------------------------------------------

    def requests(self) -> list[StoreRequest]:
        """Every S3 request the store has answered so far (its readiness checks left out),
        in order, from its access log."""
        if self.log_file is None or not self.log_file.exists():
            return []
        with open(self.log_file, "rb") as log:
            log.seek(self._log_offset)
            text = log.read().decode(errors="replace")
        found = []
        for line in text.splitlines():
            match = _ACCESS.search(_ANSI.sub("", line))
            if match and not match["path"].startswith(_MOTO_API):
                found.append(StoreRequest(match["method"], match["path"], int(match["status"])))
        return found

    @property
    def request_count(self) -> int:
        return len(self.requests())


def _base_environment() -> dict[str, str]:
    """The server's environment: this process's, without any AWS settings of its own (the
    store's are added) and without proxies (it only speaks on loopback)."""
    return {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("AWS_") and key.lower() not in ("http_proxy", "https_proxy")
    }
