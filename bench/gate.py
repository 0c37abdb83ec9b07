"""The pre-merge gate (issue 18): how long it takes per model, and how stable its ratios are
across repeated runs on this machine, quiet and made noisy on purpose.

Each run is one ``loop.gate.run_gate`` on a tritonserver of its own (``wiring.isolated_server``,
as ``triton-gitops gate`` runs it, without the Git part: ``bench/harness/gates.py``): the base
serves ``scorer`` version 1 (testkit/models/scorer: about 3 ms a request), the head moves it
to the scenario's version, ``spec.verify.gate`` at its defaults (concurrency [1, 4], 5 rounds,
500 requests) with the bounds maxLatencyIncrease 0.2, minThroughputRatio 0.9,
maxMemoryIncrease 30%.

Scenarios: ``good`` (version 2, alike the old: every run must pass), ``slow`` (3: three times
slower: every run must fail on latency and throughput), ``heavy`` (5: a 256 MiB buffer: every
run must fail on memory). ``good-noisy`` is ``good`` with ``--burners`` processes spinning on
the CPU the whole run (this machine has 2 CPUs): the noise a shared CI runner brings, which the
interleaved rounds must absorb. ``--perf-analyzer PATH`` adds ``good`` and ``slow`` measured by
perf_analyzer.

    python -m bench.gate [--runs 5] [--burners 1] [--perf-analyzer PATH] [--output PATH]
                         [--scenarios good,slow,...] [--perf-scenarios good,slow]

Every process started here (tritonservers, burners) is ended by its pid in ``finally``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.harness.gates import SERVER, desired_state, isolated_run, summarize
from reconciler.model.spec import DesiredState
from testkit.manifests import write_scorer_repository

SCENARIOS = {"good": 2, "slow": 3, "heavy": 5, "good-noisy": 2}


def _deployment(version: int) -> str:
    return (
        "apiVersion: triton-gitops.dev/v1alpha1\nkind: ModelDeployment\nmetadata: {name: scorer}\n"
        "spec:\n  servers: {names: [prod]}\n"
        f"  versions: [{version}]\n"
        "  verify:\n    smoke:\n      - name: doubles\n        inputs:\n"
        "          INPUT0: {datatype: FP32, shape: [1, 4], data: [1, 2, 3, 4]}\n"
        "        expect:\n          OUTPUT0: {data: [2, 4, 6, 8], tolerance: 0.0001}\n"
        "    gate: {maxLatencyIncrease: 0.2, minThroughputRatio: 0.9, maxMemoryIncrease: 30%}\n"
    )


def _state(version: int) -> DesiredState:
    return desired_state(SERVER, _deployment(version))


def _burn() -> None:
    while True:
        pass


def one_run(repository: Path, workdir: Path, version: int, perf: str | None) -> dict[str, Any]:
    return isolated_run(repository, workdir, _state(1), _state(version), perf)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--burners", type=int, default=1)
    parser.add_argument("--perf-analyzer")
    parser.add_argument("--perf-runs", type=int, default=2)
    parser.add_argument("--output", type=Path)
    parser.add_argument(
        "--scenarios",
        default=",".join(SCENARIOS),
        help="which of the built-in generator's scenarios to run (comma-separated); the "
        "perf_analyzer arms follow --perf-analyzer and --perf-scenarios",
    )
    parser.add_argument("--perf-scenarios", default="good,slow")
    args = parser.parse_args(argv)
    chosen = [name for name in args.scenarios.split(",") if name]
    perf_chosen = [name for name in args.perf_scenarios.split(",") if name]
    unknown = sorted(set(chosen + perf_chosen) - SCENARIOS.keys())
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}: one of {', '.join(SCENARIOS)}")
    root = Path(tempfile.mkdtemp(prefix="bench-gate-"))
    repository = write_scorer_repository(root / "models")
    arms: list[tuple[str, int, str | None, int]] = [
        (name, SCENARIOS[name], None, args.runs) for name in chosen
    ]
    if args.perf_analyzer:
        arms += [(f"{n}-perf_analyzer", SCENARIOS[n], args.perf_analyzer, args.perf_runs)
                 for n in perf_chosen]  # fmt: skip
    results: dict[str, Any] = {
        "machine": f"{platform.node()} {platform.machine()} {multiprocessing.cpu_count()} CPUs",
        "python": platform.python_version(),
        "arms": {},
    }
    for name, version, perf, runs in arms:
        burners: list[multiprocessing.Process] = []
        if name.endswith("-noisy"):
            burners = [
                multiprocessing.Process(target=_burn, daemon=True) for _ in range(args.burners)
            ]
            for burner in burners:
                burner.start()
        try:
            done = []
            for number in range(runs):
                run = one_run(repository, root / f"{name}-{number}", version, perf)
                print(f"{name} run {number + 1}: {run['verdict']} in {run['seconds']:.1f} s",
                      file=sys.stderr)  # fmt: skip
                done.append(run)
        finally:
            for burner in burners:
                burner.terminate()  # by its pid (SIGTERM)
                burner.join()
        results["arms"][name] = {"raw": done, "summary": summarize(done)}
    text = json.dumps(results, indent=2)
    if args.output:
        args.output.write_text(text)
    print(json.dumps({k: v["summary"] for k, v in results["arms"].items()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
