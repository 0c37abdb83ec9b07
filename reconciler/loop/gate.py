"""The pre-merge quality gate (``triton-gitops gate``): each ModelDeployment a change gives new
versions or a new config, tried in an isolated tritonserver before the change may merge.

For one deployment, on a server that serves nothing else:
1. the base ref's spec is brought up as apply would bring it up there (the planner's own load
   and verify steps), with the base ref's config.pbtxt as the model repository's config (the
   folder on disk is the head's checkout), so the old versions run with the config they run
   with today;
2. the head ref's spec is planned against what that server now serves (the folder's own
   config.pbtxt this time): the planner's interface rules (``core/interface.py``) refuse a
   config, sent or declared by the new versions' config.pbtxt, that changes what clients see
   before anything is sent, with apply's own message; otherwise its load step (the new
   versions beside the old, with the whole config the reconciler would send) and its verify
   step (the new versions READY, the smoke cases, the shadow replay against the old, a
   synthesized request, the after-load interface check) run as the executor runs them;
3. old and new are load-tested with the same requests (the smoke cases' and the recorded
   ones, else one synthesized from the metadata), interleaved round by round and level by
   level (old first in even rounds, new first in odd ones), so a noisy moment of a shared
   machine falls on both; each version's memory is read after each measurement;
4. ``core/gate.judge`` judges the figures against ``spec.verify.gate``; when a check is
   inconclusive (the rounds disagree by more than the bound), as many rounds again are
   measured, once, and all of them judged.
What the server, the load generator and the memory readings are comes in as ports.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from reconciler.core.gate import judge, judge_alone
from reconciler.core.plan import plan
from reconciler.core.probes import limits, synthesized
from reconciler.core.review_diff import Change, diff
from reconciler.core.smoke import reply_mismatches
from reconciler.core.triton_config import in_sequences, streams
from reconciler.engine.context import ChangeContext, Timing
from reconciler.engine.exchange import ask
from reconciler.engine.steps import execute_step
from reconciler.loop.observation import observe_servers
from reconciler.model.errors import ReconcileError, VerifyFailed
from reconciler.model.gate import (
    GateCheck,
    GateFinding,
    GateSpec,
    GateVerdict,
    LoadFigures,
    LoadTestSpec,
    ModelGate,
)
from reconciler.model.history import History
from reconciler.model.plan import Action, Exchange, ModelChange, PlanProblem
from reconciler.model.servers import TritonServer
from reconciler.model.spec import DesiredState, ModelDeployment, RolloutSpec, Tensor
from reconciler.ports import LoadTester, MemoryGauge, TritonClient, VersionDigests

GATE_SERVER = "gate"  # the isolated server's name in plans and messages

# The manifest line each load-test check points at: its bound, else the gate block.
_CHECK_LINES = {
    "errors": ("verify.gate.maxErrorRate", "verify.gate", "versions"),
    "latency": ("verify.gate.maxLatencyIncrease", "verify.gate", "versions"),
    "latency-p50": ("verify.gate.maxLatencyIncrease", "verify.gate", "versions"),
    "between-responses": ("verify.gate.maxBetweenResponsesIncrease", "verify.gate", "versions"),
    "throughput": ("verify.gate.minThroughputRatio", "verify.gate", "versions"),
    "memory": ("verify.gate.maxMemoryIncrease", "verify.gate", "versions"),
}


class GateError(ReconcileError):
    """A deployment the gate cannot judge (not a verdict on it): the base ref's versions do
    not come up, a version is not in the model repository, the server fails."""


@dataclass(frozen=True)
class BaseConfig:
    """The model's config.pbtxt at the base ref, as JSON (None: the base ref has none)."""

    config: Mapping[str, Any] | None


@dataclass(frozen=True)
class GateTarget:
    """One ModelDeployment to gate: its spec at head, and at base (None: new at head).

    ``base_config``: the model's config.pbtxt at the base ref, which the old versions are
    brought up with; None when it could not be read (the model repository is not in the
    manifests' repository): the model repository's own is used, so a change of its inputs
    or outputs goes unseen."""

    head: ModelDeployment
    base: ModelDeployment | None
    base_config: BaseConfig | None = None


@dataclass(frozen=True)
class IsolatedServer:
    """The ports of one gate run: a tritonserver serving nothing else, on loopback.
    ``stream_load_tester``: the load generator for a streaming (decoupled) model when it is
    not ``load_tester`` (AIPerf, which drives streams only); None: ``load_tester`` measures
    every model."""

    control: TritonClient
    load_tester: LoadTester
    memory: MemoryGauge
    digests: VersionDigests
    address: str
    model_repository: str
    timing: Timing = field(default_factory=Timing)
    stream_load_tester: LoadTester | None = None


