"""Artifact digests on real folders: stable, sensitive to what matters, blind to bytecode.

The golden digest pins the documented format: a change to the hashing that would invalidate
every digest users keep in their manifests fails here first.
"""

from __future__ import annotations

import compileall
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from reconciler.adapters import artifacts
from reconciler.adapters.artifacts import EMPTY_DIGEST, digest_lines, tree_digest, version_digests
from reconciler.model.errors import ArtifactError, ReconcileError
from testkit.manifests import MODELS

MODEL_PY = b"print('hi')\n"
RUN_SH = b"#!/bin/sh\necho ok\n"
DATA = b"\x00\x01\x02"
# sha256 of each file above, as sha256sum prints it.
MODEL_PY_SHA = "caf026f25d7140209f98072605307a438914b9ce6f3c14b23d15d9667241de52"
RUN_SH_SHA = "b4d644d4279594903f1a9911956432d9473041f2984fc6014c14d7402c7d126c"
DATA_SHA = "ae4b3280e56e2faf83f414a6e3dabe9d5fbe18976544c05fed121accb85b53fc"


def _small_tree(root: Path) -> Path:
    """model.py, an executable run.sh, a file with a space in a subfolder, a symlink, and
    bytecode that must not count."""
    root.mkdir(parents=True)
    (root / "model.py").write_bytes(MODEL_PY)
    (root / "model.py").chmod(0o644)
    (root / "run.sh").write_bytes(RUN_SH)
    (root / "run.sh").chmod(0o755)
    (root / "weights").mkdir()
    (root / "weights" / "data file.bin").write_bytes(DATA)
    (root / "weights" / "data file.bin").chmod(0o600)  # only the owner's x bit counts
    (root / "current.py").symlink_to("model.py")
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"bytecode")
    return root


def test_golden_digest_of_a_small_tree(tmp_path: Path) -> None:
    tree = _small_tree(tmp_path / "3")
    assert digest_lines(tree) == [
        "link - model.py current.py\n",
        f"file - {MODEL_PY_SHA} model.py\n",
        f"file x {RUN_SH_SHA} run.sh\n",
        f"file - {DATA_SHA} weights/data%20file.bin\n",
    ]
    # The digest users put in manifests for this tree (sha256sum over the four lines above,
    # computed outside this code): it must never change.
    assert tree_digest(tree) == (
        "sha256:f8cb1bcc61131636b1af7d339849c5cf6d8c84ff54b120a259fa9c1357824282"
    )


def test_empty_folder_hashes_to_the_digest_of_nothing(tmp_path: Path) -> None:
    assert EMPTY_DIGEST == (
        "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    )
    (tmp_path / "1").mkdir()
    assert tree_digest(tmp_path / "1") == EMPTY_DIGEST
    (tmp_path / "1" / "__pycache__").mkdir()
    (tmp_path / "1" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"x")
    (tmp_path / "1" / "empty").mkdir()  # folders give no line of their own
    assert tree_digest(tmp_path / "1") == EMPTY_DIGEST


def test_the_documented_shell_recipe_gives_the_same_digest(tmp_path: Path) -> None:
    tree = tmp_path / "7"
    (tree / "sub").mkdir(parents=True)
    (tree / "model.py").write_bytes(MODEL_PY)
    (tree / "sub" / "run.sh").write_bytes(RUN_SH)
    (tree / "sub" / "run.sh").chmod(0o744)
    (tree / "b.txt").write_text("b\n")
    recipe = artifacts.__doc__
    assert recipe is not None
    script = recipe.split("files::", 1)[1].strip().replace("<folder>", str(tree))
    printed = subprocess.run(
        ["bash", "-c", script], check=True, capture_output=True, text=True
    ).stdout.split()[0]
    assert f"sha256:{printed}" == tree_digest(tree)


def test_stable_across_runs_copies_and_mtimes(tmp_path: Path) -> None:
    tree = _small_tree(tmp_path / "a")
    first = tree_digest(tree)
    assert tree_digest(tree) == first
    copy = tmp_path / "b"
    shutil.copytree(tree, copy, symlinks=True)
    assert tree_digest(copy) == first
    os.utime(copy / "model.py", (1, 1))
    assert tree_digest(copy) == first
    # A symlinked version folder is followed (it is the folder asked about).
    (tmp_path / "link").symlink_to(tree)
    assert tree_digest(tmp_path / "link") == first


def test_python_bytecode_is_ignored(tmp_path: Path) -> None:
    tree = tmp_path / "1"
    tree.mkdir()
    shutil.copy(MODELS / "echo" / "model.py", tree / "model.py")
    before = tree_digest(tree)
    compileall.compile_dir(tree, quiet=1)
    assert (tree / "__pycache__").is_dir()
    (tree / "stray.pyc").write_bytes(b"old bytecode")
    (tree / "sub" / "__pycache__").mkdir(parents=True)
    (tree / "sub" / "__pycache__" / "anything.txt").write_text("ignored too")
    assert tree_digest(tree) == before


@pytest.mark.parametrize(
    "change",
    [
        "content",
        "executable bit",
        "new file",
        "new file in a subfolder",
        "removed file",
        "renamed file",
        "symlink target",
        "symlink replaced by a copy",
    ],
)
def test_digest_changes_when_the_artifact_does(tmp_path: Path, change: str) -> None:
    tree = _small_tree(tmp_path / "1")
    before = tree_digest(tree)
    if change == "content":
        (tree / "model.py").write_bytes(MODEL_PY + b"# edited\n")
    elif change == "executable bit":
        (tree / "model.py").chmod(0o744)
    elif change == "new file":
        (tree / "extra.txt").write_text("")
    elif change == "new file in a subfolder":
        (tree / "weights" / "more.bin").write_bytes(DATA)
    elif change == "removed file":
        (tree / "run.sh").unlink()
    elif change == "renamed file":
        (tree / "run.sh").rename(tree / "start.sh")
    elif change == "symlink target":
        (tree / "current.py").unlink()
        (tree / "current.py").symlink_to("run.sh")
    elif change == "symlink replaced by a copy":
        (tree / "current.py").unlink()
        (tree / "current.py").write_bytes(MODEL_PY)
    assert tree_digest(tree) != before


def test_symlinks_are_never_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "big.bin").write_bytes(DATA)
    tree = tmp_path / "1"
    tree.mkdir()
    (tree / "shared").symlink_to(outside, target_is_directory=True)
    (tree / "gone").symlink_to(tmp_path / "nowhere")  # dangling: still just its text
    lines = digest_lines(tree)
    assert lines == [
        f"link - {tmp_path / 'nowhere'} gone\n",
        f"link - {outside} shared\n",
    ]
    before = tree_digest(tree)
    (outside / "big.bin").write_bytes(DATA + DATA)
    assert tree_digest(tree) == before


