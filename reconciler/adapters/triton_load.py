"""The gate's built-in load generator: one version of a model driven over gRPC with the same
requests, ``concurrency`` at a time, for the A/B load test of ``triton-gitops gate``.

Closed loop, as perf_analyzer's concurrency mode is: each of ``concurrency`` workers sends its
next request when its last one is answered. Each worker has its own client (its own channel),
so the workers do not queue behind one connection; all of them warm up first and the clock
starts when the last is ready. A failed request is counted and the worker goes on (the gate
wants the error rate, not the first error). Used when perf_analyzer is not there or not
wanted (``adapters/perf_analyzer.py``).

A streaming (decoupled) model is driven by streams (``streaming``): each request is one gRPC
stream read to Triton's final flag by ``adapters/triton_stream.stream_on`` (the reader the
probes and verify use), on the worker's own client. Either way an exchange comes back as the
seconds from sending it to each of its responses, and one function makes the figures of
both: the latency is the time to the first response, and for streams the times between
responses and the responses per second come with it.

A sequence model (``sequence_batching``) refuses a request that names no sequence: each
worker sends its requests as sequences of its own (a fresh correlation ID of the type the
model takes, START on the first, END on the SEQUENCE_LENGTH-th, as perf_analyzer's default
``--sequence-length``), each request timed and counted as one; a failed request ends its
sequence, and a sequence still open when the count is reached is ended by one request
after the clock stops, so that no slot stays held into the next measurement.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import tritonclient.grpc as triton_grpc
from tritonclient.utils import InferenceServerException

from reconciler.adapters.triton import infer_inputs
from reconciler.adapters.triton_sequence import correlation_id
from reconciler.adapters.triton_stream import StreamRequest, stream_on
from reconciler.core.exchange import MAX_RESPONSES
from reconciler.model.errors import ReconcileError, StepFailed
from reconciler.model.gate import LoadFigures
from reconciler.model.plan import Exchange
from reconciler.model.spec import Tensor

WARMUP_PER_WORKER = 5
SEQUENCE_LENGTH = 20  # requests per sequence of a sequence model: perf_analyzer's default


class _Sequences:
    """One worker's place in its sequences: the next request's correlation ID and flags."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.key: int | str = 0
        self.sent = SEQUENCE_LENGTH  # none open

    @property
    def open(self) -> bool:
        return self.sent < SEQUENCE_LENGTH

    def next(self) -> dict[str, Any]:
        """The sequence arguments of tritonclient's ``infer`` for the next request."""
        if not self.open:
            self.key, self.sent = correlation_id(self.config), 0
        self.sent += 1
        return {
            "sequence_id": self.key,
            "sequence_start": self.sent == 1,
            "sequence_end": self.sent == SEQUENCE_LENGTH,
        }

    def last(self) -> dict[str, Any]:
        """The arguments of a request that ends the open sequence now."""
        self.sent = SEQUENCE_LENGTH
        return {"sequence_id": self.key, "sequence_end": True}

    def broken(self) -> None:
        self.sent = SEQUENCE_LENGTH  # the next request starts a sequence of its own