def load_tester(server: IsolatedServer, streaming: bool) -> LoadTester:
    """The load generator that measures a model: a streaming model's own when the server
    has one, else the server's."""
    if streaming and server.stream_load_tester is not None:
        return server.stream_load_tester
    return server.load_tester


def gated(base: DesiredState, head: DesiredState) -> list[GateTarget]:
    """The deployments whose versions or config change between ``base`` and ``head`` (on any
    server), by name; one that leaves the manifests is not gated."""
    changes = diff(base, head)
    names = {
        m.deployment
        for m in changes.models
        if m.change is not Change.REMOVED and (m.versions_added or m.config)
    } | set(changes.deployments_added)
    targets = []
    for name in sorted(names):
        deployment = head.deployments.get(name)
        if deployment is None:
            continue
        before = base.deployments.get(name) or next(
            (d for d in base.deployments.values() if d.model == deployment.model), None
        )
        targets.append(GateTarget(deployment, before))
    return targets


def _alone(deployment: ModelDeployment, server: IsolatedServer) -> DesiredState:
    """The deployment placed on the isolated server only, rolled out in one step."""
    isolated = replace(
        deployment,
        server_names=(GATE_SERVER,),
        match_labels=None,
        rollout=RolloutSpec(),
        suspend=False,
    )
    gate_server = TritonServer(
        GATE_SERVER, server.address, model_repository=server.model_repository
    )
    return DesiredState.build([gate_server], [isolated])


def _planned(
    deployment: ModelDeployment, server: IsolatedServer, repository_config: BaseConfig | None = None
) -> ModelChange | PlanProblem | None:
    """The plan for ``deployment`` alone on the isolated server; ``repository_config``: the
    model's config.pbtxt to plan with instead of the folder's (the base ref's)."""
    desired = _alone(deployment, server)
    observed = observe_servers({GATE_SERVER: server.control}, desired, History(), 1, server.digests)
    found_model = observed[GATE_SERVER].models.get(deployment.model)
    if repository_config is not None and found_model is not None:
        models = dict(observed[GATE_SERVER].models)
        models[deployment.model] = replace(found_model, repository_config=repository_config.config)
        observed[GATE_SERVER] = replace(observed[GATE_SERVER], models=models)
    found = plan(desired, observed, History(), "gate")
    for problem in found.problems:
        if problem.model in (None, deployment.model):
            return problem
    return next((c for c in found.changes if c.model == deployment.model), None)


def _run_until_unload(
    change: ModelChange, server: IsolatedServer, context: ChangeContext
) -> ReconcileError | None:
    """The change's steps up to the first that would drop the old versions or watch traffic
    (there is none here); the error of the step that failed, if one did."""
    for step in change.steps:
        if step.action in (Action.UNLOAD, Action.ANALYZE):
            break
        if step.action not in (Action.LOAD, Action.VERIFY):
            continue  # a drain (no traffic here), a library swap (not the gate's to make)
        try:
            execute_step(server.control, step, server.timing, context)
        except ReconcileError as exc:
            return exc
    return None


def _where(deployment: ModelDeployment) -> str:
    return f"{deployment.location}: ModelDeployment {deployment.name!r}"


def _bring_up_base(
    base: ModelDeployment, server: IsolatedServer, config: BaseConfig | None
) -> None:
    """The base ref's versions, up as apply brings them up, with the base ref's
    config.pbtxt (``config``, when known); GateError when they do not come up (the gate
    would judge the new against nothing)."""
    planned = _planned(base, server, config)
    if isinstance(planned, PlanProblem):
        raise GateError(f"{_where(base)} at the base ref: {planned.message}")
    if planned is None:
        return
    failed = _run_until_unload(planned, server, ChangeContext(replaces=False))
    if failed is not None:
        raise GateError(
            f"{_where(base)} at the base ref does not come up in the isolated server: {failed}"
        )


def _requests(
    head: ModelDeployment, server: IsolatedServer, version: int
) -> tuple[list[tuple[Tensor, ...]], str]:
    requests = [case.inputs for case in head.smoke]
    if requests:
        return requests, "smoke cases"
    if head.shadow is not None and head.shadow.requests:
        return list(head.shadow.requests), "shadow requests"
    made = synthesized(server.control.interface(head.model, version))
    if made is None:
        raise GateError(
            f"{_where(head)}: no request to load-test with: no smoke case, no shadow request, "
            "and an input whose datatype cannot be synthesized"
        )
    return [made.inputs], "synthesized from the metadata"