def test_odd_names_are_percent_encoded(tmp_path: Path) -> None:
    tree = tmp_path / "1"
    tree.mkdir()
    (tree / "a b\nc%.py").write_bytes(b"")
    (tree / "näme").symlink_to("x y")
    assert [line.split(" ", 3)[2:] for line in digest_lines(tree)] == [
        ["e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", "a%20b%0Ac%25.py\n"],
        ["x%20y", "n%C3%A4me\n"],
    ]


def test_errors_name_the_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "9"
    with pytest.raises(ArtifactError, match=f"{missing}: it does not exist"):
        tree_digest(missing)
    (tmp_path / "file").write_text("")
    with pytest.raises(ArtifactError, match="is not a folder"):
        tree_digest(tmp_path / "file")
    assert issubclass(ArtifactError, ReconcileError)

    tree = tmp_path / "1"
    tree.mkdir()
    os.mkfifo(tree / "pipe")
    with pytest.raises(ArtifactError, match=f"{tree / 'pipe'}: neither a regular file"):
        tree_digest(tree)
    (tree / "pipe").unlink()

    (tree / "model.py").write_text("x = 1\n")

    def refuse(path: object, mode: str = "r") -> object:
        raise PermissionError(13, "Permission denied", str(path))

    # Root reads any file whatever its mode bits, so the refusal is simulated.
    monkeypatch.setattr(artifacts, "open", refuse, raising=False)
    with pytest.raises(ArtifactError, match=f"cannot read {tree / 'model.py'}: Permission denied"):
        tree_digest(tree)


def test_version_digests_of_a_model_repository(model_repository: Path, tmp_path: Path) -> None:
    digests = version_digests(str(model_repository), "echo", [1, 2, 8])
    assert digests[8] is None
    # Every version holds the same model.py; the fixture's compiled bytecode does not count.
    assert (model_repository / "echo" / "1" / "__pycache__").is_dir()
    (tmp_path / "fresh").mkdir()
    shutil.copy(MODELS / "echo" / "model.py", tmp_path / "fresh" / "model.py")
    assert digests[1] == digests[2] == tree_digest(tmp_path / "fresh")


def test_version_digests_of_odd_names_are_missing(model_repository: Path) -> None:
    assert version_digests(str(model_repository), "../echo", [1]) == {1: None}
    assert version_digests(str(model_repository), "absent", [1, 2]) == {1: None, 2: None}
    assert version_digests(str(model_repository), "chain", [1]) == {1: EMPTY_DIGEST}
