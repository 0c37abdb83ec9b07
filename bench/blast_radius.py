"""Blast radius of a bad rollout (issue 13): the client requests one bad version fails before
the analysis puts the old one back, for each way a version can be bad.

One real tritonserver (``LocalTriton``) serves the test model ``echo`` (OUTPUT0 = INPUT0 *
version) at version 1, under the load of ``bench.rollback_latency``: ``--threads`` (4) client
threads sending unversioned requests for the whole run (Triton answers them with the highest
READY version, so a new version takes all of them from its load until the revert). Each
rollout commits ``versions: [V]`` to a bare Git remote and runs ``reconcile`` in-process
(apply mode). Failure modes (see ``testkit/models/echo/model.py``):

* ``exception-40``: version 4 raises on 40% of its requests (Triton counts them failed);
* ``error-100``: version 10 answers every request with an error response (Triton 2.51 counts
  those successes: only the probes see them);
* ``error-1``: version 11 answers 1% of its requests with an error response;
* ``wrong-output``: version 3 answers x3 where the manifest's smoke case expects x2;
* ``slow-3x``: version 5 answers correctly, ``slow_ms`` late (a config parameter), chosen by
  a calibration step so that clients see about 3x version 1's latency.

Every rollout's analysis: ``interval: 1s``, ``duration: 10s``, ``noTraffic: wait``, a
``successRate`` check (min 0.95; 0.999 for ``error-1``, whose 99% is above 0.95), plus a
``latency`` check (``maxIncrease: 1.0``) for ``slow-3x`` and a smoke case for
``wrong-output``; probes and early abort at the reconciler's defaults. Then ``--good`` good
rollouts, each to the other of 1 and 2 from what serves, with ``exception-40``'s manifest, and
``--good-strict`` more with every check any mode used (success rate at least 0.999, latency, a
smoke case expecting the new version's answer): a revert is a false revert. The
"today" arm is the same manifest without the feature (``probes: {enabled: false}``,
``earlyAbort: {confidence: 0, every: 0s}``: judged by Triton's counters at each evaluation
only), for ``exception-40`` and ``error-100``, its rollouts alternating with the new arm's.

Every failed spec is held until a commit changes it, so successive commits alternate a
harmless ``failureLimit: 0`` (present or absent). A bad version that is not detected ends up
serving alone; a commit of ``[1]`` without analysis then puts version 1 back (in the same
window: its failures count).

Per rollout, on the ``time.monotonic()`` clock of this one process: whether it was reverted;
the rule that caught it (the failing evaluation's text); the client requests in its window
(from the commit's apply to version 1 serving alone again, settled, plus ``--gap``) that
failed because of the bad version (its error, or a wrong answer: an answer from version 3),
and for ``slow-3x`` the requests it answered (affected, not failed); READY (the forward load
call returned) to the revert (the in-place load of version 1 alone returned), split into
READY to the analysis's start (the verify step: the first probe goes out as the analysis
starts), the analysis's start to the failing evaluation, that to the revert load being sent,
and the load call; the probes sent; and every Triton and metrics call the pass made
(``bench.harness.calls``), to say where the time between READY and the verdict went.

    python -m bench.blast_radius [--rollouts N] [--good N] [--good-strict N] [--threads 4]
        [--modes ...] [--today N] [--today-error N] [--slow-ms MS] [--output PATH]
        [--report JSON]

Every process started here (one tritonserver and its backend stubs) is stopped in ``finally``.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.harness.calls import Call, CallLog, between, seconds_by_label
from bench.harness.cli import markdown_main, read_json, write_json
from bench.harness.errors import VOID, BenchError
from bench.harness.provenance import busy_processes, machine, other_tritonservers, provenance
from bench.harness.report import render
from bench.harness.rollouts import ManifestRemote, backend_stubs, masked, smoke_case_lines
from bench.harness.stats import summary
from bench.harness.triton import Index
from reconciler.model.analysis import CheckResult, Evaluation
from reconciler.model.plan import Action
from reconciler.model.results import ChangeResult, Outcome
from testkit.loadgen import LoadGenerator, Sample
from testkit.local_triton import LocalTriton
from testkit.manifests import write_model_repository

MODEL = "echo"
SERVER = "edge-a"
OLD, OTHER_GOOD = 1, 2  # the version serving before each bad rollout; the good rollouts' other
INTERVAL_S = 1.0
DURATION_S = 10.0
LATENCY_MAX_INCREASE = 1.0  # slow-3x and the good rollouts: at most twice the old mean
TARGET_FAILED = 50  # median failed requests per rollout, exception-40 and error-100
TODAY_FIGURE = 1019  # BENCHMARKS.md, "Rollback latency under load": median of 20, v4
SLOW_TARGET_RATIO = 3.0
RESULTS = Path(__file__).parent / "results"


@dataclass(frozen=True)
class Mode:
    """One way a version is bad, and the manifest that rolls it out."""

    name: str
    version: int
    what: str
    effect: str  # error: its requests fail; wrong: wrong answers; slow: late answers
    marker: str | None = None  # in the message of a client error the bad version causes
    min_success: float = 0.95
    latency: bool = False  # add the latency check
    smoke: bool = False  # add a smoke case expecting x2
    targeted: bool = False  # the median-at-most-50 target applies
    # The probes' settings when not the defaults: one error in a hundred needs several
    # hundred probes in the analysis's 10 s to be seen (at the default 20 rounds a second,
    # about 145 reach the new version: a 1% failure is missed about a quarter of the time).
    probes: str | None = None


MODES: tuple[Mode, ...] = (
    Mode(
        "exception-40",
        4,
        "raises on 40% of requests (Triton counts them failed)",
        "error",
        "version 4 failed request",
        targeted=True,
    ),
    Mode(
        "error-100",
        10,
        "error response to every request (Triton counts them successes)",
        "error",
        "version 10 answers request",
        targeted=True,
    ),
    Mode(
        "error-1",
        11,
        "error response to 1% of requests",
        "error",
        "version 11 answers request",
        min_success=0.999,
        probes="{rate: 100, maxShare: 0.25}",
    ),
    Mode("wrong-output", 3, "answers x3, the smoke case expects x2", "wrong", smoke=True),
    Mode("slow-3x", 5, "correct answers, about 3x version 1's latency", "slow", latency=True),
)
BY_NAME = {m.name: m for m in MODES}
TODAY_MODES = ("exception-40", "error-100")
# Triton 2.51 never finishes unloading a Python version whose execute raised (version 4):
# it stays UNLOADING (see ``bench.harness.triton.Index.settle``). The others must unload.
STUCK_UNLOADING = (4,)


# -- the manifests ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Analysis:
    """The analysis a rollout's manifest asks for."""

    min_success: float = 0.95
    latency: bool = False
    smoke_factor: int | None = None  # a smoke case expecting INPUT0 * this
    today: bool = False  # without probes and early abort: the counters at evaluations only
    smoke_is_new_version: bool = False  # the smoke factor is the version rolled out
    probes: str | None = None  # the probes' settings, when not the defaults

    def describe(self) -> str:
        checks = [f"successRate min {self.min_success:g}"]
        if self.latency:
            checks.append(f"latency maxIncrease {LATENCY_MAX_INCREASE:g}")
        if self.smoke_is_new_version:
            checks.append("smoke case expecting the new version's answer")
        elif self.smoke_factor is not None:
            checks.append(f"smoke case expecting x{self.smoke_factor}")
        checks.append(
            "probes off, earlyAbort confidence 0, every 0s"
            if self.today
            else f"probes {self.probes}, earlyAbort at its defaults"
            if self.probes
            else "probes and earlyAbort at their defaults"
        )
        return ", ".join(checks)


