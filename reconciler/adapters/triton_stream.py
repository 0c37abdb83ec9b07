"""One streamed exchange with a model version over gRPC ModelStreamInfer (a decoupled
model, which refuses a unary call): the request pinned by version, with
``triton_enable_empty_final_response`` set so that the end of every stream is flagged, its
responses read until that final flag. Used by the Triton adapter's ``stream``
(``adapters/triton.py``), which maps what this raises onto the error tree.

A client of its own per stream: tritonclient holds one stream per client object, and probes
may run side by side. It is closed at the end, the request cancelled if it has not ended.
The gate's load generator (``adapters/triton_load.py``) reads its streams with ``stream_on``,
one after another on each worker's own client.
"""

from __future__ import annotations

import contextlib
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import tritonclient.grpc as triton_grpc
from tritonclient.utils import InferenceServerException

from reconciler.core.exchange import Reply
from reconciler.model.errors import ProbeTimedOut, StreamCut, VerifyFailed


@dataclass(frozen=True)
class StreamRequest:
    model: str
    version: int
    inputs: list[triton_grpc.InferInput]
    outputs: tuple[str, ...]  # none named: every output
    deadline: float  # seconds for the whole stream, to its final flag
    max_responses: int


def stream_once(
    address: str,
    request: StreamRequest,
    who: str,
    unreachable: Callable[[InferenceServerException], bool],
) -> Reply:
    """The responses to ``request`` from the server at ``address`` until the final flag.
    ProbeTimedOut when it has not come by the deadline; VerifyFailed for an error inside the
    stream (with how many responses came first) or more than ``max_responses``; an error
    that says the server is ``unreachable``, before any response, as tritonclient raises it.
    ``who`` names the server in messages."""
    client = triton_grpc.InferenceServerClient(address)
    try:
        return stream_on(client, request, who, unreachable)
    finally:
        client.close()


def stream_on(
    client: triton_grpc.InferenceServerClient,
    request: StreamRequest,
    who: str,
    unreachable: Callable[[InferenceServerException], bool],
) -> Reply:
    """``stream_once`` on a client the caller holds (and closes): one stream at a time on
    it, stopped at the end (cancelled if it did not end), so the next may start."""
    doing = f"{who}: streaming {request.model} version {request.version}"
    events: queue.Queue[tuple[Any, InferenceServerException | None]] = queue.Queue()
    responses: list[dict[str, npt.NDArray[np.generic]]] = []
    seconds: list[float] = []
    ended = False  # the final flag came: the stream is closed, not cancelled
    started = time.monotonic()
    try:
        # tritonclient calls back with keywords: result=, error=.
        client.start_stream(callback=lambda result, error: events.put((result, error)))
        client.async_stream_infer(
            request.model,
            request.inputs,
            model_version=str(request.version),
            outputs=[triton_grpc.InferRequestedOutput(name) for name in request.outputs] or None,
            enable_empty_final_response=True,
        )
        while True:
            left = started + request.deadline - time.monotonic()
            try:
                result, error = events.get(timeout=max(left, 0.0))
            except queue.Empty:
                raise ProbeTimedOut(
                    f"{doing}: {len(responses)} response(s) and no final flag within "
                    f"{request.deadline:g}s"
                ) from None
            if error is not None:
                if unreachable(error):
                    if not responses:
                        raise error  # the server, not the version: the adapter says so
                    raise StreamCut(
                        f"{doing}: the stream was closed after {len(responses)} response(s) "
                        f"without its final flag: {error.message()}"
                    )
                raise VerifyFailed(
                    f"{doing}: an error in the stream after {len(responses)} response(s): "
                    f"{error.message()}"
                )
            response = result.get_response()
            if response.outputs:  # the final flag may come alone, with no tensor
                answer = {}
                for output in response.outputs:
                    array = result.as_numpy(output.name)
                    if array is not None:
                        answer[output.name] = array
                responses.append(answer)
                seconds.append(time.monotonic() - started)
            final = response.parameters.get("triton_final_response")
            if final is not None and final.bool_param:
                ended = True
                return Reply(tuple(responses), tuple(seconds), streamed=True)
            if len(responses) > request.max_responses:
                raise StreamCut(
                    f"{doing}: more than {request.max_responses} responses and no final flag: "
                    "the stream was cut"
                )
    finally:
        # A stream that ended is closed, not cancelled: on 2.51 a stream cancelled right
        # after its final flag could leave the version UNLOADING for good once unloaded (a
        # clean-clone CI run: version 1 UNLOADING 30 s after its verify streams, no client).
        # One that did not end (deadline, cut, error) is cancelled.
        with contextlib.suppress(Exception):  # ending it must not hide why it ended
            client.stop_stream(cancel_requests=not ended)
