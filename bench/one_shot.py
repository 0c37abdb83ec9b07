"""One-shot passes as users run them (issue 46): ``triton-gitops apply`` in a new process over
a simulated fleet, its wall time (the interpreter's start included) and its peak memory.

The fleet is ``bench.fleet``'s (one ``TritonServer`` with discovery over ``--instances``
simulated Triton 2.51 instances, ``--models`` ModelDeployments on every one, all in sync, so
every pass is a no-op, checked by its exit code 0). Per shape, ``--runs`` applies, each a
fresh ``python -m reconciler apply`` with its own ``--state``: the first with nothing kept
beside the state store (every loaded model's config read), then with the configs the run
before kept (``adapters/config_memory.py``), then once with ``--config-recheck 0`` (kept
configs not trusted: every config read again, the same work as the first). Peak memory is
the process's maximum resident set (``ru_maxrss`` of the child, read by ``os.wait4``).

Goals: 1,000 x 100 at most 10 s and 1 GiB; 10 x 1,000 at most 5 s.

    python -m bench.one_shot [--shapes 1000x100 10x1000] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.fleet import DNS, Group, SimulatedFleet, fleet_addresses, model_names, write_manifests
from bench.harness.cli import envelope, markdown_main, section_head
from bench.harness.errors import BenchError

RESULTS = Path(__file__).parent / "results"
GOALS = {"1000x100": (10.0, 1024.0), "10x1000": (5.0, None)}  # seconds, MiB


@dataclass(frozen=True)
class Applied:
    """One apply: wall seconds, peak resident MiB, its own CPU seconds, its output."""

    wall: float
    peak_mib: float
    cpu: float
    output: str


def applied(
    argv: Sequence[str], cwd: Path | None = None, env: Mapping[str, str] | None = None
) -> Applied:
    """One apply in a new process (in ``cwd``, with ``env``: another code tree's)."""
    started = time.perf_counter()
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=cwd, env=env
    )
    assert process.stdout is not None
    output = process.stdout.read().decode(errors="replace")
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise BenchError(f"apply exited {process.returncode}:\n{output[-3000:]}")
    return Applied(wall, usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime, output)


@dataclass(frozen=True)
class Fleet:
    """``bench.fleet``'s simulated fleet, its manifests committed to ``repo_url``, and the
    hosts file that names its instances."""

    simulated: SimulatedFleet
    repo_url: str
    hosts: Path

    def apply(
        self, where: Path, extra: Sequence[str] = (), tree: Path | None = None
    ) -> tuple[Applied, float]:
        """``python -m reconciler apply`` in a new process, its state store and Git cache in
        ``where`` (``tree``: another code tree's); the apply, and the CPU seconds the
        simulated fleet spent meanwhile. The simulated servers share this machine's cores
        with the apply: what each side spent says what bounds a pass here (a cold one's
        config calls cost the simulator about as much CPU as the reconciler, issue 46)."""
        (where / "state").mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "reconciler", "apply", "--repo", self.repo_url]
        argv += ["--state", str(where / "state" / "state.db"), "--cache-dir", str(where / "cache")]
        argv += ["--hosts-file", str(self.hosts), *extra]
        env = None if tree is None else {**os.environ, "PYTHONPATH": str(tree)}
        before = self.simulated.cpu_seconds()
        one = applied(argv, cwd=tree, env=env)
        return one, self.simulated.cpu_seconds() - before


@contextmanager
def started_fleet(instances: int, models: int, root: Path) -> Iterator[Fleet]:
    """``instances`` simulated instances serving ``models`` models, all in sync; stopped at
    the end."""
    names = model_names(models)
    addresses = fleet_addresses(instances, 13)
    fleet = SimulatedFleet([Group("pool", addresses, tuple(names))], 2, root).start()
    try:
        repo = write_manifests(root / "git", names, fleet.port)
        hosts = root / "hosts"
        hosts.write_text(f"{DNS} {' '.join(addresses)}\n")
        yield Fleet(fleet, repo.url, hosts)
    finally:
        fleet.stop()


