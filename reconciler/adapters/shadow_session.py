"""One shadow phase's comparison inside the live comparator (``adapters/comparator.py``):
the mirrored copies it is offered, sampled, queued and compared on a worker thread of its
own (the serving version asked twice, the candidate once, each pinned by version, in random
order, one call after another: ``comparator_calls`` makes each call, ``core/comparison.py``
judges the answers), and the figures the analysis reads. ``Channels`` are the connections
the sessions share: one gRPC channel per server, one pooled HTTP client for the SSE copies.
Split from the comparator's server so that each module stays one concern: the server
receives copies, a session compares them.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, TypeAlias

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from reconciler.adapters.comparator_calls import (
    Exchanged,
    Failed,
    Generation,
    HttpSides,
    StreamFailed,
    Unreadable,
    call,
    outputs,
)
from reconciler.adapters.comparator_http import NotCompared
from reconciler.core.comparison import ROLES, deviation, interleaved
from reconciler.model.shadow import (
    Comparison,
    Deviation,
    ShadowFigures,
    ShadowTarget,
    Uncomparable,
)

log = logging.getLogger(__name__)

QUEUE = 16  # sampled requests waiting for their comparison, at most
LATENCIES_KEPT = 20_000  # per side: the latest calls' seconds, for the quantiles
DEVIATIONS_KEPT = 20_000  # the latest requests' deviations, for the noise discount
SAMPLES_KEPT = 5  # reasons kept per kind (GitHub Scientist's capped samples)

# Called with (deployment, outcome) for each mirrored request: ``/metrics`` counts them.
Observer = Callable[[str, str], None]


@dataclass(frozen=True)
class _Route:
    """Where one request's three calls go: the servers, and for a request of a sampled
    sequence the sequence id each side knows it by (fresh ids, one per side: the serving
    version asked twice must hold two sequences, not one fed twice)."""

    primary: str
    secondary: str
    candidate: str
    sequence_ids: tuple[int, int, int] | None = None  # primary, secondary, candidate
    streamed: bool = False  # mirrored from a gRPC stream: each side asked by a stream
    # The same servers' HTTP endpoints (primary, secondary, candidate; "" where undeclared):
    # where an SSE copy's sides are asked.
    http: tuple[str, str, str] = ("", "", "")


class ShadowSession:
    """One target's comparison while its phase lasts: fed by the server, read by the
    analysis (``figures``), ended by the engine (``end``)."""

    def __init__(
        self,
        target: ShadowTarget,
        channels: Channels,
        observer: Observer,
        on_end: Callable[[ShadowSession], None],
    ) -> None:
        self.target, self.spec = target, target.spec
        self._on_end = on_end
        self._channels, self._observer = channels, observer
        self._lock = threading.Lock()
        self._figures = ShadowFigures()
        self._candidate_count = self._noise_count = self._compared = 0
        self._first_candidate = ""
        self._primary_s: deque[float] = deque(maxlen=LATENCIES_KEPT)
        self._candidate_s: deque[float] = deque(maxlen=LATENCIES_KEPT)
        self._deviations: deque[tuple[Deviation, Deviation]] = deque(maxlen=DEVIATIONS_KEPT)
        self._samples: dict[str, list[str]] = {}
        self._next_at = 0.0  # monotonic: no comparison starts before this
        self._random = random.Random(f"{target.deployment}/{target.candidate_version}")
        self._queue: queue.Queue[tuple[Mirrored, _Route] | None] = queue.Queue(QUEUE)
        self._turn = 0
        self._streamed = False  # requests came mirrored from streams (gRPC or SSE)
        # The sampled sequences in flight (the client's sequence id -> their route), and
        # those cut short (a request dropped: the rest of it is not sent either).
        self._sequences: dict[str, _Route] = {}
        self._cut: set[str] = set()
        # The server's threads offer requests at once: the routes and sequences are theirs.
        self._routing = threading.Lock()
        self._worker = threading.Thread(
            target=self._work, name=f"comparator-{target.deployment}", daemon=True
        )
        self._worker.start()

    # -- fed by the server ----------------------------------------------------------------

    def offer(self, request: service_pb2.ModelInferRequest, streamed: bool = False) -> None:
        """A mirrored request; ``streamed``: it came in a gRPC stream (ModelStreamInfer),
        and each side is asked by a stream of its own, to its final flag."""
        if request.model_name != self.target.model:
            self._count("other_model")
            return
        sequence = _sequence_of(request)
        if sequence is not None and not self.spec.whole_sequences:
            self._count("sequence")
            return
        with self._routing:
            if sequence is not None:
                self._offer_in_sequence(request, sequence)
                return
            if not self._sampled():
                self._count("not_sampled")
                return
            self._streamed = self._streamed or streamed
            self._enqueue(request, replace(self._route(), streamed=streamed))

    def offer_generation(self, copy: Generation) -> None:
        """A mirrored HTTP ``generate_stream`` request (server-sent events): sampled and
        bounded as any other; each side is asked by a ``generate_stream`` of its own, pinned
        by version, at its server's HTTP endpoint, and read to the end of its events."""
        target = self.target
        if copy.model != target.model:
            self._count("other_model")
            return
        undeclared = _without_http(target)
        if undeclared:
            self._received_one()
            self._count(
                "no_http",
                f"an SSE copy, and {', '.join(undeclared)} declare(s) no HTTP endpoint "
                "(TritonServer spec.http) to ask it at",
            )
            return
        with self._routing:
            if not self._sampled():
                self._count("not_sampled")
                return
            self._streamed = True
            self._enqueue(copy, replace(self._route(), streamed=True))

    def not_compared(self, copy: NotCompared) -> None:
        """A mirrored HTTP inference request that cannot be compared (a unary one, or a
        body that is no JSON object)."""
        if copy.model != self.target.model:
            self._count("other_model")
        else:
            self.unparsable(copy.why)

    def _received_one(self) -> None:
        with self._lock:
            self._figures = replace(self._figures, received=self._figures.received + 1)

    def _sampled(self) -> bool:
        """One more received request; whether the rate lets a comparison start now."""
        self._received_one()
        now = time.monotonic()
        with self._lock:
            if now < self._next_at:
                return False
            self._next_at = now + 1.0 / self.spec.rate
            return True

    def _enqueue(self, request: Mirrored, route: _Route) -> bool:
        try:
            self._queue.put_nowait((request, route))
        except queue.Full:
            self._count("dropped")
            return False
        return True

    def _offer_in_sequence(self, request: service_pb2.ModelInferRequest, sequence: str) -> None:
        """Whole sequences (``sequences: whole``): sampled at their start, then every
        request of a sampled one is compared, in order, each side in a sequence of its own;
        a request dropped (a full queue) cuts the rest of its sequence."""
        start = _flag(request, "sequence_start")
        end = _flag(request, "sequence_end")
        if start:
            self._cut.discard(sequence)
            self._sequences.pop(sequence, None)
            if self._sampled():
                ids = (_fresh_id(), _fresh_id(), _fresh_id())
                self._sequences[sequence] = replace(self._route(), sequence_ids=ids)
            else:
                self._count("not_sampled")
                return
        else:
            self._received_one()
        route = self._sequences.get(sequence)
        if route is None:
            self._count("dropped" if sequence in self._cut else "not_sampled")
        elif not self._enqueue(request, route):
            self._sequences.pop(sequence, None)
            self._cut.add(sequence)
        if end:
            self._sequences.pop(sequence, None)
            self._cut.discard(sequence)

    def unparsable(self, why: str) -> None:
        self._received_one()
        self._count("unparsable", why)

    # -- read by the analysis -------------------------------------------------------------

    def figures(self) -> ShadowFigures:
        with self._lock:
            return replace(
                self._figures,
                comparison=Comparison(
                    self._compared,
                    self._candidate_count,
                    self._noise_count,
                    self._first_candidate,
                    tuple(self._primary_s),
                    tuple(self._candidate_s),
                    tuple(self._deviations),
                    self._streamed,
                ),
                samples={k: tuple(v) for k, v in self._samples.items()},
            )

    def end(self) -> None:
        """Stop comparing: requests still queued are left uncompared."""
        self._on_end(self)
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._queue.put(None)
        self._worker.join(timeout=3 * self.spec.timeout + 1)

    # -- the comparisons ------------------------------------------------------------------

    def _count(self, outcome: str, why: str | None = None) -> None:
        with self._lock:
            if hasattr(self._figures, outcome):
                self._figures = replace(
                    self._figures, **{outcome: getattr(self._figures, outcome) + 1}
                )
            if why is not None:
                kept = self._samples.setdefault(outcome, [])
                if len(kept) < SAMPLES_KEPT:
                    kept.append(why)
        self._observer(self.target.deployment, outcome)

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            try:
                self._compare(*item)
            except Exception as exc:
                log.exception("comparator: comparing a request of %s failed", self.target.model)
                self._count("unparsable", f"{type(exc).__name__}: {exc}")

    def _route(self) -> _Route:
        """The servers of the next comparison, in turn."""
        target = self.target
        turn, self._turn = self._turn, self._turn + 1
        # The secondary on another server of the same version when there is one: Diffy's
        # secondary is another instance.
        primary, secondary = turn % len(target.primary), (turn + 1) % len(target.primary)
        candidate = turn % len(target.candidate)
        return _Route(
            target.primary[primary],
            target.primary[secondary],
            target.candidate[candidate],
            http=(
                _nth(target.primary_http, primary),
                _nth(target.primary_http, secondary),
                _nth(target.candidate_http, candidate),
            ),
        )

    def _compare(self, request: Mirrored, route: _Route) -> None:
        target, spec = self.target, self.spec
        ids = dict(zip(ROLES, route.sequence_ids or (None, None, None), strict=True))
        address = {
            "primary": route.primary,
            "secondary": route.secondary,
            "candidate": route.candidate,
        }
        version = {
            "primary": target.primary_version,
            "secondary": target.primary_version,
            "candidate": target.candidate_version,
        }

        http = dict(zip(ROLES, route.http, strict=True))

        def ask(role: str) -> Exchanged | grpc.RpcError | StreamFailed:
            if isinstance(request, Generation):
                try:
                    sides = self._channels.sides()
                    return sides.generated(http[role], request, version[role], spec.timeout)
                except StreamFailed as exc:
                    return exc
            pinned = service_pb2.ModelInferRequest()
            pinned.CopyFrom(request)
            pinned.model_version = str(version[role])
            if ids[role] is not None:
                pinned.parameters["sequence_id"].Clear()
                pinned.parameters["sequence_id"].int64_param = ids[role]
            stub = self._channels.stub(address[role])
            try:
                return call(stub, pinned, spec.timeout, route.streamed)
            except Failed as exc:
                return exc

        answers, took = interleaved(self._random, ask, time.monotonic)
        busy: dict[str, float] = {}
        for role, spent in took.items():
            busy[address[role]] = busy.get(address[role], 0.0) + spent
        # The latency compared: a unary call's time, a stream's to its first response.
        seconds = {
            role: answer.first if isinstance(answer, Exchanged) else took[role]
            for role, answer in answers.items()
        }
        # One server kept busy at most maxShare of the time (as the probes are).
        spent = max(busy.values())
        with self._lock:
            self._next_at = max(self._next_at, time.monotonic() + spent / spec.max_share - spent)
        self._judge(answers, seconds)

    def _judge(
        self,
        answers: dict[str, Exchanged | grpc.RpcError | StreamFailed],
        seconds: dict[str, float],
    ) -> None:
        for role in ("primary", "secondary"):
            answer = answers[role]
            if not isinstance(answer, Exchanged):
                self._count("primary_failed", f"{role}: {_status(answer)}")
                return
        answered = {role: a for role, a in answers.items() if isinstance(a, Exchanged)}
        candidate_answer = answers["candidate"]
        try:
            primary = outputs(answered["primary"])
            secondary = outputs(answered["secondary"])
            candidate = outputs(answered["candidate"]) if "candidate" in answered else None
        except Unreadable as exc:
            if self.spec.uncomparable is Uncomparable.SKIP:
                self._count("uncomparable", str(exc))
                return
            self._compared_one(Deviation(), Deviation(unanswered=True, why=str(exc)), seconds)
            return
        noise = deviation(primary, secondary, self.spec.tolerance)
        if not isinstance(candidate_answer, Exchanged):
            timed_out = candidate_answer.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            if timed_out:
                self._count("candidate_timeouts")
            why = (
                f"timed out after {self.spec.timeout:g}s"
                if timed_out
                else f"answered an error: {_status(candidate_answer)}"
            )
            self._compared_one(noise, Deviation(unanswered=True, why=why), seconds)
            return
        assert candidate is not None
        self._compared_one(noise, deviation(primary, candidate, self.spec.tolerance), seconds)

    def _compared_one(
        self, noise: Deviation, candidate: Deviation, seconds: dict[str, float]
    ) -> None:
        """Count one compared request: at the declared tolerance (``/metrics``, the
        report), and its deviations, which the noise discount learns from."""
        disagreed = bool(candidate.why) or candidate.unanswered
        with self._lock:
            self._compared += 1
            self._primary_s.append(seconds["primary"])
            self._candidate_s.append(seconds["candidate"])
            self._deviations.append((noise, candidate))
            if disagreed:
                self._candidate_count += 1
                self._first_candidate = self._first_candidate or candidate.why
            if noise.why:
                self._noise_count += 1
        self._observer(self.target.deployment, "compared")
        if disagreed:
            self._observer(self.target.deployment, "candidate_disagreed")
        if noise.why:
            self._observer(self.target.deployment, "noise")


