"""Streaming (decoupled) models rolled out on a real tritonserver (issue 42, points 1 and 2).

The test model ``gen`` (testkit/models/gen/model.py) streams one token a response and ends
with Triton's final flag; version 3 answers every request with an error inside the stream,
version 4 fails after two tokens. Triton refuses a unary call to it (UNIMPLEMENTED), so
before the reconciler asked by streams, ``apply`` printed ``verify 2 ok`` having checked
nothing, and with an analysis and no client traffic a good and a failing version both ended
inconclusive. Each check here is the reconciler's own: no client streams.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.grpc as triton_grpc

from testkit.cli_run import Reconciler, cli
from testkit.loadgen import StreamClient
from testkit.local_triton import LocalTriton
from testkit.manifests import GENERATOR, ManifestRepo, server_doc, write_generator_repository
from tests.integration.flows import ready_versions

pytestmark = pytest.mark.triton


@pytest.fixture(scope="module")
def generator_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTriton]:
    root = tmp_path_factory.mktemp("streaming")
    models = write_generator_repository(root / "models")
    server = LocalTriton(models, log_file=root / "triton.log").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def reconciler(
    generator_server: LocalTriton, manifests: ManifestRepo, tmp_path: Path
) -> Reconciler:
    with triton_grpc.InferenceServerClient(generator_server.grpc_address) as client:
        client.unload_model(GENERATOR)
    manifests.write(
        "servers/a.yaml",
        server_doc(
            "a",
            generator_server.grpc_address,
            generator_server.model_repository,
            metrics=generator_server.metrics_url,
        ),
    )
    return Reconciler(manifests.url, tmp_path / "reconciler")


def _gen(version: int, extra: str = "") -> str:
    return (
        "apiVersion: triton-gitops.dev/v1alpha1\n"
        "kind: ModelDeployment\n"
        "metadata: {name: gen}\n"
        "spec:\n"
        "  servers: {names: [a]}\n"
        f"  versions: [{version}]\n" + extra
    )


ANALYSIS = (
    "  verify:\n"
    "    analysis:\n"
    "      interval: 1s\n"
    "      duration: 3s\n"
    "      minEvidence: 5\n"
    "      checks:\n"
    "        - name: success-rate\n"
    "          successRate: {min: 0.99}\n"
)

SMOKE = (
    "  verify:\n"
    "    smoke:\n"
    "      - name: counts-up\n"
    "        inputs:\n"
    "          PROMPT: {datatype: INT32, shape: [3], data: [1, 2, 3]}\n"
    "        expect:\n"
    "          TOKEN: {data: [6, 7, 8, 9, 10]}\n"
    "        stream:\n"
    "          responses: 5\n"
    "          each: [{TOKEN: {data: [6]}}, {TOKEN: {data: [7]}}]\n"
    "          deadline: 10s\n"
)


def _roll(manifests: ManifestRepo, reconciler: Reconciler, doc: str) -> tuple[int, str, dict]:
    manifests.write("gen.yaml", doc)
    manifests.commit("gen")
    result = reconciler.apply("--output", "json")
    return result.code, result.explain(), json.loads(result.out)


def test_a_streaming_model_is_verified_by_a_synthesized_stream(
    generator_server: LocalTriton, manifests: ManifestRepo, reconciler: Reconciler
) -> None:
    code, why, _ = _roll(manifests, reconciler, _gen(1))
    assert code == 0, why
    manifests.write("gen.yaml", _gen(2))
    manifests.commit("gen 2")
    planned = reconciler.plan()
    assert "a stream synthesized from the inputs, if 1 answers it" in planned.out, planned.out
    assert "a streaming model: asked by gRPC streams" in planned.out, planned.out
    code, why, _ = _roll(manifests, reconciler, _gen(2))
    assert code == 0, why
    assert ready_versions(generator_server, GENERATOR) == {2}
    status = cli("status", *reconciler.options)
    assert "in-sync (streaming)" in status.out, status.out
    # A version that answers every stream with an error: caught at verify, 2 serves on.
    code, why, _ = _roll(manifests, reconciler, _gen(3))
    assert code == 1, why
    assert "a stream synthesized from the model's inputs, which version 2 answers" in why, why
    assert "an error in the stream after 0 response(s)" in why, why
    assert ready_versions(generator_server, GENERATOR) == {2}


def test_a_smoke_case_judges_the_stream_reassembled(
    generator_server: LocalTriton, manifests: ManifestRepo, reconciler: Reconciler
) -> None:
    code, why, _ = _roll(manifests, reconciler, _gen(1, SMOKE))
    assert code == 0, why
    # Version 4 streams two tokens, then an error: the smoke case fails, 1 serves on.
    code, why, _ = _roll(manifests, reconciler, _gen(4, SMOKE))
    assert code == 1, why
    assert "smoke counts-up on version 4" in why or "an error in the stream after 2" in why, why
    assert ready_versions(generator_server, GENERATOR) == {1}


def test_an_analysis_without_client_streams_judges_by_streaming_probes(
    generator_server: LocalTriton, manifests: ManifestRepo, reconciler: Reconciler
) -> None:
    """Measured on main before: a good version 2 and a failing version 3 both ended
    "probes: none sent", inconclusive, reverted. Now the probes stream."""
    code, why, _ = _roll(manifests, reconciler, _gen(1))  # a first deployment: nothing to
    assert code == 0, why  # judge a synthesized stream against
    code, why, report = _roll(manifests, reconciler, _gen(2, ANALYSIS))
    assert code == 0, why
    (change,) = report["result"]["changes"]
    probes = [e["probes"] for e in change["analysis"]["evaluations"] if e.get("probes")]
    assert probes and probes[-1]["sent"] > 0 and probes[-1]["failed"] == 0, why
    assert ready_versions(generator_server, GENERATOR) == {2}
    code, why, _ = _roll(manifests, reconciler, _gen(3, ANALYSIS))
    assert code == 1, why
    assert "an error in the stream" in why, why
    assert ready_versions(generator_server, GENERATOR) == {2}


def test_a_stream_in_flight_during_a_swap_ends_on_the_version_that_started_it(
    generator_server: LocalTriton, manifests: ManifestRepo, reconciler: Reconciler
) -> None:
    """Issue 42, point 5: the unload of the old version waits for the streams in flight on
    it to end there (Triton keeps it UNLOADING until their final flag); none is cut."""
    # 60 tokens 100 ms apart: a stream of 6 s, still in flight on version 1 when its
    # unload comes (after version 2's load, about 2 s, and its verify).
    slow = (
        "  config: {parameters: {tokens: {string_value: '60'}, token_ms: {string_value: '100'}}}\n"
    )
    code, why, _ = _roll(manifests, reconciler, _gen(1, slow))
    assert code == 0, why
    with StreamClient(generator_server.grpc_address, GENERATOR) as streamer:
        time.sleep(0.5)  # a stream under way on version 1
        code, why, report = _roll(manifests, reconciler, _gen(2, slow))
        time.sleep(0.5)
    assert code == 0, why
    cut = [s for s in streamer.streams if s.error is not None or len(s.tokens) != 60]
    assert cut == [], f"streams cut or short: {cut}"
    mixed = [set(s.versions) for s in streamer.streams if len(set(s.versions)) != 1]
    assert mixed == [], f"streams answered by two versions: {mixed}"
    assert streamer.streams and streamer.streams[0].versions[0] == "1", streamer.streams[:1]
    (change,) = report["result"]["changes"]
    unload = next(s for s in change["steps"] if s["action"] == "unload")
    assert "the streams in flight on them end there first" in unload["reason"], unload
    # It waited for the stream on version 1, which ended there whole.
    assert unload["seconds"] >= 1.0, unload
    assert ready_versions(generator_server, GENERATOR) == {2}


# Five tokens 10 ms apart; version 6 sends each after the first 50 ms apart (a slow decode).
PACED = (
    "  config: {parameters: {tokens: {string_value: '5'}, token_ms: {string_value: '10'}}}\n"
    "  verify:\n"
    "    analysis:\n"
    "      interval: 1s\n"
    "      duration: 6s\n"
    "      minEvidence: 5\n"
    "      probes: {maxShare: 0.5}\n"
    "      checks:\n"
    "        - name: success-rate\n"
    "          successRate: {min: 0.99}\n"
    "        - name: first-response\n"
    "          latency: {maxIncrease: 1.0}\n"
    "        - name: between-responses\n"
    "          latency: {maxIncrease: 1.0, of: betweenResponses}\n"
)


def test_time_between_responses_is_judged_by_the_probe_streams(
    generator_server: LocalTriton, manifests: ManifestRepo, reconciler: Reconciler
) -> None:
    """Issue 42, point 3: a streaming version's time between responses, new against old, by
    the probes' streams (Triton 2.51 has no such figure: its ``response_stats`` are empty for
    a Python model). A good version passes both latency checks on their figures; one whose
    first token comes as fast but every next one five times slower is reverted by the time
    between responses alone, with the figures in its message."""
    code, why, _ = _roll(manifests, reconciler, _gen(1, PACED.split("  verify:")[0]))
    assert code == 0, why
    code, why, report = _roll(manifests, reconciler, _gen(2, PACED))
    assert code == 0, why
    (change,) = report["result"]["changes"]
    last = change["analysis"]["evaluations"][-1]
    verdicts = {c["check"]: (c["verdict"], c.get("detail")) for c in last["checks"]}
    assert verdicts["between-responses"][0] == "pass", verdicts
    assert verdicts["first-response"][0] == "pass", verdicts
    probes = [e["probes"] for e in change["analysis"]["evaluations"] if e.get("probes")]
    assert any(p["streamed"] and p["gap_median_ms"] for p in probes), probes
    code, why, report = _roll(manifests, reconciler, _gen(6, PACED))
    assert code == 1, why
    assert "between-responses=" in why and "time between responses" in why, why
    assert "first-response=" not in why.split("failed after")[-1].split(";")[0], why
    assert ready_versions(generator_server, GENERATOR) == {2}


def test_a_stream_without_its_final_flag_is_cut_and_fails_the_version(
    tmp_path: Path, manifests: ManifestRepo
) -> None:
    """Issue 42, point 2: version 7 streams its tokens and never sends the final flag (as a
    backend can: server#7626). Its probe streams reach their deadline and count as cut, not
    as answered; the version is reverted and the old one serves. On a server of its own:
    Triton keeps version 7 UNLOADING for ever after it."""
    models = write_generator_repository(tmp_path / "models")
    server = LocalTriton(models, log_file=tmp_path / "triton.log").start()
    try:
        manifests.write(
            "servers/a.yaml",
            server_doc(
                "a", server.grpc_address, server.model_repository, metrics=server.metrics_url
            ),
        )
        reconciler = Reconciler(manifests.url, tmp_path / "reconciler")
        code, why, _ = _roll(manifests, reconciler, _gen(1))
        assert code == 0, why
        analysis = ANALYSIS.replace("      minEvidence: 5\n", "      probes: {timeout: 2s}\n")
        manifests.write("gen.yaml", _gen(7, analysis))
        manifests.commit("gen 7")
        result = reconciler.apply("--output", "json")
        code, why = result.code, result.explain()
        assert code == 1, why
        report = json.loads(result.out)
        assert "no final flag" in why, why
        (change,) = report["result"]["changes"]
        probes = [e["probes"] for e in change["analysis"]["evaluations"] if e.get("probes")]
        assert probes and probes[-1]["cut"] >= 1, probes
        assert ready_versions(server, GENERATOR) == {1}
    finally:
        server.stop()
