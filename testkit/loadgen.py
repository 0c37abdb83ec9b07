"""A client load generator for the zero-downtime tests and the benchmarks.

Several threads send requests to one model in a loop (each with its own gRPC client),
unversioned or pinned to one version, and record every outcome: which version answered (the
test models multiply their input by their version), how long it took, and every failure with
its message, a response without OUTPUT0 (a renamed output) included.
"""

from __future__ import annotations

import http.client
import itertools
import json
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import tritonclient.grpc as triton_grpc
from tritonclient.utils import InferenceServerException

# The pause between one thread's requests for clients that watch a rollout rather than load
# the server (the tests' zero-downtime witnesses): a request every 2 to 3 ms from each thread
# (400 a second where back to back makes 1,800) still meets the gap a swap done in the wrong
# order leaves (the old version gone while the new one loads: 1.3 s for echo here), for a
# third of the CPU (two threads on echo, client and server: 0.46 CPU, against 1.5). Back to
# back, three test processes' clients wanted more than the 2 CPUs of these machines, and
# every server and reconciler beside them waited.
WITNESS_PAUSE = 0.002


@dataclass
class Sample:
    started: float  # time.monotonic() when the request was sent
    seconds: float
    version: int | None  # None when the request failed
    error: str | None = None


@dataclass
class LoadGenerator:
    address: str
    model: str
    threads: int = 4
    version: int | None = None  # pin every request to this version; None: unversioned
    # Each thread stops at its first failed request, as perf_analyzer does: a client whose
    # failures all fall in the first moments of a bad version.
    stop_at_first_failure: bool = False
    # Each request a different input (its first element 1, so the answer still tells the
    # version): for comparisons of answers that depend on the input.
    varied: bool = False
    # Seconds each thread waits after each answer (WITNESS_PAUSE); 0: back to back, the load
    # the benchmarks and the tests that count requests through a router want.
    pause: float = 0.0
    samples: list[Sample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _workers: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _run(self) -> None:
        ones = np.ones((1, 4), dtype=np.float32)
        draw = np.random.default_rng()
        with triton_grpc.InferenceServerClient(self.address) as client:
            while not self._stop.is_set():
                item = triton_grpc.InferInput("INPUT0", [1, 4], "FP32")
                if self.varied:
                    ones = draw.random((1, 4), dtype=np.float32)
                    ones[0][0] = 1.0
                item.set_data_from_numpy(ones)
                started = time.monotonic()
                try:
                    result = client.infer(
                        self.model,
                        [item],
                        model_version=str(self.version) if self.version else "",
                        client_timeout=30,
                    )
                    output = result.as_numpy("OUTPUT0")
                except InferenceServerException as exc:
                    sample = Sample(started, time.monotonic() - started, None, str(exc))
                else:
                    seconds = time.monotonic() - started
                    if output is None:
                        # What a client built for OUTPUT0 meets when the served config renames it.
                        sample = Sample(started, seconds, None, "no output OUTPUT0 in the response")
                    else:
                        sample = Sample(started, seconds, round(float(output[0][0])))
                with self._lock:
                    self.samples.append(sample)
                if sample.error is not None and self.stop_at_first_failure:
                    return
                if self.pause:
                    self._stop.wait(self.pause)

    def start(self) -> LoadGenerator:
        for _ in range(self.threads):
            worker = threading.Thread(target=self._run, daemon=True)
            worker.start()
            self._workers.append(worker)
        return self

    def stop(self) -> list[Sample]:
        self._stop.set()
        for worker in self._workers:
            worker.join(timeout=60)
        return self.samples

    def __enter__(self) -> LoadGenerator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait_for_samples(self, count: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.samples) < count and time.monotonic() < deadline:
            time.sleep(0.01)

    @property
    def failures(self) -> list[Sample]:
        with self._lock:
            return [s for s in self.samples if s.error is not None]

    def versions_seen(self) -> set[int]:
        with self._lock:
            return {s.version for s in self.samples if s.version is not None}


class SequenceClient:
    """Runs sequences of 6 requests (start ... end) to the test sequence model (``counter``:
    the running sum times its version, or its ``scale``) and checks every running sum."""

    def __init__(self, address: str, model: str = "counter") -> None:
        self.address, self.model = address, model
        self.broken: list[str] = []
        self.completed = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        sequence = 1000
        with triton_grpc.InferenceServerClient(self.address) as client:
            while not self.stop.is_set():
                sequence += 1
                total, version = 0.0, None
                for index in range(6):
                    item = triton_grpc.InferInput("INPUT0", [1, 1], "FP32")
                    item.set_data_from_numpy(np.array([[1.0]], dtype=np.float32))
                    total += 1.0
                    try:
                        answer = float(
                            client.infer(
                                self.model,
                                [item],
                                sequence_id=sequence,
                                sequence_start=index == 0,
                                sequence_end=index == 5,
                            )
                            .as_numpy("OUTPUT0")
                            .reshape(-1)[0]
                        )
                    except InferenceServerException as exc:
                        self.broken.append(f"sequence {sequence}: {exc}")
                        break
                    seen = round(answer / total)
                    if version is None:
                        version = seen
                    if answer != total * version:
                        self.broken.append(f"sequence {sequence}: {answer} after {total}")
                        break
                    time.sleep(0.05)
                else:
                    self.completed += 1

    def __enter__(self) -> SequenceClient:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)


