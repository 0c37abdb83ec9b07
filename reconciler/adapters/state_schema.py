"""The state store's schema, versioned: which tables a state file has is the number in its
``PRAGMA user_version``, and ``MIGRATIONS`` take a file from any earlier number to ``LATEST``.

Version 0 is every file written before versions existed (their tables and columns were added
by probing, so such a file may lack any of the later ones); migration 1 brings each of them to
the last unversioned layout. Each migration runs in its own transaction with the version it
sets, so a kill mid-migration leaves the file at the version before it, and the next opening
runs it again. A file with a higher number than ``LATEST`` was written by a newer triton-gitops:
it is refused (``NewerStateFile``), never migrated down, moved aside or written.

A new table or column is a new ``Migration`` at the end, never an edit of an old one: old
files are migrated by the same steps as they were when the step was written. Tests build a
file at every earlier version (tests/adapters/state_files/) and migrate it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass

from reconciler.faults import fault_point
from reconciler.model.errors import MigrationFailed, NewerStateFile

# The last layout before versions (what migration 1 reaches), table by table. A file from
# before any of them gains it empty.
_UNVERSIONED_TABLES = (
    """CREATE TABLE IF NOT EXISTS managed (
        server TEXT NOT NULL,
        model TEXT NOT NULL,
        revision TEXT NOT NULL,
        PRIMARY KEY (server, model)
    )""",
    """CREATE TABLE IF NOT EXISTS passes (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        revision TEXT NOT NULL,
        finished_at REAL NOT NULL,
        ok INTEGER NOT NULL,
        summary TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS holds (
        deployment TEXT PRIMARY KEY,
        fingerprint TEXT NOT NULL,
        revision TEXT NOT NULL,
        reason TEXT NOT NULL,
        previous TEXT NOT NULL,
        configs TEXT NOT NULL,
        created_at REAL NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS rollouts (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        revision TEXT NOT NULL,
        deployment TEXT NOT NULL,
        server TEXT NOT NULL,
        model TEXT NOT NULL,
        from_versions TEXT NOT NULL,
        to_versions TEXT NOT NULL,
        outcome TEXT NOT NULL,
        verdict TEXT,
        checks TEXT NOT NULL,
        error TEXT,
        rollback_seconds REAL,
        finished_at REAL NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS applied_specs (
        deployment TEXT PRIMARY KEY,
        revision TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        versions TEXT NOT NULL,
        config TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS footprints (
        server TEXT NOT NULL,
        model TEXT NOT NULL,
        bytes_per_version REAL NOT NULL,
        PRIMARY KEY (server, model)
    )""",
    """CREATE TABLE IF NOT EXISTS staged_rollouts (
        deployment TEXT PRIMARY KEY,
        fingerprint TEXT NOT NULL,
        revision TEXT NOT NULL,
        progress TEXT NOT NULL,
        updated_at REAL NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS undelivered_alerts (
        receiver TEXT PRIMARY KEY,
        deliveries TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS suspensions (
        target TEXT PRIMARY KEY,
        by TEXT NOT NULL,
        at TEXT NOT NULL,
        reason TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS operator_actions (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        at TEXT NOT NULL,
        verb TEXT NOT NULL,
        target TEXT NOT NULL,
        by TEXT NOT NULL,
        detail TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS operator_orders (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        deployment TEXT NOT NULL,
        kind TEXT NOT NULL,
        by TEXT NOT NULL,
        at TEXT NOT NULL,
        at_epoch REAL NOT NULL,
        reason TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS live_status (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        snapshot TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS open_alerts (
        model TEXT NOT NULL,
        server TEXT NOT NULL,
        kind TEXT NOT NULL,
        revision TEXT NOT NULL,
        PRIMARY KEY (model, server, kind)
    )""",
    """CREATE TABLE IF NOT EXISTS condition_transitions (
        deployment TEXT NOT NULL,
        type TEXT NOT NULL,
        status TEXT NOT NULL,
        since TEXT NOT NULL,
        PRIMARY KEY (deployment, type)
    )""",
    # The repository (its URL without credentials) and manifest folder this store is the
    # record of, written by the first pass that records; a pass over any other is refused.
    """CREATE TABLE IF NOT EXISTS bound_source (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        repo TEXT NOT NULL,
        path TEXT NOT NULL,
        bound_at TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS webhook_deliveries (
        key TEXT PRIMARY KEY,
        seen_at REAL NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS webhook_deliveries_by_time ON webhook_deliveries (seen_at)",
)


def _columns(db: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in db.execute(f"PRAGMA table_info({table})")}


def _the_last_unversioned_layout(db: sqlite3.Connection) -> None:
    for statement in _UNVERSIONED_TABLES:
        db.execute(statement)
    if "backend" not in _columns(db, "applied_specs"):  # from before backend revisions
        db.execute("ALTER TABLE applied_specs ADD COLUMN backend TEXT")
    if "reverted" not in _columns(db, "holds"):  # from before revert push records
        db.execute("ALTER TABLE holds ADD COLUMN reverted TEXT")
        # Holds from before: whether their revert was pushed is unknown; never push again.
        db.execute("UPDATE holds SET reverted = 'recorded before revert push records'")


def _indexes_for_retention(db: sqlite3.Connection) -> None:
    # What pruning (StateStore.record_pass) and history's lookups search by: without them a
    # year of passes is read whole on every pass.
    db.execute("CREATE INDEX IF NOT EXISTS passes_by_time ON passes (finished_at)")
    db.execute("CREATE INDEX IF NOT EXISTS rollouts_by_time ON rollouts (finished_at)")
    db.execute("CREATE INDEX IF NOT EXISTS rollouts_by_model ON rollouts (model, id)")
    db.execute("CREATE INDEX IF NOT EXISTS operator_actions_by_time ON operator_actions (at)")


def _alert_outbox_and_rows_of_holds(db: sqlite3.Connection) -> None:
    # Issue 17, point 1. alert_outbox: the failure alerts (opened and resolved) recorded and
    # not yet handed to the receivers, one per AlertEvent.identity (its JSON), oldest first
    # by rowid. rollouts_in_flight: the rows a journal wrote with a hold, which the pass's
    # record completes rather than adding a second.
    db.execute(
        "CREATE TABLE IF NOT EXISTS alert_outbox (identity TEXT PRIMARY KEY, event TEXT NOT NULL)"
    )
    db.execute("CREATE TABLE IF NOT EXISTS rollouts_in_flight (rollout_id INTEGER PRIMARY KEY)")


@dataclass(frozen=True)
class Migration:
    version: int  # what ``user_version`` says once it has run
    summary: str
    run: Callable[[sqlite3.Connection], None]


MIGRATIONS = (
    Migration(1, "the tables and columns of every unversioned file", _the_last_unversioned_layout),
    Migration(2, "indexes for bounded history (pruning by age)", _indexes_for_retention),
    Migration(
        3, "the alert outbox and the rows written with a hold", _alert_outbox_and_rows_of_holds
    ),
)
LATEST = MIGRATIONS[-1].version


def version(db: sqlite3.Connection) -> int:
    return int(db.execute("PRAGMA user_version").fetchone()[0])


def refuse_newer(db: sqlite3.Connection, where: str) -> None:
    """Raise NewerStateFile when ``db`` was written by a newer triton-gitops."""
    found = version(db)
    if found > LATEST:
        raise NewerStateFile(where, found, LATEST)


def migrate(db: sqlite3.Connection, where: str, *, to: int | None = None) -> list[Migration]:
    """Run the migrations ``db`` (``where``: its file, for messages) has not had, up to
    ``to`` (None: all), in order, each in a transaction of its own with its version number; the ones
    run. A failure rolls its migration back and raises MigrationFailed."""
    refuse_newer(db, where)
    if version(db) >= (LATEST if to is None else to):
        return []  # current: no write lock taken (a store is opened several times a pass)
    ran: list[Migration] = []
    for migration in MIGRATIONS:
        if to is not None and migration.version > to:
            break
        db.execute("BEGIN IMMEDIATE")
        try:
            # Read inside the transaction: another writer may have migrated it meanwhile.
            refuse_newer(db, where)
            at = version(db)
            if at < migration.version:
                try:
                    migration.run(db)
                except sqlite3.Error as exc:  # a bug, not damage: never moved aside for it
                    summary = migration.summary
                    raise MigrationFailed(where, at, migration.version, summary, exc) from exc
                db.execute(f"PRAGMA user_version = {migration.version}")
                ran.append(migration)
                fault_point("state.migrate")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
    return ran
