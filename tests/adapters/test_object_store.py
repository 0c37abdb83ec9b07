"""A model repository in an S3 bucket, with real components: moto's S3-protocol server
(``testkit.object_store.LocalObjectStore``) and a real tritonserver reading the bucket
(``testkit.local_triton.LocalTriton`` over ``s3://http://127.0.0.1:PORT/BUCKET/PREFIX``).

Nothing here leaves loopback: the store, the server and this process's AWS clients all have
explicit credentials, the us-east-1 region and the EC2 metadata lookup off."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc

from reconciler.adapters.model_repository import store_trouble
from reconciler.adapters.object_repository import open_store
from reconciler.model.errors import RepositoryUnavailable
from reconciler.model.repository import parse_repository
from testkit.local_triton import LocalTriton, LocalTritonError
from testkit.manifests import ECHO_CONFIG, echo_repository
from testkit.object_store import LocalObjectStore, ObjectStoreError


@pytest.fixture(scope="module", autouse=True)
def _no_metadata_lookup() -> Iterator[None]:
    """This process's AWS clients too: never the EC2 metadata address."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AWS_EC2_METADATA_DISABLED", "true")
        patch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        yield


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalObjectStore]:
    log = tmp_path_factory.mktemp("store") / "moto.log"
    with LocalObjectStore(log_file=log) as started:
        yield started


