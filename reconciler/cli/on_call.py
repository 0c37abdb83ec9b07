"""The on-call verbs: ``suspend``, ``resume``, ``retry``, ``abort``, ``promote`` and ``undo``,
each on the state store (``loop.on_call``; undo: a commit, ``loop.undo``) or through the
running service with ``--service``; and ``reconcile``, a pass of the running service now.
"""

from __future__ import annotations

import argparse
import sys
from contextlib import nullcontext
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reconciler.cli.options import (
    default_state,
    lock_timeout_option,
    seconds_option,
    settings_of,
    source_options,
    token_file_option,
)
from reconciler.cli.shell import (
    EXIT_ERROR,
    EXIT_OK,
    Command,
    Commands,
    actor,
    existing_state,
    failed,
    operator_token,
)
from reconciler.core.undo import UndoRequest
from reconciler.model.history import Hold, OperatorOrder, OrderKind
from reconciler.model.source import Source

if TYPE_CHECKING:
    from reconciler.loop.on_call import VerbDone


def _declare_reconcile(commands: Commands) -> None:
    reconcile_verb = commands.add_parser(
        "reconcile",
        help="ask the running service for a pass now and wait for its outcome",
        description="Ask the running service (--service) for a pass now, as `flux reconcile` "
        "does, and wait until a pass that started after the request has finished: exit 0 "
        "when it fully succeeded and left no ModelDeployment held, 1 otherwise (each failed "
        "server or model is printed, and each held deployment with its servers and the "
        "failed revision: Stalled, as `flux reconcile` fails on a stalled object). "
        "Recorded under the operator token's name.",
    )
    reconcile_verb.add_argument("--service", required=True, metavar="URL")
    token_file_option(reconcile_verb)
    seconds_option(reconcile_verb, "--timeout", 900.0, "longest wait (%(default)g)")


def _reconcile_now(args: argparse.Namespace) -> int:
    from reconciler.adapters.operator_client import ask_service, wait_for_pass

    token = operator_token(args, needed_by="reconcile")
    status, reply = ask_service(args.service, token, "reconcile", None)
    if status != 202:
        return failed(f"the service answered {status}: {reply.get('error', reply)}")
    print(f"reconcile: pass requested by {reply['by']}; waiting", file=sys.stderr)
    outcome = wait_for_pass(args.service, token, int(reply["after"]), args.timeout)
    revision = (outcome.get("revision") or "")[:12] or "no revision"
    print(f"pass {outcome['number']} at {revision}: {outcome['result']} "
          f"({outcome['seconds']:g} s, finished {outcome['finished_at']})")  # fmt: skip
    for one in outcome.get("failed", []):
        where = one["server"] + (f"/{one['model']}" if one.get("model") else "")
        print(f"  {where}: {one['reason']}")
    # A held deployment is stalled, as ``flux reconcile`` fails on a stalled object: the pass
    # may have gone through, but what serves is not what Git asks until someone acts.
    held = _held_deployments(outcome.get("held", []))
    for deployment, (servers, why) in held.items():
        print(f"  held: {deployment} on {', '.join(servers)}: {why}; a commit that changes "
              f"it, `triton-gitops retry {deployment}` or `undo` lifts it")  # fmt: skip
    return EXIT_OK if outcome.get("ok") and not held else EXIT_ERROR


def _held_deployments(held: list[dict[str, Any]]) -> dict[str, tuple[list[str], str]]:
    """``GET /v1/passes/last``'s held models by deployment: its servers, and why (the failed
    revision and the first line of the reason)."""
    found: dict[str, tuple[list[str], str]] = {}
    for h in held:
        reason = (h.get("reason") or "failed").splitlines()[0]
        why = f"revision {(h.get('revision') or '')[:12]} failed: {reason}"
        found.setdefault(h["deployment"], ([], why))[0].append(h["server"])
    return found


