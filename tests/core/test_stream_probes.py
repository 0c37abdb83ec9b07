"""A streaming model's probes as the analysis counts and judges them (issue 42, points 2
and 3): each probe stream timed to its first response and between its responses, a stream
that never sends its final flag counted cut, one probe stream at a time per version, and the
``latency`` check's ``of: betweenResponses`` judged on the probes' streams, new against old.
plan() + apply() on the Triton fake with a fake clock (``tests/core/test_probing.py``'s)."""

from __future__ import annotations

from dataclasses import replace

from reconciler.core.latency import (
    OLD_UNDER_LOAD_PROBES,
    STREAMED,
    between_responses_check,
    beyond_bound,
    old_under_load,
    pinned_latency_check,
    uneven_load,
    woken_probes,
)
from reconciler.core.plan.planner import plan
from reconciler.core.probes import ProbeRequest, failures_in_sight
from reconciler.engine.probes import Prober, ProbeSender
from reconciler.model.analysis import (
    AnalysisSpec,
    Check,
    Figures,
    ProbeFigures,
    ProbeOutcome,
    ProbeSpec,
    RolloutVerdict,
    Verdict,
)
from reconciler.model.history import History
from reconciler.model.plan import Action, Step
from reconciler.model.results import Outcome
from reconciler.model.spec import Tensor
from reconciler.views.render import progress_line
from tests.core.fakes import FakeClock, deploy, desired_state, observe
from tests.core.test_probing import (
    DECOUPLED,
    NO_QUERIES,
    SUCCESS,
    Clients,
    Streams,
    Traffic,
    rollout,
    spec,
)

BETWEEN = Check("between", "latency", max_increase=0.5, of="betweenResponses")
FIRST = Check("first", "latency", max_increase=0.5)
# The probes' default pace; each round streams to the new and the old version side by side.
PACED = spec(checks=(SUCCESS, FIRST, BETWEEN), duration=10.0)


def test_a_stream_counts_its_time_between_responses_and_a_cut_stream_counts_cut() -> None:
    figures = ProbeFigures()
    figures = figures.counted(ProbeOutcome(None, 0.010, streamed=True, gap=0.002), old=False)
    figures = figures.counted(ProbeOutcome("no final flag", 1.0, streamed=True, cut=True), False)
    figures = figures.counted(ProbeOutcome(None, 0.012, streamed=True, gap=0.003), old=True)
    assert (figures.sent, figures.failed, figures.cut, figures.gaps) == (2, 1, 1, (0.002,)), figures
    assert (figures.old_sent, figures.old_cut, figures.old_gaps) == (1, 0, (0.003,)), figures
    later = figures.counted(ProbeOutcome(None, 0.011, streamed=True, gap=0.004), old=False)
    window = later.since(figures)
    assert (window.sent, window.cut, window.gaps) == (1, 0, (0.004,)), window
    text = str(figures)
    assert "probe streams: 1 of 2 failed (1 cut: no final flag)" in text, text
    assert "2.0ms between responses (500/s)" in text, text
    assert "to the first response (p50 10.0ms, p95 1000.0ms)" in text, text


def test_time_between_responses_is_judged_new_against_old_by_the_probe_streams() -> None:
    def probes(new_gap: float, old_gap: float) -> ProbeFigures:
        figures = ProbeFigures()
        for _ in range(6):
            figures = figures.counted(ProbeOutcome(None, 0.01, True, gap=new_gap), old=False)
            figures = figures.counted(ProbeOutcome(None, 0.01, True, gap=old_gap), old=True)
        return figures

    same = between_responses_check(BETWEEN, probes(0.002, 0.002), has_old=True)
    assert same.verdict is Verdict.PASS, same
    slower = between_responses_check(BETWEEN, probes(0.010, 0.002), has_old=True, pending=True)
    assert slower.verdict is Verdict.FAIL and slower.value == 4.0, slower
    assert "time between responses" in slower.detail, slower.detail
    first = between_responses_check(BETWEEN, probes(0.010, 0.002), has_old=False)
    assert first.verdict is Verdict.SKIPPED, first
    unary = between_responses_check(BETWEEN, ProbeFigures(sent=9, old_sent=9), has_old=True)
    assert unary.verdict is Verdict.NO_DATA and "streaming model" in unary.detail, unary


