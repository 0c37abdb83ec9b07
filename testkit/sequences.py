"""Client sequences of the test sequence model (``counter``) through a router, for the
sequence-affinity research (issue 44 point 1, ``docs/sequence-affinity.md``).

``SequenceLoad`` runs client threads that each send sequences of random length (START ...
END) through tritonclient gRPC, one after the other, with the sequence's own key in a
request header (``SEQUENCE_HEADER``) on every call, and records each sequence: when it
started, which server answered its START (told by the running sum's multiplier: the
counter answers ``sum * version``, or ``sum * scale``), and whether and when it broke (an
error, such as Triton's "must specify the START flag" from a server that never saw the
sequence start, or a wrong running sum).

With ``stream``, each sequence is sent over a gRPC stream of its own (tritonclient's
``start_stream`` ... ``stop_stream``): one HTTP/2 stream, which Envoy routes once.

``SequenceSessions`` is the client side of Envoy's stateful sessions (``affinity:
session`` in ``testkit.envoy``): a gRPC interceptor that sends no session headers with a
sequence's START, keeps the ones Envoy answers with (the pool and the server), and sends
them back on the sequence's later requests, keyed by the request's own ``sequence_id``;
``with_sessions`` puts it under a tritonclient ``InferenceServerClient``, whose calls are
otherwise unchanged.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import math
import queue
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
import tritonclient.grpc as triton_grpc
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import InferenceServerException

from testkit.envoy import POOL_HEADER, SEQUENCE_HEADER, SESSION_HEADER


class _CallDetails(
    collections.namedtuple(
        "_CallDetails",
        ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression"),
    ),
    grpc.ClientCallDetails,
):
    pass


def _parameter(request: Any, name: str) -> Any:
    parameters = getattr(request, "parameters", None)
    if parameters is None or name not in parameters:
        return None
    value = parameters[name]
    return getattr(value, value.WhichOneof("parameter_choice"))


class SequenceSessions(grpc.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """Sends each sequence's session headers (``SESSION_HEADER``, ``POOL_HEADER``) back to
    the router: none with the START (the router then picks by the weights), the values the
    START's answer carried with every later request of that ``sequence_id``; forgotten at
    the END."""

    def __init__(self, headers: tuple[str, ...] = (SESSION_HEADER, POOL_HEADER)) -> None:
        self.headers = headers
        self._sessions: dict[Any, list[tuple[str, str]]] = {}
        self._lock = threading.Lock()

    def intercept_unary_unary(
        self, continuation: Callable[..., Any], details: Any, request: Any
    ) -> Any:
        sequence = _parameter(request, "sequence_id")
        if not sequence:
            return continuation(details, request)
        start = bool(_parameter(request, "sequence_start"))
        metadata = [(k, v) for k, v in (details.metadata or ()) if k not in self.headers]
        with self._lock:
            if start:
                self._sessions.pop(sequence, None)
            metadata.extend(self._sessions.get(sequence, ()))
        outcome = continuation(
            _CallDetails(
                details.method, details.timeout, metadata, details.credentials,
                details.wait_for_ready, details.compression,
            ),
            request,
        )  # fmt: skip
        answered: list[tuple[str, str]] = []
        with contextlib.suppress(grpc.RpcError):
            answered = [(k, v) for k, v in outcome.initial_metadata() or () if k in self.headers]
        with self._lock:
            if _parameter(request, "sequence_end"):
                self._sessions.pop(sequence, None)
            elif answered:
                kept = dict(self._sessions.get(sequence, ()))
                kept.update(answered)
                self._sessions[sequence] = list(kept.items())
        return outcome


def with_sessions(
    client: triton_grpc.InferenceServerClient, sessions: SequenceSessions
) -> triton_grpc.InferenceServerClient:
    """``client`` with its calls through ``sessions``. tritonclient has no hook for
    interceptors: this replaces its channel and stub (private attributes of tritonclient
    2.73), which is what a user would do too."""
    client._channel = grpc.intercept_channel(client._channel, sessions)
    client._client_stub = service_pb2_grpc.GRPCInferenceServiceStub(client._channel)
    return client


@dataclass
class Sequence:
    """One client sequence: ``scale`` is the multiplier of the server that answered its
    START (None if the START failed); ``broken`` what broke it, at ``broken_at``."""

    key: int
    length: int
    started: float
    scale: int | None = None
    sent: int = 0
    ended: float | None = None
    broken: str | None = None
    broken_at: float | None = None


_KEYS = itertools.count(int(time.time() * 1000) % 10**9 * 1000)  # distinct across runs
_KEYS_LOCK = threading.Lock()


class SequenceLoad:
    """``threads`` client threads sending sequences of ``lengths`` requests (each length
    drawn uniformly), ``pause`` seconds apart, to ``model`` at ``address``; with
    ``sessions`` each thread's client sends the session headers (``headers``) back
    (``SequenceSessions``);
    with ``stream`` each sequence goes over a gRPC stream of its own. ``stop`` lets the
    sequences in flight finish and starts no new one."""

    def __init__(
        self,
        address: str,
        threads: int = 4,
        lengths: tuple[int, int] = (2, 40),
        pause: float = 0.02,
        sessions: bool = False,
        stream: bool = False,
        model: str = "counter",
        seed: int = 44,
        headers: tuple[str, ...] = (SESSION_HEADER, POOL_HEADER),
    ) -> None:
        self.address, self.lengths, self.pause = address, lengths, pause
        self.sessions, self.stream, self.model, self.seed = sessions, stream, model, seed
        self.headers = headers  # with sessions: the response headers sent back
        self.sequences: list[Sequence] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(n,), daemon=True) for n in range(threads)
        ]

    def start(self) -> SequenceLoad:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self, timeout: float = 60.0) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout)

    def __enter__(self) -> SequenceLoad:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def snapshot(self) -> list[Sequence]:
        with self._lock:
            return list(self.sequences)

    def _run(self, number: int) -> None:
        draw = random.Random(self.seed * 1000 + number)
        client = triton_grpc.InferenceServerClient(self.address)
        if self.sessions:
            client = with_sessions(client, SequenceSessions(self.headers))
        try:
            while not self._stop.is_set():
                with _KEYS_LOCK:
                    key = next(_KEYS)
                sequence = Sequence(key, draw.randint(*self.lengths), time.monotonic())
                with self._lock:
                    self.sequences.append(sequence)
                if self.stream:
                    self._stream(client, sequence)
                else:
                    self._send(client, sequence)
        finally:
            client.close()

    def _send(self, client: triton_grpc.InferenceServerClient, sequence: Sequence) -> None:
        for index in range(sequence.length):
            try:
                result = client.infer(
                    self.model,
                    [_one()],
                    sequence_id=sequence.key,
                    sequence_start=index == 0,
                    sequence_end=index == sequence.length - 1,
                    headers={SEQUENCE_HEADER: str(sequence.key)},
                    client_timeout=10,
                )
            except InferenceServerException as exc:
                sequence.broken, sequence.broken_at = str(exc), time.monotonic()
                return
            if not self._check(sequence, index, result):
                return
        sequence.ended = time.monotonic()

    def _stream(self, client: triton_grpc.InferenceServerClient, sequence: Sequence) -> None:
        answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
        client.start_stream(
            lambda result, error: answers.put((result, error)),
            headers={SEQUENCE_HEADER: str(sequence.key)},
        )
        try:
            for index in range(sequence.length):
                client.async_stream_infer(
                    self.model,
                    [_one()],
                    sequence_id=sequence.key,
                    sequence_start=index == 0,
                    sequence_end=index == sequence.length - 1,
                )
                try:
                    result, error = answers.get(timeout=10)
                except queue.Empty:
                    result, error = None, "no answer within 10 s"
                if error is not None:
                    sequence.broken, sequence.broken_at = str(error), time.monotonic()
                    return
                if not self._check(sequence, index, result):
                    return
            sequence.ended = time.monotonic()
        finally:
            client.stop_stream()

    def _check(self, sequence: Sequence, index: int, result: Any) -> bool:
        """Records the answer to request ``index``; False if it broke the sequence."""
        output = result.as_numpy("OUTPUT0")
        answer = float(output.reshape(-1)[0]) if output is not None else float("nan")
        sequence.sent = index + 1
        if index == 0:
            sequence.scale = round(answer)
        elif sequence.scale is None or answer != (index + 1) * sequence.scale:
            sequence.broken = f"running sum {answer} after {index + 1} (x{sequence.scale})"
            sequence.broken_at = time.monotonic()
            return False
        time.sleep(self.pause)
        return True


def _one() -> triton_grpc.InferInput:
    item = triton_grpc.InferInput("INPUT0", [1, 1], "FP32")
    item.set_data_from_numpy(np.array([[1.0]], dtype=np.float32))
    return item


def in_flight_at(sequences: list[Sequence], moment: float) -> list[Sequence]:
    """The sequences started before ``moment`` that had not ended or broken by then."""
    return [
        s for s in sequences if s.started < moment and (s.ended or s.broken_at or math.inf) > moment
    ]


def started_between(sequences: list[Sequence], start: float, end: float) -> Iterator[Sequence]:
    return (s for s in sequences if start <= s.started < end)


def broken_between(sequences: list[Sequence], start: float, end: float) -> list[Sequence]:
    return [s for s in sequences if s.broken_at is not None and start <= s.broken_at < end]
