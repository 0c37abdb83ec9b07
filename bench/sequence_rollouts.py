"""Good rollouts of a sequence model through a real Envoy, by the reconciler (issue 44's
goals): no client sequence broken across ``--rollouts`` of them, canary and blue-green in
turn, and how long each server's drain waited against the lengths of the sequences sent.

Two real tritonservers serve the sequence model ``counter`` (a running sum per sequence,
times the version): pool ``stable`` = [a], pool ``canary`` = [c], behind one Envoy whose
route the reconciler keeps by RDS with ``spec.sequenceAffinity`` (mechanism ``session``).
``--threads`` client threads send sequences of 2 to 40 requests (``--pause`` seconds apart)
through Envoy all along, each sending the session headers of its START's answer back. Each
rollout is ``triton-gitops apply`` of the next commit: versions 1 and 2 in turn, two canary
rollouts (steps 10%, 50%: then the drain phase), then two blue-green ones, and so on; each
with an analysis (probes on: whole sequences of their own).

Per rollout: its exit code, its wall time, each drain step's seconds (the old pool's waits
for the sequences in flight there; the idle window is the config's 5 s
max_sequence_idle_microseconds), the client sequences that started or broke during it, and
at each canary weight strictly between 0 and 100% (Envoy's runtime, read every 50 ms) the
share of new sequences the canary took, against max(3 SE, 2 pp) of the weight.

With ``--walk``, issue 44 point 5 in one run instead: the canary 10% -> 50% -> 100%, a
blue-green switch to the other pool, the switch back, then a version the on-call aborts
1.5 s into the canary's 50% (``testkit.on_call.AbortAt``): no client sequence may break
but in the last, where the sequences broken after the abort are counted beside what the
switch back's drain says it cut.

    python -m bench.sequence_rollouts [--rollouts 20 | --walk] [--threads 8] [--pause 0.02]
        [--slots 8] [--output PATH]

Every process started here (two tritonservers, one Envoy) is stopped in finally.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.harness.provenance import host, provenance
from testkit.cli_run import Reconciler
from testkit.envoy import POOL_HEADER, LocalEnvoy, pool_weight
from testkit.local_triton import LocalTriton
from testkit.manifests import (
    ManifestRepo,
    router_doc,
    sequence_deployment_doc,
    server_doc,
    write_model_repository,
)
from testkit.on_call import AbortAt
from testkit.sequences import Sequence, SequenceLoad, broken_between, started_between

HEADER = "x-sequence-id"  # the Router's spec.sequenceAffinity.header
STRATEGIES = ("canary", "canary", "blueGreen", "blueGreen")  # in turn, rollout by rollout


def _router(envoy: LocalEnvoy) -> str:
    pools = {"stable": ["a"], "canary": ["c"]}
    return router_doc(envoy.admin_url, pools, routes_file=envoy.routes_file, sequence_header=HEADER)


def _traffic(strategy: str) -> str:
    if strategy.startswith("canary"):
        steps = "10%, 50%, 100%" if strategy == "canary to 100%" else "10%, 50%"
        return (
            "{router: edge, strategy: canary, stablePool: stable, canaryPool: canary, "
            f"steps: [{steps}]}}"
        )
    return "{router: edge, strategy: blueGreen, pools: [stable, canary]}"


# Issue 44 point 5 in one run (``--walk``): (version, strategy, aborted by the on-call at
# the canary's 50%). The canary to 100%, a blue-green switch to the other pool, the switch
# back, then a version reverted while it carries half the clients.
WALK = (
    (2, "canary to 100%", False),
    (1, "blueGreen", False),
    (2, "blueGreen", False),
    (1, "canary", True),
)


def _rollouts(count: int, walk: bool) -> list[tuple[int, str, bool]]:
    if walk:
        return list(WALK)
    return [(2 if n % 2 == 0 else 1, STRATEGIES[n % len(STRATEGIES)], False) for n in range(count)]


def _cut(report: dict[str, Any]) -> list[Any]:
    """What each switch back's drain cut (``model.results.Cut``), as apply's JSON says."""
    return [
        r.get("cut")
        for c in report.get("result", {}).get("changes", [])
        for r in c.get("revert", [])
        if r.get("action") == "drain"
    ]


def _counter(version: int, strategy: str) -> str:
    return sequence_deployment_doc(version, _traffic(strategy), duration="3s", drain="120s")


class CanaryWeights:
    """Envoy's runtime weight of pool canary (of 10,000), read every 50 ms while the
    rollouts run: each change with the time it was first seen."""

    def __init__(self, admin_url: str) -> None:
        self.admin_url = admin_url
        self.changes: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> CanaryWeights:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                weight: int | None = pool_weight(self.admin_url, "canary")
            except (OSError, ValueError):
                weight = None
            if weight is not None and (not self.changes or self.changes[-1][1] != weight):
                self.changes.append((time.monotonic(), weight))
            time.sleep(0.05)


SETTLE = 0.2  # seconds after a weight change before new sequences are counted against it


def weight_shares(
    sequences: list[Sequence],
    changes: list[tuple[float, int]],
    new: int,
    start: float,
    end: float,
) -> list[dict[str, Any]]:
    """Per period of one canary weight strictly between 0 and 100% within [start, end)
    (at least 1 s and 20 sequences): the share of the sequences started in it whose START
    the new version answered (during the canary's steps it runs on the canary pool alone;
    at 0 and 100% the stable pool may already run it too), against the weight, within
    max(3 standard errors, 2 points) as issue 44 asks."""
    bounds = [*changes, (math.inf, -1)]
    periods = []
    for (began, weight), (ended, _) in itertools.pairwise(bounds):
        lo, hi = max(began + SETTLE, start), min(ended, end)
        if hi - lo < 1.0 or not 0 < weight < 10_000:
            continue
        started = [s for s in started_between(sequences, lo, hi) if s.scale is not None]
        if len(started) < 20:
            continue
        w = weight / 10_000
        share = sum(1 for s in started if s.scale == new) / len(started)
        bound = max(3 * math.sqrt(w * (1 - w) / len(started)), 0.02)
        periods.append(
            {"weight": w, "sequences": len(started), "share": round(share, 4),
             "within": abs(share - w) <= bound, "bound": round(bound, 4)}
        )  # fmt: skip
    return periods


def _drains(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"server": c["server"], "seconds": s["seconds"], "ok": s["ok"]}
        for c in report.get("result", {}).get("changes", [])
        for s in c["steps"]
        if s["action"] == "drain"
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=20)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--pause", type=float, default=0.02, help="seconds between requests")
    parser.add_argument("--output", type=Path)
    parser.add_argument(
        "--slots", type=int, default=8,
        help="sequences a server holds at once (the counter's max_batch_size, Direct): at "
        "least the client sequences in flight; 50 on 8 slots broke half of them at rest, "
        "with no rollout and no router (Triton 2.51's backlog)",
    )  # fmt: skip
    parser.add_argument(
        "--walk", action="store_true",
        help="issue 44 point 5 instead of --rollouts: the canary to 100%%, a blue-green switch, "
        "the switch back, then a version aborted by the on-call at 50%% (cuts counted)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    planned = _rollouts(args.rollouts, args.walk)
    rollouts: list[dict[str, Any]] = []
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-seq-rollouts-") as scratch:
        root = Path(scratch)
        repository = write_model_repository(root / "models")
        config = repository / "counter" / "config.pbtxt"
        config.write_text(
            config.read_text().replace("max_batch_size: 8", f"max_batch_size: {args.slots}")
        )
        a = LocalTriton(repository, log_file=root / "a.log")
        c = LocalTriton(repository, log_file=root / "c.log")
        envoy: LocalEnvoy | None = None
        try:
            a.start()
            c.start()
            pools = {"stable": [a.grpc_address], "canary": [c.grpc_address]}
            envoy = LocalEnvoy.of(root / "envoy", pools, {"stable": 10_000}, rds=True).start()
            manifests = ManifestRepo(root / "manifests")
            for name, server in (("a", a), ("c", c)):
                doc = server_doc(name, server.grpc_address, repository, metrics=server.metrics_url)
                manifests.write(f"servers/{name}.yaml", doc)
            manifests.write("router.yaml", _router(envoy))
            manifests.write("counter.yaml", _counter(1, planned[0][1]))
            manifests.commit("counter 1")
            reconciler = Reconciler(manifests.url, root / "reconciler")
            first = reconciler.apply()
            if first.code != 0:
                print(first.explain(), file=sys.stderr)
                return 1
            load = SequenceLoad(
                envoy.address, threads=args.threads, pause=args.pause, sessions=True,
                headers=(HEADER, POOL_HEADER),
            )  # fmt: skip
            with load, CanaryWeights(envoy.admin_url) as weights:
                time.sleep(1.0)
                for number, (version, strategy, aborted) in enumerate(planned):
                    manifests.write("counter.yaml", _counter(version, strategy))
                    manifests.commit(f"counter {version} ({strategy})")
                    start = time.monotonic()
                    state = root / "reconciler" / "state.db"
                    with contextlib.ExitStack() as on_call:
                        abort = (
                            on_call.enter_context(AbortAt(envoy.admin_url, state, "counter"))
                            if aborted
                            else None
                        )
                        applied = reconciler.apply("--output", "json")
                    end = time.monotonic()
                    try:
                        report = json.loads(applied.out)
                    except ValueError:
                        report = {}
                    sequences = load.snapshot()
                    drains = _drains(report)
                    row: dict[str, Any] = {
                        "rollout": number + 1,
                        "version": version,
                        "strategy": strategy,
                        "code": applied.code,
                        "seconds": round(end - start, 1),
                        "drains": drains,
                        "sequences_started": len(list(started_between(sequences, start, end))),
                        "broken": len(broken_between(sequences, start, end)),
                        # When each broke, in the rollout's seconds (the first 20).
                        "broken_detail": [
                            {
                                "started": round(q.started - start, 2),
                                "broke": round((q.broken_at or end) - start, 2),
                                "scale": q.scale,
                                "sent": q.sent,
                                "length": q.length,
                                "why": (q.broken or "")[:70],
                            }
                            for q in broken_between(sequences, start, end)[:20]
                        ],
                        "weights": weight_shares(sequences, weights.changes, version, start, end),
                    }
                    if abort is not None:
                        given = abort.given if abort.given is not None else end
                        row["abort_after_seconds"] = round(given - start, 1)
                        row["broken_before_abort"] = len(broken_between(sequences, start, given))
                        row["cut"] = _cut(report)
                    if applied.code != 0 and abort is None:
                        row["explain"] = applied.explain()[-2000:]
                    rollouts.append(row)
                    print(
                        f"rollout {number + 1} ({strategy} to {version}): exit {applied.code}, "
                        f"{row['seconds']} s, drains "
                        f"{[round(d['seconds'], 1) for d in drains]}, sequences "
                        f"{row['sequences_started']}, broken {row['broken']}, shares "
                        f"{[(p['weight'], p['share'], p['within']) for p in row['weights']]}",
                        flush=True,
                    )
            sequences = load.snapshot()
        finally:
            if envoy is not None:
                envoy.stop()
            c.stop()
            a.stop()
    done = [s for s in sequences if s.ended is not None]
    durations = sorted(s.ended - s.started for s in done if s.ended is not None)
    waited = [float(d["seconds"]) for r in rollouts for d in r["drains"] if d["ok"]]
    good = [r for r in rollouts if "cut" not in r]
    summary = {
        "rollouts": len(rollouts),
        "converged": sum(1 for r in good if r["code"] == 0),
        "aborted": sum(1 for r in rollouts if "cut" in r and r["code"] != 0),
        "sequences": len(sequences),
        "broken": sum(1 for s in sequences if s.broken),
        "broken_in_good_rollouts": sum(r["broken"] for r in good),
        "broken_before_abort": sum(r.get("broken_before_abort", 0) for r in rollouts),
        # Cut by a switch back after the on-call's abort, some after apply returned (the
        # revert's unload of the aborted version): the rest.
        "broken_after_abort": sum(1 for s in sequences if s.broken)
        - sum(r["broken"] for r in good)
        - sum(r.get("broken_before_abort", 0) for r in rollouts),
        "broken_why": sorted({(s.broken or "")[:120] for s in sequences if s.broken}),
        "sequence_seconds": {
            "median": round(statistics.median(durations), 3) if durations else None,
            "p95": round(durations[int(0.95 * (len(durations) - 1))], 3) if durations else None,
            "max": round(durations[-1], 3) if durations else None,
        },
        "drain_seconds": {
            "count": len(waited),
            "median": round(statistics.median(waited), 2) if waited else None,
            "max": round(max(waited), 2) if waited else None,
        },
        "weight_periods": sum(len(r["weights"]) for r in rollouts),
        "weight_periods_within": sum(p["within"] for r in rollouts for p in r["weights"]),
        "wall_minutes": round((time.monotonic() - began) / 60, 1),
    }
    print(json.dumps(summary, indent=1), flush=True)
    report_out = {
        "benchmark": "sequence_rollouts",
        "command": "python -m bench.sequence_rollouts " + " ".join(argv or sys.argv[1:]),
        "host": host(),
        "provenance": provenance(),
        "args": vars(args),
        "summary": summary,
        "rollouts": rollouts,
    }
    if args.output:
        args.output.write_text(json.dumps(report_out, indent=2, default=str) + "\n")
    aborted_ok = summary["aborted"] == len(rollouts) - len(good)
    clean = summary["broken_in_good_rollouts"] == 0 and summary["broken_before_abort"] == 0
    return 0 if clean and aborted_ok and summary["converged"] == len(good) else 1


if __name__ == "__main__":
    sys.exit(main())
