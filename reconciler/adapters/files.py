"""Manifests and shadow files read from a local directory
(``validate``).
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from reconciler.adapters.git import path_in_work_tree
from reconciler.core.spec.selection import (
    MAX_SOURCE_IGNORE_BYTES,
    SOURCE_IGNORE,
    ManifestSelection,
    ignore_text,
)
from reconciler.core.spec.yaml import MAX_MANIFEST_BYTES, UnreadFile
from reconciler.model.errors import ValidationError
from reconciler.model.problems import Problem


def manifest_files_in(directory: Path) -> dict[str, bytes]:
    """The manifests under ``directory`` (core/spec/selection.py says which files are), by
    path relative to it; links are never followed (see UnreadFile). The repository's root,
    for its ``.sourceignore``, is the top of the Git work tree holding ``directory`` (the
    directory itself outside one)."""
    if not directory.is_dir():
        raise ValidationError([Problem(str(directory), 0, "no such directory")])
    folder = path_in_work_tree(directory)
    root = directory.resolve().parents[len(PurePosixPath(folder).parts) - 1] if folder else None
    selection = ManifestSelection(
        folder,
        ignore_text(read_in_directory(root, SOURCE_IGNORE, MAX_SOURCE_IGNORE_BYTES))
        if root is not None
        else None,
        ignore_text(read_in_directory(directory, SOURCE_IGNORE, MAX_SOURCE_IGNORE_BYTES)),
    )
    files: dict[str, bytes] = {}
    for top, folders, names in os.walk(directory):
        here = Path(top)
        # Hidden folders (.git among them) are never manifests: not even walked.
        folders[:] = [f for f in folders if not f.startswith(".")]
        for name in [*names, *(f for f in folders if (here / f).is_symlink())]:
            path = here / name
            relative = path.relative_to(directory).as_posix()
            if not selection.selects(f"{folder}/{relative}" if folder else relative):
                continue
            if path.is_symlink():
                files[relative] = UnreadFile.link(str(path.readlink()))
            elif path.is_file():
                too_large = path.stat().st_size > MAX_MANIFEST_BYTES
                files[relative] = UnreadFile.too_large() if too_large else path.read_bytes()
    return dict(sorted(files.items()))


def read_in_directory(directory: Path, name: str, limit: int) -> bytes | None:
    """The regular file ``name`` under ``directory`` (at most ``limit + 1`` bytes), or None
    when it is absent, escapes the directory or passes through a symbolic link: what a Git
    tree gives for the same name (GitSource.read_file)."""
    path = directory
    for part in PurePosixPath(name).parts:
        if part in ("/", "..") or path.is_symlink():
            return None
        path = path / part
    if path.is_symlink() or not path.is_file() or path.stat().st_size > limit:
        return None
    return path.read_bytes()
