"""What every command of the command line shares: exit codes, the parser class, how a report is
printed in the format asked and how an error is told, secrets from files, who is asking.
"""

from __future__ import annotations

import argparse
import getpass
import logging
import os
import socket
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from reconciler.model.errors import ReconcileError, ValidationError

EXIT_OK, EXIT_ERROR, EXIT_CHANGES = 0, 1, 2
EXIT_GATE_FAILED = 3  # gate: a deployment failed it (1 stays an error: not judged)
EXIT_GATE_INCONCLUSIVE = 4  # gate: none failed, one's measurements too noisy to judge
EXIT_NO_SERVER = 3  # status: every declared server unreachable (1: status could not run)
# plan and apply's own records with --log-format json (their progress, why they stopped)
log = logging.getLogger("triton_gitops.cli")

# What ``commands.add_parser`` is called on (argparse names no public type for it).
Commands = Any


@dataclass(frozen=True)
class Command:
    """One subcommand: how its options are declared, and what runs it (its exit code)."""

    declare: Callable[[Commands], None]
    run: Callable[[argparse.Namespace], int]


def failed(message: str) -> int:
    """An error that ends a command: "error: ..." on stderr, exit 1."""
    print(f"error: {message}", file=sys.stderr)
    return EXIT_ERROR


def problems_at(exc: ValidationError) -> int:
    """Manifests that do not validate at a ref (diff, gate): each problem, then the count."""
    for problem in exc.problems:
        print(problem, file=sys.stderr)
    print(f"{len(exc.problems)} problem(s) at {exc.revision}", file=sys.stderr)
    return EXIT_ERROR


def operator_token(args: argparse.Namespace, needed_by: str = "--service") -> str:
    """The operator token a command sends to the running service; ReconcileError without."""
    token = secret(args.token_file, "TRITON_GITOPS_OPERATOR_TOKEN")
    if not token:
        raise ReconcileError(f"{needed_by} needs --token-file (or $TRITON_GITOPS_OPERATOR_TOKEN)")
    return token


def existing_state(args: argparse.Namespace) -> Path:
    """--state, which must exist: a verb never creates one (a suspend written to a store no
    reconciler reads would pause nothing while saying it did); ReconcileError otherwise."""
    if not args.state.exists():
        raise ReconcileError(f"no state store at {args.state}: give the reconciler's --state")
    return Path(args.state)


def print_as(output: str, renderers: Mapping[str, Callable[[], str | None]]) -> None:
    """The report in the format ``--output`` asks for, on stdout (a renderer's None: nothing
    to print, as GitHub annotations when there are none)."""
    text = renderers[output]()
    if text is not None:
        print(text)


class Parser(argparse.ArgumentParser):
    """Usage errors exit 1: exit 2 means "changes pending" for plan and diff. Abbreviated
    options are off (in every subparser: they are made of this class), so that ``--config``
    is never taken for ``--config-recheck`` and a new option never breaks an old script."""

    commands: dict[str, argparse.ArgumentParser]  # the subcommands' parsers, by name

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_ERROR, f"{self.prog}: error: {message}\n")


CONFIG_HELP = (
    "YAML file of option defaults (keys are long option names, e.g. repo, interval, "
    "revert-mode; a key no command has is refused). Precedence: command-line flag, then "
    "$TRITON_GITOPS_<OPTION> (e.g. TRITON_GITOPS_REPO), then this file, then the built-in "
    "default. $TRITON_GITOPS_CONFIG names the file too."
)


def secret(file: Path | None, variable: str) -> str | None:
    """A secret from a mounted file, else from the environment; never from a flag's value."""
    if file is not None:
        return file.read_text().strip() or None
    return os.environ.get(variable) or None


def actor(args: argparse.Namespace) -> str:
    if args.actor:
        return str(args.actor)
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def tell(args: argparse.Namespace, text: str, **fields: Any) -> None:
    """Why plan or apply stopped, on stderr: a line of text, or with --log-format json an
    ERROR record like every other line there."""
    if args.log_format == "json":
        log.error(text, extra={"fields": fields})
    else:
        print(text, file=sys.stderr)
