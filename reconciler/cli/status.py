"""What serves and what happened, read without changing anything: ``status`` (each server and
model, desired against served; ``--watch``: the rollouts in progress as they run) and
``history`` (the rollouts and on-call actions the state store recorded).
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
import time
from pathlib import Path

from reconciler.cli.options import (
    default_state,
    seconds_option,
    settings_of,
    source_options,
    token_file_option,
)
from reconciler.cli.shell import (
    EXIT_NO_SERVER,
    EXIT_OK,
    Command,
    Commands,
    existing_state,
    failed,
    operator_token,
    print_as,
)
from reconciler.model.errors import ReconcileError
from reconciler.model.source import Source


def _declare_history(commands: Commands) -> None:
    history = commands.add_parser(
        "history",
        help="list recorded rollouts with their verdicts and check values",
        description="List rollouts from the state store, newest first: revision, server, "
        "model, from and to versions, outcome, the analysis verdict and each check's value.",
    )
    history.add_argument("--model", help="only this model")
    history.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    history.add_argument("--output", choices=("text", "json"), default="text")
    history.add_argument("--state", type=Path, default=default_state(), help="state store")


def _history(args: argparse.Namespace) -> int:
    from reconciler import wiring  # late: see cli/__init__.py
    from reconciler.views.render import history_json, history_text

    if not args.state.exists():
        # Not an error: nothing was applied with this state store yet (and none is made).
        print(f"no history yet: no state store at {args.state} (apply and run write it)",
              file=sys.stderr)  # fmt: skip
        if args.output == "json":
            print(history_json([], []))
        return EXIT_OK
    with wiring.state_store(args.state, read_only=True) as store:
        rollouts = store.rollouts(args.model, args.limit)
        actions = store.operator_actions(args.model, args.limit)
    print_as(
        args.output,
        {
            "json": lambda: history_json(rollouts, actions),
            "text": lambda: history_text(rollouts, actions),
        },
    )
    return EXIT_OK


def _declare_status(commands: Commands) -> None:

    status = commands.add_parser(
        "status",
        help="per server and model: desired versus served versions, holds, last error",
        description="Observe every declared server and show, per server and model, the "
        "versions the manifests ask for, the versions Triton serves, whether it is in sync, "
        "pending, held, suspended or unreachable, the last rollout, and the last applied "
        "revision. Changes nothing (the state store is only read). Exit 0, 3 when every "
        "declared server is unreachable, 1 when it cannot run. With --watch, shows instead "
        "the rollouts in progress as they run (each server's step and since when, the latest "
        "evaluation with each check's value and threshold, the analysis time left), from the "
        "state store a running reconciler writes (--state) or from a running service "
        "(--service).",
    )
    source_options(status, repo_required=False)
    status.add_argument(
        "--watch", action="store_true", help="follow the rollouts in progress (Ctrl-C ends)"
    )
    status.add_argument(
        "--service", metavar="URL", help="with --watch: read a running service's GET /status"
    )
    status.add_argument("--model", help="only this model (as history --model)")
    status.add_argument(
        "--server", help="only this server, or a discovered fleet's instances by its name"
    )
    token_file_option(status)
    seconds_option(status, "--every", 1.0, "with --watch: refresh (%(default)g)")


def _status(args: argparse.Namespace) -> int:
    from reconciler import wiring  # late: see cli/__init__.py
    from reconciler.loop.status import status
    from reconciler.views.render import status_json, status_text

    if args.watch:
        if args.model or args.server:
            return failed("--model and --server narrow status's rows; --watch shows them all")
        return _watch_status(args)
    if args.service and not args.repo:
        # What the service gives is the rollouts in progress, the view of --watch.
        return failed(
            "status --service reads a running service's rollouts in progress: add --watch "
            "(without it, status observes the servers the manifests declare: give --repo)"
        )
    if not args.repo:
        return failed("status needs --repo (or --watch)")
    source, settings = Source(args.repo, args.ref, args.path), settings_of(args)
    # Every server is still observed: what a model's row says depends on the whole plan.
    with wiring.ports(settings, source) as ports:
        whole = status(source, settings, ports)
    report = whole.narrowed(args.model, args.server)
    print_as(
        args.output, {"json": lambda: status_json(report), "text": lambda: status_text(report)}
    )
    if whole.no_server_reached:
        print("error: no declared server answered", file=sys.stderr)
        return EXIT_NO_SERVER
    if whole.invalid:
        return failed(
            f"the manifests at {whole.revision} do not validate ({len(whole.invalid)} "
            f"problem(s)); shown: what the last applied revision {whole.declared_at} declares"
        )
    return EXIT_OK


def _watch_status(args: argparse.Namespace) -> int:
    """status --watch: the live view, redrawn on a terminal; elsewhere printed each time it
    changes (one block per change, for logs). Runs until interrupted."""
    from reconciler import wiring  # late: see cli/__init__.py
    from reconciler.adapters.operator_client import live_status
    from reconciler.views.live import live_text

    token = operator_token(args) if args.service else None
    if not args.service:
        existing_state(args)
    terminal, shown = sys.stdout.isatty(), ""
    # SIGTERM ends it as Ctrl-C does (a process started in the background by a shell that
    # has no job control ignores SIGINT, so a supervisor or a script sends SIGTERM).
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        while True:
            try:
                if args.service:
                    snapshot = live_status(args.service, str(token)).get("in_progress")
                else:
                    with wiring.state_store(args.state, read_only=True) as store:
                        snapshot = store.live()
                    # Written by a reconciler that no longer runs (killed mid-pass): the
                    # lock is the kernel's word on that, whatever the snapshot says.
                    if snapshot and wiring.lock_holder(args.state) is None:
                        snapshot = {**snapshot, "abandoned": True}
            except ReconcileError as exc:  # the service or the store did not answer
                return failed(str(exc))
            if args.output == "json":
                text = json.dumps(snapshot or {"rollouts": []}, sort_keys=True)
            else:
                text = live_text(snapshot, time.time())
            if terminal:
                print("\x1b[H\x1b[2J" + text, flush=True)  # redraw in place
            elif _without_clock(text) != _without_clock(shown):
                print(text + ("\n" if args.output != "json" else ""), flush=True)
            shown = text
            time.sleep(args.every)
    except KeyboardInterrupt:
        return EXIT_OK


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _without_clock(text: str) -> str:
    """The live view less what changes every second (durations): a log gets a block only
    when a step, a state or an evaluation changed."""
    return re.sub(r"\d+s( left)?\b|updated \S+", "", text)


COMMANDS = {
    "history": Command(_declare_history, _history),
    "status": Command(_declare_status, _status),
}
