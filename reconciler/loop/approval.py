"""The approval phase: only fast-forward, signed and approved commits
are applied. Called by the pass (``loop.phases.approve``), which gives it the mirror's checks.
"""

from __future__ import annotations

from reconciler.model.errors import (
    HistoryRewritten,
    NotApproved,
    TrustedKeysError,
    UnverifiedRevision,
)
from reconciler.model.settings import ApprovalSettings
from reconciler.model.source import SignaturePolicy
from reconciler.ports import CommitChecks


def check_approved(
    checks: CommitChecks,
    last_applied: str | None,
    revision: str,
    approval: ApprovalSettings,
    *,
    repository: str = "the repository",
) -> None:
    """Refuse a revision that was not approved the way ``approval`` demands.

    Fast-forward only: the tracked branch must descend from the last applied commit (a
    force-push is refused until an operator accepts that exact head; so is a last applied
    commit the mirror does not hold, named as such). Then signatures (``head``: the commit
    applied; ``all``: every commit since the last applied one; on a first pass, or past an
    accepted rewrite whose old history the mirror lacks, only the head), then approval
    trailers on the commit applied. ``repository``: how messages name it.
    """
    accepted = approval.accept_rewrite is not None and revision.startswith(approval.accept_rewrite)
    # The same commit again needs no git process.
    known = last_applied if last_applied == revision else None
    if last_applied is not None and known is None:
        if checks.has_commit(last_applied):
            known = last_applied
        elif not accepted:
            raise HistoryRewritten(last_applied, revision, missing_from=repository)
        if known is not None and not accepted and not checks.is_fast_forward(known, revision):
            raise HistoryRewritten(known, revision)
    if approval.verify_signatures is not None:
        if approval.trusted_keys is None:
            raise TrustedKeysError("--verify-signatures needs --trusted-keys DIR")
        policy = approval.verify_signatures if known else SignaturePolicy.HEAD
        verdicts = checks.signature_verdicts(approval.trusted_keys, policy, known, revision)
        if not all(v.ok for v in verdicts):
            raise UnverifiedRevision(verdicts)
    if approval.require_trailer:
        found = checks.approvals(revision, approval.require_trailer)
        if len(found) < approval.min_approvals:
            raise NotApproved(
                f"refusing revision {revision}: {len(found)} distinct "
                f"{approval.require_trailer} trailer(s), {approval.min_approvals} required"
                + (f" (found: {', '.join(found)})" if found else "")
            )
