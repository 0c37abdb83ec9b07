"""Rollback latency under load: from the failing evaluation to version 1 answering again.

One real tritonserver (``LocalTriton``, from the nvidia-pytriton wheel) serves the test model
``echo`` (OUTPUT0 = INPUT0 * version); version 4 fails 40% of its requests. The ModelDeployment
has a post-swap analysis (interval 1s, duration 10s, noTraffic wait, success rate at least
0.95), read from the server's own metrics endpoint. Version 1 is deployed under load first;
then a ``LoadGenerator`` sends unversioned requests from several threads for the whole run
while each rollout commits ``versions: [4]`` to a bare Git remote and runs the reconciler's
``reconcile`` in-process (apply mode). Triton answers unversioned requests with the highest
READY version, so version 4 takes the traffic from its load until the revert. Every failed
spec is held until a commit changes it, so successive rollouts alternate a harmless
``failureLimit: 0`` (present or absent): each commit is a fresh rollout from 1 to 4.

Per reverted rollout, all on the ``time.monotonic()`` clock of this one process:

* reconciler: ``ChangeResult.rollback_seconds``, from the failing evaluation (the analyze
  step's ``ended_at``) until the in-place load of version 1 alone returned; split into the
  gap before that load, the load call, and the verify poll that follows it.
* client: from the failing evaluation to the start of the final run of version-1 answers (the
  first request started after that instant from which on every request is answered by
  version 1), and the last request answered by version 4 or failed, relative to that instant.
* failed requests in the rollout's window (load of 4 to the next rollout), before and after
  the failing evaluation: all of them come from version 4.
* time to detection: the analyze step's duration against the configured interval, and how
  many evaluations it took.

Target: median client-observed rollback under 50 ms. Then, for comparison, a few reverts done
by hand with tritonclient (the floor): load [1, 4], wait until 4 is READY, let it take traffic
for one interval, then time the same in-place load of [1] and the same READY poll.

    python -m bench.rollback_latency [--rollouts N] [--threads N] [--floor-reverts N]
    python -m bench.rollback_latency --report JSON      # the report again, from a saved result

Every process started here (one tritonserver and its backend stubs) is stopped in ``finally``.
"""

from __future__ import annotations

import argparse
import bisect
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.harness.cli import measured, quiet_reconciler_log, read_json, write_json
from bench.harness.errors import VOID, BenchError
from bench.harness.provenance import machine, provenance
from bench.harness.report import fixed, machine_line, render
from bench.harness.rollouts import ManifestRemote, backend_stubs, masked
from bench.harness.stats import summary
from bench.harness.triton import Index
from reconciler.model.analysis import RolloutVerdict
from reconciler.model.plan import Action
from reconciler.model.reports import PassReport
from reconciler.model.results import ChangeResult, Outcome
from testkit.loadgen import LoadGenerator, Sample
from testkit.local_triton import LocalTriton
from testkit.manifests import write_model_repository

MODEL = "echo"
SERVER = "edge-a"
GOOD, BAD = 1, 4
BAD_ERROR = f"version {BAD} failed request"  # the test model's own failures
INTERVAL_S = 1.0
DURATION_S = 10.0
TARGET_MS = 50.0
RESULTS = Path(__file__).parent / "results"


def deployment_doc(versions: list[int], failure_limit: bool) -> str:
    """The analysed ModelDeployment; ``failure_limit`` adds the default ``failureLimit: 0``
    (same behaviour, different spec: a held spec is never tried again)."""
    return (
        "apiVersion: triton-gitops.dev/v1alpha1\n"
        "kind: ModelDeployment\n"
        "metadata:\n"
        f"  name: {MODEL}\n"
        "spec:\n"
        "  servers:\n"
        f"    names: [{SERVER}]\n"
        f"  versions: [{', '.join(map(str, versions))}]\n"
        "  verify:\n"
        "    analysis:\n"
        f"      interval: {INTERVAL_S:g}s\n"
        f"      duration: {DURATION_S:g}s\n"
        "      noTraffic: wait\n"
        + ("      failureLimit: 0\n" if failure_limit else "")
        + "      checks:\n"
        "        - name: success-rate\n"
        "          successRate: {min: 0.95}\n"
    )


# -- the server, as the benchmark sees it ------------------------------------------------------


