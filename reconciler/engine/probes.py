"""The analysis's probes: the reconciler's own requests to the new versions, while they are
watched. What to send and what counts as a failure is ``core/probes.py``; this module sends
them, paced, and keeps the count (``ProbeFigures``) the analysis judges. A probe is one
exchange with a version (``engine/exchange.py``): a unary call, or a stream for a model that
streams; only a round's shape depends on which.

Four parts: ``chosen`` (which requests probe), ``ProbeSender`` (one probe sent and timed),
``Pace`` (when the next round may go) and ``Prober``, which runs the rounds and counts.

Pacing: at most ``rate`` probe rounds a second, each of ``concurrency`` probes at once,
and a probe slot never keeps the server busy more than ``max_share`` of the time (after
probes that took t, the lower median of the last PACE_ROUNDS rounds, the next waits
t / max_share - t), so a slow server gets fewer probes, and one probe delayed by a busy
machine does not stop them. A stream keeps the server busy until its final flag. One probe
in ``OLD_EVERY`` goes to an old version instead, for a baseline; a streaming model's round
is one stream to each new version and one to the old, at once. The first probes (the
volley) are sent back to back as soon as the analysis starts, so a version that fails every
request is caught within a few requests of becoming READY.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from statistics import median_low

from reconciler.core.probes import (
    Judge,
    ProbeRequest,
    declared,
    outcome,
    synthesized,
    unanswered,
    wrong,
)
from reconciler.engine.exchange import ask
from reconciler.model.analysis import ProbeFigures, ProbeOutcome, ProbeSpec
from reconciler.model.errors import ProbeTimedOut, StreamCut, VerifyFailed
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
class Sent:
    """One probe sent: how it counts, and what the pace needs to know of it."""

    counted: ProbeOutcome
    # How long the exchange kept the server busy: a unary call's time, a stream's until
    # its final flag (its latency, ``counted.seconds``, is the time to the first response).
    busy: float
    # Time spent on a probe sent before it and not counted: a wake-up probe
    # (``ProbeSender.warm``), or one that missed its deadline and was sent again.
    wake_seconds: float = 0.0
    timed_out: bool = False  # no answer (no final flag) within the probe's deadline

    @property
    def server_seconds(self) -> float:
        return self.busy + self.wake_seconds


class ProbeSender:
    """Sends one probe to one version of the step's model and judges what came back, as
    ``judge`` says (an old version's sender: ``core.probes.unanswered``)."""

    def __init__(
        self,
        control: ModelControl,
        step: Step,
        timeout: float,
        clock: Callable[[], float],
        judge: Judge = wrong,
    ) -> None:
        self.control, self.step, self.timeout, self.clock = control, step, timeout, clock
        self.judge = judge

    def send(self, request: ProbeRequest, version: int) -> Sent:
        """One probe; one that got no answer within its deadline is sent again at once and
        fails only if that one does too: on a CPU-starved machine a probe of a good version
        timed out while Triton counted it answered (bench.false_verdicts, with a burner:
        1 of 2 probes failed, 0 of 2 requests in Triton's counters), and one such probe among
        few failed the rollout. A version that hangs misses both deadlines."""
        first = self._once(request, version)
        if not first.timed_out:
            return first
        again = self._once(request, version)
        if again.counted.error is not None:
            error = f"{again.counted.error} (twice in a row)"
            return replace(again, counted=replace(again.counted, error=error))
        return replace(again, wake_seconds=first.server_seconds)

    def warm(self, request: ProbeRequest, version: int) -> Sent:
        """A wake-up probe, then the probe that counts, back to back to the same version. A
        version that takes only the probes sleeps between them (an idle Python stub, woken
        by each), while the version it is compared with serves clients and stays awake: on
        a busy machine the wake-up alone made a good idle version 60-120% slower than a busy
        one (bench.false_verdicts). Timed after a wake-up, both are measured awake (with both
        cores held by a burner the idle one still read 50-150% slower on a 1.5 ms model:
        BENCHMARKS.md, not closed). A wake-up that fails counts as the probe."""
        wake = self.send(request, version)
        if wake.counted.error is not None:
            return wake
        measured = self.send(request, version)
        return replace(measured, wake_seconds=measured.wake_seconds + wake.server_seconds)

    def _once(self, request: ProbeRequest, version: int) -> Sent:
        started = self.clock()
        deadline, cap = request.limits(self.timeout)
        streaming = self.step.streaming
        try:
            reply = ask(
                self.control,
                self.step.model,
                version,
                request.inputs,
                request.outputs,
                exchange=self.step.exchange,
                timeout=deadline,
                max_responses=cap,
                clock=self.clock,
            )
        except VerifyFailed as exc:
            took = self.clock() - started
            timed_out = isinstance(exc, ProbeTimedOut)
            failed = ProbeOutcome(
                f"{request.name} on version {version}: {exc}",
                took,
                streamed=streaming,
                # A stream that never ended, not one the version ended with an error.
                cut=streaming and (timed_out or isinstance(exc, StreamCut)),
            )
            return Sent(failed, took, timed_out=timed_out)
        busy = self.clock() - started
        return Sent(outcome(request, reply, version, busy, self.judge), busy)


def chosen(
    step: Step,
    interface: ModelInterface | None,
    old: ProbeSender | None,
    unread: str | None = None,
) -> tuple[tuple[ProbeRequest, ...], ProbeFigures]:
    """The probe requests, and the figures they start from (what was left out, and why
    there are none, when none): declared ones, else one synthesized from ``interface`` (the
    old versions'). A request judged against the old version is tried on it now (through
    ``old``, where it serves), and left out if the old version fails it too; with no old
    version, only smoke cases: a request with no expected answer is judged against the old
    version, and with none (a first deployment) its failure says nothing about the new one
    (a model may reject zeros)."""
    outputs = tuple(t.name for t in interface.outputs) if interface else ()
    requests = declared(step.smoke, step.shadow, outputs)
    if not requests and interface is not None:
        made = synthesized(interface)
        requests = (made,) if made is not None else ()
    if not requests:
        return (), ProbeFigures(
            note="no old version to judge a synthesized request against; declare smoke cases "
            "to probe a first deployment"
            if not step.baseline
            else "the model's inputs could not be read to synthesize a request"
            + (f" ({unread})" if unread else "")
            if interface is None
            else "an input's datatype is unknown: no request could be synthesized"
        )
    if not any(r.relative for r in requests):
        return requests, ProbeFigures()
    if old is None:
        kept = tuple(r for r in requests if not r.relative)
        first = (
            "no old version to judge a synthesized or recorded request against; "
            "declare smoke cases to probe a first deployment"
            if not step.baseline
            else f"no server serves version {max(step.baseline)} to judge a synthesized or "
            "recorded request against; declare smoke cases to probe this model"
        )
        return kept, ProbeFigures(note=None if kept else first)
    version = max(step.baseline)
    kept = tuple(
        r for r in requests if not r.relative or old.send(r, version).counted.error is None
    )
    skipped = len(requests) - len(kept)
    note = (
        None
        if kept
        else f"version {version} fails the {skipped} synthesized or recorded request(s) too; "
        "declare smoke cases to probe this model"
    )
    return kept, ProbeFigures(skipped=skipped, note=note)


class Pace:
    """When the next probe round may be sent: at most ``rate`` a second, and a round's
    server time at most ``max_share`` of the time, by the lower median of the last rounds."""

    def __init__(self, spec: ProbeSpec, clock: Callable[[], float]) -> None:
        self.spec, self.clock = spec, clock
        self.next_at: float | None = None  # None: at once
        self._recent: deque[float] = deque(maxlen=PACE_ROUNDS)  # the last rounds' seconds

    def due(self) -> float:
        return self.next_at if self.next_at is not None else self.clock()

    def after(self, started: float, server_seconds: float) -> None:
        """A round that began at ``started`` kept the server busy ``server_seconds``."""
        self._recent.append(server_seconds)
        took = median_low(self._recent)
        self.next_at = max(
            started + 1.0 / self.spec.rate, self.clock() + took / self.spec.max_share - took
        )


class Prober:
    """Sends the probes of one analyze step and counts them. Built by ``prepare`` before
    the new versions load, so that no request is spent on the old version's baseline after
    the new ones take traffic. ``sender`` reaches the new versions; ``old`` the old ones
    (None: none to compare with), on the same server, or on the old pool's once this
    server's left (``TrafficPlan.old_probed_on``)."""

    def __init__(
        self,
        sender: ProbeSender,
        spec: ProbeSpec,
        requests: tuple[ProbeRequest, ...],
        figures: ProbeFigures | None = None,
        old: ProbeSender | None = None,
    ) -> None:
        self.sender, self.step, self.spec = sender, sender.step, spec
        self.old = old
        self.requests = requests
        self.figures = figures or ProbeFigures()
        self.pace = Pace(spec, sender.clock)
        self._turn = 0
        self._pool: ThreadPoolExecutor | None = None
        # Each probe after a wake-up probe to the same version (``ProbeSender.warm``): set
        # by the analysis when latency is judged by the probes alone.
        self.warm = False
        # A streaming model's round sends one stream to each new version and one to the old
        # version side by side: never two streams at once to one version (a stream holds an
        # instance, or a slot of its batch, for the whole generation), and the old version's
        # baseline measured in the same moment, in every round rather than one in OLD_EVERY
        # (streams are long, so rounds are few: five each side took 25 rounds).
        self.side_by_side = self.step.streaming

    @classmethod
    def prepare(
        cls,
        control: ModelControl,
        step: Step,
        spec: ProbeSpec,
        clock: Callable[[], float],
        interface: ModelInterface | None,
        unread: str | None,
        old_at: ModelControl | None,
    ) -> Prober:
        """The prober of ``step``, its requests ``chosen`` (``interface``: the old versions';
        ``unread``: why it could not be read); the old versions probed on ``old_at``'s
        server (None: on none)."""
        sender = ProbeSender(control, step, spec.timeout, clock)
        old = (
            None
            if old_at is None or not step.baseline
            else ProbeSender(old_at, step, spec.timeout, clock, unanswered)
        )
        requests, figures = chosen(step, interface, old, unread)
        return cls(sender, spec, requests, figures, old)

    def old_under_load(
        self, count: int, sleep: Callable[[float], None], stopping: Callable[[], bool]
    ) -> None:
        """Before the new versions load: ``count`` probes to the old version while it still
        carries the clients' streams, paced as the rounds are (``Step.old_under_load``).
        Their times to the first response are the baseline once the new versions carry
        those streams (``ProbeFigures.old_loaded``); a failed one is left out: it says
        nothing of the new versions."""
        if not self.requests or self.old is None:
            return
        old = max(self.step.baseline)
        clock = self.sender.clock
        for turn in range(count):
            if stopping():
                break
            sleep(max(0.0, self.pace.due() - clock()))
            started = clock()
            sent = self.old.send(self.requests[turn % len(self.requests)], old)
            if sent.counted.error is None:
                loaded = (*self.figures.old_loaded, sent.counted.seconds)
                self.figures = replace(self.figures, old_loaded=loaded)
            self.pace.after(started, sent.server_seconds)
        self.pace = Pace(self.spec, clock)  # the new versions' rounds pace by their own

    def volley(self, limit: int) -> None:
        """Each request once on each new version, back to back; a failed one again at once,
        until it passes or ``limit`` failed in a row (the early abort's run)."""
        pairs = [(r, v) for v in self.step.versions for r in self.requests][:VOLLEY_MAX]
        for request, version in pairs:
            while True:
                sent = self.sender.send(request, version)
                self.figures = self.figures.counted(sent.counted, old=False)
                if sent.counted.error is None or self.figures.consecutive >= limit:
                    break
            if self.figures.consecutive >= limit:
                return
        self.pace.next_at = self.sender.clock()

    def due(self) -> float | None:
        """When the next round may be sent (None: no probes to send)."""
        return self.pace.due() if self.requests else None

    def round(self) -> None:
        """One paced round: ``concurrency`` probes at once, round robin over the new
        versions and requests, one in ``OLD_EVERY`` to an old version; a streaming model's
        one stream to each new version and one to the old, at once."""
        if not self.requests:
            return
        started = self.sender.clock()
        jobs = self._jobs()
        if len(jobs) == 1:
            sent = [self._send(jobs[0])]
        else:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(len(jobs), "probe")
            sent = list(self._pool.map(self._send, jobs))
        for (_, _, old), one in zip(jobs, sent, strict=True):
            self.figures = self.figures.counted(one.counted, old)
        # The server's time for the round: a wake-up probe's too.
        self.pace.after(started, max(s.server_seconds for s in sent))

    def _send(self, job: tuple[ProbeRequest, int, bool]) -> Sent:
        request, version, old = job
        sender = self.old if old and self.old is not None else self.sender
        return sender.warm(request, version) if self.warm else sender.send(request, version)

    def _jobs(self) -> list[tuple[ProbeRequest, int, bool]]:
        """The next round's probes: (request, version, to an old version)."""
        if not self.side_by_side:
            return [self._next_job() for _ in range(self.spec.concurrency)]
        self._turn += 1
        request = self.requests[self._turn % len(self.requests)]
        jobs = [(request, v, False) for v in sorted(set(self.step.versions))]
        if self.old is not None:
            jobs.append((request, max(self.step.baseline), True))
        return jobs

    def _next_job(self) -> tuple[ProbeRequest, int, bool]:
        self._turn += 1
        if self.old is not None and self._turn % OLD_EVERY == 0:
            old = max(self.step.baseline)
            return self.requests[self._turn % len(self.requests)], old, True
        pairs = [(r, v) for v in self.step.versions for r in self.requests]
        request, version = pairs[self._turn % len(pairs)]
        return request, version, False

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
