"""Streaming models compared live (issue 43): how many compared streams catch a candidate
whose generation diverges on 2% of prompts, how often a good but nondeterministic candidate
is failed, and what the comparator costs the clients' time to the first response.

Two real tritonservers: ``a`` (the stable pool, every client stream) and ``c`` (the canary
pool), serving the streaming test model ``gen`` (testkit/models/gen/model.py, 30 tokens a
generation); one real Envoy routes ``--threads`` client threads streaming varied prompts
(``StreamClient(varied=True)``) to ``stable`` and mirrors copies of the streams to the
reconciler's comparator (``adapters/comparator.py``, in this process), which streams each
sampled prompt to the serving version twice and to the candidate once (``bench/shadow.py``
does the same for a unary model).

1. **Streams to catch** (``--catch N``): version 1 against version 10 on ``c`` (version 10
   diverges from token 20 on prompts whose sum is a multiple of 50: 2% of them), every
   mirrored stream compared (rate 200 a second) until N are; for each sample size n, the
   share of the windows of n consecutive comparisons that the default rule fails, at
   minAgreement 0.99 and 0.995, the smallest n caught in at least 95% of them, and the same
   from the binomial distribution at the measured rate.
2. **Nondeterministic good candidate** (``--noisy N``): version 1 against version 2 with the
   config parameter ``noise`` (``--noise``, default 0.1: that share of each version's streams
   has one token, at a random position from 10 on, changed), N comparisons; the share of
   disjoint windows of 100 that the rule fails at minAgreement 0.99, 0.95 and 0.9 (a false
   failure each), and of all windows.
3. **Clients' time to the first response** (``--rounds R``, ``--seconds S``): rounds cycle
   the comparator off (nothing mirrored) and on (the default share, 10%, mirrored and
   compared at the default rate and maxShare, versions 1 and 2 on ``c``); the clients (a
   process of their own) time each stream's first response; p50 and p99 per arm, and their
   ratio on/off, in one run.

    python -m bench.stream_shadow [--catch 2000] [--noisy 2000] [--rounds 6] [--seconds 5]
                                  [--threads 4] [--output bench/results/stream_shadow.json]

Every process started here (two tritonservers, one Envoy) is stopped in ``finally``.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import tritonclient.grpc as triton_grpc

from bench.harness.provenance import host, provenance
from bench.harness.stats import percentile
from bench.shadow import (
    AGREEMENTS,
    SIZES,
    _router,
    binomial_caught,
    caught_share,
    outcome_recorder,
    smallest,
)
from reconciler.adapters.comparator import LiveComparator
from reconciler.model.shadow import LiveShadow, ShadowTarget
from testkit.envoy import LocalEnvoy
from testkit.loadgen import StreamClient
from testkit.local_triton import LocalTriton, free_port
from testkit.manifests import GENERATOR, generator_config, write_generator_repository

TOKENS = "30"
NOISY_AGREEMENTS = (0.99, 0.95, 0.9)
WINDOW = 100  # comparisons a shadow phase's minRequests would judge


def _load(address: str, versions: list[int], noise: str = "0") -> None:
    config = generator_config(versions, {"tokens": TOKENS, "noise": noise}, instances=2)
    with triton_grpc.InferenceServerClient(address) as client:
        client.load_model(GENERATOR, config=json.dumps(config))


def _compare(
    count: int, threads: int, envoy: LocalEnvoy, listen: str, canary: str, candidate: int
) -> tuple[list[tuple[bool, bool]], dict[str, Any], str]:
    """Every mirrored stream compared until ``count`` are: each (the candidate disagreed,
    the serving version disagreed with itself), the comparator's counts, the first reason."""
    outcomes, lock, observe = outcome_recorder()
    comparator = LiveComparator(listen, observe)
    spec = LiveShadow(share=10_000, rate=200, max_share=1.0, timeout=10.0)
    target = ShadowTarget(GENERATOR, GENERATOR, (canary,), 1, (canary,), candidate, spec, "canary")
    router = _router(envoy)
    session = comparator.begin(target)
    started = time.monotonic()
    try:
        router.route({"stable": 10_000, "canary": 0}, {"comparator": 10_000})
        with StreamClient(envoy.address, GENERATOR, threads=threads, varied=True):
            while len(outcomes) < count and time.monotonic() - started < 900:
                time.sleep(0.2)
        figures = session.figures()
    finally:
        router.route({"stable": 10_000, "canary": 0}, {"comparator": 0})
        session.end()
    with lock:
        kept = outcomes[:count]
    return kept, figures.counts(), figures.comparison.first_candidate


