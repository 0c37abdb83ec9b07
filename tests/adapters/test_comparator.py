"""The comparator (``adapters/comparator.py``) against a real tritonserver, fed as a router
feeds it: KServe v2 ``ModelInfer`` requests over gRPC, answers discarded. What it cannot use
(bytes that do not parse, a sequence's request, another model's, a version that does not
answer, a candidate too slow, more than its queue holds) is counted, never raised, and it
listens only while a session is open."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from reconciler.adapters.comparator import LiveComparator
from reconciler.adapters.shadow_session import ShadowSession
from reconciler.model.shadow import LiveShadow, ShadowFigures, ShadowTarget
from testkit.local_triton import LocalTriton, free_port
from testkit.manifests import ECHO_CONFIG

pytestmark = pytest.mark.triton

CONFIG = {
    **ECHO_CONFIG,
    "parameters": {"scale": {"string_value": "1"}, "slow_ms": {"string_value": "600"}},
    "version_policy": {"specific": {"versions": [1, 2, 5]}},
}


@pytest.fixture(scope="module")
def module_triton(
    model_repository: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalTriton]:
    logs = tmp_path_factory.mktemp("comparator")
    server = LocalTriton(model_repository, log_file=logs / "triton.log").start()
    try:
        with triton_grpc.InferenceServerClient(server.grpc_address) as client:
            client.load_model("echo", config=json.dumps(CONFIG))
        yield server
    finally:
        server.stop()


def still_running(server: LocalTriton, when: str) -> None:
    """Fail naming the server's end (its exit code, its log's last lines) if it has ended:
    the tests of this module share one tritonserver."""
    assert server.process is not None
    code = server.process.poll()
    assert code is None, f"the module's tritonserver exited ({code}) {when}:\n{server.log_tail()}"


@pytest.fixture
def triton(module_triton: LocalTriton) -> Iterator[str]:
    still_running(module_triton, "before this test")
    yield module_triton.grpc_address
    still_running(module_triton, "during this test")


def request(model: str = "echo", **parameters: int) -> service_pb2.ModelInferRequest:
    tensor = service_pb2.ModelInferRequest.InferInputTensor(
        name="INPUT0", datatype="FP32", shape=[1, 4]
    )
    made = service_pb2.ModelInferRequest(model_name=model, inputs=[tensor])
    made.raw_input_contents.append(np.arange(4, dtype=np.float32).tobytes())
    for name, value in parameters.items():
        made.parameters[name].int64_param = value
    return made


def settle(session: ShadowSession, until: int, timeout: float = 10.0) -> ShadowFigures:
    """The session's figures once ``until`` requests were compared or left out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        figures = session.figures()
        done = sum(
            v
            for k, v in figures.counts().items()
            if k not in ("candidate_disagreed", "noise", "candidate_timeouts")
        )
        if done >= until:
            return figures
        time.sleep(0.02)
    return session.figures()