def settle(triton: Index) -> dict[int, str]:
    """Version 1 alone READY; version 4 may stay UNLOADING (see ``Index.settle``)."""
    return triton.settle(MODEL, GOOD, stuck_unloading=(BAD,))


def hand_revert(triton: Index, poll_interval: float) -> dict[str, float]:
    """The floor: [1, 4] loaded and serving; then load [1] in place and poll the index
    until 4 is no longer READY (what the reconciler's revert load and verify do).

    The config is read before the timed part, as the reconciler reads it at observe time.
    """
    triton.load(MODEL, triton.config(MODEL), [GOOD, BAD])
    deadline = time.monotonic() + 120
    while BAD not in triton.ready(MODEL):
        if time.monotonic() > deadline:
            raise BenchError(f"version {BAD} did not become READY: {triton.states(MODEL)}")
        time.sleep(poll_interval)
    time.sleep(INTERVAL_S)  # version 4 takes the traffic for one analysis interval
    config = triton.config(MODEL)
    t0 = time.monotonic()
    triton.load(MODEL, config, [GOOD])
    t1 = time.monotonic()
    while True:
        ready = triton.ready(MODEL)
        if GOOD in ready and BAD not in ready:
            break
        time.sleep(poll_interval)
    t2 = time.monotonic()
    return {"started": t0, "load_ended": t1, "load": t1 - t0, "verify": t2 - t1}


class Manifests:
    """The manifest remote; ``reconcile`` runs in this process against it."""

    def __init__(self, root: Path, triton: LocalTriton, repository: Path) -> None:
        self.remote = ManifestRemote(root, triton, repository, SERVER, "echo.yaml")

    def commit(self, versions: list[int], failure_limit: bool) -> str:
        return self.remote.commit(deployment_doc(versions, failure_limit), f"echo {versions}")

    def apply(self) -> PassReport:
        return self.remote.apply()


# -- one rollout --------------------------------------------------------------------------------


@dataclass
class Rollout:
    index: int  # negative: a warm-up rollout, not counted
    revision: str
    apply_started: float  # time.monotonic(), comparable with Sample.started
    apply_seconds: float
    window_end: float  # the rollout's requests are those started before this
    load_ended: float  # the load of [1, 4] returned: version 4 can take traffic
    detected_at: float  # the failing evaluation (the analyze step's ended_at)
    analysis_seconds: float
    evaluations: int
    failing_at: float  # the failing evaluation, seconds since the analysis started
    success_rate: float | None  # the failing evaluation's success rate of version 4
    rollback_seconds: float  # ChangeResult.rollback_seconds
    gap_seconds: float  # failing evaluation -> the revert load was sent
    revert_load_seconds: float
    revert_verify_seconds: float
    revert_done: float  # the revert's verify returned


def read_rollout(index: int, revision: str, change: ChangeResult) -> dict[str, Any]:
    """The reconciler's own figures for a reverted rollout; BenchError for anything else."""
    analysis = change.analysis
    if (
        change.outcome is not Outcome.REVERTED
        or analysis is None
        or analysis.ok
        or analysis.verdict is not RolloutVerdict.FAILED
        or change.rollback_seconds is None
        or len(change.revert) != 2
    ):
        raise BenchError(
            f"rollout {index} ({revision[:12]}) was not reverted by its analysis: outcome "
            f"{change.outcome}, verdict {analysis.verdict if analysis else None}, error "
            f"{change.error}"
        )
    load = next(r for r in change.steps if r.step.action is Action.LOAD)
    revert_load, revert_verify = change.revert
    last = analysis.evaluations[-1]
    rate = next((r.value for r in last.results if r.check == "success-rate"), None)
    return {
        "load_ended": load.ended_at,
        "detected_at": analysis.ended_at,
        "analysis_seconds": analysis.seconds,
        "evaluations": len(analysis.evaluations),
        "failing_at": last.at,
        "success_rate": rate,
        "rollback_seconds": change.rollback_seconds,
        "gap_seconds": revert_load.ended_at - revert_load.seconds - analysis.ended_at,
        "revert_load_seconds": revert_load.seconds,
        "revert_verify_seconds": revert_verify.seconds,
        "revert_done": revert_verify.ended_at,
    }


