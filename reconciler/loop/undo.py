"""``triton-gitops undo``: put one ModelDeployment back to the spec it had at an earlier
revision of the tracked branch, by a commit pushed there as the revert write-back pushes
(``--revert-mode commit``), or shown as a patch (``--dry-run``). Called by the CLI (one-shot,
on the state store given) and by the service (``POST /v1/deployments/<name>/undo``).

Nothing is applied here: the next pass reads the undo commit and applies it like any other,
so the repository stays the source of truth. Every refusal is an ``UndoRefused`` naming the
deployment, its file:line and the revision.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from reconciler.core.spec.edit import restore_spec
from reconciler.core.undo import (
    DeploymentDocument,
    Undone,
    UndoRequest,
    converged_revisions,
    deployment_document,
    undo_message,
    undo_patch,
)
from reconciler.model.errors import SourceUnavailable, UndoRefused
from reconciler.model.settings import Settings
from reconciler.model.source import RevertEdit, Source
from reconciler.ports import Ports, StateStore

# Rollouts of the model read to find its last converged revision (newest first).
ROLLOUTS_READ = 500


def undo(request: UndoRequest, source: Source, settings: Settings, ports: Ports) -> Undone:
    """Go back (or, dry run, show going back); the state store is opened through ``ports``
    and must exist (the caller checks: a verb never creates one)."""
    name = request.deployment
    if not request.dry_run:
        _refuse_unapprovable(settings, name)
    branch = ports.reverts.tracked_branch(source.ref)
    head = ports.manifests.fetch(branch)
    files = ports.manifests.read(head, source.path).files
    current = deployment_document(files, name)
    if current is None:
        raise UndoRefused(
            f"undo: no ModelDeployment named {name!r} on branch {branch} at {head[:12]}"
        )
    state = ports.open_state()
    try:
        revision, earlier = (
            _at_revision(request.to_revision, current, branch, head, source, ports)
            if request.to_revision
            else _last_converged(state, current, branch, head, source, ports)
        )
        patch = _patch(files, current, earlier, revision)
        done = Undone(name, current.location, branch, head, revision, patch)
        if request.dry_run:
            return done
        edit = RevertEdit(name, current.location.file, current.fingerprint, (), None, earlier.spec)
        message = undo_message(request, current, revision)
        pushed = ports.reverts.push_revert(branch, (edit,), message)
        if pushed is None:
            raise UndoRefused(
                f"undo: {name} ({current.location}) changed on {branch} since {head[:12]}; "
                "nothing pushed (run undo again to go back from the new spec)"
            )
        reason = f": {request.reason}" if request.reason else ""
        state.record_action("undo", name, request.by, f"back to {revision} by {pushed.sha}{reason}")
        return replace(done, commit=pushed.sha)
    finally:
        state.close()


def _patch(
    files: Mapping[str, bytes],
    current: DeploymentDocument,
    earlier: DeploymentDocument,
    revision: str,
) -> str:
    """The head's file with the earlier spec written back, as a patch; refused when the edit
    would not read back as exactly that spec."""
    file = current.location.file
    before = files[file].decode()
    after = restore_spec(before, current.name, current.fingerprint, earlier.spec)
    written = None if after is None else deployment_document({file: after.encode()}, current.name)
    if after is None or written is None or written.fingerprint != earlier.fingerprint:
        raise UndoRefused(
            f"undo: {current.name} ({current.location}): the spec of {revision[:12]} cannot "
            "be written back into the file as it is; nothing pushed"
        )
    return undo_patch(file, before, after)


def _refuse_unapprovable(settings: Settings, name: str) -> None:
    """The reconciler's own commits (this one, as the revert write-back's) are neither signed
    nor carry approval trailers: a reconciler that demands either would refuse to apply it."""
    approval = settings.approval
    if approval.verify_signatures is None and not approval.require_trailer:
        return
    demands = (
        "signed commits (--verify-signatures)"
        if approval.verify_signatures
        else (f"{approval.require_trailer} trailers (--require-trailer)")
    )
    raise UndoRefused(
        f"undo: {name}: the reconciler applies only {demands}, and an undo commit is not one "
        "(it holds no signing key, and may not approve its own change): nothing pushed. "
        "Print the change with --dry-run and commit it signed and approved yourself."
    )


def _at_revision(
    wanted: str, current: DeploymentDocument, branch: str, head: str, source: Source, ports: Ports
) -> tuple[str, DeploymentDocument]:
    where = f"{current.name} ({current.location})"
    try:
        revision = ports.manifests.fetch(wanted)
    except SourceUnavailable as exc:
        raise UndoRefused(f"undo: {where}: no revision {wanted!r}: {exc}") from None
    if not _on_branch(ports, revision, head):
        raise UndoRefused(
            f"undo: {where}: revision {revision[:12]} is not on the tracked branch {branch} "
            f"(not an ancestor of its head {head[:12]})"
        )
    earlier = deployment_document(ports.manifests.read(revision, source.path).files, current.name)
    if earlier is None:
        raise UndoRefused(
            f"undo: {where}: ModelDeployment {current.name!r} did not exist at revision "
            f"{revision[:12]}"
        )
    if earlier.fingerprint == current.fingerprint:
        raise UndoRefused(
            f"undo: {where}: its spec on {branch} is already the one it had at "
            f"{revision[:12]}; nothing to undo"
        )
    return revision, earlier


def _last_converged(
    state: StateStore,
    current: DeploymentDocument,
    branch: str,
    head: str,
    source: Source,
    ports: Ports,
) -> tuple[str, DeploymentDocument]:
    name = current.name
    model = str(current.spec.get("model", name))
    candidates = converged_revisions(
        state.rollouts(model, ROLLOUTS_READ), name, state.applied_spec(name)
    )
    for revision in candidates:
        if not _on_branch(ports, revision, head):
            continue  # from before a rewrite of the branch: not a spec the branch had
        earlier = deployment_document(ports.manifests.read(revision, source.path).files, name)
        if earlier is not None and earlier.fingerprint != current.fingerprint:
            return revision, earlier
    known = f"{len(candidates)} converged revision(s) on record" if candidates else "none on record"
    raise UndoRefused(
        f"undo: {name} ({current.location}): no earlier converged revision whose spec differs "
        f"from the one on {branch} at {head[:12]} ({known}); give --to-revision SHA"
    )


def _on_branch(ports: Ports, revision: str, head: str) -> bool:
    try:
        return ports.approval.is_fast_forward(revision, head)
    except SourceUnavailable:
        return False  # a commit the mirror no longer has
