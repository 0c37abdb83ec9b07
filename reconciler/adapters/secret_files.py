"""The service's secret files (``--git-token-file``, ``--github-secret-file``,
``--gitlab-token-file``, ``--reconcile-token-file``, ``--operator-tokens-file``), read again
when they change, so that a rotated Kubernetes Secret takes effect without a restart.

Before each use ``SecretFiles.current`` compares each file with what it last read: the file
the path resolves to (Kubernetes swaps the ``..data`` symlink of a Secret volume, so the path
stays and the target changes), its inode, modification time and size: a few ``stat`` calls,
no read unless something changed. A new value that is empty or cannot be read or parsed is
not taken: the old one stays, and a warning names the file (never a value). Each value read
is concealed from every log line (``credentials.conceal``).

``cli/service.py`` (``triton-gitops run``) makes one; ``service/daemon.py`` asks it before each
webhook, on-call verb and pass.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from reconciler.credentials import conceal

log = logging.getLogger("triton_gitops.secrets")

# What tells a changed file: the resolved target, its inode, mtime (ns) and size.
_Stamp = tuple[str, int, int, int]


class SecretFileError(ValueError):
    """A secret file that cannot be read at start (the service refuses to start)."""


def _stamp(path: Path) -> _Stamp:
    found = os.stat(path)  # follows every symlink, ..data included
    return os.path.realpath(path), found.st_ino, found.st_mtime_ns, found.st_size


def secret_text(text: str, source: str) -> str | None:
    """A plain secret: the file's text without surrounding blanks (empty: None, off)."""
    return text.strip() or None


def _values(value: Any) -> list[str]:
    if isinstance(value, Mapping):
        return [str(v) for v in value.values()]
    return [value] if isinstance(value, str) else []


class SecretFiles:
    """Named secret files, each turned into its value by its parser (``secret_text`` unless
    given: ``parse(text, path)``, raising ValueError on bad content). Every file is read at
    once: one that cannot be read raises SecretFileError."""

    def __init__(
        self,
        files: Mapping[str, Path],
        parsers: Mapping[str, Callable[[str, str], Any]] | None = None,
    ) -> None:
        self._files = dict(files)
        self._parsers = dict(parsers or {})
        self._stamps: dict[str, _Stamp] = {}
        self._values: dict[str, Any] = {}
        self._lock = threading.Lock()
        for name, path in self._files.items():
            try:
                self._stamps[name] = _stamp(path)
                self._values[name] = self._parse(name, path.read_text())
            except (OSError, ValueError) as exc:
                raise SecretFileError(str(exc)) from exc  # it names the file
            conceal(*_values(self._values[name]))

    def _parse(self, name: str, text: str) -> Any:
        return self._parsers.get(name, secret_text)(text, str(self._files[name]))

    def current(self) -> dict[str, Any]:
        """Every value by name, re-reading the files that changed since they were read."""
        with self._lock:
            for name, path in self._files.items():
                self._refresh(name, path)
            return dict(self._values)

    def _refresh(self, name: str, path: Path) -> None:
        try:
            stamp = _stamp(path)
        except OSError as exc:
            self._keep(name, path, f"cannot be read ({exc.strerror})", None)
            return
        if stamp == self._stamps.get(name):
            return
        try:
            text = path.read_text()
            value = self._parse(name, text) if text.strip() else None
        except (OSError, ValueError) as exc:
            self._keep(name, path, f"cannot be read or parsed: {exc}", stamp)
            return
        if not value:
            self._keep(name, path, "is empty", stamp)
            return
        conceal(*_values(value))
        self._values[name] = value
        self._stamps[name] = stamp
        log.warning("secret file changed: read again", extra={"fields": {"file": str(path)}})

    def _keep(self, name: str, path: Path, why: str, stamp: _Stamp | None) -> None:
        """Keep the old value; warn once per change of the file (not at every request)."""
        if stamp is not None and self._stamps.get(name) == stamp:
            return
        if stamp is not None:
            self._stamps[name] = stamp
        elif self._stamps.get(name) == ("", 0, 0, 0):
            return
        else:
            self._stamps[name] = ("", 0, 0, 0)
        log.warning(
            f"secret file {why}; the value read before stays in use",
            extra={"fields": {"file": str(path)}},
        )
