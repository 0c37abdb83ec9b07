"""The state store's file on disk: opened for writing (checked, migrated, moved aside when it
cannot be read) or for reading only (never created, migrated or moved); see ``state.py``.

A file that fails SQLite's check is moved aside with its WAL side files as
``<name>.corrupt-<unix time>``, and a new, empty one is started; what happened is returned,
for the store to log and report.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from pathlib import Path

from reconciler.adapters.state_schema import LATEST, migrate, refuse_newer, version
from reconciler.model.errors import StateFileRefused

log = logging.getLogger("triton_gitops.state")

_SIDE_FILES = ("", "-wal", "-shm")  # SQLite's WAL and shared-memory files go with the store


def open_for_writing(path: Path) -> tuple[sqlite3.Connection, str | None]:
    """The record at ``path``, ready to write, and what happened to an unreadable or missing
    file (None: it was read as it was)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    recovered = None
    if not path.exists():
        recovered = (
            f"state file {path} does not exist: starting with an empty state. If this "
            "reconciler ran before, its record is lost: models loaded on the servers that "
            "no manifest declares are left alone (not unloaded), and holds on failed specs "
            "are forgotten"
        )
        log.warning(recovered)
    try:
        return _connect(path), recovered
    except sqlite3.DatabaseError as exc:
        aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
        for suffix in _SIDE_FILES:
            found = path.with_name(path.name + suffix)
            if found.exists():
                found.rename(aside.with_name(aside.name + suffix))
        recovered = (
            f"state file {path} is unreadable ({exc}); moved aside to {aside} and started "
            "with an empty state: models loaded on the servers that no manifest declares "
            "are left alone (not unloaded), and holds on failed specs are forgotten"
        )
        log.error(recovered)
        return _connect(path), recovered


def open_read_only(path: Path) -> sqlite3.Connection:
    """The record at ``path`` for a command that only reads it: an existing file opened
    read-only (SQLite ``mode=ro``, ``query_only``), an older one migrated in a copy in memory;
    no file, or one that cannot be read, is an empty record in memory."""
    if path.exists():
        try:
            db = sqlite3.connect(
                f"{path.resolve().as_uri()}?mode=ro",
                uri=True,
                isolation_level=None,
                check_same_thread=False,
            )
            try:
                _check(db)
                refuse_newer(db, str(path))
                if version(db) < LATEST:  # migrated in a copy in memory, the file untouched
                    copy = _in_memory()
                    db.backup(copy)
                    db.close()
                    db = copy
                    migrate(db, str(path))
            except (sqlite3.DatabaseError, StateFileRefused):
                db.close()
                raise
            db.execute("PRAGMA query_only=1")
            return db
        except sqlite3.DatabaseError as exc:
            log.warning(
                f"state file {path} is unreadable ({exc}): read as an empty record; the next "
                "apply or run moves it aside"
            )
    db = _in_memory()
    migrate(db, "(no state file)")
    db.execute("PRAGMA query_only=1")
    return db


def _connect(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        _check(db)
        refuse_newer(db, str(path))  # before anything is written to it
        db.execute("PRAGMA journal_mode=WAL")
        # With WAL, NORMAL keeps the store consistent through a crash or a kill (a power cut
        # may lose the last pass's record, never corrupt it) and saves a sync per commit.
        db.execute("PRAGMA synchronous=NORMAL")
        for step in migrate(db, str(path)):
            log.info("state file %s: migrated to version %d (%s)", path, step.version, step.summary)
    except (sqlite3.DatabaseError, StateFileRefused):
        db.close()
        raise
    return db


def _check(db: sqlite3.Connection) -> None:
    # Garbage after a valid header only shows when its pages are read: check them all now
    # (a few milliseconds for a store of this size) rather than fail mid-pass.
    verdict = db.execute("PRAGMA quick_check").fetchone()[0]
    if verdict != "ok":
        raise sqlite3.DatabaseError(f"integrity check: {verdict}")


def _in_memory() -> sqlite3.Connection:
    return sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
