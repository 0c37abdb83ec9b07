"""Artifact digests: a stable hash of a model version folder, to pin in a manifest.

A ModelDeployment may pin a version to a digest (``versions: [{version: 3, digest:
"sha256:..."}]``). When the reconciler can read the server's model repository, it hashes the
version folder before loading and refuses a mismatch: someone changed the artifact under a
released version number. ``triton-gitops digest PATH`` prints the digest to put in the
manifest. Reads files only; no Triton, no network.

The digest format (a contract: users keep these strings in Git)
----------------------------------------------------------------
``tree_digest(folder)`` is ``"sha256:"`` followed by the lowercase hex SHA-256 of a listing
text built from the folder (the version folder, e.g. ``<repository>/<model>/3``):

1. Walk the folder recursively. The folder itself may be a symlink (it is followed); a
   symlink inside it is never followed, whether it points to a file or to a directory.
2. Leave out every entry named ``__pycache__`` (with everything under it) and every entry
   whose name ends in ``.pyc``. Python writes these on import: Triton's Python backend writes
   ``__pycache__/model.cpython-3XX.pyc`` the first time it loads a version, and
   ``python -m compileall`` writes them ahead. They depend on the interpreter and on whether
   the version was ever loaded, not on the artifact, so hashing them would make a version's
   digest change the moment it is first served.
3. Each remaining regular file gives the line
   ``file <x> <sha256 of its bytes, lowercase hex> <path>``, where ``<x>`` is ``x`` when the
   file's owner-execute bit is set (as Git records it) and ``-`` otherwise.
   Each remaining symlink gives ``link - <target> <path>``, ``<target>`` being the link's
   text as ``readlink`` returns it (never resolved, dangling or not).
   Directories give no line of their own: an empty subfolder does not change the digest.
   Anything else (a FIFO, a socket, a device) is an error.
4. ``<path>`` is the entry's path relative to the folder, with ``/`` between components.
   ``<path>`` and ``<target>`` are written percent-encoded (RFC 3986): the bytes of the name
   as the file system holds them (UTF-8 in practice), every byte other than ``A-Z a-z 0-9
   - . _ ~ /`` as ``%XX`` with uppercase hex. So a line never holds a space or a newline
   other than its separators: ``model.py`` stays ``model.py``, ``my model.py`` becomes
   ``my%20model.py``.
5. Each line ends with ``\\n``; the lines are sorted by their encoded ``<path>`` (plain
   byte order, all ASCII) and concatenated. The digest is SHA-256 over that text, in ASCII.

A folder with nothing to hash (empty, or holding only ``__pycache__``) hashes the empty text:
``sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855``.

Only the version folder is hashed: the model's ``config.pbtxt`` sits beside the version
folders, is shared by all of them, and is compared as config by the plan.

The same digest by hand, for a folder without symlinks, names that need encoding, or ``.pyc``
files::

    cd <folder> && find . -type f -printf '%P\\n' | LC_ALL=C sort | while read -r p; do
      case $(stat -c %a "$p") in *[1357]??) x=x ;; *) x=- ;; esac
      echo "file $x $(sha256sum < "$p" | cut -d' ' -f1) $p"
    done | sha256sum
"""

from __future__ import annotations

import hashlib
import os
import stat
import urllib.parse
from collections.abc import Iterable
from pathlib import Path

from reconciler.model.errors import ArtifactError

EMPTY_DIGEST = "sha256:" + hashlib.sha256(b"").hexdigest()
_SKIPPED_FOLDER = "__pycache__"
_SKIPPED_SUFFIX = ".pyc"
_CHUNK = 1 << 20


def skipped(name: str) -> bool:
    """Whether an entry named ``name`` is left out of a digest (rule 2)."""
    return name == _SKIPPED_FOLDER or name.endswith(_SKIPPED_SUFFIX)


def encoded(text: str) -> str:
    """A path or link target as a digest line writes it (rule 4)."""
    # os.fsencode gives the name's bytes as the file system holds them, even for names that
    # are not valid UTF-8 (Python keeps those as surrogate escapes).
    return urllib.parse.quote(os.fsencode(text), safe="/")


def file_line(executable: bool, sha256: str, relative: str) -> str:
    """A regular file's line (rule 3); ``relative`` already ``encoded``."""
    return f"file {'x' if executable else '-'} {sha256} {relative}\n"


def digest_of(lines: Iterable[str]) -> str:
    """``"sha256:<hex>"`` of the lines, sorted by path as rule 5 says."""
    digest = hashlib.sha256()
    for line in sorted(lines, key=lambda line: line.rsplit(" ", 1)[1]):
        digest.update(line.encode("ascii"))
    return f"sha256:{digest.hexdigest()}"


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while chunk := stream.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _line(path: Path, relative: str) -> str:
    try:
        status = path.lstat()
        if stat.S_ISLNK(status.st_mode):
            return f"link - {encoded(os.readlink(path))} {relative}\n"
        if stat.S_ISREG(status.st_mode):
            return file_line(bool(status.st_mode & stat.S_IXUSR), _file_sha256(path), relative)
    except OSError as exc:
        raise ArtifactError(f"cannot read {path}: {exc.strerror or exc}") from exc
    raise ArtifactError(f"cannot hash {path}: neither a regular file nor a symlink")


def digest_lines(folder: Path) -> list[str]:
    """The sorted lines ``tree_digest`` hashes (see the module docstring): what to show when
    a digest does not match, or to compare two copies of a version line by line."""
    root = Path(folder)
    if not root.is_dir():
        what = "does not exist" if not root.exists() else "is not a folder"
        raise ArtifactError(f"cannot hash {root}: it {what}")

    def refuse(exc: OSError) -> None:
        raise ArtifactError(f"cannot read {exc.filename}: {exc.strerror or exc}") from exc

    lines: dict[str, str] = {}
    for current, folders, files in os.walk(root, onerror=refuse, followlinks=False):
        here = Path(current)
        # os.walk lists a symlink to a folder among the folders; it is an entry of its own.
        links = [name for name in folders if (here / name).is_symlink()]
        folders[:] = sorted(n for n in folders if n not in links and not skipped(n))
        for name in sorted((*files, *links)):
            if skipped(name):
                continue
            path = here / name
            relative = encoded(path.relative_to(root).as_posix())
            lines[relative] = _line(path, relative)
    return [lines[path] for path in sorted(lines)]


def tree_digest(folder: Path) -> str:
    """``"sha256:<hex>"`` of ``folder``'s files, as the module docstring defines it.

    Raises ``ArtifactError`` naming the path for a missing folder, an unreadable file or
    folder, or a special file.
    """
    return digest_of(digest_lines(folder))


def version_digests(repository: str, model: str, versions: Iterable[int]) -> dict[int, str | None]:
    """The digest of each of ``model``'s version folders in ``repository``; None for a version
    whose folder is missing (the plan reports it as a missing version, not as a mismatch).
    Raises ``ArtifactError`` for a folder that is there but cannot be hashed."""
    base = Path(repository) / model
    named = "/" not in model and model not in ("", ".", "..")  # as read_model: no escaping
    digests: dict[int, str | None] = {}
    for version in versions:
        folder = base / str(version)
        digests[version] = tree_digest(folder) if named and folder.is_dir() else None
    return digests
