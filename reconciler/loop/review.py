"""The desired-state diff between two refs (``diff``), for reviewers, and the desired states
the pre-merge ``gate`` compares. Called by the CLI with the manifests
``wiring.review_manifests`` gives.
"""

from __future__ import annotations

from reconciler.core.review_diff import DesiredDiff, diff
from reconciler.core.spec.desired import load_desired_state, read_manifests
from reconciler.model.errors import ValidationError
from reconciler.model.spec import DesiredState
from reconciler.ports import ManifestSource


def diff_refs(
    manifests: ManifestSource, base: str, head: str, path: str
) -> tuple[str, str, DesiredDiff]:
    """The desired-state diff between two refs (no servers needed): (base sha, head sha, diff)."""
    states = []
    for ref in (base, head):
        revision = manifests.read(manifests.fetch(ref), path)
        try:
            states.append((revision.sha, load_desired_state(revision.files)))
        except ValidationError as exc:
            raise ValidationError(exc.problems, revision.sha) from None
    (base_sha, base_state), (head_sha, head_state) = states
    return base_sha, head_sha, diff(base_state, head_state)


def desired_at(manifests: ManifestSource, ref: str, path: str) -> tuple[str, DesiredState]:
    """The validated desired state at ``ref`` with the shadow request files it names (the
    gate replays them): (sha, state). ValidationError names the revision."""
    revision = manifests.read(manifests.fetch(ref), path)
    reading = read_manifests(
        revision.files,
        lambda name: manifests.read_file(revision.sha, f"{path.strip('/')}/{name}".lstrip("/")),
    )
    if reading.problems:
        raise ValidationError(list(reading.problems), revision.sha)
    return revision.sha, reading.desired
