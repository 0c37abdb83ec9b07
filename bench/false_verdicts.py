"""False verdicts (issue 26): verdicts about the version, not the machine.

Good rollouts (the new version is as good as the old) must pass whatever the machine is
doing, and bad ones must still be caught. Every rollout is one ``triton-gitops apply
--output json`` run in this process (``testkit.cli_run``) against a bare Git remote
(``testkit.manifests.ManifestRepo``); the servers are real tritonservers
(``testkit.local_triton``), the router a real Envoy (``testkit.envoy``), the clients
``testkit.loadgen`` threads sending unversioned requests through the whole rollout.

Arms (each on servers and an Envoy of its own, started for the arm and stopped after it):

* ``single``: one server, ``echo`` (OUTPUT0 = INPUT0 * version), 2 client threads;
* ``staged``: three servers, ``rollout.steps: [{servers: 1}, {servers: 100%}]``, one client
  thread per server;
* ``canary``: three servers behind Envoy (pools ``stable`` [a, b], ``canary`` [c]),
  ``traffic: {strategy: canary, steps: [10%, 50%]}``, 2 client threads through Envoy;
* ``blue-green``: two servers behind Envoy (pools ``blue`` [a], ``green`` [b]), ``traffic:
  {strategy: blueGreen, keepOld: 3s}``, 2 client threads through Envoy;
* ``slow-100ms``: one server, ``paced``, this benchmark's own model (its execute sleeps
  100 ms a request), 2 client threads. Its rollouts only go up (1 -> 2 -> 3...): a version
  below the one serving sees only the probes (unversioned requests go to the highest), and
  at 100 ms a probe the probes alone cannot reach ``minEvidence`` in a few seconds (README,
  "Post-swap analysis": a documented limit, not a verdict about the machine).

The echo arms alternate 1 -> 2 and 2 -> 1 (a false revert is followed by the same rollout
again). Every arm's analysis is the same: ``interval: 1s``, ``duration`` 4 s (3 s with
``--quick``), ``noTraffic: wait``, ``minEvidence: 10``, checks ``successRate: {min: 0.99}``
and ``latency: {maxIncrease: 0.5}``, probes and early abort at their defaults. Half of each
arm's rollouts (which half: ``--seed``) run with a CPU burner: one busy-loop process per core
(``python -c``, a loop on ``time.monotonic()``; stress-ng is not installed here), started
just before the apply and ended by its pid right after it; each stops itself after
``BURNER_LIMIT_S`` in any case. The share of the cores the burner got is recorded.

Bad versions, on the ``single`` arm's server with its clients, the same manifest (plus a
smoke case for ``wrong-output``), each ``--bad-rollouts`` times without and with the burner:

* ``raises``: echo version 90, this benchmark's own model: raises on every request (Triton
  counts them failed; Triton 2.51 then leaves the version UNLOADING for good);
* ``error-response``: echo version 10: an error response to every request (Triton counts
  those successes: only the probes see them);
* ``slow-3x``: echo version 5, ``slow_ms`` late: twice version 1's mean latency as clients
  see it, measured for 2 s just before (without, then with the burner), so about 3x;
* ``wrong-output``: echo version 3 (x3) against a smoke case expecting x2;
* ``interface-change``: version 2 with the model repository's ``config.pbtxt`` changed on
  disk (OUTPUT0 TYPE_FP32 -> TYPE_FP64; put back right after): refused before any load.

Each must be caught: apply exits 1 and version 1 alone serves again. Its blast radius is the
client requests it failed (an error, or an answer from version 3) from the apply's start to
0.3 s after its end; goal at most 50. ``slow-3x``'s late answers are counted apart.

Per arm and burner state: good rollouts, false reverts (with each one's verdict), failed
client requests, and for each check the closest a good version came to failing, read from
the apply's JSON report (``result.changes[].analysis.evaluations[].checks[]``: value and
threshold): the lowest ``successRate`` value against its min, the highest latency increase
against ``maxIncrease`` (and how often the probes overruled an increase measured against the
old version's mean before the swap), and the evidence (requests or probes that reached the
new versions, summed over the report's evaluations: Triton's counters, the router's, the
probes) against ``minEvidence``. A traffic rollout's report holds its last phase's analysis
only, so its evidence there is the last phase's.

Not included: the pre-merge gate's runs (``bench.gate``; the gate is being changed now).

Time, estimated from two ``--quick`` smokes (1.6 min each on this 2-core machine, shared
with a test run): about 12 minutes with the defaults (54 good rollouts: a rollout takes 6 to
8 s on one server, about 14 s staged, about 15 s through a canary that passes; plus 5 modes x
2 x 2 bad ones); ``--quick`` (2 good rollouts per arm, 2 bad modes once each way) under
2 minutes. The burner runs at the same priority as everything else: in the smokes it got 0.3
to 0.7 of the 2 cores while servers and clients were busy, 1.6 beside the 100 ms model
(recorded per rollout as ``burner_use``).

    python -m bench.false_verdicts [--quick] [--rollouts N] [--seed S] [--arms ...]
        [--modes ...] [--bad-rollouts N] [--output PATH] [--report JSON]

Every process started here (tritonservers, Envoys, burners) is ended by its pid in
``finally``.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import math
import os
import random
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.harness.burner import BURNER_LIMIT_S, burner_plan, burning
from bench.harness.cli import markdown_main
from bench.harness.errors import BenchError
from bench.harness.provenance import busy_processes, machine, other_tritonservers, provenance
from bench.harness.report import render
from bench.harness.rollouts import smoke_case_lines
from bench.harness.triton import Index
from bench.harness.verdicts import caught_by, outcomes, phase, verdict_text
from testkit.cli_run import CliRun, Reconciler
from testkit.envoy import LocalEnvoy
from testkit.loadgen import LoadGenerator, Sample
from testkit.local_triton import LocalTriton
from testkit.manifests import MODELS, ManifestRepo, server_doc, write_model_repository

RESULTS = Path(__file__).parent / "results"
ECHO, PACED = "echo", "paced"
INTERVAL_S = 1.0
DURATION_S, QUICK_DURATION_S = 4.0, 3.0
MIN_SUCCESS = 0.99
LATENCY_MAX_INCREASE = 0.5
MIN_EVIDENCE = 10
PACED_SLEEP_MS = 100
BLAST_GOAL = 50  # failed client requests per bad rollout, at most
WINDOW_TAIL_S = 0.3  # client requests counted after the apply's end
RAISING = 90  # echo's version from this benchmark's own model: raises on every request
STUCK_UNLOADING = (RAISING,)  # Triton 2.51 never finishes unloading a version that raised
SERVER_NAMES = ("edge-a", "edge-b", "edge-c")

# This benchmark's own Python model: ``paced`` (every version) and echo version 90.
BENCH_MODEL = '''\
"""bench.false_verdicts's model: OUTPUT0 = INPUT0 * version, as testkit's echo, after
sleeping the config's ``sleep_ms`` per request (none when absent); a version from 90 on
raises on every request instead (Triton counts those requests failed)."""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils

RAISES_FROM = 90


class TritonPythonModel:
    def initialize(self, args):
        self.version = int(args["model_version"])
        config = json.loads(args["model_config"])
        self.input_name = config["input"][0]["name"]
        self.output_name = config["output"][0]["name"]
        sleep_ms = config.get("parameters", {}).get("sleep_ms", {}).get("string_value")
        self.sleep = float(sleep_ms or 0) / 1000
        self.count = 0

    def execute(self, requests):
        responses = []
        for request in requests:
            self.count += 1
            if self.version >= RAISES_FROM:
                raise RuntimeError(
                    f"version {self.version} raises on every request ({self.count})"
                )
            if self.sleep:
                time.sleep(self.sleep)
            data = pb_utils.get_input_tensor_by_name(request, self.input_name).as_numpy()
            output = pb_utils.Tensor(self.output_name, (data * self.version).astype(np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[output]))
        return responses
'''

# -- the arms and the bad versions --------------------------------------------------------------


@dataclass(frozen=True)
class Arm:
    name: str
    what: str
    servers: int
    model: str
    weight: int  # its share of the good rollouts
    threads: int = 2  # client threads (staged: one per server)
    pools: Mapping[str, tuple[int, ...]] | None = None  # router pools: server indexes
    traffic: str | None = None  # spec.rollout.traffic
    steps: str | None = None  # spec.rollout.steps
    upward: bool = False  # versions only go up (1 -> 2 -> 3...)


ARMS: tuple[Arm, ...] = (
    Arm("single", "one server, 2 client threads", 1, ECHO, 14),
    Arm(
        "staged",
        "3 servers, steps [1, 100%], 1 client thread each",
        3,
        ECHO,
        10,
        threads=1,
        steps="[{servers: 1}, {servers: 100%}]",
    ),
    Arm(
        "canary",
        "Envoy, stable [a, b] canary [c], steps [10%, 50%], 2 client threads through Envoy",
        3,
        ECHO,
        10,
        pools={"stable": (0, 1), "canary": (2,)},
        traffic="{router: edge, strategy: canary, stablePool: stable, canaryPool: canary, "
        "steps: [10%, 50%]}",
    ),
    Arm(
        "blue-green",
        "Envoy, blue [a] green [b], keepOld 3s, 2 client threads through Envoy",
        2,
        ECHO,
        10,
        pools={"blue": (0,), "green": (1,)},
        traffic="{router: edge, strategy: blueGreen, pools: [blue, green], keepOld: 3s}",
    ),
    Arm(
        "slow-100ms",
        f"one server, a model sleeping {PACED_SLEEP_MS} ms a request, 2 client threads, "
        "versions going up",
        1,
        PACED,
        10,
        upward=True,
    ),
)
ARM_BY_NAME = {a.name: a for a in ARMS}


@dataclass(frozen=True)
class Mode:
    name: str
    version: int
    what: str
    effect: str  # error | wrong | slow | refused
    smoke: bool = False  # a smoke case expecting x2


MODES: tuple[Mode, ...] = (
    Mode("raises", RAISING, "raises on every request", "error"),
    Mode("error-response", 10, "an error response to every request", "error"),
    Mode("slow-3x", 5, "about 3x version 1's latency", "slow"),
    Mode("wrong-output", 3, "answers x3, a smoke case expects x2", "wrong", smoke=True),
    Mode(
        "interface-change",
        2,
        "config.pbtxt's OUTPUT0 TYPE_FP32 -> TYPE_FP64",
        "refused",
    ),
)
MODE_BY_NAME = {m.name: m for m in MODES}
QUICK_MODES = ("raises", "interface-change")


def good_counts(total: int, arms: Sequence[Arm]) -> dict[str, int]:
    """``total`` good rollouts spread over ``arms`` by weight, each an even number (half
    with the burner), at least 2."""
    weights = sum(a.weight for a in arms)
    counts = {}
    for arm in arms:
        share = total * arm.weight / weights
        counts[arm.name] = max(2, 2 * math.ceil(share / 2 - 1e-9))
    return counts


# -- the manifests ------------------------------------------------------------------------------


def deployment_doc(
    arm: Arm,
    versions: Sequence[int],
    flip: bool,
    *,
    analysis: bool = True,
    duration: float = DURATION_S,
    slow_ms: float | None = None,
    smoke_factor: int | None = None,
) -> str:
    """The arm's ModelDeployment. ``flip`` adds the default ``failureLimit: 0`` (a different
    spec, the same behaviour: a held spec is not tried again until a commit changes it);
    ``slow_ms``: echo's config parameter (only version 5 reads it)."""
    names = ", ".join(SERVER_NAMES[: arm.servers])
    lines = [
        "apiVersion: triton-gitops.dev/v1alpha1",
        "kind: ModelDeployment",
        "metadata:",
        f"  name: {arm.model}",
        "spec:",
        f"  servers: {{names: [{names}]}}",
        f"  versions: [{', '.join(map(str, versions))}]",
    ]
    if slow_ms is not None:
        lines += [
            "  config:",
            "    parameters:",
            f'      slow_ms: {{string_value: "{slow_ms:g}"}}',
        ]
    if analysis:
        lines.append("  verify:")
        if smoke_factor is not None:
            lines += smoke_case_lines(smoke_factor)
        lines += [
            "    analysis:",
            f"      interval: {INTERVAL_S:g}s",
            f"      duration: {duration:g}s",
            "      noTraffic: wait",
            f"      minEvidence: {MIN_EVIDENCE}",
        ]
        if flip:
            lines.append("      failureLimit: 0")
        lines += [
            "      checks:",
            "        - name: success-rate",
            f"          successRate: {{min: {MIN_SUCCESS:g}}}",
            "        - name: latency",
            f"          latency: {{maxIncrease: {LATENCY_MAX_INCREASE:g}}}",
        ]
    elif flip:
        lines.append("  suspend: false")  # the default: a different spec, same behaviour
    if arm.traffic or arm.steps:
        lines.append("  rollout:")
        if arm.traffic:
            lines.append(f"    traffic: {arm.traffic}")
        if arm.steps:
            lines.append(f"    steps: {arm.steps}")
    return "\n".join(lines) + "\n"