def mode_analysis(mode: Mode, today: bool = False) -> Analysis:
    return Analysis(
        mode.min_success,
        mode.latency,
        2 if mode.smoke else None,
        today,
        probes=None if today else mode.probes,
    )


def good_analysis(version: int) -> Analysis:
    """Every check any mode uses, at its strictest; the smoke case expects ``version``."""
    return Analysis(max(m.min_success for m in MODES), True, version, smoke_is_new_version=True)


def deployment_doc(
    versions: Sequence[int], flip: bool, analysis: Analysis | None, slow_ms: float
) -> str:
    """The ModelDeployment. ``flip`` adds the default ``failureLimit: 0`` (same behaviour, a
    different spec: a held spec is never tried again); ``slow_ms`` is in every manifest's
    config (only version 5 reads it), so the config never changes between rollouts."""
    lines = [
        "apiVersion: triton-gitops.dev/v1alpha1",
        "kind: ModelDeployment",
        "metadata:",
        f"  name: {MODEL}",
        "spec:",
        "  servers:",
        f"    names: [{SERVER}]",
        f"  versions: [{', '.join(map(str, versions))}]",
        "  config:",
        "    parameters:",
        f'      slow_ms: {{string_value: "{slow_ms:g}"}}',
    ]
    if analysis is not None:
        lines.append("  verify:")
        if analysis.smoke_factor is not None:
            lines += smoke_case_lines(analysis.smoke_factor)
        lines += [
            "    analysis:",
            f"      interval: {INTERVAL_S:g}s",
            f"      duration: {DURATION_S:g}s",
            "      noTraffic: wait",
        ]
        if flip:
            lines.append("      failureLimit: 0")
        lines += [
            "      checks:",
            "        - name: success-rate",
            f"          successRate: {{min: {analysis.min_success:g}}}",
        ]
        if analysis.latency:
            lines += [
                "        - name: latency",
                f"          latency: {{maxIncrease: {LATENCY_MAX_INCREASE:g}}}",
            ]
        if analysis.probes and not analysis.today:
            lines.append(f"      probes: {analysis.probes}")
        if analysis.today:
            lines += [
                "      probes: {enabled: false}",
                "      earlyAbort: {confidence: 0, every: 0s}",
            ]
    elif flip:
        lines.append("  suspend: false")  # the default: a different spec, same behaviour
    return "\n".join(lines) + "\n"


# -- what the reconciler did --------------------------------------------------------------------


@dataclass(frozen=True)
class Timeline:
    """One rollout as the reconciler reports it (``time.monotonic()`` instants)."""

    outcome: str
    verdict: str | None
    failed_step: str | None  # the forward step that failed (verify, analyze), if one did
    error: str | None
    rule: str  # what caught it (``caught_by``), or "not detected"
    load_sent: float | None  # the forward load call was sent...
    ready: float | None  # ...and returned: the new version is READY
    analysis_started: float | None
    judged_at: float | None  # the failed step's end, else the analysis's end
    revert_load_sent: float | None
    reverted_at: float | None  # the revert's load of the old versions alone returned
    evaluations: int
    aborted: bool
    failing_result: str | None  # the failing evaluation's results, as the reconciler says
    latency_increase: float | None  # the last evaluation's latency check value
    probes_sent: int
    probes_failed: int
    old_probes_sent: int