@dataclass(frozen=True)
class Stream:
    """One generation streamed by ``StreamClient``: when it was sent, the version of each
    response (``model_version``: a pool's version tells the pool during a rollout), the
    tokens, and how it ended (None: with its final flag)."""

    started: float  # time.monotonic()
    versions: tuple[str, ...]
    tokens: tuple[int, ...]
    error: str | None
    first: float | None = None  # seconds to the first response (or event, over SSE)
    ended: float = 0.0  # time.monotonic() when it ended (its final flag, error or cut)


class StreamClient:
    """Threads streaming generations from a streaming (decoupled) model one after another
    over gRPC ModelStreamInfer, each stream on a client of its own (a new connection: a
    router places it anew), unversioned; every stream recorded (``Stream``). With ``sse``,
    ``address`` is Triton's HTTP API (or a router's listener for it) and each generation is
    one HTTP ``generate_stream`` request, answered in server-sent events. ``tokens``: the
    request parameter of the test generator (gRPC only), a generation's length for these
    clients alone (the model's config sets it for every other caller)."""

    def __init__(
        self,
        address: str,
        model: str,
        threads: int = 1,
        sse: bool = False,
        varied: bool = False,
        tokens: int | None = None,
    ) -> None:
        self.address, self.model, self.sse = address, model, sse
        # ``varied``: prompt [n] for the n-th stream, not [1, 2, 3] every time.
        self.varied = varied
        self._numbers = itertools.count()
        self.parameters = {"tokens": tokens} if tokens is not None else None
        self.streams: list[Stream] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def __enter__(self) -> StreamClient:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)

    def _run(self) -> None:
        fixed = np.array([1, 2, 3], dtype=np.int32)
        while not self._stop.is_set():
            data = np.array([next(self._numbers)], dtype=np.int32) if self.varied else fixed
            prompt = triton_grpc.InferInput("PROMPT", [len(data)], "INT32")
            prompt.set_data_from_numpy(data)
            stream = self._event_stream(data.tolist()) if self.sse else self._one(prompt)
            with self._lock:
                self.streams.append(stream)

    def _one(self, prompt: triton_grpc.InferInput) -> Stream:
        events: queue.Queue[tuple[Any, Any]] = queue.Queue()
        versions: list[str] = []
        tokens: list[int] = []
        error = None
        first: float | None = None
        started = time.monotonic()
        with triton_grpc.InferenceServerClient(self.address) as client:
            # tritonclient calls back with keywords: result=, error=.
            client.start_stream(callback=partial(_put, events))
            client.async_stream_infer(
                self.model,
                [prompt],
                parameters=self.parameters,
                enable_empty_final_response=True,
            )
            while True:
                try:
                    result, failed = events.get(timeout=30)
                except queue.Empty:
                    error = "no final flag within 30s"
                    break
                if failed is not None:
                    error = str(failed)
                    break
                response = result.get_response()
                if response.outputs:
                    first = time.monotonic() - started if first is None else first
                    versions.append(response.model_version)
                    tokens.append(int(result.as_numpy("TOKEN")[0]))
                if response.parameters["triton_final_response"].bool_param:
                    break
            client.stop_stream()
        return Stream(started, tuple(versions), tuple(tokens), error, first, time.monotonic())

    def _event_stream(self, prompt: list[int]) -> Stream:
        """One ``generate_stream`` request on a connection of its own. Triton 2.51 takes the
        inputs as the JSON body's members by name (PROMPT a flat list: shape [3]), sends
        ``data: {"TOKEN":6,"model_name":...,"model_version":"2"}`` per response, no event
        for the final flag and no end sentinel: the stream is whole when the response
        ends cleanly, and an ``error`` member inside it is a failure (the status was 200)."""
        versions: list[str] = []
        tokens: list[int] = []
        error = None
        first: float | None = None
        started = time.monotonic()
        connection = http.client.HTTPConnection(self.address, timeout=30)
        try:
            connection.request(
                "POST",
                f"/v2/models/{self.model}/generate_stream",
                body=json.dumps({"PROMPT": prompt}),
                headers={"Content-Type": "application/json"},
            )
            answer = connection.getresponse()
            if answer.status != 200:
                error = f"HTTP {answer.status}: {answer.read()[:200]!r}"
            for line in answer if error is None else ():
                if not line.startswith(b"data: "):
                    continue
                event = json.loads(line[len(b"data: ") :])
                if "error" in event:
                    error = f"in the stream: {event['error']}"
                    break
                first = time.monotonic() - started if first is None else first
                versions.append(str(event["model_version"]))
                tokens.append(int(event["TOKEN"]))
        except (OSError, http.client.HTTPException, ValueError) as exc:
            # A connection cut mid-body is IncompleteRead (an HTTPException).
            error = f"{type(exc).__name__}: {exc}"
        finally:
            connection.close()
        return Stream(started, tuple(versions), tuple(tokens), error, first, time.monotonic())