def test_a_version_slower_between_responses_is_reverted_by_its_probe_streams() -> None:
    """The first response as fast as the old version's, every next one five times slower (a
    slower decode): the time to the first response passes, the time between fails."""
    clock = FakeClock()
    fake = Streams(clock, first=0.010, gap=0.002, slow_gap={2: 0.010})
    source = Traffic(fake, clock, rate=1000.0, failing=0.0)
    change = rollout(fake, clock, PACED, source, config=DECOUPLED)
    assert change.outcome is Outcome.REVERTED, change.error
    error = change.error or ""
    assert "between" in error and "time between responses" in error, error
    assert "probes: median 10.00ms vs 2.00ms" in error, error


def test_a_good_streaming_version_passes_both_latency_checks() -> None:
    clock = FakeClock()
    fake = Streams(clock, first=0.010, gap=0.002)
    source = Traffic(fake, clock, rate=0.0, failing=0.0)
    change = rollout(fake, clock, PACED, source, config=DECOUPLED)
    assert change.outcome is Outcome.CONVERGED, change.error
    analysis = change.analysis
    assert analysis is not None and analysis.verdict is RolloutVerdict.PASSED, change.error
    last = {r.check: r for r in analysis.evaluations[-1].results}
    assert last["between"].verdict is Verdict.PASS, last
    assert last["first"].verdict is Verdict.PASS, last
    # The step's line says what those probe streams could have seen of streams failing.
    step = next(r for r in change.steps if r.step.action is Action.ANALYZE)
    sent = sum(e.probes.sent for e in analysis.evaluations if e.probes)
    line = progress_line(step)
    assert f"{sent} probe stream(s), none failed: a version failing 1 stream in" in line, line


def test_what_probe_streams_that_passed_could_see_of_streams_failing_midway() -> None:
    """Triton 2.51's counters count a stream that fails midway a success: the probes alone
    see it, and a handful of them see only a version failing often (bench.streaming: version
    8, failing 1 stream in 20, passed 2 of 4 in-place analyses of 4 s)."""
    eight = failures_in_sight(8, 0)
    assert eight is not None and "failing 1 stream in 3 or more" in eight, eight
    sixty = failures_in_sight(59, 0)
    assert sixty is not None and "failing 1 stream in 20 or more" in sixty, sixty
    assert failures_in_sight(0, 0) is None and failures_in_sight(8, 1) is None


def test_a_stream_that_never_sends_its_final_flag_fails_as_cut() -> None:
    clock = FakeClock()
    fake = Streams(clock, first=0.010, gap=0.002, unended=frozenset({2}))
    source = Traffic(fake, clock, rate=0.0, failing=0.0)
    change = rollout(fake, clock, spec(), source, config=DECOUPLED)
    assert change.outcome is Outcome.REVERTED, change.error
    analysis = change.analysis
    assert analysis is not None, change.error
    probes = analysis.evaluations[-1].probes
    assert probes is not None and probes.cut >= 1 and probes.cut == probes.failed, probes
    assert "no final flag" in (change.error or ""), change.error


def test_a_streaming_models_round_is_one_stream_to_each_version_side_by_side() -> None:
    """Four probes in flight at once asked for: a streaming model's rounds never send two
    streams to one version (a stream holds an instance for the whole generation), and each
    probes the old version beside the new, so that five each side take five rounds."""
    clock = FakeClock()
    fake = Streams(clock, first=0.010, gap=0.002)
    fake.serve("m", [1, 2, 3])
    step = Step("s1", "m", Action.ANALYZE, (2, 3), "probed", baseline=(1,), streaming=True)
    request = ProbeRequest("p", (Tensor("IN", "FP32", (1,), (0.0,)),), ())
    sender = ProbeSender(fake, step, 1.0, clock.clock)
    prober = Prober(sender, ProbeSpec(concurrency=4, max_share=1.0), (request,), old=sender)
    rounds = []
    for _ in range(5):
        before = len(fake.streams)
        prober.round()
        rounds.append(sorted(fake.streams[before:]))
    prober.close()
    assert rounds == [[1, 2, 3]] * 5, rounds
    figures = prober.figures
    assert (figures.sent, figures.old_sent) == (10, 5), figures