def _failing_sources(result: CheckResult) -> list[str]:
    """Which of a success-rate result's sources (triton, probes) were below its min."""
    bound = re.search(r">= ([0-9.eE+-]+)", result.threshold)
    if bound is None:
        return []
    minimum = float(bound.group(1))
    return [
        source
        for source, failed, total in re.findall(r"(triton|probes): (\d+) of (\d+)", result.detail)
        if int(total) > 0 and (int(total) - int(failed)) / int(total) < minimum
    ]


def caught_by(
    outcome: str, failed_step: str | None, error: str | None, last: Evaluation | None
) -> str:
    """The rule that caught a bad rollout, from what the reconciler reported: a verify step's
    smoke case, the early abort (a run of failed probes, or the rate rule on the counters or
    the probes), or an evaluation (its failing checks and, for a success rate, the sources
    below the min)."""
    if outcome == Outcome.CONVERGED:
        return "not detected"
    if failed_step == Action.VERIFY:
        return "verify: smoke case" if error and "smoke" in error else "verify"
    if failed_step != Action.ANALYZE or last is None:
        return f"{failed_step or 'no'} step failed"
    if last.aborted:
        detail = " ".join(r.detail for r in last.results)
        if "probes in a row failed" in detail:
            return "early abort: probes in a row"
        for source, name in (("triton", "counters"), ("probes", "probes")):
            if f"early abort: {source}:" in detail:
                return f"early abort: {name}' rate"
        return "early abort"
    failed = last.failed
    if not failed:
        return f"analysis {last.verdict} (evaluation {last.index + 1})"
    parts = []
    for result in failed:
        sources = _failing_sources(result)
        parts.append(f"{result.check} ({', '.join(sources)})" if sources else result.check)
    return f"evaluation {last.index + 1}: {'; '.join(parts)}"


def read_change(change: ChangeResult) -> Timeline:
    """The rollout's timeline from its ChangeResult."""
    load = next((r for r in change.steps if r.step.action is Action.LOAD), None)
    analysis = change.analysis
    failed = next((r for r in change.steps if not r.ok), None)
    evaluations = analysis.evaluations if analysis is not None else ()
    last = evaluations[-1] if evaluations else None
    probes = [e.probes for e in evaluations if e.probes is not None]
    latency = next((r.value for r in last.results if r.check == "latency"), None) if last else None
    revert_load = change.revert[0] if change.revert and change.revert[0].ok else None
    judged = failed or analysis
    return Timeline(
        outcome=str(change.outcome),
        verdict=str(analysis.verdict) if analysis is not None and analysis.verdict else None,
        failed_step=str(failed.step.action) if failed is not None else None,
        error=change.error,
        rule=caught_by(
            str(change.outcome),
            str(failed.step.action) if failed is not None else None,
            failed.error if failed is not None else None,
            last,
        ),
        load_sent=load.ended_at - load.seconds if load is not None else None,
        ready=load.ended_at if load is not None else None,
        analysis_started=analysis.ended_at - analysis.seconds if analysis is not None else None,
        judged_at=judged.ended_at if judged is not None else None,
        revert_load_sent=(
            revert_load.ended_at - revert_load.seconds if revert_load is not None else None
        ),
        reverted_at=revert_load.ended_at if revert_load is not None else None,
        evaluations=len(evaluations),
        aborted=bool(last and last.aborted),
        failing_result=(
            "; ".join(str(r) for r in (last.failed or last.results))
            if last is not None and failed is not None
            else None
        ),
        latency_increase=latency,
        probes_sent=sum(p.sent for p in probes),
        probes_failed=sum(p.failed for p in probes),
        old_probes_sent=sum(p.old_sent for p in probes),
    )


def call_figures(
    calls: Sequence[Call], ready: float | None, judged_at: float | None, new: int
) -> dict[str, Any]:
    """Where the time between READY and the verdict went, from the pass's logged calls:
    the first probe (an infer pinned to ``new``) after READY, the probes and metrics
    readings before the verdict, the ms spent in each kind of call and outside any call.
    A probe "raised" when the call failed (an error); a wrong answer does not raise."""
    if ready is None or judged_at is None:
        return {}
    window = between(calls, ready, judged_at)
    probes = [c for c in window if c.label == "triton infer" and c.version == new]
    reads = [c for c in window if c.label == "metrics figures"]
    raised = [c for c in probes if c.failed is not None]
    spent = seconds_by_label(window)

    def mean_ms(chosen: Sequence[Call]) -> float | None:
        return statistics.fmean(c.ended - c.started for c in chosen) * 1000 if chosen else None

    return {
        "ready_to_first_probe_ms": (probes[0].started - ready) * 1000 if probes else None,
        "ready_to_first_raised_probe_end_ms": (raised[0].ended - ready) * 1000 if raised else None,
        "probes": len(probes),
        "probes_raised": len(raised),
        "probe_ms_mean": mean_ms(probes),
        "metrics_reads": len(reads),
        "metrics_read_ms_mean": mean_ms(reads),
        "ms_in_calls": {label: value * 1000 for label, value in sorted(spent.items())},
        "ms_outside_calls": (judged_at - ready - sum(spent.values())) * 1000,
    }