def router_doc(admin_url: str, pools: Mapping[str, tuple[int, ...]]) -> str:
    lines = [
        "apiVersion: triton-gitops.dev/v1alpha1",
        "kind: Router",
        "metadata: {name: edge}",
        "spec:",
        f"  envoy: {{admin: '{admin_url}'}}",
        "  pools:",
    ]
    for pool, indexes in pools.items():
        names = ", ".join(SERVER_NAMES[i] for i in indexes)
        lines.append(f"    - {{name: {pool}, servers: {{names: [{names}]}}}}")
    return "\n".join(lines) + "\n"


def write_bench_repository(root: Path, paced_versions: int) -> Path:
    """testkit's model repository, plus echo version ``RAISING`` and the ``paced`` model
    (versions 1..``paced_versions``, ``sleep_ms`` in its config.pbtxt), from this
    benchmark's own model, compiled ahead."""
    repository = write_model_repository(root)
    raising = repository / ECHO / str(RAISING)
    raising.mkdir()
    (raising / "model.py").write_text(BENCH_MODEL)
    paced = repository / PACED
    paced.mkdir()
    config = (MODELS / "echo" / "config.pbtxt").read_text().replace('"echo"', f'"{PACED}"')
    config += f'parameters {{ key: "sleep_ms" value: {{ string_value: "{PACED_SLEEP_MS}" }} }}\n'
    (paced / "config.pbtxt").write_text(config)
    for version in range(1, paced_versions + 1):
        (paced / str(version)).mkdir()
        (paced / str(version) / "model.py").write_text(BENCH_MODEL)
    compileall.compile_dir(repository, quiet=1)
    return repository


