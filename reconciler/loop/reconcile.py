"""``reconcile``: one pass, fetch to revert, as a straight run of the phases in
``loop/phases.py``. The CLI's ``plan`` and ``apply`` and the service call it, with the
``Ports`` that ``wiring.ports`` builds (tests give plain fakes).

It raises only ReconcileError subclasses, and returns a PassReport for everything else,
failures of single models included; each of those it also logs (``loop/pass_log.py``).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace

from reconciler.loop import phases
from reconciler.loop.memory import PassMemory
from reconciler.loop.pass_log import log_failures
from reconciler.model.reports import PassReport, SavedPlan
from reconciler.model.results import Progress, StepResult
from reconciler.model.settings import Settings
from reconciler.model.source import Source
from reconciler.ports import PassHooks, Ports, StepEvents


def _quiet(_: StepResult) -> None:
    pass


def _not_stopping() -> bool:
    return False


def reconcile(
    source: Source,
    settings: Settings,
    ports: Ports,
    *,
    apply_changes: bool,
    progress: Progress | None = None,
    skip: Mapping[str, str] | None = None,
    stopping: Callable[[], bool] | None = None,
    saved: SavedPlan | None = None,
    memory: PassMemory | None = None,
    events: StepEvents | None = None,
) -> PassReport:
    """One pass. ``skip``: servers to leave alone this time (name -> why); ``stopping``:
    turns true at shutdown (the change in progress finishes, no other starts); ``saved``: a
    plan made earlier (``plan --out``) that this pass must match exactly, or refuse;
    ``memory``: what the service keeps between passes (none: a one-shot pass); ``events``:
    who else watches apply's steps begin and its evaluations (``apply`` on a terminal)."""
    # once per pass: opening costs milliseconds. A plan reads the record and writes nothing
    # (no state file appears, an old one is left as it was).
    state = ports.open_state() if apply_changes else ports.read_state()
    alerts = ports.open_alerts()
    if apply_changes:
        # What a receiver that was down did not take, from earlier passes (or processes);
        # a plan leaves them to the next apply or pass, which records their delivery.
        alerts.restore(state.undelivered_alerts())
        # The failure alerts of a pass killed after its record and before its alerts went.
        phases.send_outbox(state, alerts)
    run = phases.PassRun(
        source,
        settings,
        ports,
        state,
        alerts,
        apply_changes,
        progress or _quiet,
        stopping or _not_stopping,
        skip,
        saved,
        memory,
        events,
    )
    try:
        report = _run(run)
        log_failures(report)
        return report
    finally:
        alerts.flush()
        if apply_changes:
            state.save_undelivered_alerts(alerts.backlog())
        state.close()


@contextmanager
def _phase(hooks: PassHooks, name: str) -> Iterator[None]:
    """Tell ``hooks`` that phase ``name`` runs, and how long it took (raising or not)."""
    hooks.phase_started(name)
    started = time.perf_counter()
    try:
        yield
    finally:
        hooks.phase_ended(name, time.perf_counter() - started)


def _run(run: phases.PassRun) -> PassReport:
    with _kept_from_collection():
        return _phases(run)


def _freeze(run: phases.PassRun) -> None:
    """``gc.freeze`` in a one-shot pass (no ``PassMemory``: its process ends after it). Not
    in the service: measured over 100 swaps (bench.soak --swaps 100 --arms glibc), the
    service's memory grew 8.4 MB with a freeze in every pass, about 80 KB a pass all along,
    and 0.9 MB without (flat from swap 20): what a pass frees in cycles while frozen
    waited for full collections that then came too rarely."""
    if run.memory is None:
        gc.freeze()


@contextmanager
def _kept_from_collection() -> Iterator[None]:
    """The pass's large values (the manifests, every server's state) are kept out of the
    cyclic garbage collector's full collections while the pass runs (``gc.freeze`` once
    they are built, ``gc.unfreeze`` at its end): a collection walks every object tracked,
    and a one-shot pass over 1,000 servers x 100 models spent 4 s of 12 in it, walking
    those values again and again (issue 46). They are freed by their counts as before;
    a cycle among them waits for the first collection after the pass. One-shot passes
    only (``_freeze``)."""
    try:
        yield
    finally:
        gc.unfreeze()


def _phases(run: phases.PassRun) -> PassReport:
    hooks = run.ports.hooks
    with _phase(hooks, "fetch"):
        revision = phases.fetch(run)
    with _phase(hooks, "approve"):
        phases.approve(run, revision)
    with _phase(hooks, "read"):
        desired = phases.read(run, revision)
    with _phase(hooks, "discover"):
        desired, discovered = phases.discover(run, desired)
    _freeze(run)  # the manifests, as read and expanded to every instance
    try:
        with _phase(hooks, "guard"):
            target = phases.guard(run, revision, desired, discovered)
        with phases.connected(run, target.desired) as clients:
            with _phase(hooks, "observe"):
                observed = phases.observe(run, target, clients)
            _freeze(run)  # what every server serves
            try:
                with _phase(hooks, "plan"):
                    planned = phases.plan(run, target, observed)
                if not run.apply_changes:
                    return PassReport(revision, planned.plan, served=planned.served)
                with _phase(hooks, "apply"):
                    applied = phases.apply(run, target, planned.plan, clients, observed)
            finally:
                for router in observed.routers.values():
                    router.close()
        with _phase(hooks, "record"):
            recorded = phases.record(run, target, planned, applied)
        with _phase(hooks, "alert"):
            phases.alert(run, planned.plan, recorded)
        with _phase(hooks, "revert"):
            notes = phases.revert(run, target, applied.result, recorded.holds)
        return replace(recorded.report, reverts=notes)
    finally:
        run.alerts.flush()