def _measure(
    server: IsolatedServer,
    model: str,
    versions: tuple[int, ...],
    spec: GateSpec,
    requests: list[tuple[Tensor, ...]],
    batched: bool,
    first: int = 0,
    *,
    exchange: Exchange = Exchange.UNARY,
) -> dict[int, list[LoadFigures]]:
    """Every version at every level, ``spec.rounds`` times (rounds ``first`` on),
    interleaved: the order of the versions flips from round to round. ``exchange``: how
    the model is asked (by streams, by sequences, by calls)."""
    measured: dict[int, list[LoadFigures]] = {v: [] for v in versions}
    tester = load_tester(server, exchange is Exchange.STREAM)
    for number in range(first, first + spec.rounds):
        order = versions if number % 2 == 0 else tuple(reversed(versions))
        for level in spec.concurrency:
            for version in order:
                figures = tester.measure(
                    model, version, requests, (), level, spec.requests, batched,
                    exchange=exchange,
                )  # fmt: skip
                memory = server.memory.version_memory(model, version)
                measured[version].append(replace(figures, memory_bytes=memory))
    return measured


def ab_test(
    server: IsolatedServer,
    model: str,
    versions: tuple[int, int],
    spec: GateSpec,
    requests: list[tuple[Tensor, ...]],
    batched: bool,
    memory: tuple[int | None, int | None, int | None],
    *,
    exchange: Exchange = Exchange.UNARY,
) -> tuple[list[LoadFigures], list[LoadFigures], tuple[GateCheck, ...], int]:
    """The old version (``versions[0]``) against the new, ``spec.rounds`` interleaved rounds,
    judged; when a check is inconclusive, as many rounds again, once, and all of them judged
    (more rounds narrow the interval the median lies in; one still inconclusive after that
    is reported so). ``memory``: the server's before anything, after the base, after the
    head. The old's and the new's figures, the checks, and how many rounds were measured."""
    old, new = versions
    measured = _measure(server, model, versions, spec, requests, batched, exchange=exchange)
    rounds = spec.rounds
    while True:
        old_figures, new_figures = _with_memory_fallback(measured[old], measured[new], *memory)
        checks = judge(spec, old_figures, new_figures)
        if rounds > spec.rounds or all(c.verdict is not GateVerdict.INCONCLUSIVE for c in checks):
            return old_figures, new_figures, checks, rounds
        more = _measure(server, model, versions, spec, requests, batched, rounds, exchange=exchange)
        measured = {v: measured[v] + more[v] for v in versions}
        rounds += spec.rounds


def _finding(
    name: str, exc: ReconcileError | str, deployment: ModelDeployment, *keys: str
) -> GateFinding:
    return GateFinding(name, GateVerdict.FAIL, str(exc), deployment.line(*keys, "versions"))


