"""Reading the configs a Triton server's loaded models run with, for observation
(``adapters/triton.py``): many calls under way at once, and each distinct answer converted to
its JSON form once.

A pass with nothing kept reads every loaded model's config (issue 46: 100,000 ModelConfig
calls over 1,000 servers x 100 models). One after the other, each call waits out its round
trip and holds a pool thread meanwhile; here up to ``IN_FLIGHT`` calls to one server are
under way together (gRPC's own futures on the client's channel). And the servers of a pool
run a model with the same config, so the answers repeat: protobuf's ``MessageToDict`` (pure
Python, about 30 us a config here) runs once per distinct answer, found again by its bytes.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable
from typing import Any

import grpc
from google.protobuf import json_format
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

# Enough to keep a server's answers coming back to back without a long queue on it: Triton
# answers ModelConfig from its model manager, one lock for all models.
IN_FLIGHT = 32

# The converted configs, by the config message's bytes. Shared: the planner and the config
# memory read configs and never change one (``core/triton_config`` copies before it edits,
# and ``adapters/config_memory`` already gives one object to every server it recalls a
# digest for). Bounded: a fleet runs few distinct configs; past the bound, start again.
_CONVERTED_MOST = 4096
_converted: dict[bytes, dict[str, Any]] = {}
_converted_lock = threading.Lock()


def as_json(config: Any) -> dict[str, Any]:
    """A ModelConfig message as Triton's JSON renders it (field names as in the proto, int64
    values as text): what the planner compares with spec.config."""
    key = config.SerializeToString(deterministic=True)
    found = _converted.get(key)
    if found is not None:
        return found
    found = json_format.MessageToDict(config, preserving_proto_field_name=True)
    with _converted_lock:
        if len(_converted) >= _CONVERTED_MOST:
            _converted.clear()
        _converted[key] = found
    return found


def read_configs(
    stub: Any, models: Iterable[str], timeout: float
) -> dict[str, dict[str, Any] | InferenceServerException]:
    """Each model's config from the server behind ``stub`` (tritonclient's
    ``GRPCInferenceServiceStub``), or the error its call ended with, as tritonclient raises
    it. At most ``IN_FLIGHT`` calls are under way at a time; each has ``timeout`` seconds."""
    answers: dict[str, dict[str, Any] | InferenceServerException] = {}
    pending: deque[tuple[str, Any]] = deque()

    def collect() -> None:
        model, future = pending.popleft()
        try:
            answers[model] = as_json(future.result().config)
        except grpc.RpcError as exc:
            # What tritonclient's own calls raise (its private grpc._utils.get_error_grpc).
            answers[model] = InferenceServerException(
                msg=exc.details(), status=str(exc.code()), debug_details=exc.debug_error_string()
            )

    try:
        for model in models:
            request = service_pb2.ModelConfigRequest(name=model, version="")
            pending.append((model, stub.ModelConfig.future(request, timeout=timeout)))
            if len(pending) >= IN_FLIGHT:
                collect()
        while pending:
            collect()
    finally:
        for _, future in pending:  # left by an exception (an interrupt): not waited for
            future.cancel()
    return answers
