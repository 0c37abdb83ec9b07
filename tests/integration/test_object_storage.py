"""The reconciler over a model repository in an S3 bucket, with real components: moto's
S3-protocol server on loopback, a real tritonserver loading the models from that bucket, and
the reconciler reading the same URL (``s3://http://127.0.0.1:PORT/BUCKET/models``, Triton's
own spelling). Every model-aware check works as on a folder: a swap under client load drops
no request, a version the bucket lacks is a plan problem, a changed object under a pinned
digest, an interface change in the bucket's config.pbtxt and a config.pbtxt that does not
parse are refused before any load, and a store that does not answer leaves the server serving
what it served.

Nothing leaves loopback: explicit dummy credentials, region us-east-1, no EC2 metadata."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from testkit.cli_run import Reconciler, cli, explain
from testkit.loadgen import WITNESS_PAUSE, LoadGenerator
from testkit.local_triton import LocalTriton
from testkit.manifests import (
    ManifestRepo,
    deployment_doc,
    git,
    server_doc,
    write_model_repository,
    write_scorer_repository,
)
from testkit.object_store import LocalObjectStore
from tests.integration.flows import ready_versions, served_factor


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalObjectStore]:
    with LocalObjectStore(log_file=tmp_path_factory.mktemp("store") / "moto.log") as started:
        yield started


@dataclass
class BucketFleet:
    """One tritonserver over a bucket of its own, and the reconciler pointed at both."""

    store: LocalObjectStore
    bucket: str
    url: str
    triton: LocalTriton
    reconciler: Reconciler
    manifests: ManifestRepo

    def deploy(self, *versions: int, extra: str = "") -> None:
        self.manifests.write(
            "echo.yaml", deployment_doc("echo", list(versions), ["edge-a"]) + extra
        )
        self.manifests.commit(f"echo {versions}")

    def put(self, key: str, data: bytes | str) -> None:
        self.store.put(self.bucket, f"models/{key}", data)


@pytest.fixture
def fleet(
    store: LocalObjectStore,
    manifests: ManifestRepo,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[BucketFleet]:
    for name, value in store.environment().items():  # the reconciler runs in this process
        monkeypatch.setenv(name, value)
    bucket = f"models-{uuid.uuid4().hex[:12]}"
    store.create_bucket(bucket)
    store.upload_folder(write_model_repository(tmp_path / "models"), bucket, "models")
    url = store.triton_url(bucket, "models")
    triton = LocalTriton(url, log_file=tmp_path / "triton.log", extra_env=store.environment())
    with triton:
        manifests.write(
            "servers.yaml",
            server_doc("edge-a", triton.grpc_address, url, metrics=triton.metrics_url),
        )
        yield BucketFleet(
            store, bucket, url, triton, Reconciler(manifests.url, tmp_path / "r"), manifests
        )


def test_a_swap_from_the_bucket_under_client_load_drops_no_request(fleet: BucketFleet) -> None:
    fleet.deploy(1)
    first = fleet.reconciler.apply("--output", "json")
    assert first.code == 0, explain(first.json(), first.err)
    assert ready_versions(fleet.triton, "echo") == {1}

    with LoadGenerator(fleet.triton.grpc_address, "echo", threads=2, pause=WITNESS_PAUSE) as load:
        load.wait_for_samples(100)
        fleet.deploy(2)
        swapped = fleet.reconciler.apply("--output", "json")
        load.wait_for_samples(len(load.samples) + 100)

    assert swapped.code == 0, explain(swapped.json(), swapped.err)
    assert load.failures == [], load.failures[:5]
    assert 2 in load.versions_seen()
    assert ready_versions(fleet.triton, "echo") == {2}


def test_a_version_the_bucket_lacks_is_a_plan_problem_naming_server_and_model(
    fleet: BucketFleet,
) -> None:
    fleet.deploy(8)

    planned = fleet.reconciler.plan()

    assert planned.code == 1, planned.out + planned.err
    assert (
        f"server edge-a, model echo: version(s) 8 not in the model repository {fleet.url} "
        "(it holds 1, 2, 3"
    ) in planned.out, planned.out
    assert ready_versions(fleet.triton, "echo") == set()


def test_an_object_changed_under_a_pinned_digest_is_refused(fleet: BucketFleet) -> None:
    shown = cli("digest", f"{fleet.url}/echo/2")
    assert shown.code == 0, shown.err
    digest = shown.out.strip()
    assert digest.startswith("sha256:") and len(digest) == 71, shown.out
    pinned = "  versions: [{version: 2, digest: '" + digest + "'}]\n"
    echo_2 = deployment_doc("echo", [2], ["edge-a"]).replace("  versions: [2]\n", pinned)
    fleet.manifests.write("echo.yaml", echo_2)
    fleet.manifests.commit("echo 2, pinned to its objects in the bucket")
    applied = fleet.reconciler.apply("--output", "json")
    assert applied.code == 0, explain(applied.json(), applied.err)
    fleet.deploy(1)
    assert fleet.reconciler.apply().code == 0

    fleet.put("echo/2/model.py", "# changed after release\n")
    fleet.manifests.write("echo.yaml", echo_2)
    fleet.manifests.commit("echo 2 again: its objects were changed meanwhile")
    refused = fleet.reconciler.apply()

    assert refused.code == 1, refused.out + refused.err
    assert "artifact changed under a released version number" in refused.out, refused.out
    assert ready_versions(fleet.triton, "echo") == {1}


def test_an_interface_change_in_the_buckets_config_is_refused_before_any_load(
    fleet: BucketFleet,
) -> None:
    fleet.deploy(1)
    assert fleet.reconciler.apply().code == 0
    config = (Path(__file__).resolve().parents[2] / "testkit/models/echo/config.pbtxt").read_text()
    assert '"OUTPUT0"' in config
    fleet.put("echo/config.pbtxt", config.replace('"OUTPUT0"', '"SCORES"'))
    fleet.deploy(2)

    planned = fleet.reconciler.plan()

    assert planned.code == 1, planned.out + planned.err
    assert "version 2 changes the model's interface" in planned.out, planned.out
    assert "refused before anything is loaded" in planned.out
    assert ready_versions(fleet.triton, "echo") == {1}


def test_a_config_pbtxt_in_the_bucket_that_does_not_parse_is_refused_naming_it(
    fleet: BucketFleet,
) -> None:
    fleet.deploy(1)
    assert fleet.reconciler.apply().code == 0
    fleet.put("echo/config.pbtxt", 'name: "echo"\nbackend: "python"\ninput [ {\n')
    fleet.deploy(2)

    applied = fleet.reconciler.apply()

    assert applied.code == 1, applied.out + applied.err
    assert (
        f"server edge-a, model echo: {fleet.url}/echo/config.pbtxt does not parse" in applied.out
    ), applied.out
    assert "refused before anything is loaded" in applied.out
    assert ready_versions(fleet.triton, "echo") == {1}


def test_a_store_that_does_not_answer_leaves_the_server_serving_and_holds_nothing(
    fleet: BucketFleet,
) -> None:
    fleet.deploy(1)
    assert fleet.reconciler.apply().code == 0
    fleet.deploy(2)
    # The same bucket URL with the store's port closed: the reconciler's reads fail, Triton
    # (started before) still serves version 1.
    down = fleet.url.replace(f":{fleet.store.endpoint.rsplit(':', 1)[1]}/", ":9/")
    fleet.manifests.write(
        "servers.yaml",
        server_doc("edge-a", fleet.triton.grpc_address, down, metrics=fleet.triton.metrics_url),
    )
    fleet.manifests.commit("the store is unreachable")

    waited = fleet.reconciler.apply("--output", "json")

    assert waited.code != 0, waited.out
    assert f"model repository {down}" in waited.out + waited.err, explain(waited.json(), waited.err)
    assert ready_versions(fleet.triton, "echo") == {1}
    assert waited.json()["held"] == [], explain(waited.json(), waited.err)
    status = cli("status", *fleet.reconciler.options, "--output", "json").json()
    assert status["unreachable"]["edge-a"].startswith(f"model repository {down}: "), status


def test_a_stopped_store_is_named_by_apply_and_check_not_blamed_on_triton(
    manifests: ManifestRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store Triton reads from stops (issue 41, point 4). Triton waits on it at every
    index read (about 25 s for refused connections, 2.51), so its calls time out first:
    apply used to say only `server edge-a: 127.0.0.1:PORT did not answer (reading the
    repository index)`. Both apply and check name the store's URL and what failed there,
    then Triton's symptom; the server keeps serving what it served, nothing is held."""
    with LocalObjectStore(log_file=tmp_path / "moto.log") as own:
        for name, value in own.environment().items():
            monkeypatch.setenv(name, value)
        bucket = f"models-{uuid.uuid4().hex[:12]}"
        own.create_bucket(bucket)
        own.upload_folder(write_model_repository(tmp_path / "models"), bucket, "models")
        url = own.triton_url(bucket, "models")
        triton = LocalTriton(url, log_file=tmp_path / "triton.log", extra_env=own.environment())
        with triton:
            manifests.write(
                "servers.yaml",
                server_doc("edge-a", triton.grpc_address, url, metrics=triton.metrics_url),
            )
            manifests.write("echo.yaml", deployment_doc("echo", [1], ["edge-a"]))
            manifests.commit("echo 1")
            reconciler = Reconciler(manifests.url, tmp_path / "r")
            assert reconciler.apply().code == 0
            manifests.write("echo.yaml", deployment_doc("echo", [2], ["edge-a"]))
            manifests.commit("echo 2")
            own.stop()

            # check first: Triton answers its metadata, then waits on the store at the
            # index read (and stays busy with it after the call timed out, so apply's index
            # read times out too).
            checked = cli("check", *reconciler.options, "--call-timeout", "3")
            waited = reconciler.apply("--call-timeout", "3", "--output", "json")

            store_down = (
                f"model repository {url}: listing the repository: connection refused by the "
                f"store at {own.endpoint} (is it running at that address?); Triton at "
                f"{triton.grpc_address} did not answer either ("
            )
            assert checked.code == 1, checked.out + checked.err
            failed = [line for line in checked.out.splitlines() if line.startswith("FAIL")]
            index_read = "reading the repository index): it reads its models from that store"
            assert failed == [f"FAIL server edge-a repository: {store_down}{index_read}"], (
                checked.out
            )
            assert "the store in spec.modelRepository" in checked.out, checked.out
            report = waited.json()
            assert waited.code != 0, waited.out
            assert report["held"] == [], explain(report, waited.err)
            problems = [p["message"] for p in report["problems"] if p["server"] == "edge-a"]
            assert any(m.startswith(store_down) for m in problems), problems
            assert served_factor(triton, "echo") == 1.0  # version 1 still answers


