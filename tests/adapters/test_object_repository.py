"""A model repository in object storage, read through fsspec: the same answers as a local
folder, one listing per model and read, and no object read again while it is unchanged.
Here over fsspec's in-memory file system (a real fsspec implementation, no network);
tests/integration/test_object_storage.py runs the same against an S3 server and Triton."""

from __future__ import annotations

import contextlib
import shutil
import socket
import uuid
from pathlib import Path
from typing import Any

import fsspec
import pytest

from reconciler.adapters.artifacts import tree_digest
from reconciler.adapters.object_repository import LISTING_REUSE, ObjectRepository, open_store
from reconciler.model.errors import RepositoryUnavailable
from reconciler.model.repository import RepositoryLocation, RepositoryModel, parse_repository

MODELS = Path(__file__).resolve().parents[2] / "testkit" / "models"
CONFIG = 'name: "echo"\nbackend: "python"\nmax_batch_size: 0\n'


def bucket() -> tuple[Any, RepositoryLocation]:
    fs = fsspec.filesystem("memory", skip_instance_cache=True)
    name = f"b{uuid.uuid4().hex[:10]}"
    return fs, parse_repository(f"s3://{name}/models")


def repository(files: dict[str, bytes]) -> tuple[ObjectRepository, Any, str]:
    fs, location = bucket()
    for key, data in files.items():
        fs.pipe(f"/{location.root}/{key}", data)
    return ObjectRepository(location, fs), fs, location.root


def test_config_and_versions_come_from_one_listing_and_one_read() -> None:
    store, _, _ = repository(
        {
            "echo/config.pbtxt": CONFIG.encode(),
            "echo/1/model.py": b"one",
            "echo/2/model.py": b"two",
            "echo/notes/README": b"not a version",
            "echo2/1/model.py": b"another model sharing the prefix",
        }
    )

    config, versions, error = store.read_model("echo")

    assert config is not None and config["backend"] == "python", config
    assert error is None
    assert versions == frozenset({1, 2})
    assert (store.reads.listings, store.reads.objects_read) == (1, 1), store.reads
    assert store.read_model("absent") == RepositoryModel(None, None)
    assert store.read_model("../echo") == RepositoryModel(None, None)


def test_a_config_that_does_not_parse_is_said_with_its_url_and_read_once() -> None:
    store, _, _ = repository({"echo/config.pbtxt": b'name: "echo"\ninput [ {', "echo/1/m": b"1"})

    found = store.read_model("echo")
    again = store.read_model("echo")  # the next pass: the same object, not read again

    assert found.config is None and found.versions == frozenset({1})
    assert found.config_error is not None
    assert found.config_error.startswith(f"{store.location.text}/echo/config.pbtxt does not parse")
    assert again == found and store.reads.objects_read == 1, store.reads


def test_an_unchanged_repository_is_listed_again_but_never_read_again() -> None:
    store, fs, root = repository(
        {"echo/config.pbtxt": CONFIG.encode(), "echo/1/model.py": b"one" * 1000}
    )
    store.read_model("echo")
    store.version_digests("echo", [1])
    read = (store.reads.objects_read, store.reads.bytes_read)

    for _ in range(3):  # three more passes over the same objects
        store.read_model("echo")
        store.version_digests("echo", [1])

    assert (store.reads.objects_read, store.reads.bytes_read) == read, store.reads
    # One per pass: observing lists afresh (the repository as it is now), and the digests
    # a moment later take that listing.
    assert store.reads.listings == 4
    fs.pipe(f"/{root}/echo/config.pbtxt", CONFIG.replace("0", "8").encode())
    config = store.read_model("echo").config
    assert config is not None and config["max_batch_size"] == 8  # a rewrite is read again
    assert store.reads.objects_read == read[0] + 1


def test_digests_take_a_listing_only_while_it_is_young() -> None:
    store, fs, root = repository({"echo/config.pbtxt": CONFIG.encode(), "echo/1/model.py": b"1"})
    now = [100.0]
    store.clock = lambda: now[0]
    store.read_model("echo")
    first = store.version_digests("echo", [1])[1]
    assert store.reads.listings == 1

    fs.pipe(f"/{root}/echo/1/model.py", b"changed under a released version number")
    now[0] += LISTING_REUSE  # a later pass: listed again, the change seen
    assert store.version_digests("echo", [1])[1] != first
    assert store.reads.listings == 2
    store.read_model("echo")  # observing never takes an old listing
    assert store.reads.listings == 3


