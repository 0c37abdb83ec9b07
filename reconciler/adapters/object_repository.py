"""A Triton model repository in object storage (``s3://``, ``gs://``, ``as://``), read through
fsspec's implementation for its store (s3fs, gcsfs, adlfs: the ``s3``, ``gcs`` and ``azure``
extras), with the same answers as a local folder (``model_repository.py``): a model's base
config and version numbers, and the digests of its version folders.

Cost, per model and pass: **one listing** (a recursive list of the model's prefix: one
request, more only past a page of objects): the observation reads a model's versions and
config, then the digests of its pinned versions a moment later, from the same listing
(``version_digests`` takes one up to ``LISTING_REUSE`` seconds old). An object is read only
when the listing shows it new or changed. The listing gives each object's identity in the
store (ETag, or GCS's generation, with its size and modification time): ``config.pbtxt`` is
parsed again, and a file hashed again, only when that identity changed, so a pass over an
unchanged repository reads no object at all, and a version's digest is computed once per
object version.
fsspec's own listing cache is off: a listing is the repository as it is now.

The digest is ``artifacts.py``'s contract over the objects: a file's line is
``file - <sha256> <path>`` (objects have no execute bit; a version pinned from a local copy
whose files are executable has another digest: ``triton-gitops digest`` reads the bucket),
``__pycache__`` and ``*.pyc`` are left out, and keys ending in ``/`` (folder markers some
tools write) are not files.

Errors: a store that does not answer or times out, a missing bucket, refused credentials
raise ``RepositoryUnavailable`` naming the URL and the cause in plain words (connection
refused, no answer within the timeout, HTTP 403...): the caller leaves the server unobserved,
a reason to wait, as for a server that is down. ``unreadable`` asks the store once when
Triton fails a call, so that a message blames the store Triton reads from, not Triton
(``triton.py``). Credentials come from the store's standard chain (environment, shared config
files, IRSA or workload identity), never from a manifest.
"""

from __future__ import annotations

import hashlib
import importlib
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from reconciler.adapters.artifacts import digest_of, encoded, file_line, skipped
from reconciler.core.triton_config import parse_pbtxt
from reconciler.credentials import redact
from reconciler.model.errors import RepositoryUnavailable
from reconciler.model.repository import RepositoryLocation, RepositoryModel

# Seconds for one request to connect and to answer: a store that stalls longer is down for
# this pass (the server is left unobserved), not a pass that hangs.
STORE_TIMEOUT = 10.0
# A pass lists a model to observe it and needs its pinned digests a moment later: a listing
# this young is the repository as the pass found it. Observing lists afresh every time.
LISTING_REUSE = 5.0
_CHUNK = 1 << 20
_EXTRA = {"s3": ("s3fs", "s3"), "gs": ("gcsfs", "gcs"), "as": ("adlfs", "azure")}
# What a store without an endpoint of its own is called in a message.
_SERVICE = {"s3": "AWS S3", "gs": "Google Cloud Storage", "as": "Azure Blob Storage"}
# The words for an object or bucket not found, by what was asked.
_BUCKET_MISSING = "the bucket or container does not exist"
_OBJECT_GONE = (
    "the object is gone since it was listed: the repository changed while it was read; the "
    "next pass reads it again"
)


@dataclass
class StoreReads:
    """What the repository asked of its store, for the benchmark and the tests."""

    listings: int = 0
    objects_read: int = 0
    bytes_read: int = 0


@dataclass(frozen=True)
class _Object:
    path: str  # the store's full path (bucket/prefix/model/...)
    identity: tuple[Any, ...]  # changes when the object does


