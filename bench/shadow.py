"""Live shadow traffic, compared (issue 31): how many sampled requests catch a subtly wrong
candidate, whether a good but nondeterministic one is ever failed, and what the comparator
costs the clients.

Two real tritonservers: ``a`` (the stable pool, every client request) and ``c`` (the canary
pool). One real Envoy routes ``--threads`` client threads (varied inputs) to ``stable`` and
mirrors copies to the reconciler's comparator (``adapters/comparator.py``, in this process).
The test model answers its input times ``scale`` (1 for every version here), with the config
parameters of ``testkit/models/echo/model.py``.

1. **Requests to catch** (``--catch N``): the comparator compares version 1 with version 2 on
   ``c`` (both loaded there, as in a rollout's shadow phase), version 2 5% off on the inputs
   whose CRC-32 is a multiple of 50 (2% of inputs), every mirrored request compared (rate 200
   a second) until N are. From the per-request outcomes: the disagreement rate measured, and
   for each sample size n the share of the windows of n consecutive comparisons (every start)
   that the default rule (disagreement beyond the noise above 1 - minAgreement) fails, at
   minAgreement 0.99 (the default) and 0.995; the smallest n caught in at least 95% of them,
   beside the same figure from the binomial distribution at the measured rate.
2. **False failures** (``--rollouts N``): N real rollouts (one reconcile pass each, in this
   process) of a good candidate whose answers carry relative noise 1e-5 drawn per request
   (as GPU kernels' reordered sums), alternating versions 1 and 2, each a canary with a
   shadow phase (share 100%, minRequests 100, relativeTolerance 1e-4) under client load. Goal:
   0 failed.
3. **Client p99 with the comparator on** (``--rounds R``, ``--seconds S``): rounds cycle
   through the comparator off (nothing mirrored), ``mirrored`` (Envoy mirrors the default
   share, 10%, to the comparator's port while nothing listens there: Envoy's own cost) and
   on (mirrored and compared at the default rate and maxShare, versions 1 and 2 on ``c``),
   S seconds each; the clients (a process of their own) p99 over each arm's rounds, in one
   run. Goal: on within 5% of off. With ``--pin`` (issue 41, point 8) the machine is split as
   a cluster would be: the clients, Envoy and the serving pool's server on CPU 0, the canary
   pool's server and the comparator (this process) on CPU 1, so that the figure says what the
   design costs the clients rather than what sharing two cores with the comparator does.

    python -m bench.shadow [--catch 2000] [--rollouts 20] [--rounds 10] [--seconds 5]
                           [--threads 2] [--pin] [--output bench/results/shadow.json]

Every process started here (two tritonservers, one Envoy) is stopped in ``finally``.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import tritonclient.grpc as triton_grpc

from bench.harness.passes import pass_settings, run_pass
from bench.harness.procfs import pin
from bench.harness.provenance import host, provenance
from bench.harness.stats import percentile
from reconciler.adapters.comparator import LiveComparator
from reconciler.adapters.envoy import EnvoyRouter
from reconciler.core.comparison import beyond_noise
from reconciler.model.settings import AnalysisSettings
from reconciler.model.shadow import LiveShadow, ShadowTarget, Tolerance
from reconciler.model.source import Source
from reconciler.model.traffic import EnvoyRoute, Pool, RouterSpec
from testkit.envoy import LocalEnvoy
from testkit.loadgen import LoadGenerator
from testkit.local_triton import LocalTriton, free_port
from testkit.manifests import (
    ECHO_CONFIG,
    ManifestRepo,
    router_doc,
    server_doc,
    write_model_repository,
)

# The p99 part's arms, in turn: nothing mirrored; mirrored to a comparator port nobody
# listens on; mirrored and compared.
ARMS = ("off", "mirrored", "on")
SIZES = (50, 100, 150, 200, 300, 400, 500, 600, 800, 1000, 1200, 1500)
AGREEMENTS = (0.99, 0.995)


def caught_share(outcomes: Sequence[tuple[bool, bool]], n: int, min_agreement: float) -> float:
    """The share of the windows of ``n`` consecutive comparisons (every start) that the
    reconciler's rule fails (``core.comparison.beyond_noise``: the candidate's disagreements
    beyond the noise's, against 1 - min_agreement and the noise's chance). Each outcome is
    (the candidate disagreed, the serving version disagreed with itself)."""
    if len(outcomes) < n:
        return math.nan
    candidate = [0] + [0] * len(outcomes)
    noise = [0] + [0] * len(outcomes)
    for i, (c, s) in enumerate(outcomes):
        candidate[i + 1] = candidate[i] + c
        noise[i + 1] = noise[i] + s
    windows = len(outcomes) - n + 1
    failed = sum(
        beyond_noise(candidate[i + n] - candidate[i], noise[i + n] - noise[i], n, min_agreement)
        for i in range(windows)
    )
    return failed / windows


def binomial_caught(p: float, n: int, min_agreement: float) -> float:
    """P(Binomial(n, p) > n * (1 - min_agreement)): the rule's catch probability for a
    candidate that disagrees on a share ``p`` of inputs, with no noise."""
    limit = math.floor(n * (1.0 - min_agreement) + 1e-9)
    below = sum(math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(limit + 1))
    return 1.0 - below


def outcome_recorder() -> tuple[
    list[tuple[bool, bool]], threading.Lock, Callable[[str, str], None]
]:
    """Every comparison the comparator's observer hears of, as (the candidate disagreed, the
    serving version disagreed with itself), in order; the lock that guards the list; the
    observer to give ``LiveComparator``."""
    outcomes: list[tuple[bool, bool]] = []
    lock = threading.Lock()

    def observe(_deployment: str, outcome: str) -> None:
        with lock:
            if outcome == "compared":
                outcomes.append((False, False))
            elif outcome == "candidate_disagreed":
                outcomes[-1] = (True, outcomes[-1][1])
            elif outcome == "noise":
                outcomes[-1] = (outcomes[-1][0], True)

    return outcomes, lock, observe


def smallest(caught: dict[int, float], share: float = 0.95) -> int | None:
    return next((n for n in sorted(caught) if caught[n] >= share), None)


def _load(address: str, parameters: dict[str, str], versions: list[int]) -> None:
    config = {
        **ECHO_CONFIG,
        "parameters": {k: {"string_value": v} for k, v in parameters.items()},
        "version_policy": {"specific": {"versions": versions}},
    }
    with triton_grpc.InferenceServerClient(address) as client:
        client.load_model("echo", config=json.dumps(config))


def _unload_all(address: str) -> None:
    with triton_grpc.InferenceServerClient(address) as client:
        client.unload_model("echo")


def _router(envoy: LocalEnvoy) -> EnvoyRouter:
    spec = RouterSpec(
        "edge",
        (Pool("stable", server_names=("a",)), Pool("canary", server_names=("c",))),
        envoy=EnvoyRoute(envoy.admin_url, "routing.triton", "mirror.triton"),
        comparator="comparator",
    )
    return EnvoyRouter(spec)


def catch_run(
    catch: int, threads: int, envoy: LocalEnvoy, listen: str, stable: str, canary: str
) -> dict[str, Any]:
    _load(stable, {"scale": "1"}, [1])
    _load(canary, {"scale": "1", "skew_every": "2:50"}, [1, 2])
    outcomes, lock, observe = outcome_recorder()
    comparator = LiveComparator(listen, observe)
    spec = LiveShadow(share=10_000, tolerance=Tolerance(rtol=1e-4), rate=200, max_share=1.0)
    target = ShadowTarget("echo", "echo", (canary,), 1, (canary,), 2, spec, "canary")
    router = _router(envoy)
    session = comparator.begin(target)
    started = time.monotonic()
    try:
        router.route({"stable": 10_000, "canary": 0}, {"comparator": 10_000})
        with LoadGenerator(envoy.address, "echo", threads=threads, varied=True):
            while len(outcomes) < catch and time.monotonic() - started < 600:
                time.sleep(0.2)
        figures = session.figures()
    finally:
        router.route({"stable": 10_000, "canary": 0}, {"comparator": 0})
        session.end()
    with lock:
        kept = outcomes[:catch]
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
        "first_disagreement": figures.comparison.first_candidate,
        "figures": figures.counts(),
        "caught_share_by_window": windows,
        "caught_binomial": binomial,
        "requests_to_catch_95": {
            str(a): {
                "windows": smallest({int(n): v for n, v in windows[str(a)].items()}),
                "binomial": smallest({int(n): v for n, v in binomial[str(a)].items()}),
            }
            for a in AGREEMENTS
        },
    }


def _clients(address: str, threads: int, seconds: float, out: str) -> None:
    """Client threads through Envoy for ``seconds``, in a process of their own (the
    comparator's threads must not share the clients' interpreter lock), every sample
    written to ``out`` as [started, seconds, failed] (``time.monotonic``: one clock for every
    process of the machine)."""
    with LoadGenerator(address, "echo", threads=threads, varied=True) as load:
        time.sleep(seconds)
    Path(out).write_text(
        json.dumps([[s.started, s.seconds, s.error is not None] for s in load.samples])
    )


def p99_run(
    rounds: int,
    seconds: float,
    threads: int,
    envoy: LocalEnvoy,
    listen: str,
    stable: str,
    canary: str,
    root: Path,
    share: int = 1_000,
    pinned: dict[str, int] | None = None,
) -> dict[str, Any]:
    """``pinned``: where the processes are kept, by role -> pid (``--pin``); the clients'
    process joins the serving side's CPU as it starts."""
    _load(stable, {"scale": "1"}, [1])
    _load(canary, {"scale": "1"}, [1, 2])
    comparator = LiveComparator(listen)
    spec = LiveShadow(share=share)  # rate 20, maxShare 0.05: the defaults
    target = ShadowTarget("echo", "echo", (canary,), 1, (canary,), 2, spec, "canary")
    router = _router(envoy)
    out = root / "p99-samples.json"
    warmup = 3.0
    clients = multiprocessing.get_context("spawn").Process(
        target=_clients,
        args=(envoy.address, threads, warmup + len(ARMS) * rounds * seconds + 1, str(out)),
    )
    clients.start()
    where = None
    if pinned is not None and clients.pid is not None:
        pinned["clients"] = clients.pid
        where = _pin(pinned)
    windows: list[tuple[str, float, float]] = []
    compared = 0
    try:
        time.sleep(warmup)
        for index in range(len(ARMS) * rounds):
            arm = ARMS[index % len(ARMS)]
            session = comparator.begin(target) if arm == "on" else None
            # "mirrored": Envoy mirrors the share to the comparator's port, nobody listens:
            # Envoy's own cost of the mirror, without the comparator's.
            mirrored = 0 if arm == "off" else share
            router.route({"stable": 10_000, "canary": 0}, {"comparator": mirrored})
            start = time.monotonic()
            time.sleep(seconds)
            windows.append((arm, start, time.monotonic()))
            if session is not None:
                compared += session.figures().compared
                session.end()
        router.route({"stable": 10_000, "canary": 0}, {"comparator": 0})
    finally:
        clients.join(timeout=len(ARMS) * rounds * seconds + 60)
        if clients.is_alive():
            clients.terminate()
    samples = json.loads(out.read_text())
    latencies: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for arm, start, end in windows:
        latencies[arm] += [
            s for started, s, failed in samples if start <= started <= end and not failed
        ]
    p99 = {arm: percentile(values, 99) for arm, values in latencies.items()}
    p50 = {arm: percentile(values, 50) for arm, values in latencies.items()}
    return {
        "share": share,
        "pinned": where,
        "requests": {arm: len(values) for arm, values in latencies.items()},
        "p50_ms": {arm: v * 1000 if v else None for arm, v in p50.items()},
        "p99_ms": {arm: v * 1000 if v else None for arm, v in p99.items()},
        "p99_on_over_off": p99["on"] / p99["off"] if p99["on"] and p99["off"] else None,
        "p99_mirrored_over_off": (
            p99["mirrored"] / p99["off"] if p99["mirrored"] and p99["off"] else None
        ),
        "p99_on_over_off_by_round": [
            _round_ratio(samples, windows[i], windows[i + 2])
            for i in range(0, len(windows), len(ARMS))
        ],
        "compared_while_on": compared,
        "client_failures": sum(1 for _, _, failed in samples if failed),
    }