def test_a_version_digest_in_the_bucket_equals_the_folders(tmp_path: Path) -> None:
    """The digest contract over objects: the same files give the same digest as the local
    folder (files not executable: objects have no execute bit), __pycache__ and .pyc left
    out, a folder marker key is no file."""
    folder = tmp_path / "echo" / "1"
    (folder / "weights").mkdir(parents=True)
    shutil.copy(MODELS / "echo" / "model.py", folder / "model.py")
    (folder / "model.py").chmod(0o644)  # objects have no execute bit
    (folder / "weights" / "my layer.bin").write_bytes(bytes(range(256)) * 64)
    files = {
        f"echo/1/{p.relative_to(folder).as_posix()}": p.read_bytes()
        for p in folder.rglob("*")
        if p.is_file()
    }
    files["echo/1/__pycache__/model.cpython-311.pyc"] = b"compiled on first load"
    files["echo/1/model.pyc"] = b"compiled ahead"
    store, fs, root = repository(files)
    fs.mkdir(f"/{root}/echo/1/empty/")

    found = store.version_digests("echo", [1, 7])

    assert found == {1: tree_digest(folder), 7: None}, found
    fs.pipe(f"/{root}/echo/1/model.py", b"changed under a released version number")
    store.read_model("echo")  # the next pass's observation lists it again
    assert store.version_digests("echo", [1])[1] != tree_digest(folder)


def test_a_store_that_fails_is_unavailable_naming_the_url_and_what_was_done() -> None:
    class Down:
        def find(self, *args: object, **kwargs: object) -> object:
            raise ConnectionRefusedError(111, "Connection refused")

    location = parse_repository("s3://http://127.0.0.1:9/models-bucket/models")

    with pytest.raises(RepositoryUnavailable) as raised:
        ObjectRepository(location, Down()).read_model("echo")

    message = str(raised.value)
    assert message == (
        "model repository s3://http://127.0.0.1:9/models-bucket/models: listing echo: "
        "connection refused by the store at http://127.0.0.1:9 (is it running at that address?)"
    ), message


def test_the_store_is_asked_once_for_why_it_cannot_be_read() -> None:
    """``unreadable``: one listing of the repository's root, for a message beside a failed
    Triton call; None while the store answers."""
    store, fs, _ = repository({"echo/1/model.py": b"one"})
    empty = ObjectRepository(parse_repository("s3://no-such-bucket/models"), fs)

    assert store.unreadable() is None
    trouble = empty.unreadable()

    assert trouble is not None and str(trouble).startswith(
        "model repository s3://no-such-bucket/models: listing the repository: nothing under "
        "it: the bucket or the prefix does not exist"
    ), str(trouble)


def test_an_object_gone_between_its_listing_and_its_read_is_a_reason_to_wait() -> None:
    """A listing that changes during a pass (a version deleted while it is hashed): the
    repository is unavailable for this pass, saying what happened; nothing is half-read."""
    store, fs, root = repository({"echo/1/model.py": b"one", "echo/1/weights": b"w" * 100})
    real_find = fs.find

    def find_then_delete(path: str, **kwargs: Any) -> Any:
        found = real_find(path, **kwargs)
        fs.rm(f"/{root}/echo/1/weights")  # a clean-up running beside the pass
        return found

    fs.find = find_then_delete

    with pytest.raises(RepositoryUnavailable) as raised:
        store.version_digests("echo", [1])

    message = str(raised.value)
    assert "reading" in message and "echo/1/weights" in message, message
    assert "the object is gone since it was listed" in message, message
    fs.find = real_find
    assert store.version_digests("echo", [1])[1] is not None  # the next pass reads it


def test_a_missing_bucket_and_refused_credentials_say_so() -> None:
    class Store:
        def __init__(self, error: Exception) -> None:
            self.error = error

        def find(self, *args: object, **kwargs: object) -> object:
            raise self.error

    location = parse_repository("s3://models-bucket/models")
    missing = ObjectRepository(location, Store(FileNotFoundError("models-bucket")))
    refused = ObjectRepository(location, Store(PermissionError("InvalidAccessKeyId")))

    with pytest.raises(RepositoryUnavailable, match="does not exist"):
        missing.read_model("echo")
    with pytest.raises(RepositoryUnavailable, match="refused the credentials"):
        refused.version_digests("echo", [1])


def test_a_store_that_accepts_and_never_answers_times_out_as_unavailable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A store that stalls is down for the pass: each request times out (here after 0.5 s,
    STORE_TIMEOUT in service) and is tried twice (botocore's attempts; s3fs's own retries
    around them are off), instead of holding the pass for minutes."""
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }.items():
        monkeypatch.setenv(name, value)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(32)  # accepts connections (the kernel's backlog), never answers
        port = silent.getsockname()[1]
        location = parse_repository(f"s3://http://127.0.0.1:{port}/stalled-bucket/models")

        with pytest.raises(RepositoryUnavailable) as raised:
            open_store(location, timeout=0.5).read_model("echo")

        silent.setblocking(False)
        attempts = 0
        with contextlib.suppress(BlockingIOError):
            while True:
                silent.accept()[0].close()
                attempts += 1

    assert str(raised.value).endswith(
        f"listing echo: no answer from the store at http://127.0.0.1:{port} within the 0.5s timeout"
    ), str(raised.value)
    # 3 measured (botocore's two attempts and one more request of s3fs's find); 15 with
    # s3fs's retries on.
    assert attempts <= 3, f"{attempts} connections for one listing of a store that never answers"