def test_a_latency_check_short_of_probes_runs_on_before_it_passes_unjudged() -> None:
    """Long generations paced by the default maxShare: too few probe streams to judge the
    time to the first response in the duration. The analysis runs on for up to another
    duration for them, then passes with the check shown skipped (a limit: ending it
    inconclusive reverted every good canary at its one-interval no-traffic phase)."""
    clock = FakeClock()
    fake = Streams(clock, first=0.300, gap=0.300)  # 1.2 s generations, new and old alike
    source = Traffic(fake, clock, rate=0.0, failing=0.0)
    # minEvidence 1: the probes' evidence is not what is shown here.
    paced = spec(checks=(SUCCESS, FIRST), duration=5.0, min_evidence=1)
    change = rollout(fake, clock, paced, source, config=DECOUPLED)
    assert change.outcome is Outcome.CONVERGED, change.error
    analysis = change.analysis
    assert analysis is not None and analysis.verdict is RolloutVerdict.PASSED, change.error
    assert analysis.evaluations[-1].at >= 10.0, [e.at for e in analysis.evaluations]
    last = {r.check: r for r in analysis.evaluations[-1].results}
    assert last["first"].verdict is Verdict.SKIPPED and last["first"].awaiting, last


class LaggingSource(Traffic):
    """Triton's counters as a Prometheus just restarted shows them: unreadable before the
    load (so counting cannot start at READY), then no series of the new version until its
    first scrape, then the counters."""

    def __init__(self, *args: object, lag: int = 3) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.lag, self.new_reads = lag, 0

    def figures(self, model, versions, queries=NO_QUERIES):  # type: ignore[no-untyped-def]
        if versions == (2,):
            self.new_reads += 1
            if self.new_reads == 1:
                return Figures(error="cannot query Prometheus: connection refused")
            if self.new_reads <= self.lag:
                return Figures()
        return super().figures(model, versions, queries)


def test_a_window_that_starts_before_the_first_scrape_counts_from_the_first_sighting() -> None:
    """Counting could not start at READY (the source unreadable before the load) and the
    analysis began before the source had scraped the new version: the first reading with
    its series starts the count, shown, not counted. Before, that first window read "no
    success counter", was counted as an evaluation without data, and a good version ended
    inconclusive (clean-clone CI, test_dependencies' Prometheus restart)."""
    clock = FakeClock()
    fake = Clients(clock)
    source = LaggingSource(fake, clock, 100.0, 0.0)
    change = rollout(fake, clock, spec(probes=ProbeSpec(enabled=False)), source)
    assert change.outcome is Outcome.CONVERGED, change.error
    analysis = change.analysis
    assert analysis is not None
    shown = [(e.counted, e.verdict) for e in analysis.evaluations]
    assert shown[0] == (False, Verdict.NO_DATA), shown  # the first sighting: shown only
    assert (True, Verdict.NO_DATA) not in shown, shown


def test_a_first_response_slower_only_behind_client_streams_is_held_to_the_old_under_load() -> None:
    """The new version carries the clients' streams (in place under load) and the old one
    beside it only probes: the new version's probes wait for an instance, so they read three
    times the idle old version's. Before the load the old version was probed under the same
    clients, and waited as long: against those probes the new version passes, and the check
    says which probes it was held to. With no client on either side the same figures revert."""
    clock = FakeClock()
    fake = Streams(clock, first=0.010, gap=0.002, behind_clients=0.020)
    busy = rollout(
        fake, clock, PACED, Traffic(fake, clock, rate=100.0, failing=0.0), config=DECOUPLED
    )
    assert busy.outcome is Outcome.CONVERGED, busy.error
    assert busy.analysis is not None
    before = [v for v in fake.streams[: fake.streams.index(2)] if v == 1]
    assert len(before) >= OLD_UNDER_LOAD_PROBES, fake.streams  # the old, before the load
    last = {r.check: r for r in busy.analysis.evaluations[-1].results}
    first = last["first"]
    assert first.verdict is Verdict.PASS and first.value == 0.0, first
    assert "median 30.00ms vs 30.00ms" in first.detail, first.detail
    assert "probed under the same clients before the new versions loaded" in first.detail
    assert last["between"].verdict is Verdict.PASS, last  # gaps are not held behind a client

    clock = FakeClock()
    fake = Streams(clock, first=0.010, gap=0.002, slow_first={2: 0.030})
    idle = rollout(
        fake, clock, PACED, Traffic(fake, clock, rate=0.0, failing=0.0), config=DECOUPLED
    )
    assert idle.outcome is Outcome.REVERTED, idle.error
    assert "first" in (idle.error or "") and "median 30.00ms vs 10.00ms" in (idle.error or ""), (
        idle.error
    )