def test_the_gate_reads_the_bucket_directly_and_fails_a_version_that_fails_every_request(
    store: LocalObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``gate --model-repository s3://...``: the isolated tritonserver loads the old and the
    new versions from the bucket (the bytes the fleet will load, no copy first); scorer 4
    fails every request (its verify step says so before any load test), a verdict no busy
    machine changes."""
    for name, value in store.environment().items():
        monkeypatch.setenv(name, value)
    bucket = f"gate-{uuid.uuid4().hex[:12]}"
    store.create_bucket(bucket)
    store.upload_folder(write_scorer_repository(tmp_path / "models"), bucket, "models")
    url = store.triton_url(bucket, "models")
    manifests = ManifestRepo(tmp_path / "git")
    manifests.write("manifests/servers.yaml", server_doc("prod", "10.0.0.1:8001", url))
    scorer = deployment_doc("scorer", [1], ["prod"]) + (
        "  verify:\n    gate: {concurrency: [1], rounds: 2, requests: 40}\n"
    )
    manifests.write("manifests/scorer.yaml", scorer)
    manifests.commit("base")
    git(manifests.work, "checkout", "--quiet", "-b", "change")
    manifests.write("manifests/scorer.yaml", scorer.replace("versions: [1]", "versions: [4]"))
    git(manifests.work, "commit", "--quiet", "--all", "-m", "scorer 4")
    requests_before = store.request_count

    run = cli(
        "gate", "--repo", str(manifests.work), "--path", "manifests", "--base", "main",
        "--head", "change", "--model-repository", url, "--cache-dir", str(tmp_path / "cache"),
        "--load-generator", "built-in", "--output", "json",
    )  # fmt: skip

    assert run.code == 3, run.out + run.err  # judged and failed, not an error
    (model,) = json.loads(run.out)["models"]
    assert model["verdict"] == "fail", model
    (finding,) = model["findings"]  # its verify step: before any load test
    assert finding["name"] == "verify" and "fails on version 4" in finding["message"], model
    gets = [r for r in store.requests()[requests_before:] if r.method == "GET"]
    assert any("/scorer/4/" in r.path for r in gets), gets[-20:]  # Triton read the bucket
