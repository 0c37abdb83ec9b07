"""The analysis's probes: the reconciler's own requests to the new versions, while they are
watched. What to send and what counts as a failure is ``core/probes.py``; this module sends
them, paced, and keeps the count (``ProbeFigures``) the analysis judges.

Pacing: at most ``rate`` probe rounds a second, each of ``concurrency`` probes at once, and a
probe slot never keeps the server busy more than ``max_share`` of the time (after probes
that took t, the lower median of the last PACE_ROUNDS rounds, the next waits t / max_share - t),
so a slow server gets fewer probes, and one probe delayed by a busy machine does not stop
them. One probe
in ``OLD_EVERY`` goes to an old version instead, for a baseline. The first probes (the
volley) are sent back to back as soon as the analysis starts, so a version that fails every
request is caught within a few requests of becoming READY.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from statistics import median_low

from reconciler.core.probes import ProbeRequest, declared, synthesized, wrong
from reconciler.engine.exchange import ask
from reconciler.model.analysis import ProbeFigures, ProbeSpec
from reconciler.model.errors import ProbeTimedOut, VerifyFailed
from reconciler.model.plan import Step
from reconciler.model.serving import ModelInterface
from reconciler.ports import ModelControl

OLD_EVERY = 5  # one probe in five goes to an old version, for the baseline latency
# The pace follows the lower median of this many last rounds: one probe that waited on a busy
# machine (measured here: 395 ms among probes of a few ms) must not stop the probes for
# 19 times as long, leaving an evaluation with none and the analysis without its evidence.
PACE_ROUNDS = 5
VOLLEY_MAX = 16  # at most this many (request, version) pairs in the first volley


@dataclass(frozen=True)
class _Outcome:
    error: str | None  # why the probe failed; None: it passed
    seconds: float
    # Time spent on a probe sent before it and not counted: a wake-up probe
    # (``Prober.warm``), or one that missed its deadline and was sent again.
    wake_seconds: float = 0.0
    timed_out: bool = False  # no answer within the probe's deadline
    # How long the exchange kept the server busy, where it differs from ``seconds`` (a
    # stream: ``seconds`` is its time to the first response).
    busy: float | None = None

    @property
    def server_seconds(self) -> float:
        return (self.seconds if self.busy is None else self.busy) + self.wake_seconds


class Prober:
    """Sends the probes of one analyze step and counts them. Built by ``prepare`` before
    the new versions load, so that no request is spent on the old version's baseline after
    the new ones take traffic."""

    def __init__(
        self,
        control: ModelControl,
        step: Step,
        spec: ProbeSpec,
        requests: tuple[ProbeRequest, ...],
        clock: Callable[[], float],
        skipped: int = 0,
        note: str | None = None,  # why there are no probes, when there are none
    ) -> None:
        self.control, self.step, self.spec, self.clock = control, step, spec, clock
        self.requests = requests
        self.figures = ProbeFigures(skipped=skipped, note=note)
        self._turn = 0
        self._next_at: float | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._recent: deque[float] = deque(maxlen=PACE_ROUNDS)  # the last rounds' seconds
        # Each probe after a wake-up probe to the same version (``_warm_send``): set by the
        # analysis when latency is judged by the probes alone.
        self.warm = False

    @classmethod
    def prepare(
        cls,
        control: ModelControl,
        step: Step,
        spec: ProbeSpec,
        clock: Callable[[], float],
        interface: ModelInterface | None,
    ) -> Prober:
        """The probe requests: declared ones, else one synthesized from ``interface`` (the
        old versions'). A request judged against the old version is tried on it now, and
        left out if the old version fails it too; with no old version, only smoke cases."""
        outputs = tuple(t.name for t in interface.outputs) if interface else ()
        requests = declared(step.smoke, step.shadow, outputs)
        if not requests and interface is not None:
            made = synthesized(interface)
            requests = (made,) if made is not None else ()
        note = None
        if not requests:
            note = (
                "no old version to judge a synthesized request against; declare smoke cases "
                "to probe a first deployment"
                if not step.baseline
                else "the model's inputs could not be read to synthesize a request"
                if interface is None
                else "an input's datatype is unknown: no request could be synthesized"
            )
        prober = cls(control, step, spec, requests, clock, note=note)
        prober._against_old()
        prober._no_old_version()
        return prober

    def _against_old(self) -> None:
        old = max(self.step.baseline) if self.step.baseline else None
        if old is None or not any(r.relative for r in self.requests):
            return
        kept = []
        for request in self.requests:
            if request.relative and self._send(request, old).error is not None:
                continue
            kept.append(request)
        skipped = len(self.requests) - len(kept)
        self.requests = tuple(kept)
        note = (
            f"version {old} fails the {skipped} synthesized or recorded request(s) too; "
            "declare smoke cases to probe this model"
            if not kept
            else None
        )
        self.figures = replace(self.figures, skipped=skipped, note=note)

    def _no_old_version(self) -> None:
        # A request with no expected answer is judged against the old version: with none
        # (a first deployment) its failure says nothing about the new one (a model may reject
        # zeros), so only declared smoke cases probe a first deployment.
        if self.step.baseline or not any(r.relative for r in self.requests):
            return
        self.requests = tuple(r for r in self.requests if not r.relative)
        if not self.requests:
            self.figures = replace(
                self.figures,
                note="no old version to judge a synthesized or recorded request against; "
                "declare smoke cases to probe a first deployment",
            )

    # -- sending -------------------------------------------------------------------------------

    def _send(self, request: ProbeRequest, version: int) -> _Outcome:
        """One probe; one that got no answer within its deadline is sent again at once and
        fails only if that one does too: on a CPU-starved machine a probe of a good version
        timed out while Triton counted it answered (bench.false_verdicts, with a burner:
        1 of 2 probes failed, 0 of 2 requests in Triton's counters), and one such probe among
        few failed the rollout. A version that hangs misses both deadlines."""
        first = self._send_once(request, version)
        if not first.timed_out:
            return first
        again = self._send_once(request, version)
        if again.error is not None:
            return replace(again, error=f"{again.error} (twice in a row)")
        return replace(again, wake_seconds=first.server_seconds)

    def _send_once(self, request: ProbeRequest, version: int) -> _Outcome:
        started = self.clock()
        deadline, cap = request.limits(self.spec.timeout)
        try:
            reply = ask(
                self.control,
                self.step.model,
                version,
                request.inputs,
                request.outputs,
                streaming=self.step.streaming,
                timeout=deadline,
                max_responses=cap,
                clock=self.clock,
            )
        except VerifyFailed as exc:
            return _Outcome(
                f"{request.name} on version {version}: {exc}",
                self.clock() - started,
                timed_out=isinstance(exc, ProbeTimedOut),
            )
        busy = self.clock() - started
        why = wrong(request, reply)
        # A stream's latency is its time to the first response; the whole of it keeps the
        # server busy, and paces the probes.
        latency = reply.first_seconds if reply.streamed else None
        return _Outcome(
            f"{why} (version {version})" if why else None,
            busy if latency is None else latency,
            busy=busy,
        )

    def _warm_send(self, request: ProbeRequest, version: int) -> _Outcome:
        """A wake-up probe, then the probe that counts, back to back to the same version. A
        version that takes only the probes sleeps between them (an idle Python stub, woken
        by each), while the version it is compared with serves clients and stays awake: on
        a busy machine the wake-up alone made a good idle version 60-120% slower than a busy
        one (bench.false_verdicts). Timed after a wake-up, both are measured awake (with both
        cores held by a burner the idle one still read 50-150% slower on a 1.5 ms model:
        BENCHMARKS.md, not closed). A wake-up that fails counts as the probe."""
        wake = self._send(request, version)
        if wake.error is not None:
            return wake
        measured = self._send(request, version)
        return replace(measured, wake_seconds=measured.wake_seconds + wake.server_seconds)

    def _count(self, outcome: _Outcome, old: bool) -> None:
        f = self.figures
        if old:
            self.figures = replace(
                f,
                old_sent=f.old_sent + 1,
                old_failed=f.old_failed + (outcome.error is not None),
                old_seconds=f.old_seconds + outcome.seconds,
                old_latencies=(*f.old_latencies, outcome.seconds),
            )
            return
        failed = outcome.error is not None
        self.figures = replace(
            f,
            sent=f.sent + 1,
            failed=f.failed + failed,
            seconds=f.seconds + outcome.seconds,
            latencies=(*f.latencies, outcome.seconds),
            consecutive=f.consecutive + 1 if failed else 0,
            last_error=outcome.error if failed else f.last_error,
        )

    def volley(self, limit: int) -> None:
        """Each request once on each new version, back to back; a failed one again at once,
        until it passes or ``limit`` failed in a row (the early abort's run)."""
        pairs = [(r, v) for v in self.step.versions for r in self.requests][:VOLLEY_MAX]
        for request, version in pairs:
            while True:
                outcome = self._send(request, version)
                self._count(outcome, old=False)
                if outcome.error is None or self.figures.consecutive >= limit:
                    break
            if self.figures.consecutive >= limit:
                return
        self._next_at = self.clock()

    def due(self) -> float | None:
        """When the next round may be sent (None: no probes to send)."""
        if not self.requests:
            return None
        return self._next_at if self._next_at is not None else self.clock()

    def round(self) -> None:
        """One paced round: ``concurrency`` probes at once, round robin over the new
        versions and requests, one in ``OLD_EVERY`` to an old version."""
        if not self.requests:
            return
        started = self.clock()
        jobs = [self._next_job() for _ in range(self.spec.concurrency)]
        send = self._warm_send if self.warm else self._send
        if len(jobs) == 1:
            outcomes = [send(jobs[0][0], jobs[0][1])]
        else:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.spec.concurrency, "probe")
            outcomes = list(self._pool.map(lambda job: send(job[0], job[1]), jobs))
        for (_, _, old), outcome in zip(jobs, outcomes, strict=True):
            self._count(outcome, old)
        # The server's time for the round: a wake-up probe's too.
        self._recent.append(max(o.server_seconds for o in outcomes))
        took = median_low(self._recent)
        self._next_at = max(
            started + 1.0 / self.spec.rate, self.clock() + took / self.spec.max_share - took
        )

    def _next_job(self) -> tuple[ProbeRequest, int, bool]:
        self._turn += 1
        if self.step.baseline and self._turn % OLD_EVERY == 0:
            old = max(self.step.baseline)
            return self.requests[self._turn % len(self.requests)], old, True
        pairs = [(r, v) for v in self.step.versions for r in self.requests]
        request, version = pairs[self._turn % len(pairs)]
        return request, version, False

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