@dataclass(frozen=True)
class SseRequest:
    """One ``generate_stream`` request made by ``sse_request``: the prompt and the body
    sent, the tokens streamed back, how it ended (None: whole) and how long it took."""

    prompt: int
    body: bytes
    tokens: tuple[int, ...]
    error: str | None
    seconds: float


def sse_request(address: str, model: str, prompt: int, chunked: bool = False) -> SseRequest:
    """One HTTP ``generate_stream`` request with the prompt ``[prompt]`` on a connection of
    its own, read to the end of its stream; ``chunked``: the body sent with
    ``Transfer-Encoding: chunked`` in two chunks 10 ms apart (else with Content-Length)."""
    body = json.dumps({"PROMPT": [prompt]}).encode()
    tokens: list[int] = []
    error = None
    started = time.monotonic()
    connection = http.client.HTTPConnection(address, timeout=30)
    path = f"/v2/models/{model}/generate_stream"
    headers = {"Content-Type": "application/json"}
    try:
        if chunked:

            def parts() -> Iterator[bytes]:
                yield body[:5]
                time.sleep(0.01)  # the rest once the router has sent the headers on
                yield body[5:]

            connection.request("POST", path, body=parts(), headers=headers, encode_chunked=True)
        else:
            connection.request("POST", path, body=body, headers=headers)
        answer = connection.getresponse()
        if answer.status != 200:
            error = f"HTTP {answer.status}: {answer.read()[:200]!r}"
        for line in answer if error is None else ():
            if line.startswith(b"data: "):
                event = json.loads(line[len(b"data: ") :])
                if "error" in event:
                    error = f"in the stream: {event['error']}"
                    break
                tokens.append(int(event["TOKEN"]))
    except (OSError, http.client.HTTPException, ValueError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    finally:
        connection.close()
    return SseRequest(prompt, body, tuple(tokens), error, time.monotonic() - started)


def _put(events: queue.Queue[tuple[Any, Any]], result: Any, error: Any) -> None:
    events.put((result, error))
