"""``triton-gitops check``: the ground checked before a first pass (``loop/preflight.py``)."""

from __future__ import annotations

import argparse

from reconciler.cli.options import settings_of, source_options
from reconciler.cli.shell import EXIT_ERROR, EXIT_OK, Command, Commands, print_as
from reconciler.model.preflight import FAIL
from reconciler.model.source import Source
from reconciler.views.preflight import preflight_json, preflight_text


def _declare_check(commands: Commands) -> None:
    check = commands.add_parser(
        "check",
        help="check the ground before a first pass: Git, manifests, state, servers; exit 0/1",
        description="Check, one line each with what to do when it fails: the Git remote and "
        "its credentials (a fetch of --ref), the manifests at that revision, the state store, "
        "Prometheus and Alertmanager where configured (/-/ready), each router's admin or API; "
        "then per declared server (each instance of a discovered one): it answers, its Triton "
        "version, EXPLICIT model control (an unload of a name no repository holds: a no-op in "
        "EXPLICIT mode, refused in POLL and NONE), its metrics endpoint, its model repository "
        "where the reconciler reads it. --pre leaves the servers out. Changes nothing. Exit "
        "0 when no check failed, 1 when one did.",
    )
    source_options(check)
    check.add_argument(
        "--pre", action="store_true", help="only what needs no Triton server (before they run)"
    )


def _check(args: argparse.Namespace) -> int:
    from reconciler import wiring  # late: see cli/__init__.py
    from reconciler.adapters.endpoints import not_ready
    from reconciler.loop.preflight import preflight

    source, settings = Source(args.repo, args.ref, args.path), settings_of(args)
    with wiring.ports(settings, source) as ports:
        lines = preflight(source, settings, ports, not_ready, servers=not args.pre)
    print_as(
        args.output,
        {"json": lambda: preflight_json(lines), "text": lambda: preflight_text(lines)},
    )
    return EXIT_ERROR if any(line.result == FAIL for line in lines) else EXIT_OK


COMMANDS = {"check": Command(_declare_check, _check)}