@contextlib.contextmanager
def changed_interface(repository: Path) -> Iterator[None]:
    """echo's config.pbtxt with OUTPUT0's datatype changed, put back on leaving."""
    path = repository / ECHO / "config.pbtxt"
    original = path.read_text()
    changed = re.sub(
        r'(output \[ \{ name: "OUTPUT0" data_type: )TYPE_FP32', r"\1TYPE_FP64", original
    )
    if changed == original:
        raise BenchError(f"could not change OUTPUT0's datatype in {path}")
    path.write_text(changed)
    try:
        yield
    finally:
        path.write_text(original)


# -- what the apply's report says (pure) --------------------------------------------------------


def bounds(threshold: str) -> list[tuple[str, float]]:
    """A check's threshold as ("min"|"max", bound) pairs: ``>= 0.99``, ``increase <= 0.5``,
    ``growth <= 5e+08 bytes``, ``>= 1 and <= 2``."""
    found = []
    for op, value in re.findall(r"(>=|<=)\s*([-+0-9.eE]+)", threshold):
        with contextlib.suppress(ValueError):
            found.append(("min" if op == ">=" else "max", float(value)))
    return found


def margin(value: float | None, threshold: str) -> float | None:
    """How far ``value`` is from failing ``threshold``: positive on the passing side, the
    smallest over its bounds; None when there is no value or no bound."""
    if value is None:
        return None
    gaps = [value - b if kind == "min" else b - value for kind, b in bounds(threshold)]
    return min(gaps) if gaps else None


