"""``undo``'s pure part and its choices on plain fakes (issue 15): which revision it goes back
to, which document it edits and how, and what it refuses before touching Git."""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.core.spec.build import fingerprint_of
from reconciler.core.spec.edit import restore_spec
from reconciler.core.undo import (
    UndoRequest,
    converged_revisions,
    deployment_document,
    undo_patch,
)
from reconciler.loop.undo import undo
from reconciler.model.errors import UndoRefused
from reconciler.model.history import AppliedSpec, Rollout
from reconciler.model.servers import Location
from reconciler.model.settings import ApprovalSettings, Settings
from reconciler.model.source import SignaturePolicy, Source
from tests.core.pass_fakes import World, deployment_yaml, server_yaml


def _rollout(revision: str, outcome: str, deployment: str = "echo") -> Rollout:
    return Rollout(
        revision, deployment, "s1", deployment, (1,), (2,), outcome, None, (), None, None, 0.0
    )


def test_the_converged_revisions_are_the_applied_one_then_the_rollouts_newest_first() -> None:
    rollouts = [
        _rollout("r5", "reverted"),  # the held spec
        _rollout("r4", "converged", "other"),  # another deployment's
        _rollout("r3", "converged"),
        _rollout("r3", "converged"),  # a second server: the revision counts once
        _rollout("r2", "converged"),
        _rollout("r2", "failed"),  # one server failed there: not converged
        _rollout("r1", "converged"),
    ]
    applied = AppliedSpec("echo", "r4", "fp", (2,), {})
    assert converged_revisions(rollouts, "echo", applied) == ("r4", "r3", "r1")
    assert converged_revisions(rollouts, "echo", None) == ("r3", "r1")
    assert converged_revisions([], "echo", None) == ()


TWO_DOCUMENTS = """\
# fleet models
apiVersion: triton-gitops/v1alpha1
kind: ModelDeployment
metadata:
  name: other
spec:
  servers: {names: [s1]}
  versions: [1]
---
apiVersion: triton-gitops/v1alpha1
kind: ModelDeployment
metadata:
  name: echo
spec:
  model: echo-v2  # renamed with version 3
  servers:
    names: [s1]
  # pinned by the release train
  versions:
    - {version: 3, digest: "sha256:%s"}
  verify:
    timeout: 30s
  # end of echo
""" % ("0" * 63 + "3")


def test_the_document_is_found_by_name_where_it_starts() -> None:
    found = deployment_document({"m.yaml": TWO_DOCUMENTS.encode()}, "echo")
    assert found is not None and found.location == Location("m.yaml", 10)
    assert found.spec["model"] == "echo-v2"
    assert deployment_document({"m.yaml": TWO_DOCUMENTS.encode()}, "nothing") is None
    assert deployment_document({"s.yaml": server_yaml("echo").encode()}, "echo") is None


def test_the_whole_spec_goes_back_and_the_rest_of_the_file_stays() -> None:
    current = deployment_document({"m.yaml": TWO_DOCUMENTS.encode()}, "echo")
    assert current is not None
    # The earlier spec: no model key, plain versions, no verify, a config.
    wanted = {"servers": {"names": ["s1"]}, "versions": [2], "config": {"max_batch_size": 8}}
    after = restore_spec(TWO_DOCUMENTS, "echo", current.fingerprint, wanted)
    assert after is not None
    written = deployment_document({"m.yaml": after.encode()}, "echo")
    assert written is not None and written.spec == wanted
    other = TWO_DOCUMENTS.split("---\n")[0]
    assert after.startswith(other + "---\n")  # the other document, byte for byte
    assert after.split("---\n")[1] == (
        "apiVersion: triton-gitops/v1alpha1\n"
        "kind: ModelDeployment\n"
        "metadata:\n"
        "  name: echo\n"
        "spec:\n"
        "  servers:\n"
        "    names: [s1]\n"
        "  # pinned by the release train\n"
        "  versions:\n"
        "    - 2\n"
        "  config:\n"
        "    max_batch_size: 8\n"
        "  # end of echo\n"
    )
    # A spec someone changed meanwhile is theirs: left alone.
    assert restore_spec(TWO_DOCUMENTS, "echo", fingerprint_of({"x": 1}), wanted) is None


