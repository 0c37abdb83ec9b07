"""Hostile revisions of a real manifest repository: a broken manifest next to a good change
applies nothing on a real Triton, and links or huge files in Git are refused by name
without being followed or read."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import tritonclient.grpc as triton_grpc

from reconciler.adapters.git import GitSource
from reconciler.core.spec.desired import load_desired_state
from reconciler.core.spec.yaml import MAX_MANIFEST_BYTES
from reconciler.model.errors import ValidationError
from testkit.cli_run import Reconciler
from testkit.local_triton import LocalTriton
from testkit.manifests import ManifestRepo, deployment_doc, git, server_doc
from tests.integration.flows import ready_versions


def repository_index(server: LocalTriton) -> set[tuple[str, str, str]]:
    """Everything Triton's repository index says: (model, version, state) for each entry."""
    with triton_grpc.InferenceServerClient(server.grpc_address) as client:
        index = client.get_model_repository_index(as_json=True).get("models", [])
    return {(m["name"], m.get("version", ""), m.get("state", "")) for m in index}


BROKEN = {
    # name: (how other.yaml breaks, the problem expected in the output)
    "version zero": (
        lambda: deployment_doc("other", [0], ["edge-a"]),
        "other.yaml:8: spec.versions[0]: 0 is less than the minimum of 1",
    ),
    "billion laughs": (
        lambda: (
            deployment_doc("other", [1], ["edge-a"])
            + "  config:\n    l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
            + "".join(f"    l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 9))
        ),
        "other.yaml:15: YAML refused: more than 100000 values",
    ),
    "link out of the repository": (
        None,
        "other.yaml:1: a symbolic link (to '/etc/passwd'); a manifest must be a regular file",
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_one_broken_manifest_beside_a_good_change_applies_nothing(
    case: str,
    manifests: ManifestRepo,
    triton: LocalTriton,
    model_repository: Path,
    tmp_path: Path,
) -> None:
    reconciler = Reconciler(manifests.url, tmp_path / "r")
    manifests.write("servers.yaml", server_doc("edge-a", triton.grpc_address, model_repository))
    manifests.write("echo.yaml", deployment_doc("echo", [1], ["edge-a"]))
    manifests.write("other.yaml", deployment_doc("other", [1], ["edge-a"]))
    manifests.commit("echo and other, version 1")
    first = reconciler.apply()
    assert first.code == 0, first.err
    assert ready_versions(triton, "echo") == {1} and ready_versions(triton, "other") == {1}
    served = repository_index(triton)

    # A good version bump and a broken manifest in the same revision.
    manifests.write("echo.yaml", deployment_doc("echo", [2], ["edge-a"]))
    breaks, problem = BROKEN[case]
    if breaks is None:
        manifests.remove("other.yaml")
        os.symlink("/etc/passwd", manifests.work / "other.yaml")
    else:
        manifests.write("other.yaml", breaks())
    manifests.commit(f"bump echo; break other ({case})")
    second = reconciler.apply()

    assert second.code == 1
    assert problem in second.err, second.err
    assert repository_index(triton) == served
    assert ready_versions(triton, "echo") == {1}


def test_links_and_huge_files_in_a_git_tree_are_refused_unread(
    manifests: ManifestRepo, tmp_path: Path
) -> None:
    manifests.write("servers.yaml", server_doc("edge-a", "127.0.0.1:8001", None))
    os.symlink("../../outside.yaml", manifests.work / "linked.yaml")
    os.symlink("servers.yaml", manifests.work / "alias.yaml")
    huge = "# padding\n" * (MAX_MANIFEST_BYTES // 10 + 1)
    manifests.write("huge.yaml", huge)
    manifests.commit("hostile files")
    assert git(manifests.work, "ls-files", "-s", "linked.yaml").startswith("120000")

    revision = GitSource(manifests.url, tmp_path / "cache").revision()

    assert len(revision.files["huge.yaml"]) == 0  # a marker, the blob was never read
    with pytest.raises(ValidationError) as caught:
        load_desired_state(revision.files)
    assert [str(p) for p in caught.value.problems] == [
        "alias.yaml:1: a symbolic link (to 'servers.yaml'); a manifest must be a regular "
        "file, not read",
        f"huge.yaml:1: file is larger than {MAX_MANIFEST_BYTES} bytes, not read",
        "linked.yaml:1: a symbolic link (to '../../outside.yaml'); a manifest must be a "
        "regular file, not read",
    ]
