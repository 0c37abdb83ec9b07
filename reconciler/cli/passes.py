"""``plan`` and ``apply``: one reconcile pass (``loop.reconcile``), planned only or carried
out, its progress on stderr as it runs and its report on stdout.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, nullcontext
from pathlib import Path

from reconciler.cli.options import lock_timeout_option, settings_of, source_options
from reconciler.cli.shell import (
    EXIT_CHANGES,
    EXIT_ERROR,
    EXIT_OK,
    Command,
    Commands,
    log,
    print_as,
    tell,
)
from reconciler.loop.pass_log import log_step
from reconciler.model.analysis import Evaluation
from reconciler.model.errors import ReconcileError, ValidationError
from reconciler.model.plan import Step
from reconciler.model.results import Draining, StepResult
from reconciler.model.settings import Settings
from reconciler.model.source import Source
from reconciler.views.live import drain_text, evaluation_line, started_line, waiting_line
from reconciler.views.render import progress_line


def _declare_plan(commands: Commands) -> None:
    plan_command = commands.add_parser(
        "plan",
        help="show what apply would do; exit 0 nothing to do, 2 changes pending, 1 error",
        description="Show what apply would do; exit 0 nothing to do, 2 changes pending, "
        "1 error. Reads the manifests at the commit the ref resolves to, observes every "
        "declared Triton server over gRPC and plans, per server and model, the versions to "
        "load, verify, analyze and unload. --output markdown is a pull-request comment.",
    )
    source_options(plan_command, ("text", "json", "markdown"))
    plan_command.add_argument(
        "--out",
        type=Path,
        metavar="FILE",
        help="also save the plan (revision, each server's state, steps) for apply --plan",
    )


def _declare_apply(commands: Commands) -> None:
    apply_command = commands.add_parser(
        "apply",
        help="run one reconcile pass; exit 0 when every server converged, 1 otherwise",
        description="Run one reconcile pass; exit 0 when every server converged, 1 when "
        "anything failed or was reverted. Reads the manifests at the commit the ref resolves "
        "to, observes every declared Triton server, plans and applies: load new versions "
        "beside the old, verify, analyze, then unload the old.",
    )
    source_options(apply_command)
    lock_timeout_option(apply_command)
    apply_command.add_argument(
        "--plan",
        type=Path,
        metavar="FILE",
        help="apply exactly this saved plan (plan --out); refused as stale when the tracked "
        "branch or any server moved since it was made",
    )


class ApplyLines:
    """apply's progress on stderr (never in the report on stdout): a line as each step
    begins and ends, each evaluation as it is made, and, while a step runs long, a 'still
    loading... 40s' line every few seconds on a terminal (every 30 s in a CI log). With
    --log-format json each is a log record instead, so that every line of stderr is JSON
    (a step's end the "step" event the service logs too)."""

    def __init__(self, every: float, as_records: bool = False) -> None:
        self._every = every
        self._as_records = as_records
        self._running: dict[tuple[str, str], tuple[Step, float]] = {}
        self._drains: dict[tuple[str, str], str] = {}  # a drain's latest reading, in words
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._ticker = threading.Thread(target=self._tick, name="apply-lines", daemon=True)
        self._ticker.start()

    def _say(self, line: str, step: Step) -> None:
        if self._as_records:
            where = {"server": step.server, "model": step.model, "step": str(step.action)}
            log.info(line, extra={"fields": where})
            return
        with self._lock:
            print(line, file=sys.stderr, flush=True)

    def started(self, step: Step, reverting: bool) -> None:
        with self._lock:
            self._running[(step.server, step.model)] = (step, time.monotonic())
        self._say(started_line(step, reverting), step)

    def evaluated(self, step: Step, evaluation: Evaluation, seconds_left: float) -> None:
        self._say(evaluation_line(step, evaluation, seconds_left), step)

    def routed(self, router: str, weights: Mapping[str, int], mirror: Mapping[str, int]) -> None:
        pass  # the route step's own line says it

    def draining(self, step: Step, draining: Draining) -> None:
        with self._lock:  # said with the step's next "still draining" line
            self._drains[(step.server, step.model)] = drain_text(draining.as_json())

    def ended(self, result: StepResult) -> None:
        with self._lock:
            self._running.pop((result.step.server, result.step.model), None)
            self._drains.pop((result.step.server, result.step.model), None)
        if self._as_records:
            log_step(result)
        else:
            self._say(progress_line(result), result.step)

    def _tick(self) -> None:
        while not self._done.wait(self._every):
            now = time.monotonic()
            with self._lock:
                running = list(self._running.values())
                drains = dict(self._drains)
            for step, began in running:
                if now - began >= self._every:
                    line = waiting_line(step, now - began)
                    drain = drains.get((step.server, step.model))
                    self._say(f"{line}; {drain}" if drain else line, step)

    def close(self) -> None:
        self._done.set()
        self._ticker.join()


@contextmanager
def one_reconciler(args: argparse.Namespace, settings: Settings) -> Iterator[None]:
    """Hold the reconciler lock for a one-shot command that changes something (apply,
    undo), waiting at most --lock-timeout for another holder; ReconcileError naming it."""
    from reconciler import wiring  # late: see cli/__init__.py

    lock = wiring.reconciler_lock(settings, str(args.command))
    holder = lock.holder()
    if holder is not None and args.lock_timeout > 0:
        waiting = f"waiting up to {args.lock_timeout:g} s for the reconciler lock {lock.where}"
        if args.log_format == "json":
            log.warning(waiting, extra={"fields": {"holder": str(holder), "pid": holder.pid}})
        else:
            print(f"{waiting}, held by {holder}", file=sys.stderr, flush=True)
    if not lock.acquire(args.lock_timeout):
        holder = lock.holder()
        raise ReconcileError(
            f"another reconciler holds the lock {lock.where}: "
            f"{holder or 'a process that just let it go'}; waited {args.lock_timeout:g} s "
            "(--lock-timeout). To ask a running service for a pass: triton-gitops "
            "reconcile --service URL"
        )
    try:
        yield
    finally:
        lock.release()


def _pass(args: argparse.Namespace, apply_changes: bool) -> int:
    from reconciler import wiring  # late: see cli/__init__.py
    from reconciler.adapters.plan_file import load_saved_plan, save_plan
    from reconciler.loop.reconcile import reconcile
    from reconciler.views.render import plan_json, report_json, report_text
    from reconciler.views.review import plan_markdown
    from reconciler.views.steps import plan_steps_json

    source = Source(args.repo, args.ref, args.path)
    settings = settings_of(args)
    lines = ApplyLines(5.0 if sys.stderr.isatty() else 30.0, args.log_format == "json")
    try:
        saved = load_saved_plan(args.plan, source) if getattr(args, "plan", None) else None
        with (
            one_reconciler(args, settings) if apply_changes else nullcontext(),
            wiring.ports(settings, source) as ports,
        ):
            report = reconcile(
                source,
                settings,
                ports,
                apply_changes=apply_changes,
                progress=lines.ended,
                saved=saved,
                events=lines,
            )
    except ValidationError as exc:
        for problem in exc.problems:
            tell(args, str(problem), file=problem.file, line=problem.line)
        tell(
            args,
            f"{len(exc.problems)} problem(s) in the manifests at {exc.revision}; nothing applied",
            revision=exc.revision,
        )
        return EXIT_ERROR
    except ReconcileError as exc:
        tell(args, f"error: {exc}")
        return EXIT_ERROR
    finally:
        lines.close()
    print_as(
        args.output,
        {
            "json": lambda: report_json(report),
            "markdown": lambda: plan_markdown(report.plan),
            "text": lambda: report_text(report),
        },
    )
    if getattr(args, "out", None):
        save_plan(args.out, source, report, plan_json(report.plan), plan_steps_json(report.plan))
    if not report.ok:
        return EXIT_ERROR
    if not apply_changes and report.plan.has_changes:
        return EXIT_CHANGES
    return EXIT_OK


def _plan(args: argparse.Namespace) -> int:
    return _pass(args, apply_changes=False)


def _apply(args: argparse.Namespace) -> int:
    return _pass(args, apply_changes=True)


COMMANDS = {
    "plan": Command(_declare_plan, _plan),
    "apply": Command(_declare_apply, _apply),
}