def _world() -> tuple[World, list[str]]:
    """echo at 1 (converged), 2 (converged, applied), 3 (held): the revisions, oldest first."""
    world = World()
    revisions = [
        world.manifests.commit(
            {"servers.yaml": server_yaml("s1"), "echo.yaml": deployment_yaml("echo", [v], ["s1"])}
        )
        for v in (1, 2, 3)
    ]
    world.state.recorded_rollouts = [
        _rollout(revisions[2], "reverted"),
        _rollout(revisions[1], "converged"),
        _rollout(revisions[0], "converged"),
    ]
    world.state.applied["echo"] = AppliedSpec("echo", revisions[1], "fp", (2,), {})
    return world, revisions


def test_undo_goes_back_to_the_last_converged_spec_that_differs() -> None:
    world, (rev1, rev2, _) = _world()
    source, settings = Source("repo"), Settings(Path("cache"), Path("state.db"))
    dry = undo(UndoRequest("echo", "alice", dry_run=True), source, settings, world.ports())
    assert dry.revision == rev2 and dry.commit is None and dry.location == Location("echo.yaml", 1)
    assert "-  versions: [3]\n+  versions: [2]\n" in dry.patch
    assert world.writer.pushed == [] and world.state.actions == []

    done = undo(UndoRequest("echo", "alice", reason="pager"), source, settings, world.ports())
    ((branch, (edit,), message, target),) = world.writer.pushed
    assert (branch, target, edit.file) == ("main", None, "echo.yaml")
    assert edit.spec == {"servers": {"names": ["s1"]}, "versions": [2]}  # rev2's spec
    assert message.startswith(f"Undo echo: back to its spec at {rev2[:12]}\n")
    assert "alice asked" in message and "Reason: pager" in message
    assert done.commit == "f" * 40
    (action,) = world.state.actions
    assert (action.verb, action.target, action.by) == ("undo", "echo", "alice")
    assert action.detail == f"back to {rev2} by {'f' * 40}: pager"

    # An explicit revision wins over the record.
    older = undo(UndoRequest("echo", "bob", rev1, dry_run=True), source, settings, world.ports())
    assert older.revision == rev1 and "+  versions: [1]\n" in older.patch


@pytest.mark.parametrize(
    "approval",
    [
        ApprovalSettings(verify_signatures=SignaturePolicy.HEAD),
        ApprovalSettings(require_trailer="Approved-by"),
    ],
)
def test_undo_refuses_to_push_a_commit_the_reconciler_would_not_apply(
    approval: ApprovalSettings,
) -> None:
    world, _ = _world()
    settings = Settings(Path("cache"), Path("state.db"), approval=approval)
    with pytest.raises(UndoRefused, match=r"undo: echo: the reconciler applies only .*--dry-run"):
        undo(UndoRequest("echo", "alice"), Source("repo"), settings, world.ports())
    assert world.manifests.fetched == [] and world.writer.pushed == []
    # The dry run is still there: it pushes nothing for anyone to refuse.
    dry = undo(UndoRequest("echo", "alice", dry_run=True), Source("repo"), settings, world.ports())
    assert dry.patch


def test_the_patch_marks_a_last_line_without_a_newline() -> None:
    patch = undo_patch("m.yaml", "a: 1\nversions: [3]", "a: 1\nversions: [2]")
    assert patch == (
        "--- a/m.yaml\n+++ b/m.yaml\n@@ -1,2 +1,2 @@\n a: 1\n"
        "-versions: [3]\n\\ No newline at end of file\n"
        "+versions: [2]\n\\ No newline at end of file\n"
    )