# -- what the clients saw -----------------------------------------------------------------------


def in_window(
    samples: Sequence[Sample], starts: Sequence[float], since: float, until: float
) -> Sequence[Sample]:
    """The requests started in [since, until): ``samples`` sorted by start, ``starts``
    their start times."""
    return samples[bisect.bisect_left(starts, since) : bisect.bisect_left(starts, until)]


def client_counts(
    window: Sequence[Sample],
    effect: str,
    version: int,
    marker: str | None,
    ready: float | None,
    judged_at: float | None,
    reverted_at: float | None,
) -> dict[str, Any]:
    """What one rollout's window of requests says about ``version``.

    ``failed``: requests the bad version failed (an error whose message has ``marker``) or
    answered wrongly (``effect`` wrong: any answer from ``version``); for a good rollout
    (``effect`` good) every failed request. ``affected`` (``effect`` slow): the requests the
    slow version answered, which do not fail. ``other_failures``: failed requests not
    caused by the bad version (none expected). Times in ms: the first request the new
    version answered or failed, after READY; the last one's start, after the revert.
    """

    def from_bad(s: Sample) -> bool:
        if s.version == version:
            return True
        return s.error is not None and marker is not None and marker in s.error

    if effect == "good":
        failed = [s for s in window if s.error is not None]
    elif effect == "wrong":
        failed = [s for s in window if s.version == version]
    else:
        failed = [s for s in window if s.error is not None and marker and marker in s.error]
    counted = {id(s) for s in failed}
    other = [s for s in window if s.error is not None and id(s) not in counted]
    bad = [s for s in window if from_bad(s)]

    def ms(value: float | None, origin: float | None) -> float | None:
        return None if value is None or origin is None else (value - origin) * 1000

    return {
        "requests": len(window),
        "failed": len(failed),
        "failed_until_verdict": sum(1 for s in failed if judged_at and s.started < judged_at),
        "failed_after_verdict": sum(
            1 for s in failed if judged_at is None or s.started >= judged_at
        ),
        "affected": sum(1 for s in window if s.version == version) if effect == "slow" else 0,
        "answered_by_new": sum(1 for s in window if s.version == version),
        "other_failures": len(other),
        "first_new_after_ready_ms": ms(bad[0].started if bad else None, ready),
        "last_new_started_after_revert_ms": ms(bad[-1].started if bad else None, reverted_at),
        "last_new_ended_after_revert_ms": ms(
            bad[-1].started + bad[-1].seconds if bad else None, reverted_at
        ),
        # From the first request the new version answered (or failed) to the end of the last.
        "exposure_ms": ms(bad[-1].started + bad[-1].seconds, bad[0].started) if bad else None,
        "mean_latency_new_ms": (
            statistics.fmean(s.seconds for s in window if s.version == version) * 1000
            if any(s.version == version for s in window)
            else None
        ),
        "messages": sorted({masked(s.error or "") for s in failed + other})[:3],
    }


def mean_latency(
    samples: Sequence[Sample], starts: Sequence[float], since: float, until: float, version: int
) -> tuple[float | None, int]:
    """Mean client latency (s) of the requests ``version`` answered in [since, until)."""
    answered = [s.seconds for s in in_window(samples, starts, since, until) if s.version == version]
    return (statistics.fmean(answered) if answered else None), len(answered)


# -- the run ------------------------------------------------------------------------------------


@dataclass
class Rollout:
    arm: str  # new | today | good | warmup
    mode: str  # a Mode's name, or "good"
    index: int
    old: int
    new: int
    revision: str
    manifest: str  # Analysis.describe()
    apply_started: float
    apply_seconds: float
    timeline: Timeline
    restored: bool  # not detected: a commit of [old] without analysis put it back
    calls: dict[str, Any]  # call_figures: READY to the verdict, call by call
    window_end: float = 0.0
    client: dict[str, Any] = field(default_factory=dict)

    @property
    def detected(self) -> bool:
        return self.timeline.outcome == Outcome.REVERTED


