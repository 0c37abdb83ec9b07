"""A problem found in the manifests, located in its file: what validation reports and what
``ValidationError`` carries. Its own module, imported by the specs and the errors alike."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the manifests, located in a file."""

    file: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.message}"
