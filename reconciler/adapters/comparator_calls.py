"""One side's call of a comparison the live comparator makes (``adapters/comparator.py``):
the mirrored request as it came, pinned by version, sent as a unary ``ModelInfer`` call or,
for a request mirrored from a gRPC stream (a streaming model's), over ``ModelStreamInfer``
and read to Triton's final flag; and the outputs of what came back, a stream's reassembled
as ``core.exchange.answer_of`` joins them, so that the comparison judges one answer per side
whichever shape the model answers in.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
import numpy.typing as npt
from tritonclient.grpc import InferResult, service_pb2

from reconciler.core.exchange import Reply, answer_of


class Unreadable(Exception):
    """An answer the comparator cannot read to compare."""


@dataclass(frozen=True)
class Exchanged:
    """One side's answer: a unary call's one response, or a stream's responses to its final
    flag (the final flag's empty one left out); ``first``: the seconds to the first."""

    responses: tuple[service_pb2.ModelInferResponse, ...]
    first: float


class StreamFailed(Exception):
    """An error inside a stream (Triton sends it as a message and keeps the stream open),
    or a stream without its final flag by the deadline: told as a unary call's RpcError is
    (``code``, ``details``)."""

    def __init__(self, message: str, timed_out: bool = False) -> None:
        super().__init__(message)
        self.message, self.timed_out = message, timed_out

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.DEADLINE_EXCEEDED if self.timed_out else grpc.StatusCode.UNKNOWN

    def details(self) -> str:
        return self.message


# What a side's call may end with instead of an answer.
Failed = (grpc.RpcError, StreamFailed)


def call(
    stub: Any, request: service_pb2.ModelInferRequest, timeout: float, streamed: bool
) -> Exchanged:
    """``request`` to the server behind ``stub``: over ModelStreamInfer to its final flag
    when ``streamed``, else one ModelInfer call; raises grpc.RpcError or StreamFailed."""
    if streamed:
        return _streamed(stub, request, timeout)
    started = time.monotonic()
    answer = stub.ModelInfer(request, timeout=timeout)
    return Exchanged((answer,), time.monotonic() - started)


def _streamed(stub: Any, request: service_pb2.ModelInferRequest, timeout: float) -> Exchanged:
    request.parameters["triton_enable_empty_final_response"].bool_param = True
    started = time.monotonic()
    responses: list[service_pb2.ModelInferResponse] = []
    first: float | None = None
    ended: Exchanged | None = None
    try:
        # Read on after the final flag until the server ends the call (the one request
        # sent, the client's side is closed): a call left to be cancelled after its final
        # flag could leave the version UNLOADING for good on 2.51 (adapters/triton_stream.py).
        for message in stub.ModelStreamInfer(iter((request,)), timeout=timeout):
            if message.error_message:
                raise StreamFailed(
                    f"an error in the stream after {len(responses)} response(s): "
                    f"{message.error_message}"
                )
            response = message.infer_response
            if response.outputs:
                first = time.monotonic() - started if first is None else first
                responses.append(response)
            final = response.parameters.get("triton_final_response")
            if final is not None and final.bool_param:
                ended = Exchanged(tuple(responses), first or time.monotonic() - started)
        if ended is not None:
            return ended
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            raise StreamFailed(
                f"{len(responses)} response(s) and no final flag within {timeout:g}s", True
            ) from None
        raise
    raise StreamFailed(f"the stream ended after {len(responses)} response(s) with no final flag")


def outputs(answer: Exchanged) -> dict[str, npt.NDArray[np.generic]]:
    """Every output of ``answer`` as an array, a stream's reassembled (each output's values
    from every response, in order); Unreadable names an output that cannot be read."""
    read = tuple(_response_outputs(response) for response in answer.responses)
    return answer_of(Reply(read, (answer.first,) * len(read), streamed=len(read) != 1))


def _response_outputs(
    response: service_pb2.ModelInferResponse,
) -> dict[str, npt.NDArray[np.generic]]:
    result = InferResult(response)
    outputs: dict[str, npt.NDArray[np.generic]] = {}
    for output in response.outputs:
        try:
            array = result.as_numpy(output.name)
        except Exception as exc:
            raise Unreadable(
                f"output {output.name} ({output.datatype}, shape {list(output.shape)}): "
                f"cannot be read: {exc}"
            ) from None
        if array is None:
            raise Unreadable(
                f"output {output.name} ({output.datatype}): no data in the answer "
                "(shared memory, or a datatype this client cannot read)"
            )
        outputs[output.name] = array
    return outputs
