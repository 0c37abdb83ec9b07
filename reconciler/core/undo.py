"""What ``triton-gitops undo`` goes back to and what it writes: pure, over the state store's
rollouts and the manifest files of revisions. ``loop/undo.py`` reads those and pushes.

An undo is a commit like the revert write-back's: the ModelDeployment's spec in its file at
the tracked branch's head is set back to the spec it had at an earlier revision (by default
the last one at which it converged), with ``core.spec.edit.restore_spec``, so the
repository stays the source of truth and the next pass applies it like any other commit.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from reconciler.core.spec.build import fingerprint_of
from reconciler.core.spec.yaml import plain, yaml_documents
from reconciler.model.history import AppliedSpec, Rollout
from reconciler.model.problems import Problem
from reconciler.model.results import Outcome
from reconciler.model.servers import Location


@dataclass(frozen=True)
class UndoRequest:
    """What an operator asks: this ModelDeployment back to an earlier spec."""

    deployment: str
    by: str  # the token's name (``token:<name>``) or ``--as``
    to_revision: str | None = None  # default: the last revision at which it converged
    reason: str = ""
    dry_run: bool = False  # compute the patch, push nothing, record nothing


@dataclass(frozen=True)
class DeploymentDocument:
    """One ModelDeployment as a revision's files hold it: where, and its spec as written."""

    name: str
    location: Location
    spec: Mapping[str, Any]

    @property
    def fingerprint(self) -> str:
        return fingerprint_of(self.spec)


@dataclass(frozen=True)
class Undone:
    """An undo carried out (or, ``commit`` None, shown as a dry run)."""

    deployment: str
    location: Location  # the ModelDeployment in the tracked branch's head
    branch: str
    head: str  # the head the undo commit goes on top of
    revision: str  # the revision whose spec it goes back to
    patch: str  # the change, as a unified diff of the file
    commit: str | None = None

    def __str__(self) -> str:
        back = (
            f"ModelDeployment {self.deployment} ({self.location}) back to its spec at "
            f"{self.revision[:12]}"
        )
        if self.commit is None:
            return f"{back}: dry run, nothing pushed"
        return f"{back}: pushed {self.commit[:12]} to {self.branch}"


def deployment_document(files: Mapping[str, bytes], name: str) -> DeploymentDocument | None:
    """ModelDeployment ``name`` in a revision's manifest files, or None. Only the documents
    are read, not validated: an undo of one deployment is not stopped by another's error."""
    problems: list[Problem] = []  # other files' problems: not this verb's to report
    for doc in yaml_documents(files, problems):
        root = doc.root
        metadata, spec = root.get("metadata"), root.get("spec")
        if (
            root.get("kind") == "ModelDeployment"
            and isinstance(metadata, Mapping)
            and metadata.get("name") == name
            and isinstance(spec, Mapping)
        ):
            return DeploymentDocument(name, Location(doc.file, doc.start_line), plain(spec))
    return None


def converged_revisions(
    rollouts: Iterable[Rollout], deployment: str, applied: AppliedSpec | None
) -> tuple[str, ...]:
    """The revisions at which ``deployment`` served its spec, newest first, each once: the
    revision of its applied spec (the last pass that found it served everywhere; a held spec
    never becomes it), then those at which its rollouts converged (``rollouts`` newest
    first), less any at which one of its rollouts was reverted or failed."""
    own = [r for r in rollouts if r.deployment == deployment]
    failed = {r.revision for r in own if r.outcome in (Outcome.REVERTED, Outcome.FAILED)}
    found = [applied.revision] if applied is not None else []
    found += [r.revision for r in own if r.outcome == Outcome.CONVERGED]
    return tuple(r for r in dict.fromkeys(found) if r not in failed)


def undo_message(request: UndoRequest, current: DeploymentDocument, revision: str) -> str:
    """The undo commit's message: who asked, the deployment, the revision gone back to."""
    lines = [
        f"Undo {request.deployment}: back to its spec at {revision[:12]}",
        "",
        f"{request.by} asked triton-gitops to put ModelDeployment {request.deployment} "
        f"({current.location.file}) back to the spec it had at {revision}.",
    ]
    if request.reason:
        lines += ["", f"Reason: {request.reason}"]
    lines += ["", f"Undo-revision: {revision}", f"Undo-requested-by: {request.by}"]
    return "\n".join(lines) + "\n"


def undo_patch(file: str, before: str, after: str) -> str:
    """The change as a unified diff that ``git apply`` takes."""
    lines = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True), f"a/{file}", f"b/{file}"
    )
    # A last line without a newline gets diff's marker, as in git's own diffs.
    return "".join(
        line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines
    )