def bad_rollout(manifests: Manifests, triton: Index, index: int, gap: float) -> Rollout:
    """Commit [4] (a spec the last one was not), apply, check it went back to 1, settle."""
    revision = manifests.commit([BAD], failure_limit=index % 2 == 0)
    started = time.monotonic()
    report = manifests.apply()
    seconds = time.monotonic() - started
    if report.result is None or len(report.result.changes) != 1:
        raise BenchError(f"rollout {index}: expected one change, got {report.plan}")
    figures = read_rollout(index, revision, report.result.changes[0])
    if triton.ready(MODEL) != {GOOD}:
        raise BenchError(
            f"rollout {index}: after the revert the server serves {triton.ready(MODEL)}"
        )
    settle(triton)
    time.sleep(gap)  # version 1 answers alone for a while: the end of the final run
    rollout = Rollout(index, revision, started, seconds, time.monotonic(), **figures)
    print(
        f"  rollout {index:>2} {revision[:8]}  detected after {rollout.analysis_seconds:6.3f}"
        f" s ({rollout.evaluations} eval, success rate {rollout.success_rate or 0:.2f})  "
        f"rollback {rollout.rollback_seconds * 1000:7.1f} ms  apply {seconds:6.2f} s",
        file=sys.stderr,
    )
    return rollout


# -- what the clients saw -----------------------------------------------------------------------


def client_view(
    samples: Sequence[Sample], starts: Sequence[float], since: float, t0: float, until: float
) -> dict[str, Any]:
    """Requests started in [since, until): around ``t0``, the instant the revert began.

    ``samples`` sorted by start, ``starts`` their start times. The final run of version-1
    answers is the longest suffix of the window answered by version 1 alone.
    """
    window = samples[bisect.bisect_left(starts, since) : bisect.bisect_left(starts, until)]
    bad = [i for i, s in enumerate(window) if s.version != GOOD]
    final_run = window[bad[-1] + 1 :] if bad else window
    first_good = next((s for s in final_run if s.started >= t0), None)
    if first_good is None:
        raise BenchError("no request answered by version 1 at the end of a rollout's window")
    last_bad = window[bad[-1]] if bad else None
    failed = [s for s in window if s.error is not None]
    return {
        "requests": len(window),
        "answered_by_bad": sum(1 for s in window if s.version == BAD),
        "failed": len(failed),
        "failed_before_detection": sum(1 for s in failed if s.started < t0),
        "failed_after_detection": sum(1 for s in failed if s.started >= t0),
        "failed_other_than_bad": sum(1 for s in failed if BAD_ERROR not in (s.error or "")),
        "first_bad_before_detection": t0 - window[bad[0]].started if bad else None,
        "client_rollback": first_good.started - t0,
        "last_bad_started": last_bad.started - t0 if last_bad else None,
        "last_bad_ended": last_bad.started + last_bad.seconds - t0 if last_bad else None,
        "failure_messages": sorted({masked(s.error or "") for s in failed}),
    }


# -- the run ----------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-rollback-") as tmp:
        root = Path(tmp)
        repository = write_model_repository(root / "models")
        server = LocalTriton(repository, log_file=root / "tritonserver.log")
        triton: Index | None = None
        deploy_load: LoadGenerator | None = None
        load: LoadGenerator | None = None
        try:
            server.start()
            triton = Index(server.grpc_address)
            machine_info = machine(triton.server_version()) | {
                "load_average_at_start": os.getloadavg()
            }
            manifests = Manifests(root, server, repository)

            # Deploy 1, analysed too: with noTraffic wait it needs clients already calling.
            manifests.commit([GOOD], failure_limit=False)
            deploy_load = LoadGenerator(server.grpc_address, MODEL, threads=2).start()
            deploy_load.wait_for_samples(20, timeout=10)  # nothing serves yet: these fail
            started = time.monotonic()
            deployed = manifests.apply()
            deploy_seconds = time.monotonic() - started
            deploy_load.stop()
            deploy_load = None
            if not deployed.ok:
                raise BenchError(f"deploying {GOOD} failed: {deployed.result}")
            settle(triton)
            print(f"  deployed {GOOD} in {deploy_seconds:.1f} s", file=sys.stderr)

            load = LoadGenerator(server.grpc_address, MODEL, threads=args.threads).start()
            load.wait_for_samples(300)
            for index in range(-args.warmup, 0):  # not counted: first loads of 4 warm up
                bad_rollout(manifests, triton, index, args.gap)
            measured_from = time.monotonic()
            time.sleep(args.gap)
            rollouts = [
                bad_rollout(manifests, triton, index, args.gap) for index in range(args.rollouts)
            ]
            floors: list[dict[str, float]] = []
            for _ in range(args.floor_reverts):
                floor = hand_revert(triton, args.poll_interval)
                settle(triton)
                time.sleep(args.gap)
                floor["window_end"] = time.monotonic()
                floors.append(floor)
            samples = load.stop()
            load = None
            assert server.process is not None
            left = {
                "states": triton.states(MODEL),
                "backend_stubs": backend_stubs(server.process.pid, MODEL),
            }
        except VOID as exc:
            RESULTS.mkdir(parents=True, exist_ok=True)
            kept = RESULTS / "rollback_latency-tritonserver.log"
            if server.log_file is not None and server.log_file.exists():
                shutil.copyfile(server.log_file, kept)
            raise BenchError(
                f"{exc}\ntritonserver log tail:\n{server.log_tail(8)}\nwhole log: {kept}"
            ) from exc
        finally:
            for generator in (deploy_load, load):
                if generator is not None:
                    generator.stop()
            if triton is not None:
                triton.close()
            server.stop()

    return report(
        args, machine_info, deploy_seconds, samples, measured_from, rollouts, floors, left
    )


