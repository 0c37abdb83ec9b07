"""The desired-state diff between two refs (``diff``), for reviewers."""

from __future__ import annotations

from pathlib import Path

from reconciler.adapters.git import GitSource
from reconciler.core.review_diff import DesiredDiff, diff
from reconciler.core.spec.desired import load_desired_state
from reconciler.model.errors import ValidationError
from reconciler.model.source import GitCredentials


def diff_refs(
    repo: str,
    base: str,
    head: str,
    path: str,
    cache_dir: Path,
    credentials: GitCredentials | None = None,
) -> tuple[str, str, DesiredDiff]:
    """The desired-state diff between two refs (no servers needed): (base sha, head sha, diff)."""
    repository = GitSource(repo, cache_dir, credentials=credentials)
    local = "://" not in repo and Path(repo).exists()
    states = []
    for ref in (base, head):
        # A local checkout (a CI job) is read in place, so its remote-tracking refs
        # (origin/main) resolve as they do there.
        revision = (
            repository.read(repository.resolve_in_place(ref), path)
            if local
            else repository.revision(ref, path)
        )
        try:
            states.append((revision.sha, load_desired_state(revision.files)))
        except ValidationError as exc:
            raise ValidationError(exc.problems, revision.sha) from None
    (base_sha, base_state), (head_sha, head_state) = states
    return base_sha, head_sha, diff(base_state, head_state)