def one_shape(instances: int, models: int, runs: int, root: Path) -> dict[str, Any]:
    records: list[dict[str, Any]] = []
    with started_fleet(instances, models, root) as fleet:
        for index in range(runs + 2):
            recheck = ["--config-recheck", "0"] if index == runs + 1 else []
            kind = "configs not trusted" if recheck else ("nothing kept" if index == 0 else "kept")
            one, fleet_cpu = fleet.apply(root, recheck)
            records.append({"run": index, "kind": kind, "wall_s": round(one.wall, 3),
                            "peak_mib": round(one.peak_mib, 1), "cpu_s": round(one.cpu, 2),
                            "fleet_cpu_s": round(fleet_cpu, 2)})  # fmt: skip
            print(f"  {instances} x {models} apply {index}: {kind}, {one.wall:.2f} s, "
                  f"{one.peak_mib:.0f} MiB, CPU {one.cpu:.1f} s (simulated fleet "
                  f"{fleet_cpu:.1f} s)", file=sys.stderr)  # fmt: skip
    kept = [r for r in records if r["kind"] == "kept"]
    return {
        "shape": f"{instances}x{models}",
        "instances": instances,
        "models": models,
        "runs": records,
        "kept_wall_median_s": statistics.median(r["wall_s"] for r in kept) if kept else None,
        "peak_mib_max": max(r["peak_mib"] for r in records),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    load_at_start = os.getloadavg()
    shapes = []
    for shape in args.shapes:
        instances, models = (int(x) for x in shape.split("x"))
        with tempfile.TemporaryDirectory(prefix="bench-one-shot-") as tmp:
            shapes.append(one_shape(instances, models, args.runs, Path(tmp)))
    return envelope("one_shot", load_at_start, shapes=shapes)


def markdown(result: dict[str, Any]) -> str:
    how = "Each apply a new process (interpreter start included); every pass a no-op, exit 0."
    lines = [
        *section_head(result, how),
        "| instances x models | nothing kept | configs kept (median, runs) | --config-recheck 0 |"
        " peak memory | goal | met |",
        "|---|---:|---|---:|---:|---|---|",
    ]
    for s in result["shapes"]:
        runs = s["runs"]
        cold = next(r for r in runs if r["kind"] == "nothing kept")
        kept = [r for r in runs if r["kind"] == "kept"]
        recheck = next(r for r in runs if r["kind"] == "configs not trusted")
        wall_goal, memory_goal = GOALS.get(s["shape"], (None, None))
        goal = (
            f"at most {wall_goal:g} s" + (f", {memory_goal:g} MiB" if memory_goal else "")
            if wall_goal
            else "-"
        )
        met = "-"
        if wall_goal is not None and s["kept_wall_median_s"] is not None:
            ok = s["kept_wall_median_s"] <= wall_goal and (
                memory_goal is None or s["peak_mib_max"] <= memory_goal
            )
            met = "**met**" if ok else "**missed**"
        kept_walls = ", ".join(f"{r['wall_s']:.1f}" for r in kept)
        # CPU seconds of the apply and of the simulated fleet (absent in older results).
        split = (
            f" (CPU {cold['cpu_s']:.1f} s + fleet {cold['fleet_cpu_s']:.1f} s)"
            if "cpu_s" in cold
            else ""
        )
        lines.append(
            f"| {s['instances']:,} x {s['models']:,} | {cold['wall_s']:.1f} s{split} "
            f"| {s['kept_wall_median_s']:.1f} s ({kept_walls}) "
            f"| {recheck['wall_s']:.1f} s | {s['peak_mib_max']:.0f} MiB | {goal} | {met} |"
        )
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.one_shot",
        description="triton-gitops apply in a new process over a simulated fleet (issue 46).",
    )
    parser.add_argument("--shapes", nargs="+", default=["1000x100", "10x1000"])
    parser.add_argument("--runs", type=int, default=3, help="applies with the configs kept")
    parser.add_argument("--output", type=Path, default=RESULTS / "one_shot.json")
    parser.add_argument("--report", type=Path, metavar="JSON", help="the section again")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    return markdown_main(parse_args(argv), run, markdown, beside=True)


if __name__ == "__main__":
    sys.exit(main())