def catch_run(
    count: int, threads: int, envoy: LocalEnvoy, listen: str, stable: str, canary: str
) -> dict[str, Any]:
    _load(stable, [1])
    _load(canary, [1, 10])
    started = time.monotonic()
    kept, counts, first = _compare(count, threads, envoy, listen, canary, 10)
    rate = sum(c for c, _ in kept) / len(kept) if kept else math.nan
    windows = {
        str(a): {str(n): caught_share(kept, n, a) for n in SIZES if n <= len(kept)}
        for a in AGREEMENTS
    }
    binomial = {str(a): {str(n): binomial_caught(rate, n, a) for n in SIZES} for a in AGREEMENTS}
    return {
        "compared": len(kept),
        "seconds": time.monotonic() - started,
        "disagreement_rate": rate,
        "noise_rate": sum(s for _, s in kept) / len(kept) if kept else math.nan,
        "first_disagreement": first,
        "figures": counts,
        "caught_share_by_window": windows,
        "caught_binomial": binomial,
        "streams_to_catch_95": {
            str(a): {
                "windows": smallest({int(n): v for n, v in windows[str(a)].items()}),
                "binomial": smallest({int(n): v for n, v in binomial[str(a)].items()}),
            }
            for a in AGREEMENTS
        },
    }


def noisy_run(
    count: int, noise: str, threads: int, envoy: LocalEnvoy, listen: str, stable: str, canary: str
) -> dict[str, Any]:
    _load(stable, [1], noise)
    _load(canary, [1, 2], noise)
    started = time.monotonic()
    kept, counts, first = _compare(count, threads, envoy, listen, canary, 2)
    disjoint = [kept[i : i + WINDOW] for i in range(0, len(kept) - WINDOW + 1, WINDOW)]

    def failed(window: list[tuple[bool, bool]], agreement: float) -> bool:
        return caught_share(window, len(window), agreement) > 0

    return {
        "noise": noise,
        "compared": len(kept),
        "seconds": time.monotonic() - started,
        "candidate_rate": sum(c for c, _ in kept) / len(kept) if kept else math.nan,
        "noise_rate": sum(s for _, s in kept) / len(kept) if kept else math.nan,
        "first_disagreement": first,
        "figures": counts,
        "disjoint_windows": len(disjoint),
        "false_failures": {str(a): sum(failed(w, a) for w in disjoint) for a in NOISY_AGREEMENTS},
        "false_failure_share_all_windows": {
            str(a): caught_share(kept, WINDOW, a) for a in NOISY_AGREEMENTS
        },
    }


def _clients(address: str, threads: int, seconds: float, out: str) -> None:
    """Streaming clients through Envoy for ``seconds``, in a process of their own, every
    stream written to ``out`` as [started, seconds to the first response, failed]."""
    with StreamClient(address, GENERATOR, threads=threads, varied=True) as clients:
        time.sleep(seconds)
    Path(out).write_text(
        json.dumps([[s.started, s.first, s.error is not None] for s in clients.streams])
    )