# Each verb on the record: its summary and its description (--help).
_VERBS: dict[str, tuple[str, str]] = {
    "suspend": (
        "pause reconciling one ModelDeployment (or all) until resume; no commit",
        "Record in the state store that DEPLOYMENT (or, without one, every ModelDeployment) "
        "is not to be reconciled: passes leave its servers as they are (no load, no unload, "
        "no router change), status shows who suspended it and when, until resume. Takes "
        "effect at the next pass of a running service sharing the state store.",
    ),
    "resume": (
        "lift a suspend (of one ModelDeployment, or without one, of all)",
        "Lift the suspension of DEPLOYMENT, or without one the suspension of every "
        "ModelDeployment (suspensions of single deployments stay: they are listed).",
    ),
    "retry": (
        "lift the hold on a ModelDeployment whose rollout failed: the same spec again",
        "A failed spec is held at what served before until a commit changes it. retry lifts "
        "the hold without a commit: the next pass tries the same spec again (and analyses it "
        "again).",
    ),
    "abort": (
        "stop a rollout in progress now: the old versions back, the spec held, an alert",
        "Tell the reconciler applying DEPLOYMENT to stop its rollout now (within a quarter of"
        " a second: in its analysis, its current stage, or before its next step): the old "
        "versions serve again, the spec is held (retry, undo or a new commit lifts it), an "
        "alert opens, and the revert write-back runs as after a failed analysis "
        "(--revert-mode). Refused when no rollout of it is in progress.",
    ),
    "promote": (
        "end a rollout's running analysis as passed (--full: every analysis left)",
        "Tell the reconciler applying DEPLOYMENT to end the analyses running now as passed "
        "('promoted' in history): the rollout goes on to its next step (the next stage or "
        "traffic share, whose analysis runs in full) or, with --full, through every step left"
        " without analysing. Refused when no rollout of it is in progress.",
    ),
}


def _declare_verb(verb: str, commands: Commands) -> None:
    summary, description = _VERBS[verb]
    command = commands.add_parser(verb, help=summary, description=description)
    command.add_argument(
        "deployment",
        nargs="?" if verb in ("suspend", "resume") else None,
        metavar="DEPLOYMENT",
        help="a ModelDeployment's metadata.name",
    )
    if verb in ("suspend", "abort", "promote"):
        command.add_argument("--reason", default="", help="shown by status and history")
    if verb == "promote":
        command.add_argument(
            "--full", action="store_true", help="skip every analysis left in the rollout"
        )
    command.add_argument(
        "--as",
        dest="actor",
        metavar="NAME",
        help="who asks, as history records it (default: USER@HOST)",
    )
    command.add_argument("--state", type=Path, default=default_state(), help="state store")
    command.add_argument(
        "--service",
        metavar="URL",
        help="ask the running service instead (e.g. http://127.0.0.1:9090): the verb is "
        "recorded under the token's name and, for resume and retry, a pass runs at once",
    )
    token_file_option(command)


def _operator_verb(args: argparse.Namespace) -> int:
    """suspend, resume, retry, abort and promote on the state store (a running service that
    shares it reads them at its next pass, or within ORDERS_EVERY for an order), or through
    the running service (``--service``)."""
    from reconciler import wiring  # late: see cli/__init__.py
    from reconciler.loop.on_call import give, never_applied

    if args.service:
        return _through_the_service(args)
    verb = _verb(args)
    with wiring.state_store(existing_state(args)) as store:
        # A typo in the name would suspend nothing that exists; said, not refused: a
        # suspension may come before the first apply.
        named = args.deployment if verb in ("suspend", "resume") else None
        if named and never_applied(store, named):
            print(f"note: no pass has applied a ModelDeployment named {named!r} yet",
                  file=sys.stderr)  # fmt: skip
        done = give(store, verb, args.deployment, actor(args), getattr(args, "reason", ""))
    return _said(done)


def _through_the_service(args: argparse.Namespace) -> int:
    """A verb (undo too) sent to the running service (``POST /v1/...``), its reply printed."""
    from reconciler.adapters.operator_client import ask_service

    token = operator_token(args)
    reason = getattr(args, "reason", "")
    extra = _undo_body(args) if args.command == "undo" else None
    status, reply = ask_service(args.service, token, _verb(args), args.deployment, reason, extra)
    if status != 200:
        return failed(f"the service answered {status}: {reply.get('error', reply)}")
    print(reply.get("patch", ""), end="")  # undo's change
    print(f"{reply['verb']}: {reply['target']} by {reply['by']}: {reply['detail']} "
          f"({reply['pass']})")  # fmt: skip
    return EXIT_OK


