"""A model repository in Google Cloud Storage (``gs://``), with real components: PyPI's
``gcp-storage-emulator`` on loopback (``testkit.gcs_store.LocalGcsStore``), the reconciler's
reader (gcsfs, the ``gcs`` extra) and a real tritonserver loading from the bucket. The same
answers as the S3 tests: config and versions from one listing, a version's digest equal to the
folder's, a missing bucket named as such, and Triton serving what it loaded from ``gs://``.

Not run here: Google's own service (credentials from a service account or workload identity);
the emulator takes no credentials. Nothing leaves loopback (``LocalGcsStore.environment``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc

from reconciler.adapters.artifacts import tree_digest
from reconciler.adapters.object_repository import open_store
from reconciler.model.errors import RepositoryUnavailable
from reconciler.model.repository import parse_repository
from testkit.gcs_store import LocalGcsStore
from testkit.local_triton import LocalTriton
from testkit.manifests import echo_repository

# gcsfs reads this once, when it is imported: on (its default), it swaps in a file system
# that first asks the service over gRPC and TLS about hierarchical namespaces, which the
# emulator cannot answer (each request then waits on retries). Set before the import.
os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"
pytest.importorskip("gcsfs", reason="the gcs extra (gcsfs) is not installed")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalGcsStore]:
    with LocalGcsStore(log_file=tmp_path_factory.mktemp("gcs") / "emulator.log") as started:
        yield started


@pytest.fixture
def in_store_environment(store: LocalGcsStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reconciler runs in this process: the emulator's address, no metadata lookup."""
    for name, value in store.environment().items():
        monkeypatch.setenv(name, value)


@pytest.mark.usefixtures("in_store_environment")
def test_the_reconciler_reads_a_gs_repository_as_a_folder(
    store: LocalGcsStore, tmp_path: Path
) -> None:
    folder = echo_repository(tmp_path / "models", 1, 2)
    store.create_bucket("gs-models")
    store.upload_folder(folder, "gs-models", "models")
    reader = open_store(parse_repository("gs://gs-models/models"), timeout=5.0)

    config, versions, _ = reader.read_model("echo")
    digests = reader.version_digests("echo", [1, 2, 3])

    assert config is not None and config["name"] == "echo" and config["backend"] == "python"
    assert versions == frozenset({1, 2})
    assert digests == {
        1: tree_digest(folder / "echo" / "1"),
        2: tree_digest(folder / "echo" / "2"),
        3: None,
    }
    assert (reader.reads.listings, reader.reads.objects_read) == (1, 3), reader.reads


@pytest.mark.usefixtures("in_store_environment")
def test_a_missing_gs_bucket_is_named_as_missing() -> None:
    reader = open_store(parse_repository("gs://no-such-gs-bucket/models"), timeout=5.0)

    with pytest.raises(RepositoryUnavailable) as raised:
        reader.read_model("echo")

    message = str(raised.value)
    assert message.startswith("model repository gs://no-such-gs-bucket/models"), message
    assert "listing echo: the bucket or container does not exist" in message, message


@pytest.mark.triton
@pytest.mark.usefixtures("in_store_environment")
def test_tritonserver_loads_and_serves_from_the_gs_bucket(
    store: LocalGcsStore, tmp_path: Path
) -> None:
    store.create_bucket("gs-serving")
    store.upload_folder(echo_repository(tmp_path / "models", 1, 2), "gs-serving", "models")
    server = LocalTriton(
        "gs://gs-serving/models", log_file=tmp_path / "triton.log", extra_env=store.environment()
    )
    with server:
        config = json.loads(json.dumps({"version_policy": {"specific": {"versions": [1, 2]}}}))
        with triton_grpc.InferenceServerClient(server.grpc_address) as client:
            try:
                client.load_model("echo")
                base = client.get_model_config("echo", as_json=True)["config"]
                client.load_model("echo", config=json.dumps({**base, **config}))
                ready = {
                    m["version"]
                    for m in client.get_model_repository_index(as_json=True)["models"]
                    if m.get("state") == "READY"
                }
                request = triton_grpc.InferInput("INPUT0", [1, 4], "FP32")
                request.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
                answers = {
                    version: client.infer("echo", [request], model_version=version).as_numpy(
                        "OUTPUT0"
                    )
                    for version in ("1", "2")
                }
            except Exception as exc:
                raise AssertionError(f"{exc}\n--- tritonserver ---\n{server.log_tail()}") from exc
        mount = server.mount_directory
        assert mount is not None and list(mount.glob("folder*/1/model.py")), server.log_tail()
    assert ready == {"1", "2"}
    assert {v: float(a[0][0]) for v, a in answers.items()} == {"1": 1.0, "2": 2.0}
