"""How a scenario runs a reconcile pass in its own process: the one place the benchmarks
call ``reconciler.loop.reconcile`` and build its ``Settings``.

``bench.daemon`` (profiling idle passes), ``bench.fleet`` (every measured pass) and
``bench.rollback_latency`` (every rollout) run passes here; ``bench.swap_under_load`` runs
the CLI instead (``testkit.cli_run``), as a user does. When the pass's signature or the
settings' shape changes, this module changes, not the scenarios.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from reconciler.loop.memory import PassMemory
from reconciler.loop.reconcile import reconcile
from reconciler.model.reports import PassReport
from reconciler.model.settings import Settings
from reconciler.model.source import Source

# Servers handled at once when nothing says otherwise (the CLI's and the service's default).
DEFAULT_PARALLEL: int = next(
    f.default for f in dataclasses.fields(Settings) if f.name == "max_parallel"
)  # type: ignore[assignment]


def pass_settings(
    cache_dir: Path,
    state_path: Path,
    *,
    hosts_file: Path | None = None,
    max_parallel: int = DEFAULT_PARALLEL,
) -> Settings:
    """The settings of an in-process pass: its own Git cache and state store; ``hosts_file``
    for discovery, ``max_parallel`` servers at once."""
    return Settings(
        cache_dir=cache_dir,
        state_path=state_path,
        hosts_file=hosts_file,
        max_parallel=max_parallel,
    )


def run_pass(source: Source, settings: Settings, *, memory: PassMemory | None = None) -> PassReport:
    """One pass that applies what it plans (as ``triton-gitops apply``; with ``memory``, as
    the service's passes). ReconcileError propagates: each scenario says what it voids."""
    return reconcile(source, settings, apply_changes=True, memory=memory)
