"""One side's call of a comparison the live comparator makes (``adapters/comparator.py``):
the mirrored request as it came, pinned by version, sent as a unary ``ModelInfer`` call or,
for a request mirrored from a gRPC stream (a streaming model's), over ``ModelStreamInfer``
and read to Triton's final flag; for a copy of an HTTP ``generate_stream`` request
(server-sent events), the same JSON body posted to the side's HTTP endpoint at
``/v2/models/{model}/versions/{version}/generate_stream`` and its events read to the end of
the response (Triton 2.51 sends no event for the final flag). Then the outputs of what came
back, a stream's reassembled as ``core.exchange.answer_of`` joins them, whichever protocol
carried it, so that the comparison judges one answer per side whichever shape the model
answers in. Every stream is capped at ``core.exchange.MAX_RESPONSES`` responses, as the
probes' and verify's are.

The event stream is read with httpx and httpx-sse (the WHATWG event-stream rules: lines
ended by CR, LF or CRLF, multi-line ``data``, comments), not by splitting lines by hand.
"""

from __future__ import annotations

import json
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

import grpc
import httpx
import numpy as np
import numpy.typing as npt
from httpx_sse import SSEError, connect_sse
from tritonclient.grpc import InferResult, service_pb2

from reconciler.core.exchange import MAX_RESPONSES, Reply, answer_of

# The members of a generate response that are not outputs (the KServe generate extension).
_METADATA = frozenset({"model_name", "model_version", "id", "parameters"})


class Unreadable(Exception):
    """An answer the comparator cannot read to compare."""


@dataclass(frozen=True)
class Generation:
    """A mirrored HTTP ``generate_stream`` request: the model its path names and its JSON
    body as the client sent it (inputs and parameters by name)."""

    model: str
    body: bytes


# One response as it came: a gRPC one, or one server-sent event's JSON object.
Response: TypeAlias = "service_pb2.ModelInferResponse | Mapping[str, Any]"


@dataclass(frozen=True)
class Exchanged:
    """One side's answer: a unary call's one response, or a stream's responses to its end
    (gRPC: the final flag's empty one left out; SSE: one per event); ``first``: the seconds
    to the first."""

    responses: tuple[Response, ...]
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


def _streamed(
    stub: Any,
    request: service_pb2.ModelInferRequest,
    timeout: float,
    cap: int = MAX_RESPONSES,
) -> Exchanged:
    request.parameters["triton_enable_empty_final_response"].bool_param = True
    started = time.monotonic()
    responses: list[service_pb2.ModelInferResponse] = []
    first: float | None = None
    ended: Exchanged | None = None
    stream = stub.ModelStreamInfer(iter((request,)), timeout=timeout)
    try:
        # Read on after the final flag until the server ends the call (the one request
        # sent, the client's side is closed): a call left to be cancelled after its final
        # flag could leave the version UNLOADING for good on 2.51 (adapters/triton_stream.py).
        for message in stream:
            if message.error_message:
                raise StreamFailed(
                    f"an error in the stream after {len(responses)} response(s): "
                    f"{message.error_message}"
                )
            response = message.infer_response
            if response.outputs:
                first = time.monotonic() - started if first is None else first
                responses.append(response)
                if len(responses) > cap:
                    stream.cancel()  # no final flag yet: cancelled, as the probes' are
                    raise StreamFailed(over_cap(cap))
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


def over_cap(cap: int) -> str:
    return f"more than {cap} responses: the stream was cut there"