class Runner:
    """Commits and applies the rollouts, one after the other, on the one server."""

    def __init__(self, remote: ManifestRemote, triton: Index, slow_ms: float, gap: float):
        self.remote, self.triton, self.slow_ms, self.gap = remote, triton, slow_ms, gap
        self.flip = False

    def commit(self, versions: list[int], analysis: Analysis | None, message: str) -> str:
        self.flip = not self.flip
        doc = deployment_doc(versions, self.flip, analysis, self.slow_ms)
        return self.remote.commit(doc, message)

    def apply_one(self, what: str) -> tuple[ChangeResult, float, float, list[Call]]:
        log = CallLog()
        started = time.monotonic()
        report = self.remote.apply(log)
        seconds = time.monotonic() - started
        if report.result is None or len(report.result.changes) != 1:
            raise BenchError(f"{what}: expected one change, got {report.plan}")
        return report.result.changes[0], started, seconds, log.calls

    def settle(self, version: int) -> None:
        self.triton.settle(MODEL, version, stuck_unloading=STUCK_UNLOADING)

    def put_back(self, version: int, why: str) -> None:
        """A commit of ``[version]`` without analysis, applied: it must converge."""
        self.commit([version], None, f"echo [{version}]: {why}")
        change, *_ = self.apply_one(why)
        if change.outcome is not Outcome.CONVERGED:
            raise BenchError(
                f"{why}: putting {version} back ended {change.outcome}: {change.error}"
            )
        self.settle(version)

    def rollout(
        self, arm: str, mode: str, index: int, old: int, new: int, analysis: Analysis
    ) -> Rollout:
        revision = self.commit([new], analysis, f"{arm} {mode} {index}: echo [{new}]")
        change, started, seconds, calls = self.apply_one(f"{arm} {mode} rollout {index}")
        timeline = read_change(change)
        figures = call_figures(calls, timeline.ready, timeline.judged_at, new)
        serving = self.triton.ready(MODEL)
        restored = False
        if change.outcome is Outcome.REVERTED:
            if serving != {old}:
                raise BenchError(f"{arm} {mode} {index}: after the revert {serving} serve")
            self.settle(old)
        elif change.outcome is Outcome.CONVERGED:
            if serving != {new}:
                raise BenchError(f"{arm} {mode} {index}: converged, but {serving} serve")
            if not arm.startswith("good"):  # a bad version went through: put the old back
                self.put_back(old, f"{mode} {index} was not detected")
                restored = True
            else:
                self.settle(new)
        else:
            raise BenchError(
                f"{arm} {mode} {index}: outcome {change.outcome}, error {change.error}"
            )
        time.sleep(self.gap)  # the old version answers alone for a while
        rollout = Rollout(
            arm,
            mode,
            index,
            old,
            new,
            revision,
            analysis.describe(),
            started,
            seconds,
            timeline,
            restored,
            figures,
            time.monotonic(),
        )
        t = timeline
        took = (
            f"READY->revert {(t.reverted_at - t.ready) * 1000:7.1f} ms"
            if t.reverted_at is not None and t.ready is not None
            else "not reverted"
        )
        print(
            f"  {arm:<6} {mode:<12} {index:>2} {old}->{new}  {t.outcome:<9} {took}  "
            f"{t.rule}  probes {t.probes_sent}  apply {seconds:5.2f} s",
            file=sys.stderr,
        )
        return rollout


def calibrate(triton: Index, load: LoadGenerator, args: argparse.Namespace) -> dict[str, Any]:
    """Choose ``slow_ms`` so that clients see version 5 at about 3x version 1's latency
    under this load: version 1's mean measured alone, then version 5 loaded beside it by hand
    (it takes the unversioned traffic) with a guess, corrected in proportion, up to 3 tries.
    Version 1 is loaded alone again with its config at the end."""
    samples = load.samples

    def measure(version: int, seconds: float) -> float:
        time.sleep(0.3)  # let the swap pass
        since = time.monotonic()
        time.sleep(seconds)
        until = time.monotonic()
        ordered = sorted(list(samples), key=lambda s: s.started)
        mean, count = mean_latency(ordered, [s.started for s in ordered], since, until, version)
        if mean is None or count < 50:
            raise BenchError(f"calibration: only {count} requests answered by {version}")
        return mean * 1000

    base = triton.config(MODEL)
    v1 = measure(OLD, 3.0)
    tries: list[dict[str, float]] = []
    if args.slow_ms is not None:
        return {"slow_ms": args.slow_ms, "chosen_by": "--slow-ms", "v1_mean_ms": v1, "tries": []}
    slow = 2 * v1  # the first guess: the sleep adds itself to the latency
    for _ in range(3):
        config = json.loads(json.dumps(base))
        config.setdefault("parameters", {})["slow_ms"] = {"string_value": f"{slow:.3g}"}
        slow = float(f"{slow:.3g}")
        triton.load(MODEL, config, [OLD, 5])
        v5 = measure(5, 2.0)
        tries.append({"slow_ms": slow, "v5_mean_ms": v5, "ratio": v5 / v1})
        print(
            f"  calibration: slow_ms {slow:g}: version 5 {v5:.2f} ms, version 1 {v1:.2f} ms "
            f"(x{v5 / v1:.2f})",
            file=sys.stderr,
        )
        if abs(v5 / v1 - SLOW_TARGET_RATIO) <= 0.3:
            break
        per_ms = max(0.2, (v5 - v1) / slow)  # client ms per ms of sleep
        slow = max(0.1, (SLOW_TARGET_RATIO - 1) * v1 / per_ms)
    triton.load(MODEL, base, [OLD])
    triton.settle(MODEL, OLD, stuck_unloading=STUCK_UNLOADING)
    best = min(tries, key=lambda t: abs(t["ratio"] - SLOW_TARGET_RATIO))
    return {
        "slow_ms": best["slow_ms"],
        "chosen_by": "calibration",
        "v1_mean_ms": v1,
        "tries": tries,
    }