def files_under(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def logs(store: LocalObjectStore, server: LocalTriton | None = None) -> str:
    text = ""
    if server is not None:
        text += f"\n--- tritonserver log ({server.log_file}) ---\n{server.log_tail(40)}"
    return text + f"\n--- moto log ({store.log_file}) ---\n{store.log_tail(20)}"


@contextmanager
def explained(store: LocalObjectStore, server: LocalTriton | None = None) -> Iterator[None]:
    """A client call that raises fails the test with the logs that say why."""
    try:
        yield
    except Exception as exc:
        raise AssertionError(f"{type(exc).__name__}: {exc}{logs(store, server)}") from exc


def answer(server: LocalTriton, version: int | None = None) -> float:
    """What echo answers for ones: the factor of the version that served."""
    with triton_grpc.InferenceServerClient(server.grpc_address) as client:
        item = triton_grpc.InferInput("INPUT0", [1, 4], "FP32")
        item.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
        result = client.infer("echo", [item], model_version=str(version) if version else "")
        return float(result.as_numpy("OUTPUT0")[0][0])


def index(server: LocalTriton) -> dict[str, str]:
    """echo's versions in the repository index -> state."""
    with triton_grpc.InferenceServerClient(server.grpc_address) as client:
        models = client.get_model_repository_index(as_json=True).get("models", [])
    return {
        m["version"]: m.get("state", "") for m in models if m["name"] == "echo" and "version" in m
    }


def test_the_store_holds_an_uploaded_folder_and_is_gone_by_its_pid(tmp_path: Path) -> None:
    folder = echo_repository(tmp_path / "models", 1, 2)
    with LocalObjectStore(log_file=tmp_path / "moto.log") as store:
        pid = store.pid
        assert pid is not None and Path(f"/proc/{pid}").exists()
        assert store.endpoint == f"http://127.0.0.1:{store.port}"
        store.create_bucket("models")
        keys = store.upload_folder(folder, "models", "/repo/")
        expected = [f"repo/{name}" for name in files_under(folder)]
        assert keys == expected, logs(store)
        assert store.keys("models") == expected, logs(store)
        assert store.keys("models", "repo/echo/2/") == ["repo/echo/2/model.py"]

        store.put("models", "repo/echo/3/model.py", "# a third version\n")
        body = store.client().get_object(Bucket="models", Key="repo/echo/3/model.py")["Body"]
        assert body.read() == b"# a third version\n"
        assert store.delete("models", "repo/echo/2/") == ["repo/echo/2/model.py"]
        store.delete("models", "repo/echo/3/model.py")
        assert store.keys("models") == ["repo/echo/1/model.py", "repo/echo/config.pbtxt"]

        # The access log counts what was asked of the store (readiness checks left out).
        requests = store.requests()
        assert requests[0].method == "PUT" and requests[0].path == "/models", requests
        assert sum(r.method == "PUT" for r in requests) == 1 + len(expected) + 1, requests
        assert sum(r.method == "DELETE" for r in requests) == 2, requests
        assert store.request_count == len(requests)
        assert store.triton_url("models", "repo") == f"s3://{store.endpoint}/models/repo"
        endpoint = store.endpoint

    assert store.process is None
    assert not Path(f"/proc/{pid}").exists(), f"moto server {pid} still runs after stop"
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(endpoint + "/moto-api/", timeout=2)


def test_urls_triton_would_not_take_as_a_custom_host_are_refused() -> None:
    store = LocalObjectStore(port=9000)  # not started: spelling only
    assert store.triton_url("my.models-1") == "s3://http://127.0.0.1:9000/my.models-1"
    assert store.triton_url("models", "/a/B_c.d/") == "s3://http://127.0.0.1:9000/models/a/B_c.d"
    for bucket, prefix in (("Models", ""), ("ab", ""), ("models_1", ""), ("models", "a b")):
        with pytest.raises(ObjectStoreError):
            store.triton_url(bucket, prefix)


def test_a_url_reaches_tritonserver_untouched_a_folder_stays_a_path() -> None:
    url = "s3://http://127.0.0.1:9000/bucket/models"
    assert LocalTriton(url).model_repository == url
    assert LocalTriton("gs://bucket/models").model_repository == "gs://bucket/models"
    assert LocalTriton("/tmp/models").model_repository == Path("/tmp/models")
    assert LocalTriton(Path("/tmp/models")).model_repository == Path("/tmp/models")


@pytest.mark.triton
def test_tritonserver_serves_echo_from_the_bucket_and_a_new_version_beside_it(
    store: LocalObjectStore, tmp_path: Path
) -> None:
    store.create_bucket("serving")
    store.upload_folder(echo_repository(tmp_path / "models", 1), "serving", "models")
    server = LocalTriton(
        store.triton_url("serving", "models"),
        log_file=tmp_path / "triton.log",
        extra_env=store.environment(),
    )
    started = time.monotonic()
    with explained(store, server):
        server.start()
    start_seconds = time.monotonic() - started
    try:
        mount = server.mount_directory
        assert mount is not None and mount.is_dir()
        assert server.process is not None
        environ = Path(f"/proc/{server.process.pid}/environ").read_bytes().split(b"\0")
        for name, value in {
            **store.environment(),
            "TRITON_AWS_MOUNT_DIRECTORY": str(mount),
        }.items():
            assert f"{name}={value}".encode() in environ, name

        before = store.request_count
        with explained(store, server), triton_grpc.InferenceServerClient(server.grpc_address) as c:
            c.load_model("echo")
            assert answer(server) == 1.0
        assert index(server) == {"1": "READY"}, logs(store, server)
        read = [r.path for r in store.requests()[before:] if r.method == "GET"]
        assert any(p.startswith("/serving/models/echo/1/model.py") for p in read), read
        # Triton runs the model from its copy in the mount folder.
        assert list(mount.glob("folder*/1/model.py")), f"{sorted(mount.rglob('*'))}"

        store.upload_folder(echo_repository(tmp_path / "v2", 2), "serving", "models")
        config = {**ECHO_CONFIG, "version_policy": {"specific": {"versions": [1, 2]}}}
        with explained(store, server), triton_grpc.InferenceServerClient(server.grpc_address) as c:
            c.load_model("echo", config=json.dumps(config))
            assert index(server) == {"1": "READY", "2": "READY"}, logs(store, server)
            assert (answer(server, 1), answer(server, 2), answer(server)) == (1.0, 2.0, 2.0)
    finally:
        server.stop()
    assert not mount.exists(), f"the mount folder {mount} outlived the server"
    print(f"tritonserver over the bucket ready in {start_seconds:.2f} s")


@pytest.mark.triton
def test_a_missing_bucket_stops_tritonserver_and_the_error_says_why(
    store: LocalObjectStore, tmp_path: Path
) -> None:
    server = LocalTriton(
        store.triton_url("no-such-bucket", "models"),
        log_file=tmp_path / "triton.log",
        extra_env=store.environment(),
    )
    with pytest.raises(LocalTritonError) as failed:
        server.start(ready_timeout=30)
    message = str(failed.value)
    assert "tritonserver exited with 1" in message, message + logs(store)
    assert "Unable to create S3 filesystem client" in message, message + logs(store)
    assert server.mount_directory is None
    assert server.process is not None and server.process.poll() == 1


def _read_by_the_reconciler(
    store: LocalObjectStore, url: str, monkeypatch: pytest.MonkeyPatch
) -> RepositoryUnavailable:
    """The reconciler's reader of ``url`` (s3fs, with the store's credentials in this
    process's environment), listing echo: the error it raised."""
    for name, value in store.environment().items():
        monkeypatch.setenv(name, value)
    location = parse_repository(url)
    with pytest.raises(RepositoryUnavailable) as raised:
        open_store(location, timeout=5.0).version_digests("echo", [1])
    return raised.value


def test_the_reconciler_told_of_a_missing_bucket_names_it_and_the_url(
    store: LocalObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = store.triton_url("no-such-bucket", "models")

    error = _read_by_the_reconciler(store, url, monkeypatch)

    assert str(error).startswith(f"model repository {url}"), str(error)
    assert "listing echo: the bucket or container does not exist" in str(error), str(error)


def test_credentials_the_store_refuses_are_named_as_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with LocalObjectStore(log_file=tmp_path / "moto.log", refuse_credentials=True) as strict:
        url = strict.triton_url("models-bucket", "models")

        error = _read_by_the_reconciler(strict, url, monkeypatch)

        refused = [r for r in strict.requests() if r.status == 403]
    assert "listing echo: the store refused the credentials (HTTP 403 InvalidAccessKeyId: " in (
        str(error)
    ), str(error)
    assert refused, "the store answered no request with 403"


def test_a_stopped_store_is_named_as_refusing_connections_even_asked_after_a_failed_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the Triton adapter asks when Triton fails a call on a server over this bucket
    (``store_trouble``, from inside the ``except`` block that caught Triton's error): the
    store's own cause, in plain words, naming its address. fsspec raises the store's error
    again in this thread, where its context becomes the failure being handled; the cause
    must be found all the same."""
    with LocalObjectStore(log_file=tmp_path / "moto.log") as stopped:
        for name, value in stopped.environment().items():
            monkeypatch.setenv(name, value)
        stopped.create_bucket("models-bucket")
        stopped.put("models-bucket", "models/echo/1/model.py", "# version 1\n")
        url = stopped.triton_url("models-bucket", "models")
        assert store_trouble(url) is None  # answering: nothing to say
    try:
        raise RuntimeError("Triton did not answer")
    except RuntimeError:
        trouble = store_trouble(url)

    assert str(trouble) == (
        f"model repository {url}: listing the repository: connection refused by the store at "
        f"{stopped.endpoint} (is it running at that address?)"
    ), str(trouble)