class GrpcLoadTester:
    """The built-in ``LoadTester`` (``ports.LoadTester``) for one server."""

    name = "built-in"

    def __init__(self, address: str, request_timeout: float = 30.0) -> None:
        self.address = address
        self.request_timeout = request_timeout

    def measure(
        self,
        model: str,
        version: int,
        requests: Sequence[tuple[Tensor, ...]],
        outputs: tuple[str, ...],
        concurrency: int,
        count: int,
        batched: bool = False,  # the requests carry their batch dimension as they are
        *,
        exchange: Exchange = Exchange.UNARY,
    ) -> LoadFigures:
        streaming = exchange is Exchange.STREAM
        config = self._config(model) if exchange is Exchange.SEQUENCE else None
        exchanges: list[tuple[float, ...]] = []
        finished: list[float] = []  # when each worker's last counted exchange ended
        errors: list[str] = []
        lock = threading.Lock()
        ready = threading.Barrier(concurrency + 1)
        numbers = itertools.count()
        wanted = [triton_grpc.InferRequestedOutput(name) for name in outputs] or None

        def worker() -> None:
            try:
                client = triton_grpc.InferenceServerClient(url=self.address)
            except BaseException:
                ready.abort()  # the others (and the caller) stop waiting for this worker
                raise
            try:
                # Inputs are built per worker: an InferInput is not shared between threads.
                prepared = [infer_inputs(request) for request in requests]
                sequences = _Sequences(config) if config is not None else None

                def send(index: int) -> tuple[tuple[float, ...], str | None]:
                    """The seconds to each response of one exchange, or why it failed."""
                    inputs = prepared[index % len(prepared)]
                    started = time.perf_counter()
                    try:
                        if streaming:
                            asked = StreamRequest(
                                model, version, inputs, outputs, self.request_timeout,
                                MAX_RESPONSES,
                            )  # fmt: skip
                            reply = stream_on(client, asked, self.address, lambda _: False)
                            return reply.seconds, None
                        client.infer(
                            model,
                            inputs,
                            model_version=str(version),
                            outputs=wanted,
                            client_timeout=self.request_timeout,
                            **(sequences.next() if sequences is not None else {}),
                        )
                    except InferenceServerException as exc:
                        if sequences is not None:
                            sequences.broken()
                        return (), exc.message() or str(exc)
                    except ReconcileError as exc:  # a stream that failed, was cut or timed out
                        return (), str(exc)
                    return (time.perf_counter() - started,), None

                for index in range(WARMUP_PER_WORKER):
                    send(index)
                try:
                    ready.wait()
                except threading.BrokenBarrierError:
                    return  # another worker could not start: the caller reports it
                mine: list[tuple[float, ...]] = []
                failed: list[str] = []
                while (index := next(numbers)) < count:
                    seconds, error = send(index)
                    if error is None:
                        mine.append(seconds)
                    else:
                        failed.append(error)
                ended = time.perf_counter()
                if sequences is not None and sequences.open:
                    with contextlib.suppress(InferenceServerException):
                        client.infer(
                            model, prepared[0], model_version=str(version), outputs=wanted,
                            client_timeout=self.request_timeout, **sequences.last(),
                        )  # fmt: skip
                with lock:
                    exchanges.extend(mine)
                    errors.extend(failed)
                    finished.append(ended)
            except BaseException:
                ready.abort()
                raise
            finally:
                client.close()

        threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
        for thread in threads:
            thread.start()
        try:
            ready.wait()
        except threading.BrokenBarrierError:
            for thread in threads:
                thread.join()
            raise StepFailed(
                f"load test of {model} version {version} at {self.address}: a worker could "
                "not start"
            ) from None
        started = time.perf_counter()
        for thread in threads:
            thread.join()
        elapsed = max(finished, default=time.perf_counter()) - started
        return figures(concurrency, exchanges, errors, elapsed, streamed=streaming)

    def _config(self, model: str) -> dict[str, Any]:
        """The loaded model's config (its correlation ID's type), as Triton answers it."""
        with triton_grpc.InferenceServerClient(url=self.address) as client:
            try:
                answer = client.get_model_config(model, as_json=True)
            except InferenceServerException as exc:
                raise StepFailed(f"load test of {model}: reading its config: {exc}") from exc
        config: dict[str, Any] = answer.get("config", {})
        return config


def figures(
    concurrency: int,
    exchanges: Sequence[tuple[float, ...]],
    errors: Sequence[str],
    elapsed: float,
    *,
    streamed: bool = False,
) -> LoadFigures:
    """One measurement's figures from the exchanges that were answered (for each, the seconds
    from sending it to each of its responses: one for a unary call) and the failures. The
    latency is the time to the first response; for streams, the median time between two
    responses (every gap of every stream pooled) and the responses per second too."""
    answered = len(exchanges)
    ms = np.array([s[0] for s in exchanges if s], dtype=np.float64) * 1000.0
    if len(ms):
        levels = np.arange(1, 100, dtype=np.float64)
        values = np.percentile(ms, levels)
        quantiles = tuple((float(p), float(v)) for p, v in zip(levels, values, strict=True))
        p50, p95, p99 = (float(np.percentile(ms, q)) for q in (50, 95, 99))
    else:
        quantiles, p50, p95, p99 = (), float("nan"), float("nan"), float("nan")
    note = f"{len(errors)} failed, first: {errors[0]}" if errors else ""
    gaps = [b - a for s in exchanges for a, b in itertools.pairwise(s)]
    responses = sum(len(s) for s in exchanges)
    return LoadFigures(
        concurrency=concurrency,
        requests=answered + len(errors),
        errors=len(errors),
        throughput=answered / elapsed if elapsed > 0 else 0.0,
        p50_ms=p50,
        p95_ms=p95,
        p99_ms=p99,
        quantiles=quantiles,
        note=note,
        streamed=streamed,
        gap_ms=float(np.median(gaps)) * 1000.0 if streamed and gaps else None,
        responses_per_second=responses / elapsed if streamed and elapsed > 0 else None,
    )
