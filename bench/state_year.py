"""A year of passes in the state store: file size and the store's time per pass, with the
default retention (``--history-days 90``) and without it (``0``: keep everything).

For issue 17 ("a state store that lasts"). No Triton: the store alone (``StateStore``, a
real SQLite file in WAL mode), driven by a simulated clock through what a service at the
default 60 s interval writes in a year: 525,600 ``record_pass`` calls, each with the summary
a real pass writes (three models on two servers: usually nothing to change), and on
``--rollouts-per-day`` passes a swap of one model (a ``Rollout`` row per server with its
analysis checks, the ``managed`` and ``applied`` rows it changes), plus ``--actions-per-day``
on-call actions. Each arm starts from an empty file.

Every ``--sample-every`` simulated days: the file's size (with its WAL), the median and 99th
percentile of ``record_pass`` over the last 500 passes, and the time of what every pass
reads from the store (``history()``, ``last_pass()``, ``open_alerts()``, ``unreverted()``;
``status`` also reads ``rollouts(limit=1000)``, timed apart). The report compares day 365
with day 7 in each arm and the two arms on day 365, measured in one run. Last, the file kept
for ever is opened with 90 days, as after an upgrade to a release with retention: how many
passes its trim takes, how long they record, and the file's size after.

    python -m bench.state_year [--days 365] [--interval 60] [--output PATH]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.harness.cli import markdown_main
from bench.harness.provenance import host, provenance
from bench.harness.report import render
from bench.harness.stats import percentile
from reconciler.adapters.state import StateStore
from reconciler.core.records import rfc3339
from reconciler.model.history import AppliedSpec, PassRecord, Rollout

START = 1.75e9
DAY = 86400.0
SERVERS = ("edge-a", "edge-b")
MODELS = ("echo", "scaler", "ranker")
# What the analysis writes per check: name, query, value, threshold, verdict.
CHECKS = tuple(
    {
        "name": name,
        "query": f'sum(rate(nv_inference_request_success{{model="{{model}}"}}[30s])) / {name}',
        "value": 0.998,
        "threshold": 0.95,
        "passed": True,
    }
    for name in ("success-rate", "latency-p99", "client-errors")
)


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


def _summary(rollouts: list[Rollout]) -> dict[str, Any]:
    """What ``loop.phases`` records: each change's outcome, and the plan's problems."""
    changes = [{"server": r.server, "model": r.model, "outcome": r.outcome} for r in rollouts]
    return {"changes": changes, "problems": []}


def _swap(number_: int, at: float) -> tuple[list[Rollout], list[AppliedSpec]]:
    model = MODELS[number_ % len(MODELS)]
    version = 1 + number_ // len(MODELS)
    revision = f"{number_:040x}"
    rollouts = [
        Rollout(
            revision=revision,
            deployment=model,
            server=server,
            model=model,
            from_versions=(version - 1,),
            to_versions=(version,),
            outcome="converged",
            verdict="passed",
            checks=CHECKS,
            error=None,
            rollback_seconds=None,
            finished_at=at,
        )
        for server in SERVERS
    ]
    applied = [AppliedSpec(model, revision, f"{number_:016x}", (version,), {"max_batch_size": 8})]
    return rollouts, applied


def _reads(store: StateStore) -> float:
    started = time.perf_counter()
    store.history()
    store.last_pass()
    store.open_alerts()
    store.unreverted()
    return time.perf_counter() - started


def _timed(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*") if p.is_file())


def run_arm(folder: Path, args: argparse.Namespace, history_days: float) -> dict[str, Any]:
    path = folder / f"state-{history_days:g}.db"
    clock = Clock()
    store = StateStore(path, history_days=history_days, clock=clock)
    passes_per_day = int(DAY // args.interval)
    every_rollout = max(1, passes_per_day // max(1, args.rollouts_per_day))
    every_action = max(1, passes_per_day // max(1, args.actions_per_day))
    samples: list[dict[str, Any]] = []
    recent: list[float] = []
    swaps = 0
    started = time.monotonic()
    for n in range(args.days * passes_per_day):
        clock.now = START + n * args.interval
        rollouts: list[Rollout] = []
        applied: list[AppliedSpec] = []
        managed: dict[str, frozenset[str]] = {}
        if n % every_rollout == every_rollout // 2:
            rollouts, applied = _swap(swaps, clock.now)
            swaps += 1
            managed = {s: frozenset(MODELS) for s in SERVERS}
        if n % every_action == every_action // 3:
            store.record_action("reconcile", MODELS[n % len(MODELS)], "token:oncall")
        record = PassRecord(
            f"{swaps:040x}",
            managed,
            True,
            _summary(rollouts),
            rollouts=tuple(rollouts),
            applied=tuple(applied),
        )
        recent.append(_timed(lambda r=record: store.record_pass(r)))
        recent = recent[-500:]
        day = (n + 1) / passes_per_day
        if (n + 1) % passes_per_day == 0 and (
            day % args.sample_every == 0 or day in (1, 7, args.days)
        ):
            counts = {
                table: store._db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
                for table in ("passes", "rollouts", "operator_actions")
            }
            samples.append(
                {
                    "day": int(day),
                    "bytes": _size(path),
                    "record_pass_median_ms": statistics.median(recent) * 1e3,
                    "record_pass_p99_ms": (percentile(recent, 99) or 0.0) * 1e3,
                    "reads_ms": statistics.median(_reads(store) for _ in range(21)) * 1e3,
                    "status_rollouts_ms": statistics.median(
                        _timed(lambda: store.rollouts(limit=1000)) for _ in range(5)
                    )
                    * 1e3,
                    "rows": counts,
                    "wall_seconds": time.monotonic() - started,
                }
            )
            print(
                f"  history {history_days:g} days: day {int(day)}: "
                f"{_size(path) / 1e6:.1f} MB, record_pass median "
                f"{samples[-1]['record_pass_median_ms']:.3f} ms, {counts}",
                file=sys.stderr,
                flush=True,
            )
    store.close()
    return {
        "history_days": history_days,
        "path": str(path),
        "passes": n + 1,
        "swaps": swaps,
        "samples": samples,
        "end": clock.now,
    }


def trim_after_upgrade(kept_for_ever: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The store kept for ever, opened as a release with retention would (90 days): how many
    passes its trim takes, how long each of them records, and the file's size after."""
    path = Path(kept_for_ever["path"])
    clock = Clock()
    clock.now = kept_for_ever["end"]
    store = StateStore(path, history_days=90.0, clock=clock)
    seconds: list[float] = []
    rows = store._db.execute("SELECT COUNT(*) FROM passes").fetchone()[0]
    before = rows
    while True:
        clock.now += args.interval
        record = PassRecord("f" * 40, {}, True, _summary([]))
        seconds.append(_timed(lambda r=record: store.record_pass(r)))
        left = store._db.execute("SELECT COUNT(*) FROM passes").fetchone()[0]
        trimmed = left < rows  # else the pass added one and forgot none: the trim is done
        rows = left
        if not trimmed:
            break
    size = _size(path)
    store.close()
    return {
        "passes_before": before,
        "passes_after": rows,
        "trimming_passes": len(seconds) - 1,
        "record_pass_max_ms": max(seconds) * 1e3,
        "record_pass_median_ms": statistics.median(seconds[:-1] or seconds) * 1e3,
        "after_trim_median_ms": seconds[-1] * 1e3,
        "bytes_after": size,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="bench-state-year-"))
    arms = [run_arm(folder, args, days) for days in (90.0, 0.0)]
    upgrade = trim_after_upgrade(arms[1], args)
    for path in folder.iterdir():
        path.unlink()
    folder.rmdir()
    return {
        "machine": host(),
        "code": provenance(),
        "at": rfc3339(time.time()),
        "settings": {k: v for k, v in vars(args).items() if k not in ("output", "report")},
        "arms": arms,
        "upgrade": upgrade,
    }


def markdown(result: dict[str, Any]) -> str:
    return render("state_year", result)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=365)
    parser.add_argument("--interval", type=float, default=60.0, help="seconds between passes")
    parser.add_argument("--rollouts-per-day", type=int, default=10)
    parser.add_argument("--actions-per-day", type=int, default=2)
    parser.add_argument("--sample-every", type=int, default=30, help="days")
    parser.add_argument("--output", type=Path, default=Path("bench/results/state_year.json"))
    parser.add_argument("--report", type=Path, help="print the section from a saved result")
    return markdown_main(parser.parse_args(argv), run, markdown)


if __name__ == "__main__":
    sys.exit(main())
