"""The state store: what the reconciler remembers between passes, in SQLite.

It records, per server, the models the last applied revision placed there (so that a
ModelDeployment removed from Git unloads its model) and every pass's outcome. WAL mode and one
transaction per write, so a kill mid-write leaves the previous record intact.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from reconciler.plan import History

_SCHEMA = """
CREATE TABLE IF NOT EXISTS managed (
    server TEXT NOT NULL,
    model TEXT NOT NULL,
    revision TEXT NOT NULL,
    PRIMARY KEY (server, model)
);
CREATE TABLE IF NOT EXISTS passes (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    revision TEXT NOT NULL,
    finished_at REAL NOT NULL,
    ok INTEGER NOT NULL,
    summary TEXT NOT NULL
);
"""


class StateStore:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    def history(self) -> History:
        managed: dict[str, set[str]] = {}
        for server, model in self._db.execute("SELECT server, model FROM managed"):
            managed.setdefault(server, set()).add(model)
        row = self._db.execute(
            "SELECT revision FROM passes WHERE ok = 1 ORDER BY id DESC LIMIT 1"
        ).fetchone()
        return History(
            revision=row[0] if row else None,
            managed={server: frozenset(models) for server, models in managed.items()},
        )

    def record_pass(
        self,
        revision: str,
        managed: Mapping[str, frozenset[str]],
        ok: bool,
        summary: Mapping[str, Any],
    ) -> None:
        """Replace the managed models of the servers in ``managed`` and log the pass."""
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            for server, models in managed.items():
                self._db.execute("DELETE FROM managed WHERE server = ?", (server,))
                self._db.executemany(
                    "INSERT INTO managed (server, model, revision) VALUES (?, ?, ?)",
                    [(server, model, revision) for model in sorted(models)],
                )
            self._db.execute(
                "INSERT INTO passes (revision, finished_at, ok, summary) VALUES (?, ?, ?, ?)",
                (revision, time.time(), int(ok), json.dumps(summary, sort_keys=True)),
            )