def generated(
    client: httpx.Client,
    address: str,
    copy: Generation,
    version: int,
    timeout: float,
    cap: int = MAX_RESPONSES,
) -> Exchanged:
    """``copy``'s body posted to ``generate_stream`` of ``version`` at the HTTP endpoint
    ``address`` (host:port), its events read to the end of the response within ``timeout``
    seconds; raises StreamFailed: an answer other than 200, an ``error`` event (Triton
    sends a failure after the first response inside the 200 stream), more than ``cap``
    events, the deadline passed, the connection cut or refused."""
    model = urllib.parse.quote(copy.model, safe="")
    url = f"http://{address}/v2/models/{model}/versions/{version}/generate_stream"
    started = time.monotonic()
    events: list[Mapping[str, Any]] = []
    first: float | None = None
    try:
        with connect_sse(
            client,
            "POST",
            url,
            content=copy.body,
            headers={"Content-Type": "application/json"},
            timeout=timeout,
        ) as source:
            answer = source.response
            if answer.status_code != 200:
                # Refused before the generation began: a JSON error, not a stream.
                text = answer.read().decode(errors="replace").strip()
                raise StreamFailed(f"HTTP {answer.status_code}: {text[:300]}")
            for event in source.iter_sse():
                data = _event_data(event.data, len(events))
                if "error" in data:
                    raise StreamFailed(
                        f"an error in the stream after {len(events)} response(s): {data['error']}"
                    )
                first = time.monotonic() - started if first is None else first
                events.append(data)
                if len(events) > cap:
                    raise StreamFailed(over_cap(cap))
                if time.monotonic() - started > timeout:
                    raise _late(len(events), timeout)
    except httpx.TimeoutException:
        raise _late(len(events), timeout) from None
    except (httpx.HTTPError, SSEError) as exc:
        # A connection refused, or cut mid-stream (an incomplete chunked body).
        raise StreamFailed(f"{type(exc).__name__} after {len(events)} response(s): {exc}") from None
    if time.monotonic() - started > timeout:
        raise _late(len(events), timeout)
    return Exchanged(tuple(events), first if first is not None else time.monotonic() - started)


def _late(count: int, timeout: float) -> StreamFailed:
    return StreamFailed(f"{count} response(s) and no end of the stream within {timeout:g}s", True)


def _event_data(data: str, before: int) -> Mapping[str, Any]:
    """One event's JSON object; StreamFailed for anything else (not Triton's answer)."""
    try:
        parsed = json.loads(data)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        raise StreamFailed(f"event {before + 1} is not a JSON object: {data[:200]!r}")
    return parsed


def outputs(answer: Exchanged) -> dict[str, npt.NDArray[np.generic]]:
    """Every output of ``answer`` as an array, a stream's reassembled (each output's values
    from every response, in order); Unreadable names an output that cannot be read."""
    read = tuple(_outputs_of(response) for response in answer.responses)
    return answer_of(Reply(read, (answer.first,) * len(read), streamed=len(read) != 1))


def _outputs_of(response: Response) -> dict[str, npt.NDArray[np.generic]]:
    if isinstance(response, service_pb2.ModelInferResponse):
        return _response_outputs(response)
    return event_outputs(response)


def event_outputs(event: Mapping[str, Any]) -> dict[str, npt.NDArray[np.generic]]:
    """The outputs of one generate response (a server-sent event's JSON object), each as
    an array: every member but the model's name and version, the request id and the
    parameters. Triton writes a one-element tensor as a number or a string, any other as a
    flat list; Unreadable names a member that is no array of numbers, strings or booleans."""
    read: dict[str, npt.NDArray[np.generic]] = {}
    for name, value in event.items():
        if name in _METADATA:
            continue
        try:
            array = np.asarray(value)
        except ValueError as exc:  # a ragged list
            raise Unreadable(f"output {name}: {exc}") from None
        if array.dtype == np.dtype(object) or array.dtype.kind not in "biufUS":
            raise Unreadable(
                f"output {name}: {type(value).__name__} {str(value)[:80]!r} is not an array "
                "of numbers, strings or booleans"
            )
        read[name] = array
    return read


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


class HttpSides:
    """One pooled HTTP client for the sides' ``generate_stream`` calls (connections kept
    alive per server), shared by the sessions."""

    def __init__(self) -> None:
        self._client = httpx.Client()

    def generated(self, address: str, copy: Generation, version: int, timeout: float) -> Exchanged:
        return generated(self._client, address, copy, version, timeout)

    def close(self) -> None:
        self._client.close()