def test_a_version_late_to_its_first_response_in_place_under_load_is_reverted() -> None:
    """Test generator version 5 in place under client streams (bench.streaming run 6: not
    judged, 37 late client streams): 300 ms late, against the old version as it answered
    under the same clients before the load."""
    clock = FakeClock()
    fake = Streams(clock, first=0.010, gap=0.002, behind_clients=0.020, slow_first={2: 0.300})
    # The bench's pace: a probe stream may hold an instance half the time.
    paced = replace(PACED, probes=ProbeSpec(max_share=0.5))
    change = rollout(
        fake, clock, paced, Traffic(fake, clock, rate=100.0, failing=0.0), config=DECOUPLED
    )
    last = change.analysis.evaluations[-1].results if change.analysis else ()
    assert change.outcome is Outcome.REVERTED, [str(r) for r in last]
    error = change.error or ""
    assert "first" in error and "median 320.00ms vs 30.00ms" in error, error
    assert "probed under the same clients" in error, error


def test_old_under_load_without_enough_probes_leaves_the_uneven_check_unjudged() -> None:
    """The old version failed or was stopped before five probes under load: the uneven
    loads are shown as before, not judged against a handful."""
    figures = ProbeFigures(
        sent=6, old_sent=6, latencies=(0.03,) * 6, old_latencies=(0.01,) * 6,
        old_loaded=(0.03,) * 4, streamed=True,
    )  # fmt: skip
    check = pinned_latency_check(FIRST, figures, STREAMED, uneven="the loads differ")
    assert check.verdict is Verdict.SKIPPED and "not judged: the loads differ" in check.detail
    held = pinned_latency_check(
        FIRST, replace(figures, old_loaded=(0.03,) * 5), STREAMED, uneven="the loads differ"
    )
    assert held.verdict is Verdict.PASS and "median 30.00ms vs 30.00ms" in held.detail, held
    # Three probes of a version 300 ms late against eight of the old under load: the rank
    # test puts them beyond the bound (1 in 165), to be confirmed by the next evaluation.
    late = replace(
        figures, sent=3, latencies=(0.33, 0.35, 0.52), old_loaded=(0.01, 0.03, 0.05, 0.08,
                                                                   0.11, 0.14, 0.2, 0.21),
    )  # fmt: skip
    judged = pinned_latency_check(FIRST, late, STREAMED, uneven="the loads differ")
    assert judged.verdict is Verdict.SKIPPED and judged.value is not None, judged
    assert "to be confirmed" in judged.detail, judged.detail
    failed = pinned_latency_check(FIRST, late, STREAMED, pending=True, uneven="uneven")
    assert failed.verdict is Verdict.FAIL, failed
    # Two new probes are not enough, whatever they read.
    few = pinned_latency_check(FIRST, replace(late, sent=2, latencies=(0.33, 0.35)), STREAMED,
                               uneven="uneven")  # fmt: skip
    assert few.verdict is Verdict.SKIPPED and few.awaiting, few


def test_the_old_version_is_probed_under_load_only_where_the_new_take_its_clients() -> None:
    """In place, a streaming model's first-response check: the old version is probed first.
    Not for a rollback (the old keeps the unversioned clients), nor without the probes or
    that check, nor for a unary model."""
    first = spec(checks=(SUCCESS, FIRST))
    assert old_under_load(True, first.checks, True, takes_clients=True) == OLD_UNDER_LOAD_PROBES
    assert old_under_load(True, first.checks, True, takes_clients=False) == 0
    assert old_under_load(True, first.checks, False, takes_clients=True) == 0
    assert old_under_load(True, (SUCCESS, BETWEEN), True, takes_clients=True) == 0
    assert old_under_load(False, first.checks, True, takes_clients=True) == 0

    clock = FakeClock()
    fake = Streams(clock, first=0.010, gap=0.002)
    fake.serve("m", [1])
    planned = plan_of(fake, first, [2])
    (step,) = [s for s in planned if s.action is Action.ANALYZE]
    assert step.old_under_load == OLD_UNDER_LOAD_PROBES, step
    assert "probe streams to 1 under its clients' load" in step.reason, step.reason
    clock = FakeClock()
    fake = Streams(clock, first=0.010, gap=0.002)
    fake.serve("m", [3])
    (back,) = [s for s in plan_of(fake, first, [2]) if s.action is Action.ANALYZE]
    assert back.old_under_load == 0, back  # a rollback: 3 keeps the unversioned clients