def run_gate(target: GateTarget, server: IsolatedServer) -> list[ModelGate]:
    """The gate's verdicts on one deployment, one per new version (one with no figures when
    the change is refused before any load). GateError when it cannot be judged."""
    clock = server.timing.clock
    started = clock()
    head, model = target.head, target.head.model
    if head.depends_on:
        raise GateError(
            f"{_where(head)} depends on {', '.join(head.depends_on)}: the gate does not bring "
            "up the models a deployment depends on yet"
        )
    before_any = server.memory.server_memory()
    if target.base is not None:
        _bring_up_base(target.base, server, target.base_config)
    after_base = server.memory.server_memory()
    planned = _planned(head, server)

    def verdict(new: int | None, old: int | None, *findings: GateFinding) -> ModelGate:
        return ModelGate(
            head.name, model, head.location.file, new, old, findings, seconds=clock() - started
        )

    if isinstance(planned, PlanProblem):
        if planned.kind == "interface-change":
            return [
                verdict(
                    None,
                    None,
                    _finding(
                        "interface",
                        planned.message,
                        head,
                        "config.output",
                        "config.input",
                        "config.max_batch_size",
                        "config",
                    ),
                )
            ]
        if planned.kind == "artifact-mismatch":
            # The folder is not the one the manifest pins: the change's fault, not the gate's.
            return [verdict(None, None, _finding("artifact", planned.message, head))]
        raise GateError(f"{_where(head)}: {planned.message}")
    if planned is None:
        return []
    new_versions = sorted(set(planned.desired) - set(planned.serving))
    old = planned.interface_baseline or (max(planned.serving) if planned.serving else None)
    context = ChangeContext(replaces=bool(planned.serving))
    if planned.interface_baseline is not None:
        context.interface = server.control.interface(model, planned.interface_baseline)
    failed = _run_until_unload(planned, server, context)
    if failed is not None:
        name = "verify" if isinstance(failed, VerifyFailed) else "load"
        keys = ("verify.smoke", "verify.shadow") if name == "verify" else ()
        finding = _finding(name, failed, head, *keys)
        return [verdict(v, old, finding) for v in new_versions] or [verdict(None, old, finding)]
    after_head = server.memory.server_memory()
    if not new_versions:
        note = GateFinding(
            "note",
            GateVerdict.PASS,
            "a config change with no new version: loaded and verified with the head config; "
            "not load-tested (Triton runs one config per model, so old and new configs cannot "
            "serve side by side)",
            head.line("config"),
        )
        return [verdict(None, old, note)]
    load_config = next((s.config for s in planned.steps if s.action is Action.LOAD), None) or {}
    batched = int(load_config.get("max_batch_size", 0) or 0) > 0
    # A decoupled model refuses unary calls: driven by streams. The plan knows it from the
    # config it has (the live one, once loaded), the load step's config says it too.
    streaming = any(s.streaming for s in planned.steps) or streams(load_config)
    exchange = Exchange.of(streaming, in_sequences(load_config))
    spec = head.gate or GateSpec()
    memory = (before_any, after_base, after_head)
    results = []
    for new in new_versions:
        notes = _old_smoke(head, server, old, exchange)
        requests, source = _requests(head, server, new)
        if old is not None:
            old_figures, new_figures, checks, rounds = ab_test(
                server, model, (old, new), spec, requests, batched, memory, exchange=exchange
            )
            if rounds > spec.rounds:
                notes.append(
                    GateFinding(
                        "note",
                        GateVerdict.PASS,
                        f"a check was inconclusive after {spec.rounds} rounds (they disagreed "
                        f"by more than the bound): {rounds - spec.rounds} more measured, all "
                        f"{rounds} judged",
                        head.line("verify.gate.rounds", "verify.gate", "versions"),
                    )
                )
        else:
            old_figures = []
            new_figures = _measure(
                server, model, (new,), spec, requests, batched, exchange=exchange
            )[new]
            checks = judge_alone(spec, new_figures)
        results.append(
            ModelGate(
                head.name,
                model,
                head.location.file,
                new,
                old,
                tuple(notes),
                checks,
                tuple(old_figures),
                tuple(new_figures),
                LoadTestSpec(load_tester(server, streaming).name, source),
                clock() - started,
                tuple((name, head.line(*keys)) for name, keys in _CHECK_LINES.items()),
            )
        )
    return results


def _old_smoke(
    head: ModelDeployment, server: IsolatedServer, old: int | None, exchange: Exchange
) -> list[GateFinding]:
    """The head's smoke cases on the old version too: one the old fails as well says the case
    (or the environment), not the new version, is off. Notes, never a failure. Asked as
    verify asks them (``engine/exchange.ask``): a streaming model's by a stream."""
    notes: list[GateFinding] = []
    if old is None:
        return notes
    for case in head.smoke:
        outputs = () if exchange is Exchange.STREAM else tuple(e.name for e in case.expect)
        deadline, cap = limits(case, None)
        try:
            reply = ask(
                server.control, head.model, old, case.inputs, outputs,
                exchange=exchange, timeout=deadline, max_responses=cap,
            )  # fmt: skip
            wrong = reply_mismatches(case, reply)
        except ReconcileError as exc:
            wrong = [str(exc)]
        if wrong:
            notes.append(
                GateFinding(
                    "note",
                    GateVerdict.PASS,
                    f"smoke {case.name} fails on the old version {old} too: {'; '.join(wrong)}",
                    head.line("verify.smoke"),
                )
            )
    return notes


def _with_memory_fallback(
    old: list[LoadFigures],
    new: list[LoadFigures],
    before_any: int | None,
    after_base: int | None,
    after_head: int | None,
) -> tuple[list[LoadFigures], list[LoadFigures]]:
    """Where no process runs one version alone (a backend inside the server), what the
    server grew by when the old versions loaded, and when the new ones loaded beside them."""
    if all(f.memory_bytes is not None for f in old + new):
        return old, new
    if before_any is None or after_base is None or after_head is None:
        return old, new
    old_growth, new_growth = after_base - before_any, after_head - after_base
    return (
        [replace(f, memory_bytes=float(old_growth)) for f in old],
        [replace(f, memory_bytes=float(new_growth)) for f in new],
    )