@dataclass
class ObjectRepository:
    """One repository URL's reader; keep it for the process (``model_repository.opened``)
    so that what it parsed and hashed is not read again."""

    location: RepositoryLocation
    fs: Any  # an fsspec AbstractFileSystem (untyped)
    reads: StoreReads = field(default_factory=StoreReads)
    timeout: float = STORE_TIMEOUT  # what ``fs`` was opened with, for a message
    clock: Callable[[], float] = time.monotonic
    _listed: dict[str, tuple[float, dict[str, _Object]]] = field(default_factory=dict)
    _configs: dict[_Object, tuple[dict[str, Any] | None, str | None]] = field(default_factory=dict)
    _hashes: dict[_Object, str] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def unreadable(self) -> RepositoryUnavailable | None:
        """Why the store cannot be read now, from one listing of the repository's root
        (one request); None when it answers. Asked when Triton fails a call on a server
        that reads this repository: Triton reads its models from the same store, and a
        message that names only Triton sends the on-call engineer to the wrong component."""
        try:
            self._store(
                "listing the repository",
                lambda: self.fs.ls(self.location.root, detail=False),
                missing="nothing under it: the bucket or the prefix does not exist",
            )
        except RepositoryUnavailable as exc:
            return exc
        return None

    def read_model(self, model: str) -> RepositoryModel:
        """The model's config.pbtxt (or why it does not parse) and version numbers; versions
        None when the model has no object under the repository."""
        objects = self._listing(model)
        if not objects:
            return RepositoryModel(None, None)
        versions = frozenset(
            int(first) for first in {r.split("/", 1)[0] for r in objects if "/" in r}
            if first.isdigit()
        )  # fmt: skip
        found = objects.get("config.pbtxt")
        if found is None:
            return RepositoryModel(None, versions)
        config, error = self._config(found)
        if error is not None:
            error = f"{self.location.model_url(model, 'config.pbtxt')} does not parse: {error}"
        return RepositoryModel(config, versions, error)

    def version_digests(self, model: str, versions: Iterable[int]) -> dict[int, str | None]:
        """The digest of each of ``versions``' folders; None for a version with no object.
        From the model's last listing when it is under ``LISTING_REUSE`` seconds old."""
        objects = self._listing(model, reuse=LISTING_REUSE)
        try:
            return self._digests(objects, versions)
        except RepositoryUnavailable:
            with self._lock:
                self._listed.pop(model, None)  # an object gone: the next read lists again
            raise

    def _digests(
        self, objects: Mapping[str, _Object], versions: Iterable[int]
    ) -> dict[int, str | None]:
        digests: dict[int, str | None] = {}
        for version in versions:
            here = f"{version}/"
            lines = [
                file_line(False, self._sha256(found), encoded(relative[len(here) :]))
                for relative, found in sorted(objects.items())
                if relative.startswith(here)
                and not any(skipped(part) for part in relative[len(here) :].split("/"))
            ]
            has_any = any(relative.startswith(here) for relative in objects)
            digests[version] = digest_of(lines) if has_any else None
        return digests

    def _listing(self, model: str, reuse: float = 0.0) -> dict[str, _Object]:
        """Every object under ``model``'s prefix, by its path relative to it; one request,
        or none when the last listing is under ``reuse`` seconds old."""
        if "/" in model or model in ("", ".", ".."):
            return {}
        with self._lock:
            last = self._listed.get(model)
        if last is not None and self.clock() - last[0] < reuse:
            return last[1]
        listed_at = self.clock()
        base = f"{self.location.root}/{model}"
        found = self._store(
            f"listing {model}", lambda: self.fs.find(base, detail=True, withdirs=False)
        )
        with self._lock:
            self.reads.listings += 1
        objects = {}
        under = base.strip("/") + "/"
        for path, info in found.items():
            name = str(path).lstrip("/")  # some file systems name paths from a leading /
            if not name.startswith(under) or name.endswith("/") or info.get("type") != "file":
                continue  # another model's prefix (echo vs echo2), a folder marker
            objects[name[len(under) :]] = _Object(str(path), _identity(info))
        with self._lock:
            self._listed[model] = (listed_at, objects)
        return objects

    def _config(self, found: _Object) -> tuple[dict[str, Any] | None, str | None]:
        """The object parsed as a config, or why it does not parse (kept per object version
        like the config: a broken file is not read again either)."""
        with self._lock:
            if found in self._configs:
                return self._configs[found]
        text = self._read(found).decode("utf-8", errors="replace")
        parsed: tuple[dict[str, Any] | None, str | None]
        try:
            parsed = parse_pbtxt(text), None
        except ValueError as exc:
            parsed = None, str(exc)
        with self._lock:
            self._forget_older(self._configs, found)
            self._configs[found] = parsed
        return parsed

    def _sha256(self, found: _Object) -> str:
        with self._lock:
            known = self._hashes.get(found)
        if known is not None:
            return known
        digest = hashlib.sha256()

        def read() -> None:
            with self.fs.open(found.path, "rb", block_size=_CHUNK) as stream:
                while chunk := stream.read(_CHUNK):
                    digest.update(chunk)
                    with self._lock:
                        self.reads.bytes_read += len(chunk)

        self._store(f"reading {found.path}", read, missing=_OBJECT_GONE)
        with self._lock:
            self.reads.objects_read += 1
            self._forget_older(self._hashes, found)
            self._hashes[found] = digest.hexdigest()
        return digest.hexdigest()

    def _read(self, found: _Object) -> bytes:
        data: bytes = self._store(
            f"reading {found.path}", lambda: self.fs.cat_file(found.path), missing=_OBJECT_GONE
        )
        with self._lock:
            self.reads.objects_read += 1
            self.reads.bytes_read += len(data)
        return data

    @staticmethod
    def _forget_older(cache: dict[_Object, Any], found: _Object) -> None:
        # One entry per path: an object rewritten replaces what its older version gave.
        for old in [o for o in cache if o.path == found.path]:
            del cache[old]

    def _store(self, doing: str, call: Any, missing: str = _BUCKET_MISSING) -> Any:
        """``call()``, its failure raised as RepositoryUnavailable saying ``doing`` and the
        cause in plain words; ``missing``: what a FileNotFoundError means for this call (an
        object the listing just showed and that is gone now: the repository changed while it
        was read, and the next pass lists again)."""
        try:
            return call()
        except FileNotFoundError as exc:
            raise self._unavailable(f"{doing}: {missing} ({_status(exc)}{exc})") from exc
        except PermissionError as exc:
            raise self._unavailable(
                f"{doing}: the store refused the credentials ({_status(exc)}{exc})"
            ) from exc
        except Exception as exc:  # the store's client raises its own classes (botocore...)
            if isinstance(exc, (TypeError, AttributeError, NameError)):
                raise  # a bug here, not the store
            raise self._unavailable(f"{doing}: {self._cause(exc)}") from exc

    def _unavailable(self, reason: str) -> RepositoryUnavailable:
        return RepositoryUnavailable(redact(self.location.text), redact(reason))

    @property
    def store_name(self) -> str:
        """The store as a message names it: at its endpoint, else the service."""
        if self.location.endpoint:
            return f"the store at {self.location.endpoint}"
        if self.location.account:
            return f"{_SERVICE['as']} account {self.location.account}"
        return _SERVICE.get(self.location.scheme, self.location.scheme)

    def _cause(self, exc: BaseException) -> str:
        """What went wrong on the way to the store, in the words an on-call engineer
        searches for; the client's own text only where those words would lose something."""
        chain = _chain(exc)
        store = self.store_name
        if any(isinstance(e, ConnectionRefusedError) for e in chain):
            return f"connection refused by {store} (is it running at that address?)"
        if any(isinstance(e, socket.gaierror) for e in chain):
            return f"the host name does not resolve ({store})"
        # botocore's ConnectTimeoutError and ReadTimeoutError are no TimeoutError.
        if any(isinstance(e, TimeoutError) or "Timeout" in type(e).__name__ for e in chain):
            return f"no answer from {store} within the {self.timeout:g}s timeout"
        status = _status(exc)
        if status.startswith("HTTP 403"):
            return f"the store refused the credentials ({status}{exc})"
        return f"{status}{type(exc).__name__}: {exc}"


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and every exception it was raised from or during: botocore wraps aiohttp's
    (also kept in its ``kwargs["error"]``), which wraps the socket's. The wrapped one is
    followed explicitly because ``__context__`` does not survive every path: fsspec raises
    the store's exception again in the calling thread, and raised inside an ``except``
    block (a failed Triton call, ``triton.py``) its context becomes that block's exception."""
    found: list[BaseException] = []
    waiting: list[BaseException | None] = [exc]
    while waiting:
        current = waiting.pop(0)
        if current is None or any(current is seen for seen in found):
            continue
        found.append(current)
        kwargs = getattr(current, "kwargs", None)
        wrapped = kwargs.get("error") if isinstance(kwargs, dict) else None
        waiting += [
            current.__cause__,
            wrapped if isinstance(wrapped, BaseException) else None,
            current.__context__,
        ]
    return found


