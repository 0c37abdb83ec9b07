"""How the state store's records map to its tables' rows: the SQL that writes a pass's record
(and prunes what is older than the history kept) and reads the history back. Each function
takes the open connection and runs inside the caller's transaction; ``state.py`` decides the
transactions, this module only the rows.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Mapping
from typing import Any

from reconciler.adapters.alerts import event_json
from reconciler.core.records import rfc3339
from reconciler.model.history import (
    AlertEvent,
    AppliedSpec,
    History,
    Hold,
    PassRecord,
    Rollout,
    StagedRecord,
    Suspension,
)

# Rows pruned per table and pass at most: the first pass over a store from before retention
# (a year of passes) spreads the deletes over a few passes instead of one long transaction.
PRUNE_BATCH = 5000

AlertKey = tuple[str, str, str, bool]  # an alert's identity: model, server, kind, resolved


def read_history(db: sqlite3.Connection, suspensions: Iterable[Suspension]) -> History:
    """What the next pass starts from."""
    managed: dict[str, set[str]] = {}
    for server, model in db.execute("SELECT server, model FROM managed"):
        managed.setdefault(server, set()).add(model)
    row = db.execute("SELECT revision FROM passes WHERE ok = 1 ORDER BY id DESC LIMIT 1").fetchone()
    holds = {
        name: Hold(
            deployment=name,
            fingerprint=fingerprint,
            revision=revision,
            reason=reason,
            previous={k: tuple(v) for k, v in json.loads(previous).items()},
            configs=json.loads(configs),
        )
        for name, fingerprint, revision, reason, previous, configs in db.execute(
            "SELECT deployment, fingerprint, revision, reason, previous, configs FROM holds"
        )
    }
    staged = {}
    for name, fingerprint, revision, progress in db.execute(
        "SELECT deployment, fingerprint, revision, progress FROM staged_rollouts"
    ):
        data = json.loads(progress)
        staged[name] = StagedRecord(
            fingerprint,
            frozenset(data["completed"]),
            {server: tuple(versions) for server, versions in data["started"].items()},
            revision,
        )
    last = db.execute("SELECT finished_at FROM passes ORDER BY id DESC LIMIT 1").fetchone()
    return History(
        staged=staged,
        last_pass_at=last[0] if last else None,
        revision=row[0] if row else None,
        managed={server: frozenset(models) for server, models in managed.items()},
        holds=holds,
        backends=dict(
            db.execute("SELECT deployment, backend FROM applied_specs WHERE backend IS NOT NULL")
        ),
        footprints={
            (server, model): size
            for server, model, size in db.execute(
                "SELECT server, model, bytes_per_version FROM footprints"
            )
        },
        suspended={s.target: s for s in suspensions},
        transitions={
            (deployment, kind): (status, since)
            for deployment, kind, status, since in db.execute(
                "SELECT deployment, type, status, since FROM condition_transitions"
            )
        },
    )


def write_pass(db: sqlite3.Connection, record: PassRecord, now: float) -> None:
    """Everything one pass learned, but the pruning."""
    for server, models in record.managed.items():
        db.execute("DELETE FROM managed WHERE server = ?", (server,))
        db.executemany(
            "INSERT INTO managed (server, model, revision) VALUES (?, ?, ?)",
            [(server, model, record.revision) for model in sorted(models)],
        )
    db.executemany("DELETE FROM holds WHERE deployment = ?", [(n,) for n in record.released])
    write_holds(db, record.holds, now)
    _write_rollouts(db, record.rollouts)
    _write_applied(db, record.applied)
    db.executemany(
        "INSERT OR REPLACE INTO footprints VALUES (?, ?, ?)",
        [(server, model, size) for (server, model), size in record.footprints.items()],
    )
    open_alerts(db, record.alerts_opened, record.revision)
    db.executemany(
        "DELETE FROM open_alerts WHERE model = ? AND server = ?", list(record.alerts_resolved)
    )
    db.executemany(
        "DELETE FROM staged_rollouts WHERE deployment = ?", [(n,) for n in record.stages_ended]
    )
    write_outbox(db, record.outbox, record.outbox_withdrawn)
    # A pass sees every declared ModelDeployment: one no longer declared is forgotten.
    db.execute("DELETE FROM condition_transitions")
    db.executemany(
        "INSERT INTO condition_transitions (deployment, type, status, since) VALUES (?, ?, ?, ?)",
        [(d, kind, status, since) for (d, kind), (status, since) in record.transitions.items()],
    )
    db.execute(
        "INSERT INTO passes (revision, finished_at, ok, summary) VALUES (?, ?, ?, ?)",
        (record.revision, now, int(record.ok), json.dumps(record.summary, sort_keys=True)),
    )


def prune(db: sqlite3.Connection, now: float, history_days: float) -> None:
    """Forget what is older than ``history_days`` (0: keep it for ever): passes (never the
    latest one, nor the latest that succeeded: the next pass starts from it), rollouts (never a
    server's latest of a ModelDeployment, nor its latest that converged: ``status`` and
    ``undo`` read them) and on-call actions. Holds, open alerts, undelivered alerts, in-flight
    records, suspensions and what is placed where are the present, not history: never pruned.
    Orders are for the rollouts in progress when they were given: a day on, none is."""
    db.execute("DELETE FROM operator_orders WHERE at_epoch < ?", (now - 86400,))
    if history_days <= 0:
        return
    cutoff = now - history_days * 86400
    last_ok = db.execute("SELECT id FROM passes WHERE ok = 1 ORDER BY id DESC LIMIT 1").fetchone()
    db.execute(
        "DELETE FROM passes WHERE id IN (SELECT id FROM passes WHERE finished_at < ? "
        "AND id NOT IN (?, (SELECT MAX(id) FROM passes)) ORDER BY finished_at LIMIT ?)",
        (cutoff, last_ok[0] if last_ok else -1, PRUNE_BATCH),
    )
    db.execute(
        "DELETE FROM rollouts WHERE id IN (SELECT id FROM rollouts WHERE finished_at < ? "
        "ORDER BY finished_at LIMIT ?) "
        "AND id NOT IN (SELECT MAX(id) FROM rollouts GROUP BY deployment, server) "
        "AND id NOT IN (SELECT MAX(id) FROM rollouts WHERE outcome = 'converged' "
        "GROUP BY deployment, server)",
        (cutoff, PRUNE_BATCH),
    )
    db.execute(
        "DELETE FROM operator_actions WHERE id IN (SELECT id FROM operator_actions "
        "WHERE at < ? ORDER BY at LIMIT ?)",
        (rfc3339(cutoff), PRUNE_BATCH),
    )


def write_holds(db: sqlite3.Connection, holds: Iterable[Hold], now: float) -> None:
    # A hold written again keeps the record of its revert push (see StateStore.record_reverted).
    db.executemany(
        "INSERT INTO holds (deployment, fingerprint, revision, reason, previous, configs, "
        "created_at) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (deployment) DO UPDATE SET "
        "fingerprint = excluded.fingerprint, revision = excluded.revision, "
        "reason = excluded.reason, previous = excluded.previous, "
        "configs = excluded.configs, created_at = excluded.created_at, "
        "reverted = CASE WHEN holds.fingerprint = excluded.fingerprint "
        "THEN holds.reverted END",
        [
            (
                h.deployment,
                h.fingerprint,
                h.revision,
                h.reason,
                json.dumps({k: list(v) for k, v in h.previous.items()}),
                json.dumps(dict(h.configs)),
                now,
            )
            for h in holds
        ],
    )


def insert_rollouts(db: sqlite3.Connection, rollouts: Iterable[Rollout]) -> None:
    db.executemany(
        "INSERT INTO rollouts (revision, deployment, server, model, from_versions, "
        "to_versions, outcome, verdict, checks, error, rollback_seconds, finished_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [_rollout_row(r) for r in rollouts],
    )


def read_rollouts(db: sqlite3.Connection, model: str | None, limit: int) -> list[Rollout]:
    """The latest rollouts, newest first, optionally of one model."""
    query = (
        "SELECT revision, deployment, server, model, from_versions, to_versions, outcome, "
        "verdict, checks, error, rollback_seconds, finished_at FROM rollouts"
    )
    args: tuple[Any, ...] = ()
    if model is not None:
        query += " WHERE model = ?"
        args = (model,)
    query += " ORDER BY id DESC LIMIT ?"
    return [
        Rollout(
            revision=row[0],
            deployment=row[1],
            server=row[2],
            model=row[3],
            from_versions=tuple(json.loads(row[4])),
            to_versions=tuple(json.loads(row[5])),
            outcome=row[6],
            verdict=row[7],
            checks=tuple(json.loads(row[8])),
            error=row[9],
            rollback_seconds=row[10],
            finished_at=row[11],
        )
        for row in db.execute(query, (*args, limit))
    ]


def open_alerts(
    db: sqlite3.Connection, alerts: Iterable[tuple[str, str, str]], revision: str
) -> None:
    """(model, server, kind) of failure alerts raised at ``revision``, open until resolved."""
    db.executemany(
        "INSERT OR REPLACE INTO open_alerts VALUES (?, ?, ?, ?)",
        [(model, server, kind, revision) for model, server, kind in alerts],
    )


def write_outbox(
    db: sqlite3.Connection, events: Iterable[AlertEvent], withdrawn: Iterable[AlertKey]
) -> None:
    # A later event of the same identity replaces the earlier, and goes to the end.
    leave_outbox(db, withdrawn)
    db.executemany(
        "INSERT OR REPLACE INTO alert_outbox (identity, event) VALUES (?, ?)",
        [(json.dumps(list(e.identity)), json.dumps(event_json(e), default=str)) for e in events],
    )


def leave_outbox(db: sqlite3.Connection, keys: Iterable[AlertKey]) -> None:
    db.executemany(
        "DELETE FROM alert_outbox WHERE identity = ?", [(json.dumps(list(k)),) for k in keys]
    )


def replace_undelivered(db: sqlite3.Connection, backlogs: Mapping[str, list[Any]]) -> None:
    db.execute("DELETE FROM undelivered_alerts")
    db.executemany(
        "INSERT INTO undelivered_alerts (receiver, deliveries) VALUES (?, ?)",
        [(k, json.dumps(v, default=str)) for k, v in backlogs.items() if v],
    )


def _write_rollouts(db: sqlite3.Connection, rollouts: Iterable[Rollout]) -> None:
    """The pass's rows; one its journal wrote with a hold (same revision, deployment, server,
    model and target) is completed, not added again. Every journal row ends here: one of a
    pass killed before its record stays as that pass wrote it."""
    new = []
    for r in rollouts:
        values = _rollout_row(r)
        row = db.execute(
            "SELECT id FROM rollouts WHERE id IN (SELECT rollout_id FROM rollouts_in_flight) "
            "AND revision = ? AND deployment = ? AND server = ? AND model = ? "
            "AND to_versions = ?",
            values[:4] + values[5:6],
        ).fetchone()
        if row is None:
            new.append(r)
            continue
        db.execute(
            "UPDATE rollouts SET from_versions = ?, outcome = ?, verdict = ?, checks = ?, "
            "error = ?, rollback_seconds = ?, finished_at = ? WHERE id = ?",
            (values[4], *values[6:], row[0]),
        )
        db.execute("DELETE FROM rollouts_in_flight WHERE rollout_id = ?", (row[0],))
    insert_rollouts(db, new)
    db.execute("DELETE FROM rollouts_in_flight")


def _rollout_row(r: Rollout) -> tuple[Any, ...]:
    return (
        r.revision,
        r.deployment,
        r.server,
        r.model,
        json.dumps(list(r.from_versions)),
        json.dumps(list(r.to_versions)),
        r.outcome,
        r.verdict,
        json.dumps(list(r.checks)),
        r.error,
        r.rollback_seconds,
        r.finished_at,
    )


def _write_applied(db: sqlite3.Connection, applied: Iterable[AppliedSpec]) -> None:
    db.executemany(
        "INSERT OR REPLACE INTO applied_specs "
        "(deployment, revision, fingerprint, versions, config, backend) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        [
            (
                a.deployment,
                a.revision,
                a.fingerprint,
                json.dumps(list(a.versions)),
                json.dumps(dict(a.config)),
                a.backend,
            )
            for a in applied
        ],
    )