def _said(done: VerbDone) -> int:
    """A verb's outcome in the local mode's words: a line on stdout, or why not on stderr."""
    from reconciler.engine.orders import ORDERS_EVERY

    if done.refused:
        if done.verb == "retry":
            return failed(f"{done.what} is not held (held: {', '.join(done.held) or 'none'})")
        if done.verb == "resume":
            return failed(f"{done.what} is not suspended")
        going = ", ".join(done.in_progress) or "none"
        return failed(f"no rollout of {done.what} is in progress (in progress: {going})")
    record = done.record
    if isinstance(record, OperatorOrder):
        print(f"{record.kind}: {done.what}: given by {record.by} at {record.at}; the "
              f"reconciler applying it obeys within {ORDERS_EVERY:g} s")  # fmt: skip
    elif isinstance(record, Hold):
        reason = record.reason.strip().splitlines()[0] if record.reason else "failed"
        print(f"retry: the hold on {done.what} (revision {record.revision[:12]}: {reason}) is "
              "lifted; the next pass tries the same spec again")  # fmt: skip
    elif done.verb == "resume":
        print(f"resumed: {done.what} (was {record})")
        if done.still_suspended:
            print("still suspended: " + "; ".join(map(str, done.still_suspended)))
    else:
        print(f"suspended: {record}")
    return EXIT_OK


def _undo_body(args: argparse.Namespace) -> dict[str, Any]:
    return {
        **({"toRevision": args.to_revision} if args.to_revision else {}),
        **({"dryRun": True} if args.dry_run else {}),
    }


def _declare_undo(commands: Commands) -> None:
    undo_command = commands.add_parser(
        "undo",
        help="put a ModelDeployment back to an earlier spec by a commit to the tracked branch",
        description="Push a commit to the tracked branch that sets DEPLOYMENT's spec back to "
        "the one it had at --to-revision, by default at the last revision at which it "
        "converged (the state store knows) and that differs from the spec in Git now; "
        "comments and the file's other documents stay. The next pass applies it like any "
        "commit (a spec held after a failed rollout changes, so its hold lifts). --dry-run "
        "prints the change as a patch and pushes nothing. One-shot with --repo and --state, "
        "or through the running service with --service and --token-file.",
    )
    undo_command.add_argument("deployment", metavar="DEPLOYMENT", help="metadata.name")
    undo_command.add_argument(
        "--to-revision", metavar="SHA", help="go back to the spec at this commit of the branch"
    )
    undo_command.add_argument(
        "--dry-run", action="store_true", help="print the change as a patch; push nothing"
    )
    undo_command.add_argument("--reason", default="", help="in the commit message and history")
    undo_command.add_argument("--as", dest="actor", metavar="NAME", help="who asks (USER@HOST)")
    undo_command.add_argument("--service", metavar="URL", help="ask the running service")
    token_file_option(undo_command)
    source_options(undo_command, repo_required=False)
    lock_timeout_option(undo_command)


def _undo(args: argparse.Namespace) -> int:
    """undo one-shot (--repo, --state) or through the service."""
    from reconciler import wiring  # late: see cli/__init__.py
    from reconciler.cli.passes import one_reconciler
    from reconciler.loop.undo import undo

    if args.service:
        return _through_the_service(args)
    if not args.repo:
        return failed("undo needs --repo (one-shot) or --service")
    existing_state(args)  # as the other verbs: never create one
    source, settings = Source(args.repo, args.ref, args.path), settings_of(args)
    request = UndoRequest(args.deployment, actor(args), args.to_revision, args.reason, args.dry_run)
    # A dry run pushes nothing: it needs no lock.
    with (
        nullcontext() if args.dry_run else one_reconciler(args, settings),
        wiring.ports(settings, source) as ports,
    ):
        done = undo(request, source, settings, ports)
    if args.dry_run:
        print(done.patch, end="")
        print(f"undo: {done}", file=sys.stderr)
    else:
        print(f"undo: {done}; the next pass applies it")
    return EXIT_OK


def _verb(args: argparse.Namespace) -> str:
    """The verb as the service's API names it (``promote --full``: promote-full)."""
    return str(OrderKind.PROMOTE_FULL) if getattr(args, "full", False) else str(args.command)


COMMANDS = {
    "reconcile": Command(_declare_reconcile, _reconcile_now),
    **{verb: Command(partial(_declare_verb, verb), _operator_verb) for verb in _VERBS},
    "undo": Command(_declare_undo, _undo),
}
