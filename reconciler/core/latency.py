"""Latency verdicts of the post-swap analysis (``core/analysis.py`` calls them): the new
versions' latency against the old versions', on the counters (the mean since the analysis's
start, against the old versions' mean over the same time or before the swap) and on the
probes (medians of the reconciler's own requests to new and old, interleaved at one pace).
Pure: no HTTP, no clock.

A verdict must be about the version, not the machine: a busy host slows every version, and a
server that serves few requests answers slower than a busy one (an idle Python stub woken for
each request). So an increase on the counters must be confirmed by the probes when there are
enough of them, and waits for them while the analysis's duration lasts when it is within
UNCONFIRMED_WAIT_MAX times the bound; an increase judged on the probes alone waits the same
way (no client, or a handful, sees those versions).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from statistics import median

from reconciler.core.readings import delta, ratio
from reconciler.model.analysis import Baseline, Check, CheckResult, Figures, ProbeFigures, Verdict

# Requests the new versions must answer in a window for their mean latency to be judged
# (fewer: the probes judge it, new against old, or it waits).
LATENCY_MIN_REQUESTS = 20
# Requests the old versions must answer over an evaluation's time for their mean over that
# time to be the latency baseline (fewer: their mean before the swap).
SAME_TIME_MIN_REQUESTS = 20
# Probes each side, new and old, before new versions that see only pinned requests are
# judged slower or not by them.
PINNED_LATENCY_MIN_PROBES = 5
# A latency increase on the counters that a second evaluation measures again waits for the
# probes (while the duration lasts) only up to this many times the bound: a canary's server
# at a small share read a good version +52% to +67% against the busy stable pool (an idle
# Python stub woken per request, bench.false_verdicts runs 1, 2 and 4), while a version
# three times slower reads +200% and clients wait on it meanwhile.
UNCONFIRMED_WAIT_MAX = 2.0
# A probe-judged increase beyond the bound fails only when the probes show it: the new
# versions' probes must lie above the old's scaled by the bound, by a one-sided Mann-Whitney
# U test at this level (exact for a handful of probes: 5 each side can reach 1 in 252). On a
# starved host, medians of 5.76 ms against 2.74 ms (+110%) over a few probes of a streaming
# model were noise (bench.streaming, a canary at 5% with the CPU burner); a version three
# times slower puts every probe beyond.
SIGNIFICANCE = 0.01
# The probes compare new and old only while the new versions serve at most this many times
# the old's requests (probes included) over the analysis: a streaming model's instance is
# held by a client stream for the whole generation, so a probe to a version that carries the
# clients waits for an instance while the idle old version answers at once. A good version
# after a blue-green switch read 9 to 107 ms against 2 to 12 ms (bench.streaming run 3).
LOAD_RATIO_MAX = 2.0
# Probes sent to the old version before the new versions load, while it carries the
# clients' streams (``old_under_load``): the time to the first response the new versions
# are held to once they carry those streams instead. Eight, so that the rank test can reach
# SIGNIFICANCE on LOADED_MIN_NEW probes of the new (8 and 3: 1 in 165): behind the clients'
# streams a probe of a slow version takes a second or more with its pace, and the clients
# meet the version meanwhile (version 5, 300 ms late: caught at evaluation 8 after 26 late
# client streams, or passed on too few probes after 37, bench.streaming run 9, with six
# old probes and five new needed).
OLD_UNDER_LOAD_PROBES = 8
# Probes of the new versions a comparison with the old version's under load needs: the
# rank test decides whether three are enough (every one above every old probe times the
# bound), and a reading beyond the bound waits for the next evaluation as ever.
LOADED_MIN_NEW = 3


def uneven_load(new_requests: float | None, old_requests: float | None) -> str | None:
    """Why the probes of the new and the old versions, sent at one pace, do not compare: the
    new versions served over LOAD_RATIO_MAX times the old's requests (probes included) since
    the analysis began. None when they compare, or when a count is missing. Only this way
    round: a new version idle beside a busy old one (a rollback, a canary at a small share)
    that still reads slower is slower."""
    if new_requests is None or old_requests is None:
        return None
    if new_requests <= LOAD_RATIO_MAX * max(old_requests, 1.0):
        return None
    return (
        f"the new versions served {new_requests:.0f} requests in this analysis and the old "
        f"{old_requests:.0f}: a probe to the new waits for an instance a client's stream holds, "
        "the old answers at once; judged where the loads compare (a router's no-traffic phase, "
        "a small step)"
    )


def old_under_load(
    streaming: bool, checks: Sequence[Check], probes_enabled: bool, takes_clients: bool
) -> int:
    """How many probes the old version gets before the new versions load, under its clients'
    load (``Step.old_under_load``): OLD_UNDER_LOAD_PROBES for a streaming model whose time to
    the first response the probes judge, when the new versions take the old one's clients on
    this server (unversioned requests reach the highest version); else 0. Once they do, the
    loads of new and old no longer compare (``uneven_load``: a version 300 ms late in place
    under load went unjudged and reached 37 client streams, bench.streaming run 6), and
    the old version under the same clients, probed just before, is the baseline that does."""
    first_response = any(c.kind == "latency" and c.of != BETWEEN_RESPONSES for c in checks)
    if streaming and probes_enabled and takes_clients and first_response:
        return OLD_UNDER_LOAD_PROBES
    return 0


def same_time_latency(
    start: Figures | None, now: Figures | None, at_least: float = SAME_TIME_MIN_REQUESTS
) -> float | None:
    """The old versions' mean latency (us) between two readings of them, when at least
    ``at_least`` requests were answered in between: a baseline taken in the conditions the
    new versions are judged in (a busy machine slows both). None otherwise."""
    if start is None or now is None or start.error or now.error:
        return None
    success = delta(start.success, now.success)
    if success is None or success < at_least:
        return None
    return ratio(delta(start.duration_us, now.duration_us), success)


def latency_check(
    check: Check,
    duration: float | None,
    success: float | None,
    baseline: Baseline,
    probes: ProbeFigures | None = None,
    pending: bool = False,
    probes_due: bool = False,
) -> CheckResult:
    """The new versions' mean latency against the old versions': over the same time when
    the old ones served enough requests meanwhile (``Baseline.same_time_latency_us``), else
    their mean before the swap. An increase beyond the bound must be confirmed by the probes
    when there are enough of them (``probes``: new and old versions on the same server,
    probed interleaved at the same pace, so both meet the same machine): a busy host slows
    every version, and a lightly loaded server answers a fast model slower than a busy one
    (a canary at 10% against the stable pool: +52% for a good version, measured); a verdict
    must be about the version. While the analysis's duration lasts (``probes_due``) probes on
    their way are waited for even when the evaluation before measured the increase too
    (``pending``): two readings of the counters share the same idle-versus-busy bias (a good
    canary at 10%: +67%, then +53%, false_verdicts run 4). After it, or beyond
    UNCONFIRMED_WAIT_MAX times the bound, a second unconfirmed increase in a row fails."""
    threshold = f"increase <= {check.max_increase:g}"
    if not baseline.has_old:
        return CheckResult(check.name, Verdict.SKIPPED, None, threshold, "no old versions")
    if success is not None and success == 0:
        return CheckResult(check.name, Verdict.NO_TRAFFIC, None, threshold, "no requests")
    mean = ratio(duration, success)
    if mean is None:
        return CheckResult(check.name, Verdict.NO_DATA, None, threshold, "no latency figures")
    if success is not None and success < LATENCY_MIN_REQUESTS:
        # A handful of requests, probes among them, on an instance that takes no client
        # traffic yet (a canary at no traffic, a small share) is no mean to hold against
        # warm client traffic: its first answers are cold. The probes, sent to the new and
        # the old versions interleaved, judge it when they are enough; else it waits.
        if probes is not None and _probe_medians(probes) is not None:
            return pinned_latency_check(
                check,
                probes,
                f"only {success:.0f} request(s) on the counters: judged by the probes",
                pending,
                probes_due,
            )
        return CheckResult(
            check.name,
            Verdict.SKIPPED,
            None,
            threshold,
            f"too few requests yet ({success:.0f}; {LATENCY_MIN_REQUESTS} needed, or "
            f"{PINNED_LATENCY_MIN_PROBES} probes each of new and old)",
        )
    same_time = baseline.same_time_latency_us
    reference = same_time if same_time is not None else baseline.mean_latency_us
    if reference is None:
        return CheckResult(
            check.name, Verdict.NO_DATA, None, threshold, "no baseline from the old versions"
        )
    if reference <= 0:
        # Counters that say the old versions answered in 0 us give no ratio to judge by.
        return CheckResult(
            check.name, Verdict.NO_DATA, None, threshold, "the old versions' latency reads 0us"
        )
    increase = mean / reference - 1.0
    limit = check.max_increase if check.max_increase is not None else math.inf
    when = "meanwhile" if same_time is not None else "before"
    detail = f"mean {mean:.0f}us vs {reference:.0f}us {when}"
    if increase <= limit:
        return CheckResult(check.name, Verdict.PASS, increase, threshold, detail)
    if probes is None:
        return CheckResult(check.name, Verdict.FAIL, increase, threshold, detail)
    return _increase_asked_of_the_probes(
        CheckResult(check.name, Verdict.FAIL, increase, threshold, detail),
        limit,
        probes,
        pending,
        probes_due,
    )


def _increase_asked_of_the_probes(
    failed: CheckResult,
    limit: float,
    probes: ProbeFigures,
    pending: bool,
    probes_due: bool,
) -> CheckResult:
    """An increase beyond the bound on the counters (``failed``), as the probes judge it:
    refuted (a pass with the probes' figure), confirmed, on its way (skipped, with the
    counters' figure, while the duration lasts or when it is the first), or a failure."""
    increase, detail = failed.value, failed.detail
    assert increase is not None
    probed = _probed_increase(probes)
    if probed is not None and probed <= limit:
        return replace(
            failed,
            verdict=Verdict.PASS,
            value=probed,
            detail=f"{detail} (+{increase:.0%}), not confirmed by the probes: new and old "
            f"probed at the same time differ by {probed:+.0%} (a busy machine, not the version)",
        )
    if probed is not None:
        detail += f"; the probes agree: {probed:+.0%} against the old version meanwhile"
    elif probes.sent > 0 and (
        not pending or (probes_due and increase <= UNCONFIRMED_WAIT_MAX * limit)
    ):
        # The probes are on their way but too few yet to confirm or refute: the counters
        # alone do not revert (a canary's first second at 10%: +66% for a good version,
        # measured); a later evaluation has more probes, or, once the duration is over (or
        # for an increase far beyond what an idle server reads), the next one confirms it by
        # itself (a model slow enough that its probes come seconds apart).
        return replace(
            failed,
            verdict=Verdict.SKIPPED,
            detail=f"{detail} (+{increase:.0%}), to be confirmed by the probes ({probes.sent} "
            f"new, {probes.old_sent} old; {PINNED_LATENCY_MIN_PROBES} each needed)",
        )
    elif pending:
        detail += "; the evaluation before measured it too"
    return replace(failed, detail=detail)


def _probed_increase(probes: ProbeFigures) -> float | None:
    """The new versions' median probe latency over the old version's, probed interleaved;
    None with fewer than PINNED_LATENCY_MIN_PROBES each side (``_probe_medians``)."""
    medians = _probe_medians(probes)
    return None if medians is None or medians[1] <= 0 else medians[0] / medians[1] - 1.0


def _probe_medians(
    probes: ProbeFigures, at_least_new: int = PINNED_LATENCY_MIN_PROBES
) -> tuple[float, float] | None:
    """The median probe latency of the new versions and of the old one, in seconds; None
    with fewer than PINNED_LATENCY_MIN_PROBES of the old, or ``at_least_new`` of the new.
    Medians, not means: a handful of probes, one of them stalled by the scheduler, is no
    mean (on a 2-core host with both cores held by a busy loop, probes of a 1.5 ms model had
    a 90th percentile of 5 ms, so one such probe among 5 to the old version moved its mean
    by half and a good version read +50% to +152%: bench.false_verdicts); a slower version
    is slower on most requests, which moves the median as much as the mean (the counters,
    where clients reach the new versions, keep judging the mean)."""
    if len(probes.latencies) < at_least_new:
        return None
    if len(probes.old_latencies) < PINNED_LATENCY_MIN_PROBES:
        return None
    return median(probes.latencies), median(probes.old_latencies)


def beyond_bound(new: Sequence[float], old: Sequence[float], limit: float) -> float:
    """The p-value of the one-sided Mann-Whitney U test that the new versions' probe
    latencies lie above the old's times ``1 + limit``: small when the increase beyond the
    bound is the version's, not a few probes' noise."""
    # Imported here: scipy.stats takes about 0.5 s to import, which every command would pay
    # (a pull request's validate, issue 46) for a test only an analysis runs.
    from scipy.stats import mannwhitneyu

    scaled = [value * (1.0 + limit) for value in old]
    return float(mannwhitneyu(new, scaled, alternative="greater").pvalue)


# Why the probes judge latency alone (the detail says which source decided).
PINNED = "the new versions see only pinned requests"
STREAMED = (
    "a streaming model: time to the first response of the probes' streams, which Triton's "
    "counters do not time"
)


def judged_by_probes(
    has_old: bool, streaming: bool, probes_only: bool, below_old: bool
) -> str | None:
    """Why the probes alone judge the new versions' latency, new against old; None: the
    counters judge it, confirmed by the probes. Only with an old version to probe. The new
    versions below the old ones (``below_old``) see only pinned requests: unversioned ones
    keep reaching the old; so do new versions the router sends no client request yet
    (``probes_only``). A streaming model's counters do not time its streams (a version whose
    first response came 300 ms late read 3.4 ms against 1.2 ms on 2.51), its probes' time
    to the first response does."""
    if not has_old:
        return None
    if streaming:
        return STREAMED
    return PINNED if probes_only or below_old else None


def woken_probes(
    judged_by_probes: bool, streaming: bool, probes_only: bool, old_under_load: bool = False
) -> bool:
    """Whether each probe is timed after a wake-up probe to the same version
    (``ProbeSender.warm``): when the probes alone judge latency, so that an idle version
    woken for each probe is not compared with a busy one kept awake by its clients. Not for
    a streaming model's phase at no traffic (``probes_only``): its rounds probe new and old
    side by side, both idle on the new pool's server, and a wake-up stream costs a whole
    generation, halving the probes (version 5, first response 300 ms late: 4 probe streams a
    side in 8 s, short of the 5 a verdict needs, went on to the canary's steps uncaught,
    bench.streaming). Nor in place once the old version was probed under its clients' load
    (``old_under_load``): the new versions then carry those clients, awake, and are held to
    those probes; a wake-up stream behind the clients' would halve their probes again (a
    version 300 ms late had 3 a side in 12 s and passed unjudged, test_streaming)."""
    if streaming and (probes_only or old_under_load):
        return False
    return judged_by_probes


LOADED = (
    "a streaming model carrying the clients' streams: the old version probed under the same "
    "clients before the new versions loaded"
)
BETWEEN = "a streaming model: time between responses, the median of each probe stream"
BETWEEN_RESPONSES = "betweenResponses"  # Check.of; its default, "firstResponse", is the schema's


def between_responses_check(
    check: Check,
    probes: ProbeFigures | None,
    has_old: bool,
    pending: bool = False,
    probes_due: bool = False,
) -> CheckResult:
    """A streaming model's time between responses, new versions against the old, by the
    probes' streams (each stream's median gap; Triton's counters have no such figure, and its
    ``response_stats`` are empty for a Python model on 2.51), judged as
    ``pinned_latency_check`` judges the time to the first response."""
    threshold = f"increase <= {check.max_increase:g}"
    if not has_old:
        return CheckResult(check.name, Verdict.SKIPPED, None, threshold, "no old versions")
    # No probe counted yet (the first volley is left out: its streams start cold) is not "no
    # streams": the check waits for them below, as the time to the first response does. Read
    # as no data, it ended every rollback of a canary inconclusive at its one-interval
    # no-traffic phase (bench.streaming).
    if probes is None or ((probes.sent or probes.old_sent) and not probes.streamed):
        return CheckResult(
            check.name, Verdict.NO_DATA, None, threshold,
            "no probe streams: time between responses is measured on a streaming model's probes",
        )  # fmt: skip
    gaps = replace(probes, latencies=probes.gaps, old_latencies=probes.old_gaps)
    return pinned_latency_check(check, gaps, BETWEEN, pending, probes_due)


def pinned_latency_check(
    check: Check,
    probes: ProbeFigures,
    why: str = PINNED,
    pending: bool = False,
    probes_due: bool = False,
    uneven: str | None = None,
) -> CheckResult:
    """The new versions against the old, both by the probes: for new versions that see only
    version-pinned requests (lower than the old, which keep the unversioned traffic), whose
    counters would compare an idle instance with a busy one. An increase beyond the bound
    waits while the analysis's duration lasts (``probes_due``), and fails when it is over and
    the evaluation before measured one too (``pending``): the new versions take few or no
    clients' requests, so waiting costs little, and a reading of a few probes of an instance
    woken for them is the noisiest the analysis takes (good versions read +47% and +51%
    against a +50% bound after 2 s, with a CPU burner: bench.false_verdicts runs 3 and 5);
    the medians over the whole duration judge on the most probes. An increase beyond
    UNCONFIRMED_WAIT_MAX times the bound is no idle instance's: the second reading fails it
    (a version so slow that it answers only a few of its clients' requests is judged here).
    ``uneven``: why the two sides' loads do not compare (``uneven_load``): an increase beyond
    the bound is then not the version's, and is shown skipped; within it, it passes."""
    threshold = f"increase <= {check.max_increase:g}"
    at_least_new = PINNED_LATENCY_MIN_PROBES
    if uneven is not None and len(probes.old_loaded) >= PINNED_LATENCY_MIN_PROBES:
        # The new versions carry the clients' streams, the old one beside them does not;
        # it did before they loaded, and was probed then: those probes compare.
        probes = replace(probes, old_latencies=probes.old_loaded)
        why, uneven, at_least_new = LOADED, None, LOADED_MIN_NEW
    medians = _probe_medians(probes, at_least_new)
    if medians is None:
        # One slow wake-up among a handful of probes is not a slower version: wait for more.
        return CheckResult(
            check.name, Verdict.SKIPPED, None, threshold,
            f"too few probes yet ({probes.sent} new, {probes.old_sent} old; "
            f"{PINNED_LATENCY_MIN_PROBES} each needed)",
            awaiting=True,
        )  # fmt: skip
    new, old = medians
    if old <= 0:
        return CheckResult(
            check.name, Verdict.NO_DATA, None, threshold, "the old version's probes read 0ms"
        )
    increase = new / old - 1.0
    limit = check.max_increase if check.max_increase is not None else math.inf
    detail = f"probes: median {new * 1e3:.2f}ms vs {old * 1e3:.2f}ms on the old version ({why})"
    if increase <= limit:
        return CheckResult(check.name, Verdict.PASS, increase, threshold, detail)
    if math.isfinite(limit):
        p_value = beyond_bound(probes.latencies, probes.old_latencies, limit)
        if p_value > SIGNIFICANCE:
            # The medians are beyond the bound, the probes as a whole are not: more probes
            # decide (the analysis runs on while it waits, then it passes).
            return CheckResult(
                check.name, Verdict.SKIPPED, increase, threshold,
                f"{detail} (+{increase:.0%}), within the noise of {len(probes.latencies)} "
                f"and {len(probes.old_latencies)} probes (p={p_value:.2g} > {SIGNIFICANCE:g})",
            )  # fmt: skip
    if uneven is not None:
        return CheckResult(
            check.name, Verdict.SKIPPED, increase, threshold,
            f"{detail} (+{increase:.0%}), not judged: {uneven}",
        )  # fmt: skip
    waits = probes_due and increase <= UNCONFIRMED_WAIT_MAX * limit
    if pending and not waits:
        return CheckResult(
            check.name, Verdict.FAIL, increase, threshold,
            f"{detail}; the evaluation before measured it too",
        )  # fmt: skip
    when = "at the end of the analysis's duration" if waits else "by the next evaluation"
    return CheckResult(
        check.name, Verdict.SKIPPED, increase, threshold,
        f"{detail} (+{increase:.0%}), to be confirmed {when}",
    )  # fmt: skip
