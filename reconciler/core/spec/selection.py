"""Which files of a repository are read as manifests: the one rule every reader applies
(``validate`` on a directory through adapters/files.py, and plan, apply, diff and gate on
a Git commit's tree through adapters/git.py).

A manifest is a ``*.yaml`` / ``*.yml`` file under the ``--path`` folder that is not
hidden, is not in a hidden folder (``.gitlab-ci.yml``, ``.github/``, ``.pre-commit-config.yaml``
belong to other tools) and is not excluded by a ``.sourceignore``: Flux's convention, in
gitignore syntax, read from the repository's root and from the ``--path`` folder. Patterns
match relative to the folder of the file that holds them; the folder's file has the last
word, as a deeper ``.gitignore`` does (so it may re-include with ``!`` what the root's
excludes). Matching is pathspec's ``GitIgnoreSpec``, which follows Git's own edge cases.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath

from pathspec import GitIgnoreSpec

MANIFEST_SUFFIXES = (".yaml", ".yml")
SOURCE_IGNORE = ".sourceignore"
# A .sourceignore is a few lines; a larger one is not read (its files are then read, and
# any that are not manifests show as problems: nothing is skipped unseen).
MAX_SOURCE_IGNORE_BYTES = 64 << 10


@dataclass(frozen=True)
class _Patterns:
    folder: PurePosixPath  # where the .sourceignore is, in the repository
    spec: GitIgnoreSpec


class ManifestSelection:
    """The manifest rule for one ``--path`` folder of one repository.

    ``folder`` is the ``--path`` folder's place in the repository ("" for its root);
    ``root_ignore`` and ``folder_ignore`` are the text of the ``.sourceignore`` files at the
    root and in that folder (None where there is none; the same file is given once).
    """

    def __init__(
        self, folder: str = "", root_ignore: str | None = None, folder_ignore: str | None = None
    ) -> None:
        self.folder = PurePosixPath(folder.strip("/") or ".")
        self._patterns = [
            _Patterns(where, GitIgnoreSpec.from_lines(text.splitlines()))
            for where, text in ((PurePosixPath("."), root_ignore), (self.folder, folder_ignore))
            if text is not None
        ]

    def selects(self, path: str) -> bool:
        """Whether the file at ``path`` (in the repository) is a manifest to read."""
        file = PurePosixPath(path)
        if file.suffix not in MANIFEST_SUFFIXES:
            return False
        try:
            inside = file.relative_to(self.folder) if self.folder != PurePosixPath(".") else file
        except ValueError:
            return False  # outside the --path folder
        if any(part.startswith(".") for part in inside.parts):
            return False
        excluded = False
        for patterns in self._patterns:
            # The later (deeper) file decides when one of its patterns matches.
            relative = file if patterns.folder == PurePosixPath(".") else inside
            verdict = patterns.spec.check_file(relative.as_posix()).include
            if verdict is not None:
                excluded = verdict
        return not excluded


def ignore_text(content: bytes | None) -> str | None:
    """A ``.sourceignore``'s bytes as its patterns' text (None when there is no file)."""
    if content is None:
        return None
    return content.decode("utf-8", "replace")