def first_response_run(
    rounds: int,
    seconds: float,
    threads: int,
    envoy: LocalEnvoy,
    listen: str,
    stable: str,
    canary: str,
    root: Path,
) -> dict[str, Any]:
    _load(stable, [1])
    _load(canary, [1, 2])
    comparator = LiveComparator(listen)
    spec = LiveShadow(share=1_000)  # 10%, rate 20, maxShare 0.05: the defaults
    target = ShadowTarget(GENERATOR, GENERATOR, (canary,), 1, (canary,), 2, spec, "canary")
    router = _router(envoy)
    out = root / "first-response-samples.json"
    warmup, arms = 3.0, ("off", "on")
    clients = multiprocessing.get_context("spawn").Process(
        target=_clients,
        args=(envoy.address, threads, warmup + len(arms) * rounds * seconds + 1, str(out)),
    )
    clients.start()
    windows: list[tuple[str, float, float]] = []
    compared = 0
    try:
        time.sleep(warmup)
        for index in range(len(arms) * rounds):
            arm = arms[index % len(arms)]
            session = comparator.begin(target) if arm == "on" else None
            router.route({"stable": 10_000, "canary": 0}, {"comparator": 1_000 if session else 0})
            start = time.monotonic()
            time.sleep(seconds)
            windows.append((arm, start, time.monotonic()))
            if session is not None:
                compared += session.figures().compared
                session.end()
        router.route({"stable": 10_000, "canary": 0}, {"comparator": 0})
    finally:
        clients.join(timeout=len(arms) * rounds * seconds + 60)
        if clients.is_alive():
            clients.terminate()
    samples = json.loads(out.read_text())
    firsts: dict[str, list[float]] = {arm: [] for arm in arms}
    for arm, start, end in windows:
        firsts[arm] += [f for s, f, failed in samples if start <= s <= end and f and not failed]
    p50 = {arm: percentile(values, 50) for arm, values in firsts.items()}
    p99 = {arm: percentile(values, 99) for arm, values in firsts.items()}
    return {
        "streams": {arm: len(v) for arm, v in firsts.items()},
        "p50_ms": {arm: v * 1000 if v else None for arm, v in p50.items()},
        "p99_ms": {arm: v * 1000 if v else None for arm, v in p99.items()},
        "p50_on_over_off": p50["on"] / p50["off"] if p50["on"] and p50["off"] else None,
        "p99_on_over_off": p99["on"] / p99["off"] if p99["on"] and p99["off"] else None,
        "compared_while_on": compared,
        "client_failures": sum(1 for _, _, failed in samples if failed),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--catch", type=int, default=2000, help="comparisons of version 10")
    parser.add_argument("--noisy", type=int, default=2000, help="comparisons of the noisy one")
    parser.add_argument("--noise", default="0.1", help="the noisy versions' share of streams")
    parser.add_argument("--rounds", type=int, default=6, help="rounds of each arm")
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds per round")
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--parts", default="catch,noisy,first", help="comma-separated")
    parser.add_argument("--output", type=Path, default=Path("bench/results/stream_shadow.json"))
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="bench-stream-shadow-"))
    models = write_generator_repository(root / "models")
    servers = {n: LocalTriton(models, log_file=root / f"triton-{n}.log") for n in "ac"}
    envoy: LocalEnvoy | None = None
    try:
        for server in servers.values():
            server.start()
        listen = f"127.0.0.1:{free_port('127.0.0.1')}"
        stable, canary = servers["a"].grpc_address, servers["c"].grpc_address
        envoy = LocalEnvoy.of(
            root / "envoy",
            {"stable": [stable], "canary": [canary]},
            {"stable": 10_000},
            mirrors={"comparator": [listen]},
        ).start()
        parts = set(args.parts.split(","))
        fleet = (envoy, listen, stable, canary)
        catch = catch_run(args.catch, args.threads, *fleet) if "catch" in parts else None
        noisy = (
            noisy_run(args.noisy, args.noise, args.threads, *fleet) if "noisy" in parts else None
        )
        first = (
            first_response_run(args.rounds, args.seconds, args.threads, *fleet, root)
            if "first" in parts
            else None
        )
        result = {
            "machine": host(),
            "provenance": provenance(),
            "arguments": vars(args) | {"output": str(args.output)},
            "catch": catch,
            "noisy": noisy,
            "first_response": first,
        }
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(result, indent=2, default=str))
        summary = {
            "streams_to_catch_95": catch and catch["streams_to_catch_95"],
            "divergent_rate": catch and catch["disagreement_rate"],
            "noisy_false_failures": noisy and noisy["false_failures"],
            "noisy_windows": noisy and noisy["disjoint_windows"],
            "first_response_p50_on_over_off": first and first["p50_on_over_off"],
            "first_response_p99_on_over_off": first and first["p99_on_over_off"],
        }
        print(json.dumps(summary, indent=2), file=sys.stdout)
    finally:
        if envoy is not None:
            envoy.stop()
        for server in servers.values():
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