# --pin: the serving side (clients, Envoy, the stable pool's server) and the comparison side
# (the canary pool's server, the comparator in this process) on a CPU each.
SERVING_SIDE, COMPARING_SIDE = {0}, {1}
SIDES = {"clients": SERVING_SIDE, "envoy": SERVING_SIDE, "stable": SERVING_SIDE}


def _pin(pinned: dict[str, int]) -> dict[str, dict[str, Any]]:
    """Each role pinned to its side: the CPUs the kernel then reports and the tasks (threads
    and child processes' threads) moved."""
    # This process (the comparator) alone: the servers, Envoy and the clients are its
    # children, each pinned to its own side.
    tasks = {
        role: pin(pid, SIDES.get(role, COMPARING_SIDE), below=role != "comparator")
        for role, pid in pinned.items()
    }
    return {
        role: {"cpus": sorted(os.sched_getaffinity(pid)), "tasks": tasks[role]}
        for role, pid in pinned.items()
    }


def _round_ratio(
    samples: Sequence[Sequence[Any]], off: tuple[str, float, float], on: tuple[str, float, float]
) -> float | None:
    """One round's p99 with the comparator on over the round's p99 with it off."""
    values = {
        arm: percentile(
            [s for started, s, failed in samples if a <= started <= b and not failed], 99
        )
        for arm, a, b in (off, on)
    }
    return values["on"] / values["off"] if values["on"] and values["off"] else None