def analysed_changes(report: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    result = report.get("result") or {}
    return [c for c in result.get("changes", []) if c.get("analysis")]


def check_margins(report: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Per check, the closest to failing over every evaluation of every change in one
    apply's report: ``margin``, ``value``, ``threshold``, ``server``, ``evaluation``; and
    ``overruled``: evaluations whose latency increase measured against the old versions'
    mean before the swap was not confirmed by the probes, with ``raw_max``, the highest such
    increase (parsed from the detail)."""
    closest: dict[str, dict[str, Any]] = {}
    for change in analysed_changes(report):
        for evaluation in change["analysis"].get("evaluations", []):
            for check in evaluation.get("checks", []):
                name = check.get("check", "?")
                entry = closest.setdefault(name, {"margin": None, "overruled": 0})
                detail = check.get("detail") or ""
                if "not confirmed by the probes" in detail:
                    entry["overruled"] += 1
                    raw = re.search(r"\(\+(-?[0-9.]+)%\)", detail)
                    if raw is not None:
                        value = float(raw.group(1)) / 100
                        entry["raw_max"] = max(entry.get("raw_max", value), value)
                gap = margin(check.get("value"), check.get("threshold", ""))
                if gap is None or (entry["margin"] is not None and gap >= entry["margin"]):
                    continue
                entry.update(
                    margin=gap,
                    value=check.get("value"),
                    threshold=check.get("threshold"),
                    verdict=check.get("verdict"),
                    server=change.get("server"),
                    evaluation=evaluation.get("index"),
                    detail=detail[:200],
                )
    return closest


def _counts(detail: str, source: str) -> int:
    """Requests a success-rate detail says ``source`` (triton, router) saw."""
    pattern = rf"{source}: \d+ of (\d+)"
    return sum(int(n) for n in re.findall(pattern, detail))


def evidence(report: Mapping[str, Any], min_evidence: int = MIN_EVIDENCE) -> dict[str, Any] | None:
    """The requests or probes that reached the new versions, as the report's evaluations
    tell it (per change: the most of Triton's counted requests, the router's and the probes
    sent, summed over its evaluations); the least over the changes, against ``min_evidence``.
    None without an analysis."""
    least: float | None = None
    for change in analysed_changes(report):
        triton = router = probes = 0
        for evaluation in change["analysis"].get("evaluations", []):
            probes += (evaluation.get("probes") or {}).get("sent", 0)
            for check in evaluation.get("checks", []):
                if check.get("threshold", "").startswith(">="):  # a success rate's sources
                    triton += _counts(check.get("detail") or "", "triton")
                    router += _counts(check.get("detail") or "", "router")
                    break
        seen = max(triton, router, probes)
        least = seen if least is None else min(least, seen)
    if least is None:
        return None
    return {"evidence": least, "min": min_evidence, "margin": least - min_evidence}


def client_figures(
    samples: Sequence[Sample], since: float, until: float, effect: str, version: int
) -> dict[str, Any]:
    """The client requests started in [since, until): ``failed`` (errors; for ``wrong``
    also answers from ``version``), ``affected`` (``slow``: answers from ``version``)."""
    window = [s for s in samples if since <= s.started < until]
    errors = [s for s in window if s.error is not None]
    wrong = [s for s in window if s.version == version] if effect == "wrong" else []
    return {
        "requests": len(window),
        "failed": len(errors) + len(wrong),
        "errors": len(errors),
        "wrong_answers": len(wrong),
        "affected": sum(1 for s in window if s.version == version) if effect == "slow" else 0,
        "messages": sorted({re.sub(r"\d+", "N", s.error.splitlines()[0]) for s in errors})[:3]
        if errors
        else [],
    }


# -- the summary and the report (pure) ----------------------------------------------------------


def _closest(records: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per check, the closest margin over ``records`` (good rollouts), with the rollout."""
    out: dict[str, dict[str, Any]] = {}
    for r in records:
        for name, entry in r.get("checks", {}).items():
            best = out.setdefault(name, {"margin": None, "overruled": 0})
            best["overruled"] += entry.get("overruled", 0)
            if "raw_max" in entry:
                best["raw_max"] = max(best.get("raw_max", entry["raw_max"]), entry["raw_max"])
            gap = entry.get("margin")
            if gap is not None and (best["margin"] is None or gap < best["margin"]):
                best.update(
                    margin=gap,
                    value=entry.get("value"),
                    threshold=entry.get("threshold"),
                    rollout=r["index"],
                )
        ev = r.get("evidence")
        if ev is not None:
            best = out.setdefault("evidence", {"margin": None})
            if best["margin"] is None or ev["margin"] < best["margin"]:
                best.update(
                    margin=ev["margin"],
                    value=ev["evidence"],
                    threshold=f">= {ev['min']}",
                    rollout=r["index"],
                )
    return out


def summarize(
    good: Sequence[Mapping[str, Any]], bad: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """Per arm and burner state: the good rollouts, the false reverts with their verdicts,
    the failed client requests, the closest margins; per bad mode and burner state: caught
    or not, by what, the blast radius."""
    arms: dict[str, dict[str, Any]] = {}
    for arm in dict.fromkeys(r["arm"] for r in good):
        for burner in (False, True):
            chosen = [r for r in good if r["arm"] == arm and r["burner"] is burner]
            if not chosen:
                continue
            false = [r for r in chosen if r["false_revert"]]
            arms.setdefault(arm, {})["on" if burner else "off"] = {
                "rollouts": len(chosen),
                "false_reverts": len(false),
                "verdicts": [
                    {
                        "index": r["index"],
                        "rollout": f"{r['old']}->{r['new']}",
                        "phase": r.get("phase"),
                        "verdict": r["verdict"],
                    }
                    for r in false
                ],
                "client_failures": sum(r["client"]["failed"] for r in chosen),
                "closest": _closest(chosen),
                "apply_seconds_median": statistics.median(r["apply_seconds"] for r in chosen),
                "burner_cores_min": min(
                    (r["burner_use"]["cores"] for r in chosen if r.get("burner_use")),
                    default=None,
                ),
            }
    modes: dict[str, dict[str, Any]] = {}
    for mode in dict.fromkeys(r["mode"] for r in bad):
        for burner in (False, True):
            chosen = [r for r in bad if r["mode"] == mode and r["burner"] is burner]
            if not chosen:
                continue
            failed = [r["client"]["failed"] for r in chosen]
            modes.setdefault(mode, {})["on" if burner else "off"] = {
                "rollouts": len(chosen),
                "caught": sum(1 for r in chosen if r["caught"]),
                "caught_by": sorted({r["caught_by"] for r in chosen}),
                "failed": failed,
                "failed_max": max(failed),
                "within_goal": max(failed) <= BLAST_GOAL,
                "affected": [r["client"]["affected"] for r in chosen],
            }
    total = len(good)
    false_total = sum(1 for r in good if r["false_revert"])
    return {
        "good_rollouts": total,
        "false_reverts": false_total,
        "arms": arms,
        "bad_rollouts": len(bad),
        "bad_caught": sum(1 for r in bad if r["caught"]),
        "modes": modes,
    }


def markdown(result: Mapping[str, Any]) -> str:
    """The section BENCHMARKS.md carries (bench/reports/false_verdicts.md), ending in a
    newline as written to bench/results/false_verdicts.md."""
    section = render(
        "false_verdicts",
        result,
        modes=MODE_BY_NAME,
        window_tail_s=WINDOW_TAIL_S,
        blast_goal=BLAST_GOAL,
    )
    return section + "\n"


def write_section(result: Mapping[str, Any], path: Path) -> None:
    """The Markdown section, written to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(markdown(result))


# -- the run ------------------------------------------------------------------------------------


class Bed:
    """One arm's servers (and Envoy), its manifest remote and its reconciler."""

    def __init__(self, root: Path, arm: Arm, repository: Path, threads: int) -> None:
        self.root, self.arm, self.repository, self.threads = root, arm, repository, threads
        self.servers = [
            LocalTriton(repository, log_file=root / f"triton-{SERVER_NAMES[i]}.log")
            for i in range(arm.servers)
        ]
        self.envoy: LocalEnvoy | None = None
        self.indexes: list[Index] = []
        self.flip = False
        self.repo = ManifestRepo(root / "git")
        self.reconciler = Reconciler(self.repo.url, root / "reconciler")

    def start(self) -> None:
        for server in self.servers:
            server.start()
        self.indexes = [Index(s.grpc_address) for s in self.servers]
        docs = [
            server_doc(SERVER_NAMES[i], s.grpc_address, self.repository, metrics=s.metrics_url)
            for i, s in enumerate(self.servers)
        ]
        self.repo.write("servers.yaml", "---\n".join(docs))
        if self.arm.pools:
            pools = {
                name: [self.servers[i].grpc_address for i in indexes]
                for name, indexes in self.arm.pools.items()
            }
            first = next(iter(self.arm.pools))
            self.envoy = LocalEnvoy.of(self.root / "envoy", pools, {first: 10_000}).start()
            self.repo.write("router.yaml", router_doc(self.envoy.admin_url, self.arm.pools))

    def stop(self) -> None:
        for index in self.indexes:
            with contextlib.suppress(Exception):
                index.close()
        if self.envoy is not None:
            self.envoy.stop()
        for server in self.servers:
            server.stop()

    def commit(self, text: str, message: str) -> None:
        self.repo.write(f"{self.arm.model}.yaml", text)
        self.repo.commit(message)

    def doc(self, versions: Sequence[int], **options: Any) -> str:
        self.flip = not self.flip
        return deployment_doc(self.arm, versions, self.flip, **options)

    def apply(self) -> tuple[CliRun, dict[str, Any]]:
        run = self.reconciler.apply("--output", "json")
        try:
            report = run.json()
        except ValueError as exc:
            raise BenchError(f"apply printed no JSON report:\n{run.explain()}") from exc
        return run, report

    def clients(self) -> list[LoadGenerator]:
        model = self.arm.model
        if self.envoy is not None:
            return [LoadGenerator(self.envoy.address, model, threads=self.threads)]
        if len(self.servers) > 1:
            return [LoadGenerator(s.grpc_address, model, threads=1) for s in self.servers]
        return [LoadGenerator(self.servers[0].grpc_address, model, threads=self.threads)]

    def settle(self, version: int, stuck: Sequence[int] = ()) -> None:
        for index in self.indexes:
            index.settle(self.arm.model, version, timeout=90.0, stuck_unloading=stuck)

    def serving(self) -> list[set[int]]:
        return [index.ready(self.arm.model) for index in self.indexes]

    def deploy(self, version: int, analysis: bool, **options: Any) -> None:
        """A commit of ``[version]`` applied: it must converge."""
        self.commit(self.doc([version], analysis=analysis, **options), f"deploy {version}")
        run, _ = self.apply()
        if run.code != 0:
            raise BenchError(f"{self.arm.name}: deploying {version} failed:\n{run.explain()}")
        self.settle(version, STUCK_UNLOADING)


@dataclass
class Watched:
    """Clients running, the burner on or off, around one apply."""

    bed: Bed
    burner: bool
    started: float = 0.0
    ended: float = 0.0
    samples: list[Sample] = field(default_factory=list)
    burner_use: dict[str, Any] = field(default_factory=dict)

    def apply(self) -> tuple[CliRun, dict[str, Any]]:
        loads = self.bed.clients()
        try:
            for load in loads:
                load.start()
            for load in loads:
                load.wait_for_samples(5 if self.bed.arm.model == PACED else 50)
            self.started = time.monotonic()
            with burning(self.burner, self.burner_use):
                run, report = self.bed.apply()
            self.ended = time.monotonic()
            time.sleep(WINDOW_TAIL_S)
        finally:
            for load in loads:
                load.stop()
        self.samples = sorted((s for load in loads for s in load.samples), key=lambda s: s.started)
        return run, report


def good_rollout(
    bed: Bed, index: int, old: int, burner: bool, duration: float, slow_ms: float | None
) -> dict[str, Any]:
    new = old + 1 if bed.arm.upward else (2 if old == 1 else 1)
    bed.commit(
        bed.doc([new], duration=duration, slow_ms=slow_ms),
        f"{bed.arm.name} good {index}: {old} -> {new}",
    )
    began = time.monotonic()
    watched = Watched(bed, burner)
    run, report = watched.apply()
    converged = run.code == 0 and all(o == "converged" for o in outcomes(report).values())
    now = new if converged else old
    bed.settle(now, STUCK_UNLOADING)
    if not converged and bed.serving() != [{old}] * len(bed.servers):
        raise BenchError(f"{bed.arm.name} {index}: reverted, but {bed.serving()} serve")
    record = {
        "arm": bed.arm.name,
        "index": index,
        "burner": burner,
        "old": old,
        "new": new,
        "exit": run.code,
        "outcomes": outcomes(report),
        "false_revert": not converged,
        "verdict": None if converged else verdict_text(report),
        "caught_by": None if converged else caught_by(report),
        "phase": None if converged else phase(report),
        "apply_seconds": round(watched.ended - watched.started, 3),
        "rollout_seconds": round(time.monotonic() - began, 3),
        "client": client_figures(watched.samples, watched.started, watched.ended, "good", new),
        "checks": check_margins(report),
        "evidence": evidence(report),
        "burner_use": watched.burner_use or None,
    }
    print(
        f"  {bed.arm.name:<10} {index:>2} {old}->{new} burner {'on ' if burner else 'off'} "
        f"exit {run.code} {'CONVERGED' if converged else 'FALSE REVERT'} "
        f"apply {record['apply_seconds']:5.1f} s, clients failed {record['client']['failed']}"
        + (f": {record['verdict'][:160]}" if not converged else ""),
        file=sys.stderr,
    )
    return record


def calibrate(bed: Bed, burner: bool) -> dict[str, Any]:
    """``slow_ms``: twice version 1's mean latency as the clients see it over 2 s, with the
    burner as given, so that version 5 answers in about 3x."""
    loads = bed.clients()
    use: dict[str, Any] = {}
    try:
        for load in loads:
            load.start()
        for load in loads:
            load.wait_for_samples(50)
        with burning(burner, use):
            time.sleep(0.5)
            since = time.monotonic()
            time.sleep(2.0)
            until = time.monotonic()
    finally:
        for load in loads:
            load.stop()
    answered = [
        s.seconds
        for load in loads
        for s in load.samples
        if since <= s.started < until and s.version == 1
    ]
    if len(answered) < 20:
        raise BenchError(f"calibration: only {len(answered)} requests answered by version 1")
    mean_ms = statistics.fmean(answered) * 1000
    return {
        "v1_mean_ms": round(mean_ms, 3),
        "slow_ms": float(f"{2 * mean_ms:.3g}"),
        "requests": len(answered),
        "burner_use": use or None,
    }


def bad_rollout(
    bed: Bed, mode: Mode, index: int, burner: bool, duration: float, slow_ms: float
) -> dict[str, Any]:
    doc = bed.doc(
        [mode.version], duration=duration, slow_ms=slow_ms, smoke_factor=2 if mode.smoke else None
    )
    bed.commit(doc, f"bad {mode.name} {index}: echo [{mode.version}]")
    watched = Watched(bed, burner)
    states_before = bed.indexes[0].states(ECHO)
    if mode.effect == "refused":
        with changed_interface(bed.repository):
            run, report = watched.apply()
    else:
        run, report = watched.apply()
    serving = bed.serving()[0]
    put_back = False
    if serving == {1}:
        bed.settle(1, STUCK_UNLOADING)
    else:  # not caught: version 1 back, without analysis
        bed.deploy(1, analysis=False, slow_ms=slow_ms)
        put_back = True
    caught = run.code == 1 and serving == {1}
    if mode.effect == "refused":
        # Nothing may have been sent to Triton: the index is as it was.
        caught = caught and bed.indexes[0].states(ECHO) == states_before
    record = {
        "mode": mode.name,
        "index": index,
        "burner": burner,
        "version": mode.version,
        "exit": run.code,
        "outcomes": outcomes(report),
        "caught": caught,
        "caught_by": caught_by(report),
        "phase": phase(report),
        "verdict": verdict_text(report),
        "serving_after": sorted(serving),
        "put_back": put_back,
        "apply_seconds": round(watched.ended - watched.started, 3),
        "client": client_figures(
            watched.samples, watched.started, watched.ended + WINDOW_TAIL_S, mode.effect,
            mode.version,
        ),
        "burner_use": watched.burner_use or None,
    }  # fmt: skip
    print(
        f"  bad {mode.name:<16} {index} burner {'on ' if burner else 'off'} exit {run.code} "
        f"{'caught' if caught else 'NOT CAUGHT'} by {record['caught_by']}; failed "
        f"{record['client']['failed']} (late {record['client']['affected']})",
        file=sys.stderr,
    )
    return record


def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    arms = [ARM_BY_NAME[name] for name in args.arms]
    counts = good_counts(args.rollouts, arms) if not args.quick else {a.name: 2 for a in arms}
    duration = QUICK_DURATION_S if args.quick else DURATION_S
    modes = [MODE_BY_NAME[name] for name in args.modes]
    good: list[dict[str, Any]] = []
    bad: list[dict[str, Any]] = []
    calibration: dict[str, Any] = {}
    machine_info: dict[str, Any] = {}
    started_at = time.time()
    with tempfile.TemporaryDirectory(prefix="bench-false-verdicts-") as tmp:
        root = Path(tmp)
        paced_versions = counts.get("slow-100ms", 0) + 1
        repository = write_bench_repository(root / "models", max(paced_versions, 2))
        for arm in arms:
            bed = Bed(root / arm.name, arm, repository, args.threads)
            try:
                print(f"{arm.name}: starting {arm.servers} server(s)", file=sys.stderr)
                bed.start()
                if not machine_info:
                    assert bed.servers[0].process is not None
                    machine_info = machine(bed.indexes[0].server_version()) | {
                        "load_average_at_start": os.getloadavg(),
                        "other_tritonservers_at_start": other_tritonservers(
                            bed.servers[0].process.pid
                        ),
                        "busy_processes_at_start": busy_processes(),
                    }
                slow_ms: float | None = None
                if arm.model == ECHO and arm.name == "single":
                    bed.deploy(1, analysis=False, slow_ms=0.5)
                    calibration["burner off"] = calibrate(bed, False)
                    slow_ms = calibration["burner off"]["slow_ms"]
                    bed.deploy(1, analysis=False, slow_ms=slow_ms)  # a config change
                else:
                    bed.deploy(1, analysis=arm.traffic is not None, duration=duration)
                serving = 1
                for i, burner in enumerate(burner_plan(counts[arm.name], rng)):
                    record = good_rollout(bed, i, serving, burner, duration, slow_ms)
                    good.append(record)
                    serving = record["new"] if not record["false_revert"] else serving
                if arm.name == "single" and modes:
                    if serving != 1:
                        bed.deploy(1, analysis=False, slow_ms=slow_ms)
                    assert slow_ms is not None
                    for burner in (False, True):
                        if burner and any(m.effect == "slow" for m in modes):
                            calibration["burner on"] = calibrate(bed, True)
                            slow_ms = calibration["burner on"]["slow_ms"]
                            bed.deploy(1, analysis=False, slow_ms=slow_ms)
                        order = [(m, i) for m in modes for i in range(args.bad_rollouts)]
                        rng.shuffle(order)
                        for mode, i in order:
                            bad.append(bad_rollout(bed, mode, i, burner, duration, slow_ms))
            finally:
                bed.stop()
    machine_info |= {
        "load_average_at_end": os.getloadavg(),
        "busy_processes_at_end": busy_processes(),
        "wall_minutes": (time.time() - started_at) / 60,
    }
    return {
        "benchmark": "false_verdicts",
        "command": " ".join(["python -m bench.false_verdicts", *sys.argv[1:]]),
        "settings": {
            "quick": args.quick,
            "seed": args.seed,
            "arms": {a.name: a.what for a in arms},
            "good_rollouts_per_arm": counts,
            "modes": [m.name for m in modes],
            "bad_rollouts_per_mode_and_burner": args.bad_rollouts,
            "threads": args.threads,
            "interval_s": INTERVAL_S,
            "duration_s": duration,
            "min_evidence": MIN_EVIDENCE,
            "min_success": MIN_SUCCESS,
            "latency_max_increase": LATENCY_MAX_INCREASE,
            "burner_limit_s": BURNER_LIMIT_S,
        },
        "machine": machine_info,
        "code": provenance(),
        "calibration": calibration,
        "summary": summarize(good, bad),
        "good": good,
        "bad": bad,
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.false_verdicts",
        description="False reverts of good rollouts, with and without a CPU burner, and bad "
        "versions still caught, on real tritonservers and Envoy.",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="2 good rollouts per arm (one each way), a 3 s analysis, "
        f"{' and '.join(QUICK_MODES)} once each way",
    )
    parser.add_argument(
        "--rollouts", type=int, default=52, help="good rollouts over the arms (default 52)"
    )
    parser.add_argument("--seed", type=int, default=26, help="which rollouts burn (default 26)")
    parser.add_argument("--arms", nargs="+", choices=list(ARM_BY_NAME), default=list(ARM_BY_NAME))
    parser.add_argument("--modes", nargs="*", choices=list(MODE_BY_NAME), default=None)
    parser.add_argument(
        "--bad-rollouts", type=int, default=None, help="per mode and burner state (default 2)"
    )
    parser.add_argument("--threads", type=int, default=2, help="client threads (default 2)")
    parser.add_argument(
        "--output", type=Path, default=RESULTS / "false_verdicts.json", help="JSON result"
    )
    parser.add_argument("--report", type=Path, metavar="JSON", help="the section again")
    args = parser.parse_args(argv)
    if args.modes is None:
        args.modes = list(QUICK_MODES) if args.quick else list(MODE_BY_NAME)
    if args.bad_rollouts is None:
        args.bad_rollouts = 1 if args.quick else 2
    if args.rollouts < 2 or args.threads < 1 or args.bad_rollouts < 1:
        parser.error("--rollouts must be at least 2, --threads and --bad-rollouts at least 1")
    if args.modes and "single" not in args.arms:
        parser.error("the bad versions run on the single arm: add it to --arms")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    return markdown_main(parse_args(argv), run, markdown, beside=True)


if __name__ == "__main__":
    sys.exit(main())
