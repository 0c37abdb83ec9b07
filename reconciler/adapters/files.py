"""Manifests and shadow files read from a local directory
(``validate``).
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from reconciler.core.spec.yaml import MANIFEST_SUFFIXES, MAX_MANIFEST_BYTES, UnreadFile
from reconciler.model.errors import Problem, ValidationError


def manifest_files_in(directory: Path) -> dict[str, bytes]:
    """Every *.yaml / *.yml under ``directory`` (hidden folders skipped), by relative path;
    links are never followed (see UnreadFile)."""
    if not directory.is_dir():
        raise ValidationError([Problem(str(directory), 0, "no such directory")])
    files: dict[str, bytes] = {}
    for path in sorted(directory.rglob("*")):
        relative = path.relative_to(directory)
        if any(part.startswith(".") for part in relative.parts[:-1]):
            continue
        if path.suffix not in MANIFEST_SUFFIXES:
            continue
        if path.is_symlink():
            files[relative.as_posix()] = UnreadFile.link(str(path.readlink()))
        elif path.is_file():
            too_large = path.stat().st_size > MAX_MANIFEST_BYTES
            files[relative.as_posix()] = UnreadFile.too_large() if too_large else path.read_bytes()
    return files


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