def report(
    args: argparse.Namespace,
    machine_info: dict[str, Any],
    deploy_seconds: float,
    samples: list[Sample],
    measured_from: float,
    rollouts: list[Rollout],
    floors: list[dict[str, float]],
    left: dict[str, Any],
) -> dict[str, Any]:
    ordered = sorted((s for s in samples if s.started >= measured_from), key=lambda s: s.started)
    starts = [s.started for s in ordered]
    per_rollout = []
    windows = []
    previous_end = measured_from
    for rollout in rollouts:
        view = client_view(
            ordered, starts, rollout.apply_started, rollout.detected_at, rollout.window_end
        )
        per_rollout.append(asdict(rollout) | {"client": view})
        windows.append((rollout.apply_started, rollout.window_end))
        previous_end = rollout.window_end
    floor_views: list[dict[str, Any]] = []
    for floor in floors:
        view = client_view(ordered, starts, previous_end, floor["started"], floor["window_end"])
        floor_views.append(floor | {"client": view})
        previous_end = floor["window_end"]
    counted_until = rollouts[-1].window_end
    in_windows = [s for s in ordered if any(a <= s.started < b for a, b in windows)]
    outside = [
        s
        for s in ordered
        if s.started < counted_until and not any(a <= s.started < b for a, b in windows)
    ]
    views = [r["client"] for r in per_rollout]
    failures = sum(v["failed"] for v in views)
    run_seconds = counted_until - measured_from
    client = summary([v["client_rollback"] for v in views], 1000)
    assert client is not None
    return {
        "benchmark": "rollback_latency",
        "command": "python -m bench.rollback_latency " + " ".join(sys.argv[1:]),
        "settings": {
            "rollouts": args.rollouts,
            "warmup_rollouts": args.warmup,
            "threads": args.threads,
            "gap_seconds": args.gap,
            "floor_reverts": args.floor_reverts,
            "floor_poll_interval": args.poll_interval,
            "analysis": {
                "interval_s": INTERVAL_S,
                "duration_s": DURATION_S,
                "noTraffic": "wait",
                "checks": "success-rate min 0.95",
                "metrics": "Triton's metrics endpoint, scraped directly",
            },
        },
        "machine": machine_info | {"load_average_at_end": os.getloadavg()},
        "code": provenance(),
        "deploy_seconds": deploy_seconds,
        "load": {
            "requests_per_second": len(in_windows + outside) / run_seconds,
            "requests_in_rollout_windows": len(in_windows),
            "requests_outside_rollouts": len(outside),
            "failures_outside_rollouts": sum(1 for s in outside if s.error is not None),
            "versions_seen": sorted({s.version for s in ordered if s.version is not None}),
        },
        "rollback_ms": {
            "reconciler": summary([r.rollback_seconds for r in rollouts], 1000),
            "reconciler_parts": {
                "gap_before_revert_load": summary([r.gap_seconds for r in rollouts], 1000),
                "revert_load_call": summary([r.revert_load_seconds for r in rollouts], 1000),
                "revert_verify_poll": summary([r.revert_verify_seconds for r in rollouts], 1000),
                "until_verify_done": summary(
                    [r.revert_done - r.detected_at for r in rollouts], 1000
                ),
            },
            "client": client,
            "client_last_bad_started": summary([v["last_bad_started"] for v in views], 1000),
            "client_last_bad_ended": summary([v["last_bad_ended"] for v in views], 1000),
        },
        "failed_requests": {
            "total": failures,
            "before_detection": sum(v["failed_before_detection"] for v in views),
            "after_detection": sum(v["failed_after_detection"] for v in views),
            "not_from_version_4": sum(v["failed_other_than_bad"] for v in views),
            "answered_by_version_4": sum(v["answered_by_bad"] for v in views),
            "per_rollout": summary([v["failed"] for v in views]),
            "messages": sorted({m for v in views for m in v["failure_messages"]})[:3],
        },
        "detection": {
            "interval_s": INTERVAL_S,
            "analysis_step_s": summary([r.analysis_seconds for r in rollouts]),
            "failing_evaluation_at_s": summary([r.failing_at for r in rollouts]),
            "evaluations": summary([r.evaluations for r in rollouts]),
            "beyond_evaluations_times_interval_ms": summary(
                [r.analysis_seconds - r.evaluations * INTERVAL_S for r in rollouts], 1000
            ),
            "version_4_exposed_before_detection_s": summary(
                [v["first_bad_before_detection"] for v in views]
            ),
            "failing_success_rate": summary([r.success_rate for r in rollouts]),
        },
        "apply_seconds": summary([r.apply_seconds for r in rollouts]),
        "floor_ms": {
            "reverts": len(floors),
            "load_call": summary([f["load"] for f in floors], 1000),
            "verify_poll": summary([f["verify"] for f in floors], 1000),
            "client": summary([f["client"]["client_rollback"] for f in floor_views], 1000),
            "client_last_bad_started": summary(
                [f["client"]["last_bad_started"] for f in floor_views], 1000
            ),
        },
        "left_on_the_server": left,
        "targets_met": {"client_median_under_50_ms": client["median"] < TARGET_MS},
        "rollouts": per_rollout,
        "floors": floor_views,
    }