# What the router mirrored: a gRPC request (unary, or one of a stream), or an SSE copy.
Mirrored: TypeAlias = "service_pb2.ModelInferRequest | Generation"


def _nth(addresses: tuple[str, ...], index: int) -> str:
    return addresses[index] if index < len(addresses) else ""


def _without_http(target: ShadowTarget) -> list[str]:
    """The target's servers (by gRPC address) that declare no HTTP endpoint."""
    missing: set[str] = set()
    for servers, http in ((target.primary, target.primary_http),
                          (target.candidate, target.candidate_http)):  # fmt: skip
        missing.update(server for index, server in enumerate(servers) if not _nth(http, index))
    return sorted(missing)


def _status(error: grpc.RpcError | StreamFailed) -> str:
    code = error.code() if hasattr(error, "code") else None
    details = error.details() if hasattr(error, "details") else str(error)
    return f"{code.name if code is not None else 'error'}: {details}"


def _sequence_of(request: service_pb2.ModelInferRequest) -> str | None:
    """The sequence a request belongs to (Triton's sequence_id parameter, nonzero), as
    text; None for a request of no sequence."""
    if "sequence_id" not in request.parameters:
        return None
    parameter = request.parameters["sequence_id"]
    value = parameter.int64_param or parameter.uint64_param or parameter.string_param
    return str(value) if value else None


def _flag(request: service_pb2.ModelInferRequest, name: str) -> bool:
    return name in request.parameters and request.parameters[name].bool_param


def _fresh_id() -> int:
    """A sequence id no client uses: random, 62 bits (Triton takes int64 and uint64)."""
    return random.getrandbits(62) | 1


class Channels:
    """One gRPC channel per server address, and one pooled HTTP client for the SSE copies'
    calls, shared by the sessions."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stubs: dict[str, Any] = {}
        self._channels: list[grpc.Channel] = []
        self._sides: HttpSides | None = None

    def sides(self) -> HttpSides:
        with self._lock:
            if self._sides is None:
                self._sides = HttpSides()
            return self._sides

    def stub(self, address: str) -> Any:
        with self._lock:
            if address not in self._stubs:
                channel = grpc.insecure_channel(address)
                self._channels.append(channel)
                self._stubs[address] = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            return self._stubs[address]

    def close(self) -> None:
        with self._lock:
            for channel in self._channels:
                channel.close()
            self._channels.clear()
            self._stubs.clear()
            if self._sides is not None:
                self._sides.close()
                self._sides = None
