"""Cold one-shot passes, this code against an earlier commit (issue 46): the same scenario
with and without a change, side by side in one run, so that the machine's noise falls on
both.

``bench.one_shot``'s fleet (discovery over simulated Triton 2.51 instances, every model
READY and in sync) and its apply: ``python -m reconciler apply`` in a new process with a
fresh ``--state``, so nothing is kept and every loaded model's config is read. Per shape,
``--rounds`` rounds of one apply by each code tree, in alternating order (ABBA...): this
checkout's tree and ``--against``'s commit, checked out with ``git worktree`` in a
temporary folder (removed at the end). Each apply's wall time, its own CPU, the simulated
fleet's CPU meanwhile and its peak resident memory; medians per tree and their ratios.

    python -m bench.cold_pass --against COMMIT [--shapes 1000x100 200x100] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.harness.cli import envelope, markdown_main, section_head
from bench.harness.provenance import REPO_ROOT
from bench.one_shot import started_fleet

RESULTS = Path(__file__).parent / "results"
FIGURES = ("wall_s", "cpu_s", "fleet_cpu_s", "peak_mib")


def one_shape(
    instances: int, models: int, rounds: int, trees: dict[str, Path], root: Path
) -> dict[str, Any]:
    runs: dict[str, list[dict[str, float]]] = {label: [] for label in trees}
    with started_fleet(instances, models, root) as fleet:
        for index in range(rounds):
            order = list(trees) if index % 2 == 0 else list(trees)[::-1]
            for label in order:
                where = root / f"apply-{index}-{label}"
                one, fleet_cpu = fleet.apply(where, tree=trees[label])
                record = {
                    "wall_s": round(one.wall, 3),
                    "cpu_s": round(one.cpu, 2),
                    "fleet_cpu_s": round(fleet_cpu, 2),
                    "peak_mib": round(one.peak_mib, 1),
                }
                runs[label].append(record)
                print(f"  {instances} x {models} round {index} {label}: {record}", file=sys.stderr)
    medians = {
        label: {f: statistics.median(r[f] for r in records) for f in FIGURES}
        for label, records in runs.items()
    }
    return {
        "shape": f"{instances}x{models}",
        "instances": instances,
        "models": models,
        "runs": runs,
        "medians": medians,
        "ratios": {
            f: round(medians["this"][f] / medians["against"][f], 3)
            for f in FIGURES
            if medians["against"][f]
        },
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    load_at_start = os.getloadavg()
    against = subprocess.run(
        ["git", "rev-parse", "--verify", f"{args.against}^{{commit}}"],
        cwd=REPO_ROOT, capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    shapes = []
    with tempfile.TemporaryDirectory(prefix="bench-cold-pass-") as tmp:
        tree = Path(tmp) / "against"
        subprocess.run(
            ["git", "worktree", "add", "--detach", "--quiet", str(tree), against],
            cwd=REPO_ROOT, check=True,
        )  # fmt: skip
        try:
            for shape in args.shapes:
                instances, models = (int(x) for x in shape.split("x"))
                root = Path(tmp) / shape
                root.mkdir()
                trees = {"this": REPO_ROOT, "against": tree}
                shapes.append(one_shape(instances, models, args.rounds, trees, root))
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(tree)], cwd=REPO_ROOT, check=False
            )
    return envelope("cold_pass", load_at_start, against=against, shapes=shapes)


def markdown(result: dict[str, Any]) -> str:
    how = (
        f"Cold applies (nothing kept), this code and `{result['against'][:7]}` alternating; "
        "medians, and this code's over the other's."
    )
    lines = [
        *section_head(result, how),
        "| instances x models | code | wall | apply's CPU | simulated fleet's CPU | peak memory |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for s in result["shapes"]:
        for label, name in (("against", f"`{result['against'][:7]}`"), ("this", "this code")):
            m = s["medians"][label]
            lines.append(
                f"| {s['instances']:,} x {s['models']:,} | {name} | {m['wall_s']:.1f} s "
                f"| {m['cpu_s']:.1f} s | {m['fleet_cpu_s']:.1f} s | {m['peak_mib']:.0f} MiB |"
            )
        r = s["ratios"]
        lines.append(
            f"| | ratio | **{r['wall_s']:.2f}** | **{r['cpu_s']:.2f}** "
            f"| {r['fleet_cpu_s']:.2f} | **{r['peak_mib']:.2f}** |"
        )
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.cold_pass",
        description="Cold one-shot applies, this code against an earlier commit (issue 46).",
    )
    parser.add_argument("--against", required=True, help="the commit to compare with")
    parser.add_argument("--shapes", nargs="+", default=["1000x100", "200x100"])
    parser.add_argument("--rounds", type=int, default=2, help="applies by each code tree")
    parser.add_argument("--output", type=Path, default=RESULTS / "cold_pass.json")
    parser.add_argument("--report", type=Path, metavar="JSON", help="the section again")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    return markdown_main(parse_args(argv), run, markdown, beside=True)


if __name__ == "__main__":
    sys.exit(main())
