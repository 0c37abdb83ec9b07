"""Reading loaded models' configs (adapters/triton_configs.py, issue 46): many calls under way
at once, bounded; the answers and errors as tritonclient's own call gives them, on a real
tritonserver; each distinct config converted once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest
import tritonclient.grpc as triton_grpc
from google.protobuf import json_format
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from reconciler.adapters import triton_configs
from reconciler.adapters.triton import TritonServerClient
from reconciler.adapters.triton_configs import IN_FLIGHT, as_json, read_configs
from reconciler.core.triton_config import parse_pbtxt, with_versions
from testkit.local_triton import LocalTriton, free_port


def test_configs_and_errors_are_tritonclients_on_a_real_server(
    triton: LocalTriton, model_repository: Path
) -> None:
    with TritonServerClient("edge-a", triton.grpc_address) as ours:
        for model in ("echo", "other"):
            config = parse_pbtxt((model_repository / model / "config.pbtxt").read_text())
            ours.load(model, with_versions(config, model, [1]))
        by_hand = triton_grpc.InferenceServerClient(triton.grpc_address)
        try:
            expected = {
                model: json_format.MessageToDict(
                    by_hand.get_model_config(model).config, preserving_proto_field_name=True
                )
                for model in ("echo", "other")
            }
            with pytest.raises(InferenceServerException) as refused:
                by_hand.get_model_config("counter")  # in the repository, not loaded
        finally:
            by_hand.close()
        answers = read_configs(ours._client._client_stub, ["echo", "counter", "other"], 10.0)
    assert list(answers) == ["echo", "counter", "other"]
    assert answers["echo"] == expected["echo"] and answers["other"] == expected["other"]
    error = answers["counter"]
    assert isinstance(error, InferenceServerException), error
    assert (error.status(), error.message()) == (
        refused.value.status(),
        refused.value.message(),
    )


def test_a_server_that_does_not_answer_gives_each_call_its_error() -> None:
    address = f"127.0.0.1:{free_port()}"
    with grpc.insecure_channel(address) as channel:
        stub = triton_grpc.service_pb2_grpc.GRPCInferenceServiceStub(channel)
        answers = read_configs(stub, ["a", "b"], 2.0)
    assert set(answers) == {"a", "b"}
    for answer in answers.values():
        assert isinstance(answer, InferenceServerException), answer
        assert str(answer.status()) == "StatusCode.UNAVAILABLE", answer


class _Future:
    def __init__(self, stub: _Stub, name: str) -> None:
        self.stub, self.name, self.cancelled = stub, name, False

    def result(self) -> Any:
        self.stub.in_flight -= 1
        if self.name == self.stub.interrupt_at:
            raise KeyboardInterrupt
        config = service_pb2.ModelConfigResponse()
        config.config.name = self.name
        config.config.max_batch_size = 8
        return config

    def cancel(self) -> bool:
        self.cancelled = True
        return True


class _Stub:
    """A stub whose calls are futures answered when asked for: it counts the calls under
    way."""

    def __init__(self, interrupt_at: str | None = None) -> None:
        self.in_flight = self.most = 0
        self.interrupt_at = interrupt_at
        self.futures: list[_Future] = []
        self.ModelConfig = self  # stub.ModelConfig.future(request, timeout=...)

    def future(self, request: Any, timeout: float) -> _Future:
        assert timeout == 3.0
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        self.futures.append(_Future(self, request.name))
        return self.futures[-1]


def test_at_most_in_flight_calls_are_under_way_and_every_answer_comes_back() -> None:
    stub = _Stub()
    models = [f"m{i:03d}" for i in range(3 * IN_FLIGHT + 5)]
    answers = read_configs(stub, models, 3.0)
    assert list(answers) == models
    assert all(answers[m] == {"name": m, "max_batch_size": 8} for m in models)
    assert stub.most == IN_FLIGHT and stub.in_flight == 0, (stub.most, stub.in_flight)


def test_an_interrupted_read_cancels_the_calls_it_left() -> None:
    stub = _Stub(interrupt_at="m001")
    with pytest.raises(KeyboardInterrupt):
        read_configs(stub, [f"m{i:03d}" for i in range(IN_FLIGHT + 3)], 3.0)
    left = [f.name for f in stub.futures if f.cancelled]
    assert left == [f"m{i:03d}" for i in range(2, IN_FLIGHT + 1)], left


def test_each_distinct_config_is_converted_once(monkeypatch: pytest.MonkeyPatch) -> None:
    conversions: list[str] = []
    convert = json_format.MessageToDict

    def counting(message: Any, **options: Any) -> dict[str, Any]:
        conversions.append(message.name)
        return convert(message, **options)

    monkeypatch.setattr(triton_configs, "_converted", {})
    monkeypatch.setattr(triton_configs.json_format, "MessageToDict", counting)
    first = service_pb2.ModelConfigResponse().config
    first.name, first.max_batch_size = "echo", 8
    again = service_pb2.ModelConfigResponse().config
    again.CopyFrom(first)  # another server's answer, the same config
    other = service_pb2.ModelConfigResponse().config
    other.CopyFrom(first)
    other.max_batch_size = 4
    assert as_json(first) is as_json(again)
    assert as_json(other) == {"name": "echo", "max_batch_size": 4}
    assert as_json(first) == {"name": "echo", "max_batch_size": 8}
    assert conversions == ["echo", "echo"], conversions