# -- output -----------------------------------------------------------------------------------


def markdown(result: dict[str, Any]) -> str:
    """The terminal report (``bench/reports/rollback_latency.md``, fixed-width text)."""
    return render(
        "rollback_latency",
        result,
        model=MODEL,
        good=GOOD,
        bad=BAD,
        target_ms=TARGET_MS,
        fixed=fixed,
        machine_line=machine_line,
    )


def print_result(result: dict[str, Any]) -> None:
    print(markdown(result))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.rollback_latency",
        description="Rollback latency under load: from the failing analysis evaluation to "
        "unversioned requests reaching the old version again, on one real tritonserver.",
    )
    parser.add_argument(
        "--rollouts", type=int, default=20, help="bad rollouts measured (default 20)"
    )
    parser.add_argument("--threads", type=int, default=4, help="client threads (default 4)")
    parser.add_argument(
        "--warmup", type=int, default=1, help="bad rollouts before measuring (default 1)"
    )
    parser.add_argument(
        "--gap",
        type=float,
        default=0.5,
        help="pause after each revert once settled: version 1 answers alone (default 0.5)",
    )
    parser.add_argument(
        "--floor-reverts",
        type=int,
        default=5,
        help="reverts done by hand with tritonclient afterwards, for comparison (default 5)",
    )
    parser.add_argument(
        "--poll-interval",
        type=float,
        default=0.05,
        help="hand floor's index poll interval (default 0.05, the reconciler's own)",
    )
    parser.add_argument(
        "--output", type=Path, default=RESULTS / "rollback_latency.json", help="JSON result"
    )
    parser.add_argument(
        "--report", type=Path, metavar="JSON", help="print the report again from a saved result"
    )
    args = parser.parse_args(argv)
    if args.rollouts < 1 or args.threads < 1 or args.warmup < 0 or args.floor_reverts < 0:
        parser.error("--rollouts and --threads must be at least 1, the others not negative")
    if args.gap <= 0:
        parser.error("--gap must be positive (the final run of version 1 needs requests)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.report is not None:
        print_result(read_json(args.report))
        return 0
    quiet_reconciler_log()  # one JSON alert line per reverted rollout
    result = measured(lambda: run(args))
    if result is None:
        return 1
    print_result(result)
    write_json(args.output, result)
    print(f"\nJSON result: {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