def false_failures(
    rollouts: int, threads: int, root: Path, models: Path, servers: dict[str, LocalTriton],
    envoy: LocalEnvoy, listen: str,
) -> dict[str, Any]:  # fmt: skip
    for server in servers.values():
        _unload_all(server.grpc_address)
    repo = ManifestRepo(root / "git")
    for name, server in servers.items():
        repo.write(
            f"servers/{name}.yaml",
            server_doc(name, server.grpc_address, models, metrics=server.metrics_url),
        )
    repo.write("router.yaml", router_doc(envoy.admin_url, {"stable": ["a"], "canary": ["c"]},
                                         "comparator"))  # fmt: skip
    source = Source(repo.url)
    settings = pass_settings(root / "cache", root / "state.db")
    settings = replace(settings, analysis=AnalysisSettings(comparator_listen=listen))
    shadow = "{share: 100%, rate: 100, maxShare: 0.5, minRequests: 100, " \
        "compare: {relativeTolerance: 0.0001}}"  # fmt: skip

    def doc(version: int) -> str:
        return (
            "apiVersion: triton-gitops.dev/v1alpha1\nkind: ModelDeployment\n"
            "metadata: {name: echo}\nspec:\n  servers: {names: [a, c]}\n"
            f"  versions: [{version}]\n"
            "  config: {parameters: {scale: {string_value: '1'}, noise: {string_value: '1e-5'}}}\n"
            "  verify:\n    analysis:\n      interval: 1s\n      duration: 2s\n"
            "      checks: [{name: success-rate, successRate: {min: 0.99}}]\n"
            "  rollout:\n    traffic: {router: edge, strategy: canary, stablePool: stable, "
            f"canaryPool: canary, steps: [50%], shadow: {shadow}}}\n"
        )

    runs: list[dict[str, Any]] = []
    with LoadGenerator(envoy.address, "echo", threads=threads, varied=True) as load:
        repo.write("echo.yaml", doc(1))
        repo.commit("echo 1")
        first = run_pass(source, settings)
        assert first.result is not None and first.result.ok, first
        for index in range(rollouts):
            version = 2 if index % 2 == 0 else 1
            repo.write("echo.yaml", doc(version))
            repo.commit(f"echo {version}")
            before = len(load.failures)
            started = time.monotonic()
            report = run_pass(source, settings)
            result = report.result
            shadow_checks = [
                str(r)
                for change in (result.changes if result else ())
                for step in change.steps
                for evaluation in step.evaluations
                for r in evaluation.results
                if r.check == "shadow"
            ]
            runs.append(
                {
                    "version": version,
                    "ok": bool(result and result.ok),
                    "seconds": time.monotonic() - started,
                    "client_failures": len(load.failures) - before,
                    "last_shadow_check": shadow_checks[-1] if shadow_checks else None,
                    "error": next((c.error for c in result.changes if c.error), None)
                    if result
                    else "no result",
                }
            )
            print(f"rollout {index + 1}: {runs[-1]['ok']} {runs[-1]['last_shadow_check']}",
                  file=sys.stderr)  # fmt: skip
    return {
        "rollouts": len(runs),
        "failed": sum(not r["ok"] for r in runs),
        "client_failures": sum(r["client_failures"] for r in runs),
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--catch", type=int, default=2000, help="comparisons of the bad one")
    parser.add_argument("--rollouts", type=int, default=20, help="rollouts of the good one")
    parser.add_argument("--rounds", type=int, default=10, help="rounds of each p99 arm")
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds per round")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--share", default="10%", help="the p99 part's mirror share (default: the schema's)"
    )
    parser.add_argument(
        "--parts", default="catch,p99,rollouts", help="which parts to run, comma-separated"
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help="the p99 part with clients, Envoy and the stable server on CPU 0, the canary "
        "server and the comparator on CPU 1",
    )
    parser.add_argument("--output", type=Path, default=Path("bench/results/shadow.json"))
    args = parser.parse_args(argv)
    if args.pin and not {0, 1} <= os.sched_getaffinity(0):
        parser.error("--pin needs CPUs 0 and 1")
    root = Path(tempfile.mkdtemp(prefix="bench-shadow-"))
    models = write_model_repository(root / "models")
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
        catch = (
            catch_run(args.catch, args.threads, envoy, listen, stable, canary)
            if "catch" in parts
            else None
        )
        share = round(float(args.share.rstrip("%")) * 100)
        pinned = None
        if args.pin:
            started = {"envoy": envoy.process, "stable": servers["a"].process}
            started["canary"] = servers["c"].process
            pinned = {role: p.pid for role, p in started.items() if p is not None}
            pinned["comparator"] = os.getpid()
        p99 = (
            p99_run(
                args.rounds,
                args.seconds,
                args.threads,
                envoy,
                listen,
                stable,
                canary,
                root,
                share,
                pinned,
            )
            if "p99" in parts
            else None
        )
        print(json.dumps(p99), file=sys.stderr)
        good = (
            false_failures(args.rollouts, args.threads, root, models, servers, envoy, listen)
            if "rollouts" in parts
            else None
        )
        result = {
            "machine": host(),
            "provenance": provenance(),
            "arguments": vars(args) | {"output": str(args.output)},
            "catch": catch,
            "p99": p99,
            "false_failures": good,
        }
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(result, indent=2, default=str))
        summary = {
            **(
                {
                    "requests_to_catch_95": catch["requests_to_catch_95"],
                    "disagreement_rate": catch["disagreement_rate"],
                }
                if catch
                else {}
            ),
            **({"false_failures": f"{good['failed']} of {good['rollouts']}"} if good else {}),
            **(
                {
                    "p99_on_over_off": p99["p99_on_over_off"],
                    "p99_mirrored_over_off": p99["p99_mirrored_over_off"],
                }
                if p99
                else {}
            ),
        }
        print(json.dumps(summary, indent=2))
    finally:
        if envoy is not None:
            envoy.stop()
        for server in servers.values():
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
