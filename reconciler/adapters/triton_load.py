"""The gate's built-in load generator: one version of a model driven over gRPC with the same
requests, ``concurrency`` at a time, for the A/B load test of ``triton-gitops gate``.

Closed loop, as perf_analyzer's concurrency mode is: each of ``concurrency`` workers sends its
next request when its last one is answered. Each worker has its own client (its own channel),
so the workers do not queue behind one connection; all of them warm up first and the clock
starts when the last is ready. A failed request is counted and the worker goes on (the gate
wants the error rate, not the first error). Used when perf_analyzer is not there or not
wanted (``adapters/perf_analyzer.py``).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Sequence

import numpy as np
import tritonclient.grpc as triton_grpc
from tritonclient.utils import InferenceServerException

from reconciler.adapters.triton import infer_inputs
from reconciler.model.errors import StepFailed
from reconciler.model.gate import LoadFigures
from reconciler.model.spec import Tensor

WARMUP_PER_WORKER = 5


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
    ) -> LoadFigures:
        latencies: list[float] = []
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

                def send(index: int) -> tuple[float, str | None]:
                    started = time.perf_counter()
                    try:
                        client.infer(
                            model,
                            prepared[index % len(prepared)],
                            model_version=str(version),
                            outputs=wanted,
                            client_timeout=self.request_timeout,
                        )
                    except InferenceServerException as exc:
                        return time.perf_counter() - started, exc.message() or str(exc)
                    return time.perf_counter() - started, None

                for index in range(WARMUP_PER_WORKER):
                    send(index)
                try:
                    ready.wait()
                except threading.BrokenBarrierError:
                    return  # another worker could not start: the caller reports it
                mine: list[float] = []
                failed: list[str] = []
                while (index := next(numbers)) < count:
                    seconds, error = send(index)
                    if error is None:
                        mine.append(seconds)
                    else:
                        failed.append(error)
                with lock:
                    latencies.extend(mine)
                    errors.extend(failed)
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
        elapsed = time.perf_counter() - started
        return figures(concurrency, latencies, errors, elapsed)


def figures(
    concurrency: int, latencies: Sequence[float], errors: Sequence[str], elapsed: float
) -> LoadFigures:
    """One measurement's figures from per-request latencies (seconds) and failures."""
    ms = np.array(latencies, dtype=np.float64) * 1000.0
    answered = len(ms)
    if answered:
        levels = np.arange(1, 100, dtype=np.float64)
        values = np.percentile(ms, levels)
        quantiles = tuple((float(p), float(v)) for p, v in zip(levels, values, strict=True))
        p50, p95, p99 = (float(np.percentile(ms, q)) for q in (50, 95, 99))
    else:
        quantiles, p50, p95, p99 = (), float("nan"), float("nan"), float("nan")
    note = f"{len(errors)} failed, first: {errors[0]}" if errors else ""
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
    )
