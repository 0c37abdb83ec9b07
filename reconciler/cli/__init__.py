"""Command line: argument parsing only; the work is in ``loop``, ``spec`` and ``views``.

A module per group of commands holds each command's options and what runs it:
``manifests`` (validate, diff, digest), ``passes`` (plan, apply), ``status`` (status,
history), ``on_call`` (reconcile, suspend, resume, retry, abort, promote, undo), ``gate`` and
``service`` (run). ``options`` has the option groups they share, ``shell`` the exit codes,
printing and error reporting.

Building the parser imports every command module, so a command module imports at its top
what declaring its options needs and nothing heavier: the wiring, the adapters and the pass
are imported in the function that runs the command (marked ``late``). A pull request's
``validate`` would otherwise start every client library the service uses (gRPC, Kubernetes,
scipy, httpx: about 1 s of the 1.5 s that issue 46 allows for 1,000 manifests);
tests/test_cli_start.py checks what ``validate`` imports.

Exit codes: ``validate`` 0 valid, 1 invalid; ``plan`` 0 nothing to do, 2 changes pending,
1 error; ``apply`` 0 every server converged, 1 anything failed or was reverted;
``history`` 0 (also without a state store: no history yet); ``status`` 0, or 3 when every
declared server is unreachable (1 an error).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from reconciler import __version__
from reconciler.adapters.logs import configure_logging
from reconciler.adapters.options import (
    ConfigFile,
    OptionSourceError,
    command_in,
    config_path,
    known_keys,
    misspelled_variables,
    read_config_file,
    refuse_unknown_keys,
    take_defaults,
)
from reconciler.cli import check, gate, manifests, on_call, passes, service, status
from reconciler.cli.options import log_options
from reconciler.cli.shell import CONFIG_HELP, EXIT_ERROR, Command, Parser, failed
from reconciler.model.errors import ReconcileError

# Every command, in the order --help lists them.
COMMANDS: dict[str, Command] = {
    **manifests.COMMANDS,
    **status.COMMANDS,
    **on_call.COMMANDS,
    **passes.COMMANDS,
    **gate.COMMANDS,
    **service.COMMANDS,
    **check.COMMANDS,
}
_HELP_ORDER = (
    "validate", "history", "reconcile", "suspend", "resume", "retry", "abort", "promote",
    "undo", "plan", "apply", "diff", "gate", "digest", "crds", "status", "run", "check",
)  # fmt: skip


def build_parser() -> Parser:
    parser = Parser(
        prog="triton-gitops",
        description="GitOps for NVIDIA Triton Inference Server: make every server serve the "
        "model versions that the manifests in a Git repository declare, with zero-downtime "
        "swaps (load new beside old, verify, then unload old).",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--config", type=Path, metavar="FILE", help=CONFIG_HELP)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in _HELP_ORDER:
        COMMANDS[name].declare(commands)
    for name, command in commands.choices.items():
        log_options(command, "json" if name == "run" else "text")
        # after the command too; absent unless given, so that the global one is kept
        command.add_argument(
            "--config", type=Path, metavar="FILE", default=argparse.SUPPRESS, help=CONFIG_HELP
        )
    parser.commands = dict(commands.choices)
    return parser


def parse_arguments(
    argv: Sequence[str],
    environ: Mapping[str, str],
    config: ConfigFile | None = None,
    parser: Parser | None = None,
) -> argparse.Namespace:
    """The command line, with the defaults the environment and the config file give (see
    ``adapters/options.py``); ``config``: that file, already read (else --config's or
    $TRITON_GITOPS_CONFIG's); ``parser``: a fresh ``build_parser()`` the caller keeps (else
    one is built). OptionSourceError for a file or variable that cannot be used; usage
    errors exit 1 (argparse)."""
    parser = parser or build_parser()
    if config is None:
        path = config_path(argv, environ)
        config = read_config_file(path) if path is not None else None
    if config is not None:
        refuse_unknown_keys(config, known_keys(parser.commands))
    command = command_in(argv, parser.commands)
    if command is not None:
        take_defaults(parser.commands[command], environ, config)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()  # one per invocation: take_defaults sets its defaults
    try:
        args = parse_arguments(arguments, os.environ, parser=parser)
    except OptionSourceError as exc:
        return failed(str(exc))
    for warning in misspelled_variables(os.environ, known_keys(parser.commands)):
        print(f"warning: {warning}", file=sys.stderr)
    if args.command != "run":  # run configures its own logging
        # Log records (alerts, each failure of a pass) go to stderr, as text or JSON lines.
        configure_logging(args.log_format, args.log_level)
    try:
        return COMMANDS[args.command].run(args)
    except ReconcileError as exc:  # every command's errors, told the one way
        return failed(str(exc))


__all__ = ["COMMANDS", "EXIT_ERROR", "build_parser", "main", "parse_arguments"]
