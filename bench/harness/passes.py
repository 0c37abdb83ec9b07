"""How a scenario runs a reconcile pass in its own process: the one place the benchmarks
call ``reconciler.loop.reconcile``, build its ``Settings`` and its ``Ports``.

``bench.daemon`` (profiling idle passes), ``bench.fleet`` (every measured pass),
``bench.rollback_latency`` (every rollout) and ``bench.swap_under_load`` (its instrumented
applies) run passes here. With a ``Probe``, the pass reports its phases to it
(``ports.hooks``) and every call to Git, the state store and Triton is timed by it (the
ports wrapped in ``Probe.timed``): nothing in the reconciler is replaced. When the pass's
signature or the settings' shape changes, this module changes, not the scenarios. With a
``CallLog`` (``bench.blast_radius``), every call to Triton and to the metrics source is kept
with its start and end instead, on the clients' clock.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.harness.calls import CallLog
from bench.harness.probe import Probe
from reconciler.loop import phases
from reconciler.loop.memory import PassMemory
from reconciler.loop.reconcile import reconcile
from reconciler.model.reports import PassReport
from reconciler.model.servers import TritonServer
from reconciler.model.settings import Settings, TritonSettings
from reconciler.model.source import Source
from reconciler.ports import FiguresSource, Ports, StateStore, TritonClient
from reconciler.wiring import ports

# Servers handled at once when nothing says otherwise (the CLI's and the service's default).
DEFAULT_PARALLEL = TritonSettings().max_parallel


def pass_settings(
    cache_dir: Path,
    state_path: Path,
    *,
    hosts_file: Path | None = None,
    max_parallel: int = DEFAULT_PARALLEL,
) -> Settings:
    """The settings of an in-process pass: its own Git cache and state store; ``hosts_file``
    for discovery, ``max_parallel`` servers at once."""
    triton = TritonSettings(hosts_file=hosts_file, max_parallel=max_parallel)
    return Settings(cache_dir=cache_dir, state_path=state_path, triton=triton)


def pass_ports(
    source: Source,
    settings: Settings,
    probe: Probe | None = None,
    calls: CallLog | None = None,
) -> Ports:
    """The real adapters (``reconciler.wiring``); with ``probe``, timed by it; with
    ``calls``, their Triton and metrics calls logged (``triton <method>``, ``metrics
    figures``).

    Labels: ``git <method>`` (fetch, read...), ``state store open``/``close`` and
    ``state <method>``, ``triton connect``/``close`` and ``triton <method>`` (load, unload,
    model_state...), each under the phase that called it."""
    real = ports(settings, source, hooks=probe)
    if calls is not None:
        real = _logged(real, calls)
    if probe is None:
        return real

    def open_state() -> StateStore:
        store = probe.time_call("state store open", real.open_state)
        return probe.timed(store, "state", {"close": "state store close"})

    def connect(server: TritonServer) -> TritonClient:
        client = probe.time_call("triton connect", lambda: real.triton(server))
        return probe.timed(client, "triton", {"close": "triton close"})

    return replace(
        real,
        manifests=probe.timed(real.manifests, "git"),
        approval=probe.timed(real.approval, "git"),
        open_state=open_state,
        triton=connect,
    )


def _logged(real: Ports, calls: CallLog) -> Ports:
    def connect(server: TritonServer) -> TritonClient:
        return calls.timed(real.triton(server), "triton")

    def metrics(server: TritonServer) -> FiguresSource | None:
        reader = real.metrics(server)
        return None if reader is None else calls.timed(reader, "metrics")

    return replace(real, triton=connect, metrics=metrics)


def run_pass(
    source: Source,
    settings: Settings,
    *,
    memory: PassMemory | None = None,
    probe: Probe | None = None,
    calls: CallLog | None = None,
) -> PassReport:
    """One pass that applies what it plans (as ``triton-gitops apply``; with ``memory``, as
    the service's passes), timed by ``probe`` if given, its Triton and metrics calls logged
    in ``calls`` if given. ReconcileError propagates: each scenario says what it voids."""
    return reconcile(
        source,
        settings,
        pass_ports(source, settings, probe, calls),
        apply_changes=True,
        memory=memory,
    )


def plan_inputs(source: Source, settings: Settings) -> tuple[Any, ...]:
    """The arguments ``plan()`` is given in a pass (desired, serving, history, revision,
    skip), built by the pass's own phases (fetch, read, discover, guard, observe) with the
    real adapters: for timing the planner alone on what a real pass hands it."""
    real = pass_ports(source, settings)
    state, alerts = real.open_state(), real.open_alerts()
    try:
        run = phases.PassRun(
            source, settings, real, state, alerts, True, _ignore, _never, None, None, None
        )
        revision = phases.fetch(run)
        desired, discovered = phases.discover(run, phases.read(run, revision))
        target = phases.guard(run, revision, desired, discovered)
        with phases.connected(run, target.desired) as clients:
            observed = phases.observe(run, target, clients)
    finally:
        state.close()
    return (target.desired, observed.serving, target.history, target.revision, None)


def _ignore(_: object) -> None:
    pass


def _never() -> bool:
    return False
