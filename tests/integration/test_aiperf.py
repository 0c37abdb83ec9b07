"""AIPerf as the gate's load generator for a streaming model (adapters/aiperf.py) against a
real tritonserver: the streaming test models (testkit/models/gen, llm) driven through
Triton's HTTP generate_stream, their time to the first response, times between responses
and failures read from AIPerf's own records.

AIPerf is not one of the project's dependencies (it brings transformers, pandas, scipy...):
it lives in a virtualenv of its own, ``.venv-aiperf`` at the repository root
(``python3 -m venv .venv-aiperf && .venv-aiperf/bin/pip install aiperf==0.13.0``, which
./dev test does and points $TRITON_GITOPS_AIPERF at). Without it these tests are skipped,
and fail in CI (tests/services.aiperf_or_skip). The gate run with ``--aiperf`` end to end
is in test_gate_streams.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import tritonclient.grpc as triton_grpc

from reconciler.adapters.aiperf import AIPerf
from reconciler.core.triton_config import parse_pbtxt
from reconciler.model.plan import Exchange
from reconciler.model.spec import Tensor
from testkit.local_triton import LocalTriton, shared_between_tests
from testkit.manifests import GENERATOR, LLM, generator_config, write_generator_repository
from tests.services import aiperf_or_skip

# Figures asserted present and failures counted, not compared: beside other tests is fine.
pytestmark = pytest.mark.triton

GOOD, FAILING, FAILS_MIDWAY = 1, 3, 4  # testkit/models/gen/model.py
TOKENS, TOKEN_MS = 5, 5
PROMPTS = [
    (Tensor("PROMPT", "INT32", (3,), (1, 2, 3)),),
    (Tensor("PROMPT", "INT32", (2,), (4, 5)),),
]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalTriton, AIPerf]]:
    """The generator (five tokens 5 ms apart) with a good version, one that fails every
    request and one that fails midway, and the vLLM-shaped ``llm``, loaded."""
    binary = aiperf_or_skip()
    root = tmp_path_factory.mktemp("aiperf")
    repository = write_generator_repository(root / "models")
    server = LocalTriton(repository, log_file=root / "triton.log").start()

    def load(server: LocalTriton) -> None:
        parameters = {"tokens": str(TOKENS), "token_ms": str(TOKEN_MS)}
        llm = parse_pbtxt((repository / LLM / "config.pbtxt").read_text())
        llm["version_policy"] = {"specific": {"versions": [GOOD]}}
        with triton_grpc.InferenceServerClient(server.grpc_address) as client:
            config = generator_config([GOOD, FAILING, FAILS_MIDWAY], parameters)
            client.load_model(GENERATOR, config=json.dumps(config))
            client.load_model(LLM, config=json.dumps(llm))

    try:
        load(server)
        (root / "work").mkdir()
        with shared_between_tests(server, load):
            yield server, AIPerf(binary, server.http_address, root / "work")
    finally:
        server.stop()


def test_streams_are_measured_to_their_first_response(served: tuple[LocalTriton, AIPerf]) -> None:
    _, tester = served
    found = tester.measure(GENERATOR, GOOD, PROMPTS, (), 2, 20, exchange=Exchange.STREAM)
    assert (found.requests, found.errors, found.note, found.streamed) == (20, 0, "", True)
    assert 0 < found.p50_ms <= found.p95_ms <= found.p99_ms
    assert found.throughput > 0
    # Five responses a stream, 5 ms apart (the model sleeps between them).
    assert found.gap_ms is not None and 4.0 <= found.gap_ms < 50.0
    assert found.responses_per_second == pytest.approx(TOKENS * found.throughput)


def test_vllm_shaped_inputs_stream_too(served: tuple[LocalTriton, AIPerf]) -> None:
    _, tester = served
    request = (
        Tensor("text_input", "BYTES", (1,), (b"what streams",)),
        Tensor("stream", "BOOL", (1,), (True,)),
        Tensor("sampling_parameters", "BYTES", (1,), (b'{"max_tokens": 6}',)),
    )
    found = tester.measure(LLM, GOOD, [request], (), 1, 10, exchange=Exchange.STREAM)
    assert (found.requests, found.errors) == (10, 0)
    assert found.p50_ms > 0
    assert found.responses_per_second == pytest.approx(6 * found.throughput)


@pytest.mark.parametrize(
    ("version", "why"),
    [
        (FAILING, "version 3 fails every request"),  # refused at once: 400, AIPerf exits 1
        # An error inside a 200 stream, which AIPerf's own summary counts as a success.
        (FAILS_MIDWAY, "version 4 failed at token 2"),
    ],
)
def test_streams_that_fail_are_the_failures(
    served: tuple[LocalTriton, AIPerf], version: int, why: str
) -> None:
    _, tester = served
    found = tester.measure(GENERATOR, version, PROMPTS, (), 2, 10, exchange=Exchange.STREAM)
    assert found.requests == found.errors == 10
    assert found.note == f"10 failed, first: {why}"
