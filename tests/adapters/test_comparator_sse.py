"""The comparator's SSE side (issue 43, point 1), without a Triton: what a mirrored HTTP
request is (``comparator_http.copy_of``), its HTTP listener fed as Envoy feeds it (a body by
Content-Length or chunked, on a kept-alive connection), a side's ``generate_stream`` read
through httpx's own test transport (``comparator_calls.generated``), and its events
reassembled into the one answer a gRPC stream of the same tokens makes. The whole path
against a real Envoy and tritonserver is
``tests/integration/test_streaming_traffic.py::test_sse_copies_mirrored_by_envoy_are_compared_and_a_divergent_candidate_is_caught``.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from reconciler.adapters.comparator_calls import (
    Exchanged,
    Generation,
    StreamFailed,
    Unreadable,
    event_outputs,
    generated,
    outputs,
)
from reconciler.adapters.comparator_http import GenerationListener, NotCompared, copy_of

BODY = b'{"PROMPT": [7]}'


UNARY = "over HTTP only generate_stream is compared"
NOT_JSON = "the body is not a JSON object (6 bytes)"


@pytest.mark.parametrize(
    ("method", "target", "body", "expected"),
    [
        ("POST", "/v2/models/gen/generate_stream", BODY, Generation("gen", BODY)),
        ("POST", "/v2/models/gen/versions/3/generate_stream?x=1", BODY, Generation("gen", BODY)),
        ("POST", "/v2/models/a%2Fb/generate_stream", BODY, Generation("a/b", BODY)),
        ("POST", "/v2/models/gen/generate", BODY,
         NotCompared("gen", f"POST /v2/models/gen/generate: {UNARY}")),
        ("POST", "/v2/models/gen/infer", b"{}",
         NotCompared("gen", f"POST /v2/models/gen/infer: {UNARY}")),
        ("POST", "/v2/models/gen/generate_stream", b"[1, 2]",
         NotCompared("gen", f"POST /v2/models/gen/generate_stream: {NOT_JSON}")),
        ("GET", "/v2/health/ready", b"", None),
        ("GET", "/v2/models/gen/generate_stream", b"", None),
        ("POST", "/v2/models/gen/load", b"{}", None),
        ("POST", "/v2/repository/index", b"{}", None),
    ],
)  # fmt: skip
def test_what_a_mirrored_http_request_is(
    method: str, target: str, body: bytes, expected: Generation | NotCompared | None
) -> None:
    assert copy_of(method, target, body) == expected


def test_an_event_is_its_outputs_without_the_model_and_version() -> None:
    event = {"model_name": "gen", "model_version": "2", "id": "7", "TOKEN": 6, "TEXT": "a"}
    read = event_outputs(event)
    assert set(read) == {"TOKEN", "TEXT"}
    assert read["TOKEN"].tolist() == 6 and read["TEXT"].tolist() == "a"
    assert event_outputs({"LOGITS": [0.5, 1.5]})["LOGITS"].dtype == np.float64
    with pytest.raises(Unreadable, match="output EXTRA: dict"):
        event_outputs({"TOKEN": 1, "EXTRA": {"nested": 1}})
    with pytest.raises(Unreadable, match="output RAGGED"):
        event_outputs({"RAGGED": [[1], [1, 2]]})


def _grpc_token(token: int, version: str = "1") -> service_pb2.ModelInferResponse:
    response = service_pb2.ModelInferResponse(model_name="gen", model_version=version)
    response.outputs.add(name="TOKEN", datatype="INT32", shape=[1])
    response.raw_output_contents.append(np.array([token], dtype=np.int32).tobytes())
    return response


def test_an_event_stream_reassembles_as_the_grpc_stream_of_the_same_tokens() -> None:
    """One notion of an exchange: the generation is the tokens in order, whichever protocol
    carried them (Triton writes a one-element tensor as a number in an event)."""
    tokens = [6, 7, 8, 508]
    events = tuple({"model_name": "gen", "model_version": "1", "TOKEN": t} for t in tokens)
    over_sse = outputs(Exchanged(events, 0.01))
    over_grpc = outputs(Exchanged(tuple(_grpc_token(t) for t in tokens), 0.01))
    assert set(over_sse) == set(over_grpc) == {"TOKEN"}
    assert over_sse["TOKEN"].tolist() == over_grpc["TOKEN"].tolist() == tokens


def _sse(*events: str) -> bytes:
    return "".join(f"data: {event}\n\n" for event in events).encode()


class _Split(httpx.SyncByteStream):
    """A body sent in pieces of ``size`` bytes: an event split across chunks, a line ending
    split from its line."""

    def __init__(self, body: bytes, size: int) -> None:
        self.body, self.size = body, size

    def __iter__(self) -> Iterator[bytes]:
        for start in range(0, len(self.body), self.size):
            yield self.body[start : start + self.size]


def _side(handler: httpx.MockTransport) -> httpx.Client:
    return httpx.Client(transport=handler)


def _answering(
    body: bytes, status: int = 200, seen: list[httpx.Request] | None = None, size: int = 7
) -> httpx.Client:
    def handle(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(request)
        kind = "text/event-stream; charset=utf-8" if status == 200 else "application/json"
        return httpx.Response(status, headers={"content-type": kind}, stream=_Split(body, size))

    return _side(httpx.MockTransport(handle))


def test_a_side_is_asked_the_same_body_pinned_by_version_and_its_events_read_to_the_end() -> None:
    seen: list[httpx.Request] = []
    events = [
        json.dumps({"model_name": "gen", "model_version": "3", "TOKEN": t}) for t in (1, 2, 3)
    ]
    body = _sse(*events).replace(b"\n\n", b"\r\n\r\n", 1) + b": a comment\n\n"
    answer = generated(_answering(body, seen=seen), "h:8000", Generation("gen", BODY), 3, 5.0)
    assert [dict(r)["TOKEN"] for r in answer.responses] == [1, 2, 3]  # type: ignore[index]
    assert answer.first >= 0
    (request,) = seen
    assert str(request.url) == "http://h:8000/v2/models/gen/versions/3/generate_stream"
    assert request.method == "POST" and request.content == BODY
    assert request.headers["content-type"] == "application/json"


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (_sse('{"TOKEN": 1}', '{"error": "failed at token 2"}'), 200,
         "an error in the stream after 1 response"),
        (b'{"error": "no such version"}', 400, "HTTP 400: {\"error\": \"no such version\"}"),
        (_sse("not json"), 200, "event 1 is not a JSON object"),
        (_sse(*['{"TOKEN": 1}'] * 5), 200, "more than 3 responses"),
    ],
)  # fmt: skip
def test_a_failed_side_is_a_stream_failure(body: bytes, status: int, message: str) -> None:
    with pytest.raises(StreamFailed, match=message.replace("(", r"\(")) as failed:
        generated(_answering(body, status), "h:8000", Generation("gen", BODY), 3, 5.0, cap=3)
    assert not failed.value.timed_out


def test_a_side_that_does_not_answer_in_time_timed_out() -> None:
    def handle(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    with pytest.raises(StreamFailed, match=r"no end of the stream within 0\.5s") as failed:
        generated(_side(httpx.MockTransport(handle)), "h:1", Generation("gen", BODY), 1, 0.5)
    assert failed.value.timed_out


def test_a_side_cut_mid_stream_is_a_stream_failure() -> None:
    class Cut(httpx.SyncByteStream):
        def __iter__(self) -> Iterator[bytes]:
            yield _sse('{"TOKEN": 1}')
            raise httpx.RemoteProtocolError(
                "peer closed connection without sending complete message body"
            )

    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=Cut())

    with pytest.raises(StreamFailed, match="RemoteProtocolError after 1 response"):
        generated(_side(httpx.MockTransport(handle)), "h:1", Generation("gen", BODY), 1, 5.0)


@pytest.fixture
def listener() -> Iterator[tuple[GenerationListener, list[Generation | NotCompared]]]:
    taken: list[Generation | NotCompared] = []
    lock = threading.Lock()

    def take(copy: Generation | NotCompared) -> None:
        with lock:
            taken.append(copy)

    running = GenerationListener("127.0.0.1:0", take)
    running.start()
    try:
        yield running, taken
    finally:
        running.stop()


def test_the_listener_takes_copies_by_length_and_chunked_on_one_connection(
    listener: tuple[GenerationListener, list[Generation | NotCompared]],
) -> None:
    """As Envoy sends mirrored copies: kept-alive, each body by Content-Length or chunked
    (as the client sent it); each answered 200 at once with no body."""
    running, taken = listener
    connection = http.client.HTTPConnection("127.0.0.1", running.port, timeout=5)
    try:
        statuses = []
        for body, chunked in ((BODY, False), (b'{"PROMPT": [8]}', True)):
            parts = iter((body[:4], body[4:])) if chunked else body
            connection.request(
                "POST", "/v2/models/gen/generate_stream", body=parts, encode_chunked=chunked
            )
            answer = connection.getresponse()
            statuses.append((answer.status, answer.read()))
        connection.request("GET", "/v2/health/ready")
        answer = connection.getresponse()
        statuses.append((answer.status, answer.read()))
    finally:
        connection.close()
    assert statuses == [(200, b"")] * 3
    assert taken == [Generation("gen", BODY), Generation("gen", b'{"PROMPT": [8]}')]


def test_the_listener_refuses_a_body_over_its_cap_and_garbage(
    listener: tuple[GenerationListener, list[Generation | NotCompared]],
) -> None:
    running, taken = listener
    connection = http.client.HTTPConnection("127.0.0.1", running.port, timeout=5)
    try:
        connection.request("POST", "/v2/models/gen/generate_stream", body=b"x" * (2 << 20))
        assert connection.getresponse().status == 413
    finally:
        connection.close()
    with socket.create_connection(("127.0.0.1", running.port), timeout=5) as raw:
        raw.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        assert raw.recv(100).startswith(b"HTTP/1.1 400")
    deadline = time.monotonic() + 1
    while time.monotonic() < deadline and taken:
        time.sleep(0.01)
    assert taken == []
