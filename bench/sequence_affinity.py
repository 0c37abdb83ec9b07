"""Sequence affinity through a real Envoy (issue 44 point 1, research; docs/sequence-affinity.md):
which Envoy mechanism keeps each client sequence on the server that started it while the
weights move, and lets new sequences follow the weights.

Two real tritonservers serve the sequence model ``counter`` (a running sum per sequence;
Triton refuses a sequence's later request on a server that never saw its START): ``a`` at
version 1 (answers sum * 1), ``b`` at version 2 (sum * 2), which tells the server of each
answer. One Envoy at a time (``testkit.envoy``), per mechanism:

- ``random``: today's route (``weighted_clusters``, a pick per request; round robin inside a
  pool);
- ``hash``: the route hashes the client's ``x-sequence-id`` header, both to pick the pool
  (``weighted_clusters.use_hash_policy``) and the server in it (``RING_HASH``);
- ``session-weighted``: Envoy's stateful session filter (header-based, ``x-triton-session``,
  not strict) on today's weighted route, as its documentation configures it; the clients send
  the header back;
- ``session``: the same filter (strict) with one route per pool matching the session header
  values of the pool's servers before the weighted route (``affinity="session"``); the clients
  send the header back;
- ``stream``: today's route, each client sequence sent over a gRPC stream of its own
  (``ModelStreamInfer``): one HTTP/2 stream, routed once (a choice of the client, not of
  the router).

Run 1, ``pools``: pools ``stable`` [a] and ``canary`` [b]; ``--threads`` client threads send
sequences of 2 to 40 requests (``--pause`` seconds apart) continuously while the canary's
weight goes 0 -> 10 -> 50 -> 100%, ``--cycles`` times (the move from 100 back to 0 is a
switch back; ``--phase`` seconds each, through Envoy's runtime). Run 2, ``rest``: one pool
``stable`` [a, b] at 100%, no weight change. For each phase: the sequences that started in
it and the share of them each pool's server answered, and the sequences that broke in it.
Run 3, ``throughput`` (issue 44's goal: affinity's cost): pool ``stable`` [a] alone, two
Envoys started side by side, one routing as today (``random``), one with the ``session``
affinity (its clients sending the headers back); ``--rounds`` rounds of ``--phase`` seconds
alternate the same client load between them, requests back to back (``--pause`` 0 by
default here): requests answered a second on each, and their ratio per round.

    python -m bench.sequence_affinity [--mechanisms random,hash,session-weighted,session,stream]
        [--phase 8] [--threads 8] [--pause 0.05] [--cycles 2] [--runs pools,rest]
        [--rounds 6] [--output PATH]
    python -m bench.sequence_affinity --runs throughput --rounds 6 --phase 5

Every process started here (two tritonservers, one Envoy at a time) is stopped in finally.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import tritonclient.grpc as triton_grpc

from bench.harness.provenance import host, provenance
from reconciler.core.triton_config import parse_pbtxt, with_versions
from testkit.envoy import LocalEnvoy
from testkit.local_triton import LocalTriton, free_port
from testkit.manifests import SEQUENCE_MODEL, write_model_repository
from testkit.sequences import SequenceLoad, broken_between, in_flight_at, started_between

MECHANISMS = ("random", "hash", "session-weighted", "session", "stream")
CANARY_STEPS = (0, 10, 50, 100)  # percent of the route's requests to the canary pool


class _Envoy(LocalEnvoy):
    """A LocalEnvoy whose bootstrap the mechanism adjusts (``session-weighted``)."""

    naive_session: bool = False

    def config(self) -> dict[str, Any]:
        config = super().config()
        if self.naive_session:
            (listener,) = config["static_resources"]["listeners"]
            manager = listener["filter_chains"][0]["filters"][0]["typed_config"]
            for http_filter in manager["http_filters"]:
                if http_filter["name"] == "envoy.filters.http.stateful_session":
                    http_filter["typed_config"]["strict"] = False
            host = manager["route_config"]["virtual_hosts"][0]
            host["routes"] = [r for r in host["routes"] if "weighted_clusters" in r["route"]]
        return config


def _envoy(workdir: Path, mechanism: str, pools: dict[str, list[str]]) -> _Envoy:
    affinity = {"random": "", "stream": "", "hash": "hash"}.get(mechanism, "session")
    envoy = _Envoy.of(workdir, pools, {"stable": 10_000}, affinity=affinity)
    assert isinstance(envoy, _Envoy)
    envoy.naive_session = mechanism == "session-weighted"
    return envoy


def _weights(envoy: LocalEnvoy, canary_percent: int) -> None:
    canary = canary_percent * 100
    query = f"routing.triton.stable={10_000 - canary}&routing.triton.canary={canary}"
    request = urllib.request.Request(f"{envoy.admin_url}/runtime_modify?{query}", method="POST")
    with urllib.request.urlopen(request, timeout=5) as answer:
        answer.read()


def _load(server: LocalTriton, version: int, repository: Path) -> None:
    base = parse_pbtxt((repository / SEQUENCE_MODEL / "config.pbtxt").read_text())
    with triton_grpc.InferenceServerClient(server.grpc_address) as client:
        config = with_versions(base, SEQUENCE_MODEL, [version])
        client.load_model(SEQUENCE_MODEL, config=json.dumps(config))


def _share(count: int, total: int) -> dict[str, Any]:
    share = count / total if total else float("nan")
    error = math.sqrt(share * (1 - share) / total) if total else float("nan")
    return {"count": count, "share": round(share, 4), "se": round(error, 4)}


def run(
    mechanism: str,
    workdir: Path,
    pools: dict[str, list[str]],
    steps: tuple[int, ...],
    phase: float,
    threads: int,
    pause: float,
) -> dict[str, Any]:
    envoy = _envoy(workdir, mechanism, pools)
    envoy.start()
    try:
        _weights(envoy, steps[0])
        load = SequenceLoad(
            envoy.address,
            threads=threads,
            pause=pause,
            sessions=mechanism.startswith("session"),
            stream=mechanism == "stream",
        )
        marks: list[tuple[int, float]] = []
        with load:
            for step in steps:
                _weights(envoy, step)
                marks.append((step, time.monotonic()))
                time.sleep(phase)
        finished = time.monotonic()  # the last phase runs on until the last sequence ends
        sequences = load.snapshot()
    finally:
        envoy.stop()
    bounds = [m[1] for m in marks[1:]] + [math.inf]
    phases = []
    for (step, start), end in zip(marks, bounds, strict=True):
        new = list(started_between(sequences, start, end))
        answered = [s for s in new if s.scale is not None]
        by_scale = collections.Counter(s.scale for s in answered)
        broken = broken_between(sequences, start, end)
        in_flight = in_flight_at(sequences, start)
        phases.append(
            {
                "canary_percent": step,
                "new_sequences": len(new),
                "answered_by_scale": {
                    str(k): _share(v, len(answered)) for k, v in sorted(by_scale.items())
                },
                "in_flight_at_change": len(in_flight),
                "broken": len(broken),
                "broken_why": dict(
                    collections.Counter(_why(s.broken or "") for s in broken).most_common()
                ),
            }
        )
    return {
        "mechanism": mechanism,
        "pools": pools,
        "sequences": len(sequences),
        "broken": sum(1 for s in sequences if s.broken),
        "completed": sum(1 for s in sequences if s.ended is not None),
        "requests": sum(s.sent for s in sequences),
        "seconds": round(finished - marks[0][1], 1),
        "phases": phases,
    }


def throughput(
    workdir: Path, pools: dict[str, list[str]], rounds: int, phase: float, threads: int,
    pause: float,
) -> dict[str, Any]:  # fmt: skip
    """Requests a second through Envoy with the ``session`` affinity and without, the same
    client load alternating between two Envoys started side by side (run 3)."""
    envoys = {m: _envoy(workdir / m, m, pools) for m in ("random", "session")}
    per_round: list[dict[str, Any]] = []
    try:
        for envoy in envoys.values():
            envoy.start()
        for number in range(rounds):
            # Each round starts with the other one: neither always runs on a warmer machine.
            order = ("random", "session") if number % 2 == 0 else ("session", "random")
            measured: dict[str, Any] = {}
            for mechanism in order:
                load = SequenceLoad(
                    envoys[mechanism].address, threads=threads, pause=pause,
                    sessions=mechanism == "session",
                )  # fmt: skip
                started = time.monotonic()
                with load:
                    time.sleep(phase)
                seconds = time.monotonic() - started  # the last sequences finish in it
                sequences = load.snapshot()
                requests = sum(s.sent for s in sequences)
                measured[mechanism] = {
                    "requests": requests,
                    "seconds": round(seconds, 3),
                    "per_second": round(requests / seconds, 1),
                    "broken": sum(1 for s in sequences if s.broken),
                }
            measured["ratio"] = round(
                measured["session"]["per_second"] / measured["random"]["per_second"], 3
            )
            per_round.append(measured)
            print(
                f"throughput round {number + 1}: off {measured['random']['per_second']}/s, "
                f"on {measured['session']['per_second']}/s, on/off {measured['ratio']}",
                flush=True,
            )
    finally:
        for envoy in envoys.values():
            envoy.stop()
    ratios = sorted(r["ratio"] for r in per_round)
    return {
        "run": "throughput",
        "pools": pools,
        "pause": pause,
        "threads": threads,
        "phase": phase,
        "rounds": per_round,
        "ratio_median": ratios[len(ratios) // 2],
        "ratio_range": [ratios[0], ratios[-1]],
    }


def _why(message: str) -> str:
    for known in ("must specify the START flag", "running sum", "no healthy upstream"):
        if known in message:
            return known
    return message[:80]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mechanisms", default=",".join(MECHANISMS))
    parser.add_argument("--phase", type=float, default=8.0)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--pause", type=float, default=0.05, help="seconds between requests")
    parser.add_argument("--cycles", type=int, default=2, help="times through the steps")
    parser.add_argument("--runs", default="pools,rest")
    parser.add_argument("--rounds", type=int, default=6, help="throughput: rounds on/off")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    mechanisms = [m for m in args.mechanisms.split(",") if m]
    unknown = set(mechanisms) - set(MECHANISMS)
    if unknown:
        parser.error(f"unknown mechanisms {sorted(unknown)}; known: {', '.join(MECHANISMS)}")
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-seq-affinity-") as scratch:
        root = Path(scratch)
        repository = write_model_repository(root / "models")
        a = LocalTriton(repository, log_file=root / "a.log")
        b = LocalTriton(repository, log_file=root / "b.log")
        try:
            a.start()
            b.start()
            _load(a, 1, repository)
            _load(b, 2, repository)
            nowhere = f"127.0.0.1:{free_port('127.0.0.1')}"  # an empty canary at rest
            layouts = {
                "pools": (
                    {"stable": [a.grpc_address], "canary": [b.grpc_address]},
                    CANARY_STEPS * args.cycles,
                ),
                "rest": ({"stable": [a.grpc_address, b.grpc_address], "canary": [nowhere]}, (0,)),
            }
            for run_name in args.runs.split(","):
                if run_name == "throughput":
                    # Back to back unless --pause says otherwise: the cost per request.
                    pause = args.pause if "--pause" in (argv or sys.argv) else 0.0
                    measured = throughput(
                        root / "throughput", {"stable": [a.grpc_address], "canary": [nowhere]},
                        args.rounds, args.phase, args.threads, pause,
                    )  # fmt: skip
                    results.append(measured)
                    continue
                pools, steps = layouts[run_name]
                phase = args.phase if len(steps) > 1 else args.phase * 2
                for mechanism in mechanisms:
                    result = run(
                        mechanism, root / f"envoy-{run_name}-{mechanism}", pools, steps, phase,
                        args.threads, args.pause,
                    )  # fmt: skip
                    result["run"] = run_name
                    results.append(result)
                    print(_line(result), flush=True)
        finally:
            b.stop()
            a.stop()
    report = {"host": host(), "provenance": provenance(), "args": vars(args), "results": results}
    if args.output:
        args.output.write_text(json.dumps(report, indent=2, default=str) + "\n")
    return 0


def _line(result: dict[str, Any]) -> str:
    phases = "; ".join(
        f"{p['canary_percent']}%: new {p['new_sequences']} "
        f"(x2 {p['answered_by_scale'].get('2', {}).get('share', 0):.0%}), "
        f"in flight {p['in_flight_at_change']}, broken {p['broken']} {p['broken_why'] or ''}"
        for p in result["phases"]
    )
    return (
        f"{result['run']:5} {result['mechanism']:16} sequences {result['sequences']}, "
        f"broken {result['broken']}, requests {result['requests']} in {result['seconds']} s | "
        f"{phases}"
    )


if __name__ == "__main__":
    sys.exit(main())