def plan_runs(args: argparse.Namespace) -> list[tuple[str, Mode, int]]:
    """(arm, mode, index) of the bad rollouts, in order: per mode its new arm's, alternating
    with its today arm's where it has one."""
    runs: list[tuple[str, Mode, int]] = []
    for mode in (BY_NAME[name] for name in args.modes):
        new = args.rollouts
        today = {"exception-40": args.today, "error-100": args.today_error}.get(mode.name, 0)
        for i in range(max(new, today)):
            if i < new:
                runs.append(("new", mode, i))
            if i < today:
                runs.append(("today", mode, i))
    return runs


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-blast-") as tmp:
        root = Path(tmp)
        repository = write_model_repository(root / "models")
        server = LocalTriton(repository, log_file=root / "tritonserver.log")
        triton: Index | None = None
        load: LoadGenerator | None = None
        try:
            server.start()
            assert server.process is not None
            triton = Index(server.grpc_address)
            machine_info = machine(triton.server_version()) | {
                "load_average_at_start": os.getloadavg(),
                "other_tritonservers_at_start": other_tritonservers(server.process.pid),
                "busy_processes_at_start": busy_processes(),
            }
            started_at = time.time()
            remote = ManifestRemote(root, server, repository, SERVER, "echo.yaml")
            runner = Runner(remote, triton, 0.0, args.gap)

            # Version 1, deployed without analysis; then the load, and slow_ms chosen on it.
            runner.put_back(OLD, "deploy")
            load = LoadGenerator(server.grpc_address, MODEL, threads=args.threads).start()
            load.wait_for_samples(300)
            calibration = calibrate(triton, load, args)
            runner.slow_ms = calibration["slow_ms"]
            runner.put_back(OLD, f"slow_ms {runner.slow_ms:g} in the config")  # a config change

            rollouts: list[Rollout] = []
            warm = BY_NAME[args.modes[0]]
            for i in range(args.warmup):  # not counted: the first loads warm up
                rollouts.append(
                    runner.rollout("warmup", warm.name, i, OLD, warm.version, mode_analysis(warm))
                )
            measured_from = time.monotonic()
            for arm, mode, i in plan_runs(args):
                analysis = mode_analysis(mode, today=arm == "today")
                rollouts.append(runner.rollout(arm, mode.name, i, OLD, mode.version, analysis))
            serving = OLD
            for arm, count in (("good", args.good), ("good-strict", args.good_strict)):
                for i in range(count):
                    new = OTHER_GOOD if serving == OLD else OLD
                    analysis = Analysis() if arm == "good" else good_analysis(new)
                    done = runner.rollout(arm, arm, i, serving, new, analysis)
                    rollouts.append(done)
                    serving = new if done.timeline.outcome == Outcome.CONVERGED else serving
            measured_until = time.monotonic()
            samples = load.stop()
            load = None
            left = {
                "states": triton.states(MODEL),
                "backend_stubs": backend_stubs(server.process.pid, MODEL),
            }
            machine_info |= {
                "load_average_at_end": os.getloadavg(),
                "other_tritonservers_at_end": other_tritonservers(server.process.pid),
                "busy_processes_at_end": busy_processes(),
                "wall_minutes": (time.time() - started_at) / 60,
            }
        except VOID as exc:
            RESULTS.mkdir(parents=True, exist_ok=True)
            kept = RESULTS / "blast_radius-tritonserver.log"
            if server.log_file is not None and server.log_file.exists():
                shutil.copyfile(server.log_file, kept)
            raise BenchError(
                f"{exc}\ntritonserver log tail:\n{server.log_tail(8)}\nwhole log: {kept}"
            ) from exc
        finally:
            if load is not None:
                load.stop()
            if triton is not None:
                triton.close()
            server.stop()
    return report(
        args, machine_info, calibration, samples, measured_from, measured_until, rollouts, left
    )


# -- the result ---------------------------------------------------------------------------------


def _ms(a: float | None, b: float | None) -> float | None:
    """b - a in ms, None when either is missing."""
    return None if a is None or b is None else (b - a) * 1000


