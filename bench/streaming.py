"""Streaming rollouts (issue 42, "Goals"): streaming versions rolled out under client streams.

Everything is real: tritonservers (``testkit.local_triton``) serving the streaming test model
``gen`` (testkit/models/gen/model.py: one token a response, then Triton's final flag; good
versions 1 and 2; 3 an error in every stream; 4 fails after two tokens; 5 its first response
300 ms late; 7 never sends the final flag; 8 fails one stream in twenty midway), Envoy
(``testkit.envoy``) for the traffic arms, the reconciler as ``apply --output json``
(``testkit.cli_run``) against a bare Git remote (``testkit.manifests.ManifestRepo``), and
clients streaming all along through ``testkit.loadgen.StreamClient`` (gRPC ModelStreamInfer,
unversioned, each stream on a connection of its own; every stream's tokens, versions and
error recorded). A client stream is *failed* when it ended with an error, *cut* when it
ended without its final flag (the client's 30 s) or with fewer tokens than asked, *mixed*
when two versions answered it.

Every analysis: ``interval: 1s``, ``duration: 4s``, ``probes: {maxShare: 0.5, timeout: 5s}``
(a probe is a whole stream: at the default 0.05 a 0.2 s stream is one probe in 4 s),
checks ``successRate: {min: 0.99}``, ``latency: {maxIncrease: 1.0}`` (time to the first
response) and ``latency: {maxIncrease: 1.0, of: betweenResponses}``, the rest at its
defaults. With ``probes: {enabled: false}`` the two latency checks are left out: a streaming
model's latency is judged by the probes alone (README), so without probes they could only
end every analysis inconclusive, a good version's as a bad one's. Generations: 20 tokens
10 ms apart (0.2 s), two instances a server, 2 client threads.

1. *Good rollouts* (``--rollouts``, default 20): half through a canary (servers a, c behind
   Envoy, pools stable [a] and canary [c], ``steps: [5%, 50%]``), half through a blue-green
   switch (pools blue [a] and green [c], ``keepOld: 3s``), versions alternating 1 -> 2 and
   2 -> 1; half of each (which half: ``--seed``) with the CPU burner of
   ``bench.false_verdicts`` (``bench.harness.burner``) from just before the apply to its
   end. Per rollout: converged or a false revert (its verdict in the reconciler's words),
   the client streams failed, cut and mixed. And ``--rollouts`` / 2 more in place (arm
   ``in-place``: one server, clients straight to it), each 1 -> 2 from 1 deployed anew, so
   that 2 takes the clients' streams and is held to 1's first response probed under them
   before the load; half with the burner (their own draw: ``--seed`` + 1).
2. *Bad versions* (``--bad-rollouts`` each, default 2), from a good version serving:
   (a) ``in-place``: one server, clients straight to it (a new version beside the old takes
   every unversioned stream from its load on), versions 3, 4, 5, 8, and 7 on a server of its
   own (Triton keeps it UNLOADING for ever); (b) through the canary's Envoy at its 5% first
   step, ``envoy-probes-off`` and ``envoy-probes-on``, versions 3, 4, 5, 8. Caught: apply
   exits 1 and the old version alone serves again. Affected: client streams failed or cut,
   and for 5 also every whole stream it answered (late). Goals: at most 25 in place, 20
   through Envoy with the probes off, 0 with them on.
3. *No client* (``--no-client``, default 10): a good version on one server with the
   analysis declared and no client at all, alternating 1 -> 2 and 2 -> 1: promoted on its
   probes' evidence, or not.
4. *Swap with streams in flight* (``--swaps``, default 2): one server, 20 instances, 20
   client threads each streaming 60 tokens 100 ms apart (6 s; the request's own ``tokens``:
   the config's 5 keep the synthesized verify stream short), an in-place swap 1 -> 2 (then
   2 -> 1) without analysis: streams cut, and the unload step's ``stream_wait_seconds``.

    python -m bench.streaming [--quick] [--rollouts N] [--bad-rollouts N] [--no-client N]
        [--swaps N] [--seed S] [--parts ...] [--arms ...] [--checks all|success-rate]

``--checks success-rate``: every analysis with the success rate alone (no latency check).

``--quick``: 4 good rollouts, each bad version once, 2 without clients, 1 swap. Every
process started here (tritonservers, Envoys, burners) is ended by its pid in ``finally``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.harness.burner import burner_plan, burning
from bench.harness.cli import markdown_main
from bench.harness.errors import BenchError
from bench.harness.provenance import busy_processes, machine, other_tritonservers, provenance
from bench.harness.report import render
from bench.harness.streams import probes_sent, stream_figures, unload_wait
from bench.harness.triton import Index
from bench.harness.verdicts import caught_by, outcomes, phase, verdict_text
from testkit.cli_run import CliRun, Reconciler
from testkit.envoy import LocalEnvoy
from testkit.loadgen import StreamClient
from testkit.local_triton import LocalTriton
from testkit.manifests import GENERATOR, ManifestRepo, router_doc, server_doc
from testkit.manifests import write_generator_repository as generator_repository

RESULTS = Path(__file__).parent / "results"
INTERVAL_S, DURATION_S = 1.0, 4.0
MIN_SUCCESS, LATENCY_MAX_INCREASE = 0.99, 1.0
TOKENS, TOKEN_MS, INSTANCES, THREADS = 20, 10, 2, 2
SWAP_TOKENS, SWAP_CONFIG_TOKENS, SWAP_TOKEN_MS, SWAP_STREAMS = 60, 5, 100, 20
WINDOW_TAIL_S = 0.5  # clients stream on this long after the apply's end
UNENDING = 7  # never sends the final flag: Triton keeps it UNLOADING for ever
GOALS = {"in-place": 25, "envoy-probes-off": 20, "envoy-probes-on": 0}
CANARY = (
    "{router: edge, strategy: canary, stablePool: stable, canaryPool: canary, steps: [5%, 50%]}"
)
BLUE_GREEN = "{router: edge, strategy: blueGreen, pools: [blue, green], keepOld: 3s}"
POOLS = {"canary": ("stable", "canary"), "blue-green": ("blue", "green")}
PARTS = ("good", "bad", "no-client", "swap")
ARMS = ("in-place", "canary", "blue-green", "envoy-probes-off", "envoy-probes-on")
STUCK = (3, 4, 5, 7, 8)  # Triton may leave these UNLOADING for ever: each bad rollout says which


@dataclass(frozen=True)
class Bad:
    version: int
    what: str
    effect: str  # error: its streams fail or are cut; slow: its streams are late


BADS = {
    3: Bad(3, "an error in every stream", "error"),
    4: Bad(4, "fails after two tokens", "error"),
    5: Bad(5, "first response 300 ms late", "slow"),
    8: Bad(8, "fails one stream in twenty midway", "error"),
    UNENDING: Bad(UNENDING, "never sends the final flag", "error"),
}


# -- the manifests (pure) -----------------------------------------------------------------------


def deployment_doc(
    version: int,
    servers: Sequence[str],
    *,
    flip: bool = False,
    analysis: bool = True,
    probes: bool = True,
    latency: bool = True,
    traffic: str | None = None,
    swap: bool = False,
    duration: float = DURATION_S,
    first_response: float | None = None,
) -> str:
    """gen's ModelDeployment; ``flip`` adds the default ``failureLimit: 0`` (a new spec, the
    same behaviour: a held spec is tried again only after a commit changes it); ``swap``:
    the in-flight arm's config (20 instances, 5 tokens 100 ms apart); ``latency``: the two
    latency checks (only with the probes, which alone judge them); ``first_response``: a
    smoke case bounding the time to the first response (seconds), the check of a slow first
    response that the probes-off arm has (``--first-response``)."""
    tokens, token_ms = (SWAP_CONFIG_TOKENS, SWAP_TOKEN_MS) if swap else (TOKENS, TOKEN_MS)
    lines = [
        "apiVersion: triton-gitops.dev/v1alpha1",
        "kind: ModelDeployment",
        f"metadata: {{name: {GENERATOR}}}",
        "spec:",
        f"  servers: {{names: [{', '.join(servers)}]}}",
        f"  versions: [{version}]",
        "  config:",
        f"    parameters: {{tokens: {{string_value: '{tokens}'}}, "
        f"token_ms: {{string_value: '{token_ms}'}}}}",
        f"    instance_group: [{{kind: KIND_CPU, count: {SWAP_STREAMS if swap else INSTANCES}}}]",
    ]
    if analysis or first_response is not None:
        lines += ["  verify:"]
    if first_response is not None:
        lines += [
            "    smoke:",
            "      - name: first-response",
            "        inputs: {PROMPT: {datatype: INT32, shape: [3], data: [1, 2, 3]}}",
            f"        stream: {{firstResponse: {first_response * 1000:g}ms}}",
        ]
    if analysis:
        lines += [
            "    analysis:",
            f"      interval: {INTERVAL_S:g}s",
            f"      duration: {duration:g}s",
            *(["      failureLimit: 0"] if flip else []),
            "      probes: {maxShare: 0.5, timeout: 5s}"
            if probes
            else "      probes: {enabled: false}",
            "      checks:",
            "        - name: success-rate",
            f"          successRate: {{min: {MIN_SUCCESS:g}}}",
        ]
        if probes and latency:
            lines += [
                "        - name: first-response",
                f"          latency: {{maxIncrease: {LATENCY_MAX_INCREASE:g}}}",
                "        - name: between-responses",
                f"          latency: {{maxIncrease: {LATENCY_MAX_INCREASE:g}, "
                "of: betweenResponses}",
            ]
    if traffic is not None:
        lines += ["  rollout:", f"    traffic: {traffic}"]
    return "\n".join(lines) + "\n"


# -- what the streams and the report say (pure) -------------------------------------------------


def summarize(result: Mapping[str, Any]) -> dict[str, Any]:
    """Per part: the counts BENCHMARKS.md reports, and each goal met or missed."""
    good, bad = result.get("good", []), result.get("bad", [])
    arms: dict[str, dict[str, Any]] = {}
    for r in good:
        a = arms.setdefault(f"{r['arm']}, burner {'on' if r['burner'] else 'off'}", {
            "rollouts": 0, "false_reverts": 0, "streams": 0, "failed": 0, "cut": 0, "mixed": 0,
            "verdicts": [], "apply_seconds": [], "burner_cores": []})  # fmt: skip
        a["rollouts"] += 1
        a["false_reverts"] += r["false_revert"]
        for key in ("streams", "failed", "cut", "mixed"):
            a[key] += r["client"][key]
        a["apply_seconds"].append(r["apply_seconds"])
        if r.get("burner_use"):
            a["burner_cores"].append(r["burner_use"]["cores"])
        if r["false_revert"]:
            a["verdicts"].append(f"rollout {r['index']} ({r['old']}->{r['new']}): {r['verdict']}")
    for a in arms.values():
        a["apply_seconds"] = statistics.median(a.pop("apply_seconds"))
        cores = a.pop("burner_cores")
        a["burner_cores_min"] = min(cores) if cores else None
    modes: dict[str, dict[str, Any]] = {}
    for r in bad:
        m = modes.setdefault(f"{r['arm']} {r['version']}", {
            "arm": r["arm"], "version": r["version"], "what": BADS[r["version"]].what,
            "rollouts": 0, "caught": 0, "caught_by": [], "affected": [], "on_bad": [],
            "goal": GOALS[r["arm"]]})  # fmt: skip
        m["rollouts"] += 1
        m["caught"] += r["caught"]
        m["caught_by"] = sorted({*m["caught_by"], r["caught_by"]})
        m["affected"].append(r["client"]["affected"])
        m["on_bad"].append(r["client"]["on_bad"])
    for m in modes.values():
        m["met"] = m["caught"] == m["rollouts"] and max(m["affected"]) <= m["goal"]
    quiet = result.get("no_client", [])
    swaps = result.get("swaps", [])
    false_reverts = sum(r["false_revert"] for r in good)
    good_failed = sum(r["client"][k] for r in good for k in ("failed", "cut", "mixed"))
    return {
        "arms": arms,
        "modes": modes,
        "goals": {
            "good: 0 failed or cut client streams, 0 false reverts": (
                None if not good else false_reverts == 0 and good_failed == 0
            ),
            "bad: each caught, affected within its goal": (
                None if not bad else all(m["met"] for m in modes.values())
            ),
            "no client: promoted on its probes' evidence": (
                None if not quiet else all(r["passed"] for r in quiet)
            ),
            "swap with 20 streams in flight: 0 cut, the unload waits": None
            if not swaps
            else all(
                s["client"]["cut"] + s["client"]["failed"] + s["client"]["mixed"] == 0
                and s["exit"] == 0
                and any(u["stream_wait_seconds"] for u in s["unload"])
                for s in swaps
            ),
        },
        "good_rollouts": len(good),
        "false_reverts": false_reverts,
        "good_client_failures": good_failed,
        "no_client_passed": sum(r["passed"] for r in quiet),
        "no_client_rollouts": len(quiet),
    }


def markdown(result: Mapping[str, Any]) -> str:
    """The section BENCHMARKS.md carries (bench/reports/streaming.md)."""
    return render("streaming", result, goals=GOALS, bads=BADS, window_tail_s=WINDOW_TAIL_S)


# -- the run ------------------------------------------------------------------------------------


class Bed:
    """Servers (one, or a and c behind an Envoy with ``pools``), Git remote, reconciler."""

    def __init__(
        self,
        root: Path,
        repository: Path,
        servers: int,
        pools: Sequence[str],
        latency: bool,
        duration: float = DURATION_S,
    ) -> None:
        self.root, self.repository, self.pools = root, repository, tuple(pools)
        self.latency = latency  # the latency checks in every analysis
        self.duration = duration  # every analysis's
        self.names = ("a", "c")[:servers]
        self.servers = [
            LocalTriton(repository, log_file=root / f"triton-{n}.log") for n in self.names
        ]
        self.envoy: LocalEnvoy | None = None
        self.indexes: list[Index] = []
        self.flip = False
        self.repo = ManifestRepo(root / "git")
        self.reconciler = Reconciler(self.repo.url, root / "reconciler")

    def __enter__(self) -> Bed:
        try:
            for server in self.servers:
                server.start()
            self.indexes = [Index(s.grpc_address) for s in self.servers]
            docs = [
                server_doc(n, s.grpc_address, self.repository, metrics=s.metrics_url)
                for n, s in zip(self.names, self.servers, strict=True)
            ]
            self.repo.write("servers.yaml", "---\n".join(docs))
            if self.pools:
                addresses = {
                    p: [s.grpc_address] for p, s in zip(self.pools, self.servers, strict=True)
                }
                self.envoy = LocalEnvoy.of(self.root / "envoy", addresses, {self.pools[0]: 10_000})
                self.envoy.start()
                members = {p: [n] for p, n in zip(self.pools, self.names, strict=True)}
                self.repo.write("router.yaml", router_doc(self.envoy.admin_url, members))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        for index in self.indexes:
            with contextlib.suppress(Exception):
                index.close()
        if self.envoy is not None:
            self.envoy.stop()
        for server in self.servers:
            server.stop()

    @property
    def address(self) -> str:
        return self.envoy.address if self.envoy is not None else self.servers[0].grpc_address

    def apply(self, version: int, message: str, **options: Any) -> tuple[CliRun, dict[str, Any]]:
        """Commit gen at ``version`` (``deployment_doc``'s options) and apply it."""
        self.flip = not self.flip
        options.setdefault("latency", self.latency)
        options.setdefault("duration", self.duration)
        self.repo.write("gen.yaml", deployment_doc(version, self.names, flip=self.flip, **options))
        self.repo.commit(message)
        run = self.reconciler.apply("--output", "json")
        try:
            return run, run.json()
        except ValueError as exc:
            raise BenchError(f"apply printed no JSON report:\n{run.explain()}") from exc

    def settle(self, version: int) -> None:
        for index in self.indexes:
            index.settle(GENERATOR, version, timeout=90.0, stuck_unloading=STUCK)

    def serving(self) -> list[set[int]]:
        return [index.ready(GENERATOR) for index in self.indexes]

    def deploy(self, version: int, **options: Any) -> None:
        run, _ = self.apply(version, f"deploy {version}", **options)
        if run.code != 0:
            raise BenchError(f"deploying gen {version} failed:\n{run.explain()}")
        self.settle(version)


def streamed_apply(
    bed: Bed, version: int, message: str, *, burner: bool = False, threads: int = THREADS,
    tokens: int | None = None, **options: Any,
) -> dict[str, Any]:  # fmt: skip
    """``bed.apply`` with clients streaming from before it to ``WINDOW_TAIL_S`` after it
    (every stream they started ends before this returns), the burner on if asked."""
    clients = StreamClient(bed.address, GENERATOR, threads=threads, tokens=tokens)
    use: dict[str, Any] = {}
    with clients:
        deadline = time.monotonic() + 30
        while len(clients.streams) < threads and time.monotonic() < deadline:
            time.sleep(0.05)
        started = time.monotonic()
        with burning(burner, use):
            run, report = bed.apply(version, message, **options)
        ended = time.monotonic()
        time.sleep(WINDOW_TAIL_S)
    if not clients.streams:
        raise BenchError(f"no client stream ended around {message!r}")
    return {"run": run, "report": report, "streams": clients.streams, "ended": ended,
            "apply_seconds": round(ended - started, 3), "burner_use": use or None}  # fmt: skip


def good_rollout(bed: Bed, arm: str, index: int, old: int, burner: bool) -> dict[str, Any]:
    new = 2 if old == 1 else 1
    traffic = {"canary": CANARY, "blue-green": BLUE_GREEN}.get(arm)  # in place: none
    done = streamed_apply(
        bed, new, f"{arm} {index}: {old} -> {new}", burner=burner, traffic=traffic
    )
    run, report = done["run"], done["report"]
    converged = run.code == 0 and all(o == "converged" for o in outcomes(report).values())
    bed.settle(new if converged else old)
    client = stream_figures(done["streams"], TOKENS)
    record = {
        "arm": arm, "index": index, "burner": burner, "old": old, "new": new, "exit": run.code,
        "false_revert": not converged, "verdict": None if converged else verdict_text(report),
        "phase": None if converged else phase(report), "apply_seconds": done["apply_seconds"],
        "client": client, "burner_use": done["burner_use"],
    }  # fmt: skip
    print(f"  {arm:<10} {index:>2} {old}->{new} burner {'on ' if burner else 'off'} exit "
          f"{run.code} {'converged' if converged else 'FALSE REVERT'}, {client['streams']} "
          f"streams, failed {client['failed']}, cut {client['cut']}"
          + (f": {str(record['verdict'])[:300]}" if not converged else ""),
          file=sys.stderr)  # fmt: skip
    return record


def bad_rollout(
    bed: Bed, arm: str, bad: Bad, index: int, old: int, first_response: float | None = None
) -> dict[str, Any]:
    traffic = CANARY if arm.startswith("envoy") else None
    probes = arm != "envoy-probes-off"
    done = streamed_apply(
        bed, bad.version, f"{arm} bad {bad.version} ({index})", traffic=traffic,
        probes=probes, first_response=None if probes else first_response,
    )  # fmt: skip
    run, report = done["run"], done["report"]
    serving = bed.serving()
    caught = run.code == 1 and all(s == {old} for s in serving)
    if caught:
        bed.settle(old)
    else:  # not caught: the old version back on every server, in place, the route as it is
        bed.deploy(old, analysis=False)
    client = stream_figures(done["streams"], TOKENS, bad)
    record = {
        "arm": arm, "version": bad.version, "index": index, "exit": run.code, "caught": caught,
        "caught_by": caught_by(report), "phase": phase(report), "verdict": verdict_text(report),
        "serving_after": [sorted(s) for s in serving], "apply_seconds": done["apply_seconds"],
        "unloading_after": [sorted(v for v, st in i.states(GENERATOR).items()
                                   if st == "UNLOADING") for i in bed.indexes],
        "client": client,
    }  # fmt: skip
    print(f"  {arm:<16} {bad.version} ({index}) exit {run.code} "
          f"{'caught' if caught else 'NOT CAUGHT'} by {record['caught_by']}; affected "
          f"{client['affected']} of {client['streams']}; serving after {record['serving_after']}: "
          f"{record['verdict'][:200]}", file=sys.stderr)  # fmt: skip
    return record


def no_client_rollout(bed: Bed, index: int, old: int) -> dict[str, Any]:
    new = 2 if old == 1 else 1
    run, report = bed.apply(new, f"no client {index}: {old} -> {new}")
    passed = run.code == 0 and all(o == "converged" for o in outcomes(report).values())
    bed.settle(new if passed else old)
    print(f"  no client {index} {old}->{new} exit {run.code}, {probes_sent(report)} probes",
          file=sys.stderr)  # fmt: skip
    return {"index": index, "old": old, "new": new, "exit": run.code, "passed": passed,
            "probes_sent": probes_sent(report), "caught_by": None if passed else caught_by(report),
            "verdict": None if passed else verdict_text(report)}  # fmt: skip


def swap_in_flight(bed: Bed, index: int, old: int) -> dict[str, Any]:
    new = 2 if old == 1 else 1
    done = streamed_apply(
        bed, new, f"swap {index}: {old} -> {new}", threads=SWAP_STREAMS, tokens=SWAP_TOKENS,
        analysis=False, swap=True,
    )  # fmt: skip
    run, report = done["run"], done["report"]
    # A failed unload (streams past its deadline) leaves the new version serving: settle there.
    now = new if run.code == 0 or bed.serving() == [{new}] else old
    bed.settle(now)
    client = stream_figures(done["streams"], SWAP_TOKENS)
    olds = [s for s in done["streams"] if s.versions and s.versions[0] == str(old)]
    on_old = len(olds)
    # When the last stream on the old version ended, in seconds before the apply's end: what
    # of the unload's wait was for streams, and what for Triton ending the version.
    last_old = round(done["ended"] - max(s.ended for s in olds), 3) if olds else None
    record = {"index": index, "old": old, "new": new, "exit": run.code, "now": now,
              "client": client,
              "streams_on_old": on_old, "unload": unload_wait(report),
              "last_old_stream_ended_before_apply_end_s": last_old,
              "apply_seconds": done["apply_seconds"],
              "verdict": None if run.code == 0 else verdict_text(report)}  # fmt: skip
    print(f"  swap {index} {old}->{new} exit {run.code}, {client['streams']} streams "
          f"({on_old} on {old}), cut {client['cut']}, failed {client['failed']}, unload "
          f"{record['unload']}", file=sys.stderr)  # fmt: skip
    return record


def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    # The bad versions rolled out beside a good one (7 has a server of its own).
    beside = [v for v in args.versions if v != UNENDING]
    latency = args.checks == "all"
    result: dict[str, Any] = {"good": [], "bad": [], "no_client": [], "swaps": [], "stopped": []}
    info: dict[str, Any] = {}
    began = time.time()
    with tempfile.TemporaryDirectory(prefix="bench-streaming-") as tmp:
        root = Path(tmp)
        repository = generator_repository(root / "models")

        def note(bed: Bed) -> None:
            if not info:
                pid = bed.servers[0].process.pid if bed.servers[0].process else None
                info.update(machine(bed.indexes[0].server_version()) | {
                    "load_average_at_start": os.getloadavg(),
                    "other_tritonservers_at_start": other_tritonservers(pid),
                    "busy_processes_at_start": busy_processes()})  # fmt: skip

        def single() -> None:
            with Bed(root / "single", repository, 1, (), latency, args.duration) as bed:
                note(bed)
                print("one server: gen 1", file=sys.stderr)
                bed.deploy(1, analysis=False)
                serving = 1
                # In place, each from 1 (deployed without analysis): 2 takes the clients'
                # streams, and its first response is held to 1's under them. A generator of
                # its own: the routed arms' burner draws stay as they were.
                good = "good" in args.parts and "in-place" in args.arms
                in_place_rng = random.Random(args.seed + 1)
                for i, burner in enumerate(
                    burner_plan(args.rollouts // 2 if good else 0, in_place_rng)
                ):
                    record = good_rollout(bed, "in-place", i, 1, burner)
                    result["good"].append(record)
                    bed.deploy(1, analysis=False)
                for i in range(args.no_client if "no-client" in args.parts else 0):
                    quiet = no_client_rollout(bed, i, serving)
                    result["no_client"].append(quiet)
                    serving = quiet["new" if quiet["passed"] else "old"]
                in_place = "bad" in args.parts and "in-place" in args.arms
                for version in beside if in_place else ():
                    for i in range(args.bad_rollouts):
                        bad = bad_rollout(bed, "in-place", BADS[version], i, serving)
                        result["bad"].append(bad)
                if "swap" in args.parts:
                    bed.deploy(serving, analysis=False, swap=True)
                    for i in range(args.swaps):
                        result["swaps"].append(swap_in_flight(bed, i, serving))
                        serving = result["swaps"][-1]["now"]

        def unending() -> None:
            with Bed(root / "unending", repository, 1, (), latency, args.duration) as bed:
                note(bed)
                print("a server of its own for gen 7", file=sys.stderr)
                bed.deploy(1, analysis=False)
                for i in range(args.bad_rollouts):
                    result["bad"].append(bad_rollout(bed, "in-place", BADS[UNENDING], i, 1))

        def routed(arm: str, pools: Sequence[str], probe_arms: Sequence[str]) -> None:
            traffic = CANARY if arm == "canary" else BLUE_GREEN
            with Bed(root / arm, repository, 2, pools, latency, args.duration) as bed:
                note(bed)
                print(f"{arm}: servers a, c behind Envoy", file=sys.stderr)
                bed.deploy(1, traffic=traffic)
                serving = 1
                good = "good" in args.parts and arm in args.arms
                for i, burner in enumerate(burner_plan(args.rollouts // 2 if good else 0, rng)):
                    record = good_rollout(bed, arm, i, serving, burner)
                    result["good"].append(record)
                    serving = record["old"] if record["false_revert"] else record["new"]
                for probes in probe_arms:
                    for version in beside:
                        for i in range(args.bad_rollouts):
                            bad = bad_rollout(
                                bed, probes, BADS[version], i, serving, args.first_response
                            )
                            result["bad"].append(bad)

        in_place = "bad" in args.parts and "in-place" in args.arms
        good_in_place = "good" in args.parts and "in-place" in args.arms
        beds: list[tuple[str, Any]] = [("one server", single)] * bool(
            in_place or good_in_place or {"no-client", "swap"} & set(args.parts)
        ) + [("gen 7's server", unending)] * (in_place and UNENDING in args.versions)
        for arm, pools in POOLS.items():
            probe_arms = [a for a in GOALS if a.startswith("envoy") and a in args.arms]
            probe_arms = probe_arms if arm == "canary" and "bad" in args.parts else []
            if ("good" in args.parts and arm in args.arms) or probe_arms:
                beds.append((arm, lambda a=arm, p=pools, b=probe_arms: routed(a, p, b)))
        for name, part in beds:
            try:  # a bed that stops voids its own remaining rollouts, not the others' figures
                part()
            except BenchError as exc:
                print(f"{name} stopped: {exc}", file=sys.stderr)
                result["stopped"].append(f"{name}: {exc}")
    info |= {"load_average_at_end": os.getloadavg(), "busy_processes_at_end": busy_processes(),
             "wall_minutes": (time.time() - began) / 60}  # fmt: skip
    result |= {
        "benchmark": "streaming",
        "command": " ".join(["python -m bench.streaming", *sys.argv[1:]]),
        "settings": {"quick": args.quick, "seed": args.seed, "parts": args.parts,
                     "arms": args.arms, "checks": args.checks, "versions": args.versions,
                     "first_response": args.first_response,
                     "rollouts": args.rollouts, "bad_rollouts": args.bad_rollouts,
                     "no_client": args.no_client, "swaps": args.swaps,
                     "interval_s": INTERVAL_S, "duration_s": args.duration,
                     "min_success": MIN_SUCCESS, "latency_max_increase": LATENCY_MAX_INCREASE,
                     "tokens": TOKENS, "token_ms": TOKEN_MS, "instances": INSTANCES,
                     "threads": THREADS, "swap_streams": SWAP_STREAMS,
                     "swap_tokens": SWAP_TOKENS, "swap_token_ms": SWAP_TOKEN_MS},
        "machine": info,
        "code": provenance(),
    }  # fmt: skip
    result["summary"] = summarize(result)
    return result


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.streaming",
        description="Streaming versions rolled out under client streams (issue 42's goals), "
        "on real tritonservers and Envoy.",
    )
    counts = (  # option, help, default, --quick's
        ("--rollouts", "good rollouts", 20, 4),
        ("--bad-rollouts", "per bad version and arm", 2, 1),
        ("--no-client", "rollouts without clients", 10, 2),
        ("--swaps", "swaps with 20 streams in flight", 2, 1),
    )
    parser.add_argument("--quick", action="store_true", help="the counts' --quick values")
    for option, what, default, quick in counts:
        parser.add_argument(option, type=int, help=f"{what} (default {default}; --quick {quick})")
    parser.add_argument(
        "--seed", type=int, default=42, help="which good rollouts burn (default 42)"
    )
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    parser.add_argument(
        "--duration", type=float, default=DURATION_S,
        help=f"every analysis's duration, seconds (default {DURATION_S:g})",
    )  # fmt: skip
    parser.add_argument(
        "--versions", nargs="+", type=int, choices=(3, 4, 5, 8, UNENDING),
        default=[3, 4, 5, 8, UNENDING],
        help="the bad versions rolled out (7: in place only, on a server of its own)",
    )  # fmt: skip
    parser.add_argument(
        "--first-response", type=float, metavar="SECONDS",
        help="the probes-off arm's manifests add a smoke case whose stream.firstResponse is "
        "this (none by default)",
    )  # fmt: skip
    parser.add_argument(
        "--checks",
        choices=("all", "success-rate"),
        default="all",
        help="the analysis's checks: all (success rate, first response, between responses; "
        "the default) or the success rate alone",
    )
    parser.add_argument(
        "--output", type=Path, default=RESULTS / "streaming.json", help="JSON result"
    )
    parser.add_argument("--report", type=Path, metavar="JSON", help="the section again")
    args = parser.parse_args(argv)
    for option, _, default, quick in counts:
        name = option[2:].replace("-", "_")
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else default)
    if args.rollouts < 2 or min(args.bad_rollouts, args.no_client, args.swaps) < 1:
        parser.error("--rollouts must be at least 2, the other counts at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    return markdown_main(parse_args(argv), run, markdown, beside=True)


if __name__ == "__main__":
    sys.exit(main())