def plan_of(fake: Streams, analysis: AnalysisSpec, versions: list[int]) -> tuple[Step, ...]:
    deployment = replace(
        deploy("m", versions, config=DECOUPLED), analysis=analysis, fingerprint="fp"
    )
    planned = plan(desired_state(deployment), {"s1": observe(fake)}, History(), "rev-2")
    (change,) = planned.changes
    return change.steps


def test_uneven_loads_are_the_new_versions_serving_over_twice_the_old() -> None:
    assert uneven_load(10.0, 6.0) is None  # the probes alone, on both sides
    assert uneven_load(1.0, 0.0) is None  # a verify stream and nothing else
    assert uneven_load(5.0, 60.0) is None  # a rollback: the old carries the clients
    assert uneven_load(None, 0.0) is None  # a count missing: the probes judge as ever
    text = uneven_load(130.0, 6.0)
    assert text is not None and "served 130 requests" in text and "the old 6" in text, text


def test_time_between_responses_waits_for_the_first_counted_probe_streams() -> None:
    """No probe stream counted yet (the first volley is left out) is a check that waits, not
    an evaluation without data: that ended every canary rollback at its no-traffic phase."""
    waiting = between_responses_check(BETWEEN, ProbeFigures(), has_old=True)
    assert waiting.verdict is Verdict.SKIPPED and waiting.awaiting, waiting
    assert "too few probes yet (0 new, 0 old" in waiting.detail, waiting.detail
    unprobed = between_responses_check(BETWEEN, None, has_old=True)
    assert unprobed.verdict is Verdict.NO_DATA, unprobed


def test_an_increase_on_the_medians_of_a_few_noisy_probes_is_not_a_slower_version() -> None:
    """A canary at 5% with the CPU burner (bench.streaming): medians of 5.76 ms against
    2.74 ms, +110% against a +100% bound, from probes spread over the same range on both
    sides. The rank test says they are not beyond the bound; a version slower on every
    probe is. (Its price: with probes this spread, even three times slower is not beyond
    +100% in 7 probes a side, p = 0.10: it waits for more.)"""
    new = [0.0021, 0.0035, 0.0050, 0.0058, 0.0062, 0.0096, 0.0130]
    old = [0.0019, 0.0024, 0.0027, 0.0027, 0.0061, 0.0078, 0.0121]
    assert beyond_bound(new, old, 1.0) > 0.01
    slower = [t + 0.300 for t in old]  # test generator version 5: first response 300 ms late
    assert beyond_bound(slower, old, 1.0) < 0.01
    figures = ProbeFigures(
        sent=7, old_sent=7, latencies=tuple(new), old_latencies=tuple(old), streamed=True
    )
    noisy = pinned_latency_check(Check("first", "latency", max_increase=1.0), figures)
    assert noisy.verdict is Verdict.SKIPPED and "within the noise of 7 and 7 probes" in noisy.detail


def test_a_streaming_phase_at_no_traffic_probes_without_wake_ups() -> None:
    """Both sides idle on the new pool's server, probed side by side: a wake-up stream
    would cost a whole generation and halve the probes. Elsewhere, as before."""
    assert woken_probes(True, streaming=True, probes_only=True) is False
    assert woken_probes(True, streaming=True, probes_only=False) is True  # a step, in place
    assert woken_probes(True, streaming=False, probes_only=True) is True  # unary: as before
    assert woken_probes(False, streaming=True, probes_only=False) is False  # counters judge
    # In place, held to the old version probed under its clients' load: the new is awake.
    assert woken_probes(True, streaming=True, probes_only=False, old_under_load=True) is False