def _status(exc: BaseException) -> str:
    """``HTTP <status> <code>: `` when some exception in the chain carries the store's
    answer (botocore's ClientError, aiohttp's and Azure's response errors), else ""."""
    for error in _chain(exc):
        response = getattr(error, "response", None)
        if isinstance(response, Mapping):
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            code = response.get("Error", {}).get("Code")
            if status:
                return f"HTTP {status}{f' {code}' if code else ''}: "
        for name in ("status", "status_code", "code"):
            value = getattr(error, name, None)
            if isinstance(value, int) and 100 <= value < 600:
                return f"HTTP {value}: "
    return ""


def _identity(info: Mapping[str, Any]) -> tuple[Any, ...]:
    """What changes when an object is rewritten, from a listing entry of any of the stores."""
    return (
        info.get("ETag") or info.get("etag") or info.get("md5Hash"),
        info.get("generation"),
        info.get("size"),
        str(info.get("LastModified") or info.get("last_modified") or info.get("updated")),
        str(info.get("created") or info.get("mtime")),  # fsspec's own (memory, local)
    )


def open_store(location: RepositoryLocation, timeout: float = STORE_TIMEOUT) -> ObjectRepository:
    """A reader of ``location`` through its store's fsspec file system. Raises
    RepositoryUnavailable when that file system is not installed (naming the extra)."""
    module_name, extra = _EXTRA[location.scheme]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise RepositoryUnavailable(
            location.text,
            f"reading {location.scheme}:// needs {module_name}: pip install "
            f"'triton-gitops[{extra}]'",
        ) from exc
    if location.scheme == "s3":
        fs = module.S3FileSystem(
            use_listings_cache=False,
            skip_instance_cache=True,
            client_kwargs={"endpoint_url": location.endpoint} if location.endpoint else {},
            config_kwargs={
                "connect_timeout": timeout,
                "read_timeout": timeout,
                "retries": {"max_attempts": 2, "mode": "standard"},
            },
        )
        # botocore's own retries only (2 attempts, standard mode: backoff on throttling);
        # s3fs's 5 more around each of them (a class attribute, not an argument) made a
        # store that never answers cost the pass 20 timeouts instead of 2 (10.7 s at a
        # 0.5 s timeout, measured).
        fs.retries = 1
    elif location.scheme == "gs":
        fs = module.GCSFileSystem(
            use_listings_cache=False, skip_instance_cache=True, timeout=timeout
        )
    else:
        fs = module.AzureBlobFileSystem(
            account_name=location.account, use_listings_cache=False, skip_instance_cache=True
        )
    return ObjectRepository(location, fs, timeout=timeout)
