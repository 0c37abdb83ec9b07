"""Repository size: what a pull request's ``validate`` and ``plan`` cost as the manifests grow
(issue 46: 1,000 ModelDeployments took 10.7 s to validate).

Per size (``--sizes``, default 100, 1,000, 3,000 ModelDeployments), a folder of manifests as
people write them (block style; 10 ``TritonServer`` documents, each model on one of them,
``versions: [1]``, a ``spec.config`` of backend, one input and one output: the fleet
benchmark's), then, each ``--runs`` times, the command as CI runs it, a fresh interpreter each
time (its start included):

- ``validate DIR`` two ways: as shipped, and with the fast reader turned off
  (``core.spec.yaml._plain`` raising ``NotPlain``, as tests/core/test_plain_yaml.py does), so
  every manifest is read by ruamel.yaml's round trip as before: the same scenario without the
  feature, in the same run;
- ``plan --repo URL`` of the same manifests committed to a bare Git remote, against 10
  simulated Triton 2.51 instances (``bench.fleet.SimulatedTriton``: every model READY at
  version 1 with the config Triton reports for it), so the plan is a no-op; its exit code (0:
  nothing to do) is checked.

Wall seconds per run (median and range), and per manifest. Goals: ``validate`` of 1,000 at
most 1.5 s, ``plan`` of 1,000 against 10 servers at most 3 s.

    python -m bench.repository_size [--sizes 100 1000 3000] [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.fleet import SPEC_CONFIG, Group, SimulatedFleet, model_names
from bench.harness.cli import envelope, markdown_main, section_head
from bench.harness.errors import BenchError
from testkit.manifests import ManifestRepo

RESULTS = Path(__file__).parent / "results"
SERVERS = 10
GOALS = {"validate": 1.5, "plan": 3.0}  # seconds, at 1,000 manifests

COMMAND = "import sys; from reconciler.cli import main; sys.exit(main())"
# The reader as it was: every manifest through ruamel's round trip.
RUAMEL_ONLY = (
    "import sys\n"
    "from reconciler.core.spec import yaml as y\n"
    "from reconciler.core.spec.plain_yaml import NotPlain\n"
    "def _not_plain(*_):\n"
    "    raise NotPlain('off')\n"
    "y._plain = _not_plain\n" + COMMAND
)


def server_doc(index: int, port: int) -> str:
    return (
        "apiVersion: triton-gitops.dev/v1alpha1\nkind: TritonServer\n"
        f"metadata:\n  name: s{index}\nspec:\n  grpc: 127.11.0.{index + 1}:{port}\n"
    )


def model_doc(name: str, server: int) -> str:
    (inp,), (out,) = SPEC_CONFIG["input"], SPEC_CONFIG["output"]
    return (
        "apiVersion: triton-gitops.dev/v1alpha1\nkind: ModelDeployment\n"
        f"metadata:\n  name: {name}\n"
        f"spec:\n  servers:\n    names: [s{server}]\n  versions: [1]\n"
        f"  config:\n    backend: {SPEC_CONFIG['backend']}\n"
        f"    input:\n      - name: {inp['name']}\n        data_type: {inp['data_type']}\n"
        f"        dims: {inp['dims']}\n"
        f"    output:\n      - name: {out['name']}\n        data_type: {out['data_type']}\n"
        f"        dims: {out['dims']}\n"
    )


def timed(argv: Sequence[str], expect: int, env: dict[str, str]) -> float:
    started = time.perf_counter()
    run = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, check=False)
    wall = time.perf_counter() - started
    if run.returncode != expect:
        raise BenchError(f"{' '.join(argv[3:])}: exit {run.returncode}\n{run.stdout}{run.stderr}")
    return wall


def spread(samples: Sequence[float], manifests: int) -> dict[str, Any]:
    median = statistics.median(samples)
    return {
        "runs": [round(s, 3) for s in samples],
        "median_s": round(median, 3),
        "min_s": round(min(samples), 3),
        "max_s": round(max(samples), 3),
        "ms_per_manifest": round(median / manifests * 1000, 3),
    }


def one_size(size: int, runs: int, root: Path) -> dict[str, Any]:
    names = model_names(size)
    placed = [names[i::SERVERS] for i in range(SERVERS)]
    env = dict(os.environ)
    fleet = SimulatedFleet(
        [Group(f"s{i}", (f"127.11.0.{i + 1}",), tuple(placed[i])) for i in range(SERVERS)],
        2,
        root,
    ).start()
    try:
        repo = ManifestRepo(root / "git")
        folder = root / "manifests"
        for i in range(SERVERS):
            text = server_doc(i, fleet.port)
            repo.write(f"servers/s{i}.yaml", text)
            (folder / "servers").mkdir(parents=True, exist_ok=True)
            (folder / "servers" / f"s{i}.yaml").write_text(text)
        (folder / "models").mkdir(exist_ok=True)
        for index, name in enumerate(names):
            text = model_doc(name, index % SERVERS)
            repo.write(f"models/{name}.yaml", text)
            (folder / "models" / f"{name}.yaml").write_text(text)
        repo.commit(f"{size} models on {SERVERS} servers")
        python = [sys.executable, "-c"]
        arms: dict[str, list[float]] = {"validate": [], "validate, ruamel only": [], "plan": []}
        for _ in range(runs):  # interleaved, so that a busy moment hits every arm alike
            arms["validate"].append(timed([*python, COMMAND, "validate", str(folder)], 0, env))
            arms["validate, ruamel only"].append(
                timed([*python, RUAMEL_ONLY, "validate", str(folder)], 0, env)
            )
            plan = ["plan", "--repo", repo.url, "--cache-dir", str(root / "cache")]
            plan += ["--state", str(root / "state.db")]
            arms["plan"].append(timed([*python, COMMAND, *plan], 0, env))
        figures = {arm: spread(samples, size) for arm, samples in arms.items()}
    finally:
        fleet.stop()
    shipped, before = figures["validate"], figures["validate, ruamel only"]
    return {
        "manifests": size,
        "servers": SERVERS,
        **figures,
        "validate_speedup": round(before["median_s"] / shipped["median_s"], 2),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    load_at_start = os.getloadavg()
    sizes = []
    for size in args.sizes:
        with tempfile.TemporaryDirectory(prefix="bench-repository-") as tmp:
            print(f"{size} manifests", file=sys.stderr)
            sizes.append(one_size(size, args.runs, Path(tmp)))
    return envelope("repository_size", load_at_start, sizes=sizes)


def markdown(result: dict[str, Any]) -> str:
    how = "Wall seconds per run, a fresh interpreter each (median, range)."
    lines = [
        *section_head(result, how),
        "| manifests | validate | validate, ruamel only | ratio | plan (10 servers) |"
        " validate ms/manifest | plan ms/manifest |",
        "|---:|---|---|---:|---|---:|---:|",
    ]
    for s in result["sizes"]:
        v, r, p = s["validate"], s["validate, ruamel only"], s["plan"]
        lines.append(
            f"| {s['manifests']:,} | {v['median_s']:.2f} ({v['min_s']:.2f}-{v['max_s']:.2f}) "
            f"| {r['median_s']:.2f} ({r['min_s']:.2f}-{r['max_s']:.2f}) "
            f"| {s['validate_speedup']:.1f}x "
            f"| {p['median_s']:.2f} ({p['min_s']:.2f}-{p['max_s']:.2f}) "
            f"| {v['ms_per_manifest']:.2f} | {p['ms_per_manifest']:.2f} |"
        )
    at = {s["manifests"]: s for s in result["sizes"]}
    if 1000 in at:
        lines += ["", "| goal (1,000 manifests) | median | met |", "|---|---:|---|"]
        for arm, goal in GOALS.items():
            median = at[1000][arm]["median_s"]
            lines.append(
                f"| {arm} at most {goal:g} s | {median:.2f} s | "
                f"{'**met**' if median <= goal else '**missed**'} |"
            )
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.repository_size",
        description="validate and plan as the repository grows (issue 46).",
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 3000])
    parser.add_argument("--runs", type=int, default=5, help="runs per size and command")
    parser.add_argument(
        "--output", type=Path, default=RESULTS / "repository_size.json", help="JSON result"
    )
    parser.add_argument("--report", type=Path, metavar="JSON", help="the section again")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    return markdown_main(parse_args(argv), run, markdown, beside=True)


if __name__ == "__main__":
    sys.exit(main())
