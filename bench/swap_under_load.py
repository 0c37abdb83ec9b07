"""Swap under load: the reconciler's ``apply`` against Triton's own load calls done by hand.

One real tritonserver (``LocalTriton``, from the nvidia-pytriton wheel) serves the test model
``echo`` (OUTPUT0 = INPUT0 * version) while a ``LoadGenerator`` sends unversioned requests from
several threads. Each round swaps echo between versions 1 and 2 twice:

* reconciler: commit a manifest to a bare Git remote and run ``apply`` in-process (the CLI's
  ``main``); the wall time of that call is measured.
* hand floor: with tritonclient gRPC, exactly the calls the reconciler's plan makes: load with
  the whole config and version policy [old, new], poll the repository index until the new
  version is READY (the verify), load with policy [new] (the unload step).

Rounds alternate which kind goes first and in which direction (ABBA), so both kinds do both
directions equally often and machine noise falls on both alike. Before each swap the server is
settled: no version LOADING or UNLOADING.

Reported: requests, failures, p50/p99 latency in a baseline window before any swap and in the
windows of each kind of swap (a request counts as "during" when it started inside a swap's
wall-clock window); apply and floor wall times and their ratio. Targets: 0 failures, ratio
(median apply / median floor) at most 1.1. Then a few more applies run instrumented (the pass
in this process, its phases timed through its hooks and its calls to Git, the state store and
Triton through its ports; ``bench.harness.probe``) and one under cProfile, to show where the
reconciler's time beyond the floor goes.

    python -m bench.swap_under_load [--swaps N] [--threads N] [--baseline-seconds S]
    python -m bench.swap_under_load --report JSON      # the report again, from a saved result

Every process started here (one tritonserver and its backend stubs) is stopped in ``finally``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.harness.cli import measured, read_json, write_json
from bench.harness.errors import VOID, BenchError
from bench.harness.passes import pass_settings, run_pass
from bench.harness.probe import Probe
from bench.harness.provenance import machine, other_tritonservers, provenance
from bench.harness.report import fixed, machine_line, render
from bench.harness.stats import bootstrap_ratio, percentile, time_stats
from bench.harness.triton import Index
from reconciler.model.errors import ReconcileError
from reconciler.model.source import Source
from testkit.cli_run import Reconciler
from testkit.loadgen import LoadGenerator, Sample
from testkit.local_triton import LocalTriton
from testkit.manifests import ManifestRepo, deployment_doc, server_doc, write_model_repository

MODEL = "echo"
SERVER = "edge-a"
TARGET_RATIO = 1.1
RESULTS = Path(__file__).parent / "results"


# -- one swap of each kind ---------------------------------------------------------------------


@dataclass
class Swap:
    kind: str  # "reconciler" or "hand"
    round: int
    source: int
    target: int
    started: float  # time.monotonic(), comparable with Sample.started
    seconds: float
    parts: dict[str, float] = field(default_factory=dict)

    @property
    def window(self) -> tuple[float, float]:
        return (self.started, self.started + self.seconds)


def hand_floor(
    triton: Index, config: dict[str, Any], old: int, new: int, poll: float
) -> dict[str, float]:
    """The floor: load [old, new]; wait until new is READY; load [new]. Timed per part.

    ``config``: the one the model runs with, read once before (the reconciler reads it at
    observe time, before its loads)."""
    t0 = time.monotonic()
    triton.load(MODEL, config, [old, new])
    t1 = time.monotonic()
    while True:
        states = triton.states(MODEL)
        if states.get(new) == "READY":
            break
        if states.get(new) not in ("LOADING", None) or time.monotonic() - t1 > 120.0:
            raise BenchError(f"version {new} did not become READY: {states}")
        time.sleep(poll)
    t2 = time.monotonic()
    triton.load(MODEL, config, [new])
    t3 = time.monotonic()
    return {"load_both": t1 - t0, "wait_ready": t2 - t1, "load_new": t3 - t2}


class Manifests:
    """The manifest remote and a reconciler (in-process CLI) pointed at it; ``source`` and
    ``settings`` are the same for a pass run without the CLI (the instrumented applies)."""

    def __init__(self, root: Path, triton: LocalTriton, repository: Path, smoke: bool) -> None:
        self.repo = ManifestRepo(root / "git")
        self.reconciler = Reconciler(self.repo.url, root / "reconciler")
        self.source = Source(self.repo.url)
        self.settings = pass_settings(
            root / "reconciler" / "cache", root / "reconciler" / "state.db"
        )
        self.smoke = smoke
        self.repo.write("servers.yaml", server_doc(SERVER, triton.grpc_address, repository))

    def commit(self, version: int) -> None:
        factor = float(version) if self.smoke else None
        self.repo.write(
            "echo.yaml", deployment_doc(MODEL, [version], [SERVER], expect_factor=factor)
        )
        self.repo.commit(f"echo {version}")

    def apply(self) -> float:
        """Run ``apply`` in-process; its wall time in seconds."""
        started = time.monotonic()
        run = self.reconciler.apply()
        seconds = time.monotonic() - started
        if run.code != 0:
            raise BenchError(f"apply exited {run.code}\n{run.out}\n{run.err}")
        return seconds


def reconciler_swap(manifests: Manifests, triton: Index, round_: int, old: int, new: int) -> Swap:
    manifests.commit(new)  # the user's push: not part of the reconciler's time
    started = time.monotonic()
    seconds = manifests.apply()
    if triton.ready(MODEL) != {new}:
        raise BenchError(f"after apply to {new} the server serves {triton.ready(MODEL)}")
    return Swap("reconciler", round_, old, new, started, seconds)


def hand_swap(
    triton: Index, config: dict[str, Any], poll: float, round_: int, old: int, new: int
) -> Swap:
    started = time.monotonic()
    parts = hand_floor(triton, config, old, new, poll)
    seconds = time.monotonic() - started
    if triton.ready(MODEL) != {new}:
        raise BenchError(f"after the hand swap to {new} the server serves {triton.ready(MODEL)}")
    return Swap("hand", round_, old, new, started, seconds, parts)


# -- where one apply's time goes ------------------------------------------------------------


def breakdown(
    manifests: Manifests, triton: Index, count: int, current: int, gap: float
) -> tuple[list[dict[str, Any]], int]:
    """``count`` instrumented applies: the pass run in this process (``bench.harness.passes``,
    the same state store and Git cache as the CLI's), its phases timed through
    ``ports.hooks`` and its calls to Git, the state store and Triton through the ports; per
    apply: wall time and seconds/calls per label."""
    probe = Probe()
    runs: list[dict[str, Any]] = []
    for _ in range(count):
        new = 2 if current == 1 else 1
        manifests.commit(new)
        probe.reset()
        started = time.monotonic()
        try:
            report = run_pass(manifests.source, manifests.settings, probe=probe)
        except ReconcileError as exc:
            raise BenchError(f"instrumented apply raised {type(exc).__name__}: {exc}") from exc
        wall = time.monotonic() - started
        if not report.ok:
            raise BenchError(f"instrumented apply to {new} failed: {report.result}")
        runs.append(
            {
                "from": current,
                "to": new,
                "wall": wall,
                "seconds": dict(probe.seconds),
                "calls": dict(probe.calls),
            }
        )
        current = new
        triton.settle(MODEL, current)
        time.sleep(gap)
    return runs, current


def profile_one(
    manifests: Manifests, triton: Index, current: int, out: Path
) -> tuple[dict[str, Any], int]:
    """One apply under cProfile (its calling thread only: the pools' threads are not seen)."""
    new = 2 if current == 1 else 1
    manifests.commit(new)
    profiler = cProfile.Profile()
    started = time.monotonic()
    profiler.enable()
    try:
        manifests.apply()
    finally:
        profiler.disable()
    wall = time.monotonic() - started
    profiler.dump_stats(out)
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("cumulative").print_stats(25)
    triton.settle(MODEL, new)
    return {"from": current, "to": new, "wall": wall, "top_cumulative": text.getvalue()}, new


# -- statistics ---------------------------------------------------------------------------------


def window_stats(
    samples: Sequence[Sample], windows: Sequence[tuple[float, float]]
) -> dict[str, Any]:
    inside = [s for s in samples if any(a <= s.started < b for a, b in windows)]
    ok = [s.seconds * 1000 for s in inside if s.error is None]
    span = sum(b - a for a, b in windows)
    return {
        "window_seconds": span,
        "requests": len(inside),
        "failures": sum(1 for s in inside if s.error is not None),
        "requests_per_second": len(inside) / span if span else None,
        "p50_ms": percentile(ok, 50),
        "p99_ms": percentile(ok, 99),
        "max_ms": max(ok) if ok else None,
    }


def summarize_breakdown(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median seconds and mean calls per label over the instrumented applies."""
    labels: list[str] = []
    for run in runs:
        labels += [label for label in run["seconds"] if label not in labels]
    rows = {
        label: {
            "median_seconds": statistics.median(r["seconds"].get(label, 0.0) for r in runs),
            "mean_calls": statistics.fmean(r["calls"].get(label, 0) for r in runs),
        }
        for label in labels
    }
    walls = [r["wall"] for r in runs]
    top = [label for label in labels if " > " not in label]
    accounted = statistics.median(sum(r["seconds"].get(t, 0.0) for t in top) for r in runs)
    # The work the hand floor does too: both Triton loads and the wait for READY, i.e. the
    # apply phase less the calls in it that the floor does not make (the interface check,
    # the smoke inference, the state store's journal). The sleeps between the verify's index
    # polls are in no call, so they count as the floor's, as the floor sleeps too.
    floor_calls = ("apply > triton load", "apply > triton model_state")

    def floor_work(seconds: dict[str, float]) -> float:
        other = sum(
            v for k, v in seconds.items() if k.startswith("apply > ") and k not in floor_calls
        )
        return seconds.get("apply", 0.0) - other

    overhead = [r["wall"] - floor_work(r["seconds"]) for r in runs]
    return {
        "applies": len(runs),
        "median_wall": statistics.median(walls),
        "rows": rows,
        "unaccounted_median_seconds": statistics.median(walls) - accounted,
        "overhead_beyond_floor_work": time_stats(overhead),
    }


# -- the run ----------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, Any]:
    # Other work on the machine skews both kinds of swap; say how busy it was.
    before = {"load_average": os.getloadavg(), "other_tritonservers": other_tritonservers()}
    with tempfile.TemporaryDirectory(prefix="bench-swap-") as tmp:
        root = Path(tmp)
        repository = write_model_repository(root / "models")
        server = LocalTriton(repository, log_file=root / "tritonserver.log")
        triton: Index | None = None
        load: LoadGenerator | None = None
        try:
            server.start()
            triton = Index(server.grpc_address)
            server_version = triton.server_version()
            manifests = Manifests(root, server, repository, args.smoke)
            manifests.commit(1)
            manifests.apply()  # deploy echo 1; also warms the Git mirror and the imports
            triton.settle(MODEL, 1)
            config = triton.config(MODEL)  # what the reconciler reads to build its loads

            load = LoadGenerator(server.grpc_address, MODEL, threads=args.threads).start()
            load.wait_for_samples(100)
            time.sleep(0.5)
            baseline = (time.monotonic(), time.monotonic() + args.baseline_seconds)
            time.sleep(args.baseline_seconds)

            swaps: list[Swap] = []
            current = 1

            def do(kind: str, round_: int, new: int) -> None:
                nonlocal current
                if kind == "reconciler":
                    swap = reconciler_swap(manifests, triton, round_, current, new)
                else:
                    swap = hand_swap(triton, config, args.poll_interval, round_, current, new)
                current = new
                swaps.append(swap)
                triton.settle(MODEL, current)
                time.sleep(args.gap)
                print(
                    f"  round {round_:>2} {kind:<10} {swap.source}->{swap.target} "
                    f"{swap.seconds:7.3f} s",
                    file=sys.stderr,
                )

            # Warm-up round (not counted): both kinds once, as round 0 is done below.
            for kind, new in (("reconciler", 2), ("hand", 1)):
                do(kind, -1, new)
            swaps.clear()

            for round_ in range(args.swaps):
                # ABBA: even rounds R 1->2, H 2->1; odd rounds H 1->2, R 2->1.
                order = ("reconciler", "hand") if round_ % 2 == 0 else ("hand", "reconciler")
                do(order[0], round_, 2)
                do(order[1], round_, 1)

            measured_until = time.monotonic()
            runs, current = breakdown(manifests, triton, args.breakdown_swaps, current, args.gap)
            args.output.parent.mkdir(parents=True, exist_ok=True)
            profile, current = profile_one(
                manifests, triton, current, args.output.with_suffix(".prof")
            )
            samples = load.stop()
            own = server.process.pid if server.process else None
            after = {
                "load_average_with_this_run": os.getloadavg(),
                "other_tritonservers": other_tritonservers(own),
            }
            load = None
        except VOID as exc:
            raise BenchError(f"{exc}\ntritonserver log tail:\n{server.log_tail()}") from exc
        finally:
            if load is not None:
                load.stop()
            if triton is not None:
                triton.close()
            server.stop()

    return report(
        args,
        machine(server_version) | {"before_run": before, "at_end": after},
        samples,
        baseline,
        swaps,
        measured_until,
        runs,
        profile,
    )


def report(
    args: argparse.Namespace,
    machine_info: dict[str, Any],
    samples: list[Sample],
    baseline: tuple[float, float],
    swaps: list[Swap],
    measured_until: float,
    runs: list[dict[str, Any]],
    profile: dict[str, Any],
) -> dict[str, Any]:
    rec = [s for s in swaps if s.kind == "reconciler"]
    hand = [s for s in swaps if s.kind == "hand"]
    rec_times = [s.seconds for s in rec]
    hand_times = [s.seconds for s in hand]
    by_round = {s.round: s for s in hand}
    paired = [r.seconds / by_round[r.round].seconds for r in rec]
    interval = bootstrap_ratio([(r.seconds, by_round[r.round].seconds) for r in rec])
    measured = [s for s in samples if baseline[0] <= s.started < measured_until]
    failures = [s for s in samples if s.error is not None]
    ratio_median = statistics.median(rec_times) / statistics.median(hand_times)
    ratio_mean = statistics.fmean(rec_times) / statistics.fmean(hand_times)
    hand_parts = {
        part: time_stats([s.parts[part] for s in hand])
        for part in ("load_both", "wait_ready", "load_new")
    }
    return {
        "benchmark": "swap_under_load",
        "command": "python -m bench.swap_under_load " + " ".join(sys.argv[1:]),
        "settings": {
            "swaps": args.swaps,
            "threads": args.threads,
            "baseline_seconds": args.baseline_seconds,
            "gap_seconds": args.gap,
            "hand_poll_interval": args.poll_interval,
            "smoke": args.smoke,
            "breakdown_swaps": args.breakdown_swaps,
        },
        "machine": machine_info,
        "code": provenance(),
        "load": {
            "baseline": window_stats(samples, [baseline]),
            "during_reconciler_applies": window_stats(samples, [s.window for s in rec]),
            "during_hand_swaps": window_stats(samples, [s.window for s in hand]),
            "whole_measured_run": window_stats(measured, [(baseline[0], measured_until)]),
            "failures_whole_run_including_breakdown": len(failures),
            "failure_messages": sorted({s.error or "" for s in failures})[:5],
            "versions_seen": sorted({s.version for s in samples if s.version is not None}),
        },
        "swap_seconds": {
            "reconciler_apply": time_stats(rec_times),
            "hand_floor": time_stats(hand_times),
            "hand_floor_parts": hand_parts,
        },
        "ratio": {
            "median": ratio_median,
            "mean": ratio_mean,
            "mean_of_paired_ratios": statistics.fmean(paired),
            "median_95pct_interval_paired_bootstrap": interval,
            "target": TARGET_RATIO,
        },
        "targets_met": {
            "zero_failures": not failures,
            "ratio_at_most_1.1": ratio_median <= TARGET_RATIO,
        },
        "swaps": [asdict(s) for s in swaps],
        "breakdown": summarize_breakdown(runs) if runs else None,
        "breakdown_runs": runs,
        "profile": profile,
    }


# -- output -----------------------------------------------------------------------------------


def markdown(result: dict[str, Any]) -> str:
    """The terminal report (``bench/reports/swap_under_load.md``, fixed-width text): client
    load per window, swap times and ratio, breakdown."""
    return render("swap_under_load", result, model=MODEL, fixed=fixed, machine_line=machine_line)


def print_result(result: dict[str, Any]) -> None:
    print(markdown(result))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.swap_under_load",
        description="Zero-downtime swaps under load: reconciler apply vs Triton's own load "
        "calls done by hand, on one real tritonserver.",
    )
    parser.add_argument("--swaps", type=int, default=10, help="swaps of each kind (default 10)")
    parser.add_argument("--threads", type=int, default=4, help="client threads (default 4)")
    parser.add_argument(
        "--baseline-seconds", type=float, default=3.0, help="baseline window (default 3)"
    )
    parser.add_argument(
        "--gap", type=float, default=0.5, help="pause after each swap once settled (default 0.5)"
    )
    parser.add_argument(
        "--poll-interval",
        type=float,
        default=0.05,
        help="hand floor's index poll interval while waiting for READY (default 0.05, the "
        "reconciler's own)",
    )
    parser.add_argument(
        "--breakdown-swaps",
        type=int,
        default=6,
        help="extra instrumented applies for the time breakdown (default 6; 0 to skip)",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="give the deployment a smoke case (the reconciler then also infers once per swap; "
        "the hand floor does not)",
    )
    parser.add_argument(
        "--output", type=Path, default=RESULTS / "swap_under_load.json", help="JSON result"
    )
    parser.add_argument(
        "--report", type=Path, metavar="JSON", help="print the report again from a saved result"
    )
    args = parser.parse_args(argv)
    if args.swaps < 1 or args.threads < 1 or args.baseline_seconds <= 0:
        parser.error("--swaps and --threads must be at least 1, --baseline-seconds positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.report is not None:
        print_result(read_json(args.report))
        return 0
    result = measured(lambda: run(args))
    if result is None:
        return 1
    print_result(result)
    write_json(args.output, result)
    print(f"\nJSON result: {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