def _calls_summary(figures: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``call_figures`` over an arm's rollouts: a summary of each figure; ms in calls per
    label (a label a rollout did not call counts 0 there)."""
    present = [f for f in figures if f]
    keys = (
        "ready_to_first_probe_ms",
        "ready_to_first_raised_probe_end_ms",
        "probes",
        "probes_raised",
        "probe_ms_mean",
        "metrics_reads",
        "metrics_read_ms_mean",
        "ms_outside_calls",
    )
    labels = sorted({label for f in present for label in f["ms_in_calls"]})
    return {key: summary([f[key] for f in present]) for key in keys} | {
        "ms_in_calls": {
            label: summary([f["ms_in_calls"].get(label, 0.0) for f in present]) for label in labels
        }
    }


def arm_summary(rollouts: Sequence[Rollout]) -> dict[str, Any]:
    """The figures of one arm of one mode. Where the time went (``parts_ms``, ``calls``, the
    client's times) is over the detected rollouts, or over all of them when none was
    (``timed_over`` says which): a rollout that was not detected ran the whole duration."""
    detected = [r for r in rollouts if r.detected]
    timed = detected or list(rollouts)
    t = [r.timeline for r in timed]
    c = [r.client for r in rollouts]
    ct = [r.client for r in timed]
    directions = Counter(f"{r.old}->{r.new}" for r in rollouts)
    return {
        "rollouts": len(rollouts),
        "detected": len(detected),
        "by_direction": {
            d: {"rollouts": n, "reverted": sum(1 for r in detected if f"{r.old}->{r.new}" == d)}
            for d, n in sorted(directions.items())
        },
        "timed_over": "detected" if detected else "all (none detected)",
        "manifest": rollouts[0].manifest,
        "failed_per_rollout": summary([x["failed"] for x in c]),
        "failed_until_verdict": summary([x["failed_until_verdict"] for x in c]),
        "affected_per_rollout": summary([x["affected"] for x in c]),
        "other_failures": sum(x["other_failures"] for x in c),
        "rules": dict(Counter(r.timeline.rule for r in rollouts).most_common()),
        "ready_to_revert_ms": summary([_ms(x.ready, x.reverted_at) for x in t]),
        "parts_ms": {
            "ready_to_analysis_start": summary([_ms(x.ready, x.analysis_started) for x in t]),
            "ready_to_verdict": summary([_ms(x.ready, x.judged_at) for x in t]),
            "analysis_start_to_verdict": summary([_ms(x.analysis_started, x.judged_at) for x in t]),
            "verdict_to_revert_load_sent": summary(
                [_ms(x.judged_at, x.revert_load_sent) for x in t]
            ),
            "revert_load_call": summary([_ms(x.revert_load_sent, x.reverted_at) for x in t]),
            "load_call": summary([_ms(x.load_sent, x.ready) for x in t]),
        },
        "client_ms": {
            "first_new_after_ready": summary([x["first_new_after_ready_ms"] for x in ct]),
            "last_new_started_after_revert": summary(
                [x["last_new_started_after_revert_ms"] for x in ct]
            ),
            "mean_latency_new": summary([x["mean_latency_new_ms"] for x in ct]),
            "exposure": summary([x["exposure_ms"] for x in ct]),
        },
        "calls": _calls_summary([r.calls for r in timed]),
        "probes_sent": summary([r.timeline.probes_sent for r in rollouts]),
        "evaluations": summary([r.timeline.evaluations for r in rollouts]),
        "latency_increase": summary([x.latency_increase for x in t]),
        "apply_seconds": summary([r.apply_seconds for r in rollouts]),
        "messages": sorted({m for x in c for m in x["messages"]})[:4],
        "example_failing_result": next(
            (r.timeline.failing_result for r in rollouts if r.timeline.failing_result), None
        ),
    }


def report(
    args: argparse.Namespace,
    machine_info: dict[str, Any],
    calibration: dict[str, Any],
    samples: list[Sample],
    measured_from: float,
    measured_until: float,
    rollouts: list[Rollout],
    left: dict[str, Any],
) -> dict[str, Any]:
    ordered = sorted(samples, key=lambda s: s.started)
    starts = [s.started for s in ordered]
    for r in rollouts:
        mode = BY_NAME.get(r.mode)
        good = r.arm.startswith("good") or mode is None
        effect = "good" if good or mode is None else mode.effect
        t = r.timeline
        r.client = client_counts(
            in_window(ordered, starts, r.apply_started, r.window_end),
            effect,
            r.new,
            None if good or mode is None else mode.marker,
            t.ready,
            t.judged_at,
            t.reverted_at,
        )
    counted = [r for r in rollouts if r.arm != "warmup"]
    windows = [(r.apply_started, r.window_end) for r in counted]
    window_starts = [a for a, _ in windows]

    def outside(s: Sample) -> bool:
        i = bisect.bisect_right(window_starts, s.started) - 1
        return i < 0 or s.started >= windows[i][1]

    apart = [s for s in in_window(ordered, starts, measured_from, measured_until) if outside(s)]
    seconds = measured_until - measured_from
    measured = in_window(ordered, starts, measured_from, measured_until)
    return {
        "benchmark": "blast_radius",
        "command": " ".join(["python -m bench.blast_radius", *sys.argv[1:]]),
        "settings": {
            "rollouts_per_mode": args.rollouts,
            "good_rollouts": args.good,
            "good_strict_rollouts": args.good_strict,
            "today_rollouts": {"exception-40": args.today, "error-100": args.today_error},
            "threads": args.threads,
            "warmup_rollouts": args.warmup,
            "gap_seconds": args.gap,
            "modes": list(args.modes),
            "analysis": {
                "interval_s": INTERVAL_S,
                "duration_s": DURATION_S,
                "noTraffic": "wait",
                "latency_max_increase": LATENCY_MAX_INCREASE,
                "metrics": "Triton's metrics endpoint, scraped directly",
            },
            "manifests": {
                **{m.name: mode_analysis(m).describe() for m in MODES},
                "today": mode_analysis(MODES[0], today=True).describe(),
                "good": Analysis().describe(),
                "good-strict": good_analysis(OTHER_GOOD).describe(),
            },
        },
        "machine": machine_info,
        "code": provenance(),
        "calibration": calibration,
        "load": {
            "requests_per_second": len(measured) / seconds,
            "measured_seconds": seconds,
            "requests_outside_rollouts": len(apart),
            "failures_outside_rollouts": sum(1 for s in apart if s.error is not None),
            "version_1_mean_latency_ms_outside_rollouts": (
                statistics.fmean(s.seconds for s in apart if s.version == OLD) * 1000
                if any(s.version == OLD for s in apart)
                else None
            ),
        },
        "left_on_the_server": left,
        "today_figure_from_benchmarks_md": TODAY_FIGURE,
        **derived(rollouts),
        "rollouts": [asdict(r) | {"detected": r.detected} for r in rollouts],
    }


def derived(rollouts: Sequence[Rollout]) -> dict[str, Any]:
    """The summaries of a run, from its rollouts alone (so that ``--report`` can make them
    again from a saved result): per arm and mode, the good arms and their false reverts, the
    ratios and the targets."""
    counted = [r for r in rollouts if r.arm != "warmup"]
    arms: dict[str, dict[str, Any]] = {}
    for arm in ("new", "today"):
        for mode in MODES:
            chosen = [r for r in counted if r.arm == arm and r.mode == mode.name]
            if chosen:
                arms.setdefault(arm, {})[mode.name] = arm_summary(chosen)
    goods = {
        arm: [r for r in counted if r.arm == arm]
        for arm in ("good", "good-strict")
        if any(r.arm == arm for r in counted)
    }
    good_summary = {arm: arm_summary(chosen) for arm, chosen in goods.items()}
    new, today = arms.get("new", {}), arms.get("today", {})

    def median(arm: Mapping[str, Any], name: str) -> float | None:
        figures = arm.get(name, {}).get("failed_per_rollout")
        return figures["median"] if figures else None

    ratios = {}
    for name in TODAY_MODES:
        a, b = median(today, name), median(new, name)
        ratios[name] = None if a is None or b is None or b == 0 else a / b
    targets: dict[str, bool | None] = {}
    for name in ("exception-40", "error-100"):
        value = median(new, name)
        targets[f"{name}_median_at_most_{TARGET_FAILED}"] = (
            None if value is None else value <= TARGET_FAILED
        )
    targets["every_mode_detected"] = all(a["detected"] == a["rollouts"] for a in new.values())
    targets["no_false_revert"] = (
        good_summary["good"]["detected"] == 0 if "good" in good_summary else None
    )
    return {
        "arms": arms,
        "good": good_summary,
        "false_reverts": {
            arm: [
                {
                    "index": r.index,
                    "rollout": f"{r.old}->{r.new}",
                    "rule": r.timeline.rule,
                    "result": r.timeline.failing_result,
                }
                for r in chosen
                if r.detected
            ]
            for arm, chosen in goods.items()
        },
        "ratio_today_over_new": ratios,
        "targets_met": targets,
    }


def rollouts_of(result: Mapping[str, Any]) -> list[Rollout]:
    """A saved result's rollouts, as the run made them."""
    rollouts = []
    for saved in result["rollouts"]:
        fields = {k: v for k, v in saved.items() if k != "detected"}
        fields["timeline"] = Timeline(**fields["timeline"])
        rollouts.append(Rollout(**fields))
    return rollouts


def refreshed(result: dict[str, Any]) -> dict[str, Any]:
    """A saved result with its summaries made again from its rollouts (and each rollout's
    manifest described as this version of the code describes it)."""
    rollouts = rollouts_of(result)
    for r in rollouts:
        if r.arm == "good-strict":
            r.manifest = good_analysis(r.new).describe()
    return (
        result
        | derived(rollouts)
        | {"rollouts": [asdict(r) | {"detected": r.detected} for r in rollouts]}
    )


# -- the report ---------------------------------------------------------------------------------


def markdown(result: dict[str, Any]) -> str:
    """The section (``bench/reports/blast_radius.md``), from a result's summaries: each mode's
    bad version, and a good arm's false reverts counted by rule (most frequent first)."""
    return render(
        "blast_radius",
        result,
        versions={m.name: m.version for m in MODES},
        false_rules={
            arm: dict(Counter(f["rule"] for f in false).most_common())
            for arm, false in result["false_reverts"].items()
        },
    )


# -- the command --------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.blast_radius",
        description="Failed client requests per bad rollout, per failure mode, with the "
        "analysis's probes and early abort and without them, on one real tritonserver.",
    )
    parser.add_argument("--rollouts", type=int, default=20, help="per mode (default 20)")
    parser.add_argument(
        "--good", type=int, default=20, help="good rollouts, base manifest (default 20)"
    )
    parser.add_argument(
        "--good-strict",
        type=int,
        default=10,
        help="good rollouts with every check any mode used (default 10)",
    )
    parser.add_argument("--threads", type=int, default=4, help="client threads (default 4)")
    parser.add_argument(
        "--modes",
        nargs="+",
        choices=[m.name for m in MODES],
        default=[m.name for m in MODES],
        help="failure modes (default all)",
    )
    parser.add_argument(
        "--today", type=int, default=20, help="today-arm rollouts of exception-40 (default 20)"
    )
    parser.add_argument(
        "--today-error",
        type=int,
        default=5,
        help="today-arm rollouts of error-100, each watched the whole duration (default 5)",
    )
    parser.add_argument("--warmup", type=int, default=1, help="rollouts not counted (default 1)")
    parser.add_argument(
        "--gap", type=float, default=0.5, help="pause after each rollout (default 0.5 s)"
    )
    parser.add_argument(
        "--slow-ms", type=float, default=None, help="version 5's delay; default: calibrated"
    )
    parser.add_argument(
        "--output", type=Path, default=RESULTS / "blast_radius.json", help="JSON result"
    )
    parser.add_argument(
        "--report",
        type=Path,
        metavar="JSON",
        help="print the section from a saved result (its summaries made again, written back)",
    )
    args = parser.parse_args(argv)
    if (
        min(args.rollouts, args.threads) < 1
        or min(args.good, args.good_strict, args.today, args.today_error) < 0
    ):
        parser.error("--rollouts and --threads must be at least 1, the others not negative")
    if args.warmup < 0 or args.gap <= 0:
        parser.error("--warmup must not be negative, --gap must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.report is not None:  # the summaries made again from the saved rollouts
        result = refreshed(read_json(args.report))
        write_json(args.report, result)
        print(markdown(result))
        return 0
    return markdown_main(args, run, markdown)


if __name__ == "__main__":
    sys.exit(main())