def listening(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex((host, int(port))) == 0


def test_what_the_comparator_cannot_use_is_counted_and_a_good_request_compared(
    triton: str,
) -> None:
    comparator = LiveComparator(f"127.0.0.1:{free_port('127.0.0.1')}")
    spec = LiveShadow(share=10_000, rate=1_000, max_share=1.0, min_requests=1)
    session = comparator.begin(ShadowTarget("d", "echo", (triton,), 1, (triton,), 2, spec))
    try:
        with grpc.insecure_channel(comparator.address) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            raw = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
            answered = raw(b"\xff\xff\xff not a protobuf", timeout=5)
            assert answered == b""  # an empty answer, at once: the router discards it
            stub.ModelInfer(request(sequence_id=7), timeout=5)
            stub.ModelInfer(request("other"), timeout=5)
            stub.ModelInfer(request(), timeout=5)
        figures = settle(session, 4)
    finally:
        session.end()
    assert (figures.unparsable, figures.sequence, figures.other_model) == (1, 1, 1), figures
    assert figures.compared == 1, figures
    # Versions 1 and 2 both answer the input times 1 (the config's scale): they agree.
    assert (figures.comparison.candidate_count, figures.comparison.noise_count) == (0, 0)
    assert "not a ModelInferRequest" in figures.samples["unparsable"][0]
    assert not listening(comparator.address)  # the last session ended: it stopped listening


def test_a_slow_candidate_times_out_a_full_queue_drops_and_a_missing_version_is_counted(
    triton: str,
) -> None:
    comparator = LiveComparator(f"127.0.0.1:{free_port('127.0.0.1')}")
    # Version 5 answers 600 ms late (the config's slow_ms); the calls may take 150 ms, time
    # enough for version 1 on a loaded machine (5 ms was not: a CI run's 18 comparisons all
    # ended with the serving version's call past it).
    spec = LiveShadow(share=10_000, rate=10_000, max_share=1.0, timeout=0.15)
    session = comparator.begin(ShadowTarget("d", "echo", (triton,), 1, (triton,), 5, spec))
    missing = comparator.begin(ShadowTarget("e", "echo", (triton,), 3, (triton,), 1, spec))
    try:
        assert listening(comparator.address)
        with grpc.insecure_channel(comparator.address) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            for _ in range(60):
                stub.ModelInfer(request(), timeout=5)
        slow = settle(session, 60)
        gone = settle(missing, 60)
    finally:
        session.end()
        missing.end()
    assert slow.received == 60 and slow.candidate_timeouts >= 1, slow
    assert slow.comparison.candidate_count == slow.candidate_timeouts, slow
    assert slow.comparison.first_candidate == "timed out after 0.15s"
    # 60 at once, one comparison at a time, at most 16 waiting: the rest dropped.
    # (A serving version's call past 150 ms leaves its request uncompared: primary_failed.)
    assert slow.dropped >= 1, slow
    assert slow.compared + slow.dropped + slow.primary_failed == 60, slow
    # Version 3 is not loaded: nothing to compare with, never the candidate's fault.
    assert gone.primary_failed >= 1 and gone.compared == 0, gone
    assert "primary" in gone.samples["primary_failed"][0] or "secondary" in str(gone.samples)


COUNTER = {
    "name": "counter",
    "backend": "python",
    "max_batch_size": 8,
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [1]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [1]}],
    "sequence_batching": {
        "max_sequence_idle_microseconds": 5000000,
        "control_input": [
            {
                "name": "START",
                "control": [{"kind": "CONTROL_SEQUENCE_START", "fp32_false_true": [0, 1]}],
            },
            {
                "name": "CORRID",
                "control": [{"kind": "CONTROL_SEQUENCE_CORRID", "data_type": "TYPE_UINT64"}],
            },
        ],
    },
    "instance_group": [{"kind": "KIND_CPU", "count": 1}],
    "version_policy": {"specific": {"versions": [1, 2]}},
}


def in_sequence(
    sequence: int, value: float, start: bool, end: bool
) -> service_pb2.ModelInferRequest:
    tensor = service_pb2.ModelInferRequest.InferInputTensor(
        name="INPUT0", datatype="FP32", shape=[1, 1]
    )
    made = service_pb2.ModelInferRequest(model_name="counter", inputs=[tensor])
    made.raw_input_contents.append(np.array([[value]], dtype=np.float32).tobytes())
    made.parameters["sequence_id"].int64_param = sequence
    made.parameters["sequence_start"].bool_param = start
    made.parameters["sequence_end"].bool_param = end
    return made


def compare_sequences(triton: str, scale: str) -> ShadowFigures:
    """Three sequences of four requests each, as a router mirrors them, compared whole:
    version 1 against version 2 of the running-sum model, answering times ``scale``."""
    with triton_grpc.InferenceServerClient(triton) as client:
        config = {**COUNTER, "parameters": {"scale": {"string_value": scale}}}
        client.load_model("counter", config=json.dumps(config))
    comparator = LiveComparator(f"127.0.0.1:{free_port('127.0.0.1')}")
    spec = LiveShadow(share=10_000, rate=1_000, max_share=1.0, whole_sequences=True)
    session = comparator.begin(ShadowTarget("d", "counter", (triton,), 1, (triton,), 2, spec))
    try:
        with grpc.insecure_channel(comparator.address) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            for sequence in (11, 12, 13):
                for step in range(4):
                    stub.ModelInfer(
                        in_sequence(sequence, step + 1.5, step == 0, step == 3), timeout=5
                    )
                    time.sleep(0.02)  # a client awaits each answer before the next
        return settle(session, 12)
    finally:
        session.end()


def test_whole_sequences_are_compared_each_side_in_a_sequence_of_its_own(triton: str) -> None:
    alike = compare_sequences(triton, "1")
    assert alike.compared == 12 and alike.sequence == 0, alike
    # The serving version asked twice on one server agrees with itself on every running
    # sum: each side had a sequence of its own (the client's id shared would have summed
    # the primary's and the secondary's inputs together).
    assert (alike.comparison.noise_count, alike.comparison.candidate_count) == (0, 0), alike
    # Version 2 answering times 3: every request of every sequence disagrees.
    wrong = compare_sequences(triton, "1:1,2:3")
    assert wrong.compared == 12 and wrong.comparison.candidate_count == 12, wrong
    assert wrong.comparison.noise_count == 0, wrong
