"""The state store: what the reconciler remembers between passes, in SQLite.

Per server, the models the last applied revision placed there (so that a ModelDeployment
removed from Git unloads its model); holds on ModelDeployments whose rollout failed; every
rollout with its verdict and check values (for ``history``); the failure alerts still open;
alerts a receiver has not taken yet (retried by the next pass); each pass's outcome; and each
ModelDeployment's condition statuses with the time each took its status (``lastTransitionTime``);
and the repository and manifest folder it is the record of (``bound_source``).
WAL mode and one transaction per pass, so a kill mid-write leaves the previous record intact.
The tables are versioned (``state_schema.py``): a writer migrates an older file in place, and
a file written by a newer release is refused. History is bounded: each pass forgets passes,
rollouts and on-call actions older than ``history_days`` (``_prune``); the present (holds,
open alerts, in-flight records) is never pruned.

``StateStore(path, read_only=True)`` is the record as ``plan``, ``status`` and ``history``
see it: an existing file opened read-only (SQLite ``mode=ro``, ``query_only``: a write
raises), never created, migrated or moved aside; no file, or one that cannot be read, is an
empty record in memory. Only ``apply``, ``run`` and the on-call verbs write. (A reader of a
WAL store may leave SQLite's ``-wal`` and ``-shm`` side files, its readers' shared index,
not the record: removing them under another process's connection would be unsafe.)

A state file that cannot be read (garbage, a truncated copy) is moved aside as
``<name>.corrupt-<unix time>`` and a new, empty one is started, with an error in the log naming
both; a missing one is started empty with a warning. Empty means the reconciler no longer knows
which loaded models it placed: it then unloads none of them (only declared models are planned),
and holds are forgotten, so a failed spec is tried, and analysed, again.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from reconciler.adapters.alerts import event_from_json, event_json
from reconciler.adapters.state_schema import LATEST, migrate, refuse_newer, version
from reconciler.core.records import rfc3339
from reconciler.faults import fault_point
from reconciler.model.errors import StateFileRefused
from reconciler.model.history import (
    ALL_DEPLOYMENTS,
    AlertEvent,
    AppliedSpec,
    History,
    Hold,
    OperatorAction,
    OperatorOrder,
    OrderKind,
    PassRecord,
    Rollout,
    StagedRecord,
    Suspension,
)
from reconciler.model.settings import DEFAULT_HISTORY_DAYS

log = logging.getLogger("triton_gitops.state")


_SIDE_FILES = ("", "-wal", "-shm")  # SQLite's WAL and shared-memory files go with the store


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


def _read_only(path: Path) -> sqlite3.Connection:
    """The record at ``path`` for a command that only reads it; see the module's docstring."""
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


def _in_memory() -> sqlite3.Connection:
    return sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)


# Rows pruned per table and pass at most: the first pass over a store from before retention
# (a year of passes) spreads the deletes over a few passes instead of one long transaction.
_PRUNE_BATCH = 5000


class StateStore:
    def __init__(
        self,
        path: Path,
        *,
        read_only: bool = False,
        history_days: float = DEFAULT_HISTORY_DAYS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``history_days``: how long passes, rollouts and on-call actions are kept (0: for
        ever; see ``_prune``); ``clock``: the wall clock the record is written with."""
        self.path = path
        self.history_days = history_days
        self._clock = clock
        self.recovered: str | None = None  # what happened to an unreadable or missing file
        if read_only:
            self._db = _read_only(path)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            self.recovered = (
                f"state file {path} does not exist: starting with an empty state. If this "
                "reconciler ran before, its record is lost: models loaded on the servers that "
                "no manifest declares are left alone (not unloaded), and holds on failed specs "
                "are forgotten"
            )
            log.warning(self.recovered)
        try:
            self._db = _connect(path)
        except sqlite3.DatabaseError as exc:
            aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
            for suffix in _SIDE_FILES:
                found = path.with_name(path.name + suffix)
                if found.exists():
                    found.rename(aside.with_name(aside.name + suffix))
            self.recovered = (
                f"state file {path} is unreadable ({exc}); moved aside to {aside} and started "
                "with an empty state: models loaded on the servers that no manifest declares "
                "are left alone (not unloaded), and holds on failed specs are forgotten"
            )
            log.error(self.recovered)
            self._db = _connect(path)

    def close(self) -> None:
        self._db.close()

    def history(self) -> History:
        managed: dict[str, set[str]] = {}
        for server, model in self._db.execute("SELECT server, model FROM managed"):
            managed.setdefault(server, set()).add(model)
        row = self._db.execute(
            "SELECT revision FROM passes WHERE ok = 1 ORDER BY id DESC LIMIT 1"
        ).fetchone()
        holds = {
            name: Hold(
                deployment=name,
                fingerprint=fingerprint,
                revision=revision,
                reason=reason,
                previous={k: tuple(v) for k, v in json.loads(previous).items()},
                configs=json.loads(configs),
            )
            for name, fingerprint, revision, reason, previous, configs in self._db.execute(
                "SELECT deployment, fingerprint, revision, reason, previous, configs FROM holds"
            )
        }
        backends = {
            name: revision
            for name, revision in self._db.execute(
                "SELECT deployment, backend FROM applied_specs WHERE backend IS NOT NULL"
            )
        }
        footprints = {
            (server, model): size
            for server, model, size in self._db.execute(
                "SELECT server, model, bytes_per_version FROM footprints"
            )
        }
        staged = {}
        for name, fingerprint, revision, progress in self._db.execute(
            "SELECT deployment, fingerprint, revision, progress FROM staged_rollouts"
        ):
            data = json.loads(progress)
            staged[name] = StagedRecord(
                fingerprint,
                frozenset(data["completed"]),
                {server: tuple(versions) for server, versions in data["started"].items()},
                revision,
            )
        last = self._db.execute(
            "SELECT finished_at FROM passes ORDER BY id DESC LIMIT 1"
        ).fetchone()
        return History(
            staged=staged,
            last_pass_at=last[0] if last else None,
            revision=row[0] if row else None,
            managed={server: frozenset(models) for server, models in managed.items()},
            holds=holds,
            backends=backends,
            footprints=footprints,
            suspended={s.target: s for s in self.suspensions()},
            transitions={
                (deployment, kind): (status, since)
                for deployment, kind, status, since in self._db.execute(
                    "SELECT deployment, type, status, since FROM condition_transitions"
                )
            },
        )

    # -- on-call verbs: each changes the record and is recorded, in one transaction ----------

    def _act(self, verb: str, target: str, by: str, detail: str) -> OperatorAction:
        action = OperatorAction(rfc3339(self._clock()), verb, target, by, detail)
        self._db.execute(
            "INSERT INTO operator_actions (at, verb, target, by, detail) VALUES (?, ?, ?, ?, ?)",
            (action.at, action.verb, action.target, action.by, action.detail),
        )
        return action

    def record_action(self, verb: str, target: str, by: str, detail: str = "") -> OperatorAction:
        """A verb that changes no record of its own (``reconcile``), kept in history."""
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            return self._act(verb, target, by, detail)

    def suspend(self, target: str, by: str, reason: str = "") -> Suspension:
        """Pause reconciling ``target`` (a ModelDeployment, or ALL_DEPLOYMENTS) until
        ``resume``; suspending again replaces who, when and why."""
        suspension = Suspension(target, by, rfc3339(self._clock()), reason)
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute(
                "INSERT OR REPLACE INTO suspensions (target, by, at, reason) VALUES (?, ?, ?, ?)",
                (target, by, suspension.at, reason),
            )
            self._act("suspend", target, by, reason)
        return suspension

    def resume(self, target: str, by: str) -> Suspension | None:
        """Lift the suspension of ``target``; the one lifted, or None when there was none."""
        lifted = next((s for s in self.suspensions() if s.target == target), None)
        if lifted is None:
            return None
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute("DELETE FROM suspensions WHERE target = ?", (target,))
            self._act("resume", target, by, f"suspended by {lifted.by} at {lifted.at}")
        return lifted

    def applied_deployments(self) -> list[str]:
        """The ModelDeployments some pass has applied (their names)."""
        return [row[0] for row in self._db.execute("SELECT deployment FROM applied_specs")]

    def suspensions(self) -> list[Suspension]:
        return [
            Suspension(target, by, at, reason)
            for target, by, at, reason in self._db.execute(
                "SELECT target, by, at, reason FROM suspensions ORDER BY target"
            )
        ]

    def retry(self, deployment: str, by: str) -> Hold | None:
        """Lift the hold on ``deployment`` so the next pass tries the same spec again; the hold
        lifted, or None when there was none."""
        hold = self.history().holds.get(deployment)
        if hold is None:
            return None
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute("DELETE FROM holds WHERE deployment = ?", (deployment,))
            self._act("retry", deployment, by, f"hold at {hold.revision[:12]}: {hold.reason}")
        return hold

    def give_order(
        self, kind: OrderKind, deployment: str, by: str, reason: str = ""
    ) -> OperatorOrder | None:
        """An order to ``deployment``'s rollout in progress, for apply to obey (it reads them
        while it runs: ``orders``), recorded in history in the same transaction; None, and
        nothing written, when no rollout of it is in progress."""
        at_epoch = self._clock()
        order = OperatorOrder(kind, deployment, by, rfc3339(at_epoch), at_epoch, reason)
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            if deployment not in self.in_progress():
                return None
            self._db.execute(
                "INSERT INTO operator_orders (deployment, kind, by, at, at_epoch, reason) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (deployment, str(kind), by, order.at, at_epoch, reason),
            )
            self._act(str(kind), deployment, by, reason)
        return order

    def orders(self, deployment: str, since: float) -> list[OperatorOrder]:
        """The orders given to ``deployment`` at or after ``since`` (wall clock), oldest
        first. A store that cannot be read gives none (logged): a rollout is never failed
        for want of its orders."""
        rows = self._rows_or_none(
            "the operator's orders",
            "SELECT kind, deployment, by, at, at_epoch, reason FROM operator_orders "
            "WHERE deployment = ? AND at_epoch >= ? ORDER BY id",
            (deployment, since),
        )
        return [OperatorOrder(OrderKind(kind), *rest) for kind, *rest in rows]

    def _rows_or_none(self, what: str, query: str, args: tuple[Any, ...]) -> list[Any]:
        """The rows of ``query``, or none when the store cannot be read (logged, naming
        ``what``): for what runs beside a rollout and must never fail it."""
        try:
            return self._db.execute(query, args).fetchall()
        except sqlite3.Error as exc:
            log.warning("state file %s: %s cannot be read: %s", self.path, what, exc)
            return []

    def record_live(self, snapshot: Mapping[str, Any] | None) -> None:
        """The rollouts of the pass in progress (``loop/live.py``), replacing the last
        snapshot; None: apply has ended. A failed write is logged: the live view is never
        worth failing a rollout for."""
        try:
            with self._db:
                if snapshot is None:
                    self._db.execute("DELETE FROM live_status")
                else:
                    self._db.execute(
                        "INSERT OR REPLACE INTO live_status (id, snapshot) VALUES (1, ?)",
                        (json.dumps(snapshot, sort_keys=True),),
                    )
        except sqlite3.Error as exc:
            log.warning("state file %s: the live status cannot be written: %s", self.path, exc)

    def live(self) -> dict[str, Any] | None:
        """The last snapshot of the pass in progress, None when no apply runs."""
        row = self._db.execute("SELECT snapshot FROM live_status").fetchone()
        return dict(json.loads(row[0])) if row else None

    def in_progress(self) -> set[str]:
        """The ModelDeployments a pass has begun rolling out and not yet recorded (the
        journal's entries): what an abort or a promote can act on."""
        return {row[0] for row in self._db.execute("SELECT deployment FROM staged_rollouts")}

    def operator_actions(self, target: str | None = None, limit: int = 100) -> list[OperatorAction]:
        """The latest on-call verbs, newest first (of one target, and those on everything)."""
        query = "SELECT at, verb, target, by, detail FROM operator_actions"
        args: tuple[Any, ...] = ()
        if target is not None:
            query += " WHERE target IN (?, ?)"
            args = (target, ALL_DEPLOYMENTS)
        query += " ORDER BY id DESC LIMIT ?"
        return [OperatorAction(*row) for row in self._db.execute(query, (*args, limit))]

    def record_stage(
        self,
        deployment: str,
        fingerprint: str,
        revision: str,
        completed: Iterable[str],
        started: Mapping[str, tuple[int, ...]],
    ) -> None:
        """A staged rollout is about to start a stage: written at once, in its own
        transaction, so a reconciler that stops mid-rollout leaves it behind."""
        progress = {
            "completed": sorted(completed),
            "started": {server: list(versions) for server, versions in started.items()},
        }
        with self._db:
            self._db.execute(
                "INSERT OR REPLACE INTO staged_rollouts VALUES (?, ?, ?, ?, ?)",
                (deployment, fingerprint, revision, json.dumps(progress), self._clock()),
            )

    def _write_holds(self, holds: Iterable[Hold]) -> None:
        # A hold written again keeps the record of its revert push (see record_reverted).
        self._db.executemany(
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
                    self._clock(),
                )
                for h in holds
            ],
        )

    def record_hold(
        self, hold: Hold, rollout: Rollout | None = None, alert: AlertEvent | None = None
    ) -> None:
        """A rollout failed and its revert is about to run: held at once, in its own
        transaction, so a reconciler killed mid-revert does not try the failed spec again;
        with it the rollout's row as far as it is known (the pass's record completes it) and
        its failure alert, open and in the outbox, so that a kill loses neither."""
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            self._write_holds([hold])
            if rollout is not None:
                self._insert_rollouts([rollout])
                self._db.execute(
                    "INSERT INTO rollouts_in_flight (rollout_id) VALUES (last_insert_rowid())"
                )
            if alert is not None:
                self._write_outbox([alert], ())
                self._open_alerts(
                    [(alert.model or "", alert.server or "", alert.kind)], alert.revision
                )

    def record_reverted(self, deployments: Iterable[str], note: str) -> None:
        """The revert of these held ModelDeployments is in Git (``note``: how), so no later
        pass pushes it again."""
        with self._db:
            self._db.executemany(
                "UPDATE holds SET reverted = ? WHERE deployment = ?",
                [(note, name) for name in deployments],
            )

    def unreverted(self) -> set[str]:
        """Held ModelDeployments whose revert was not pushed to Git (yet)."""
        return {name for (name,) in self._db.execute(
            "SELECT deployment FROM holds WHERE reverted IS NULL"
        )}  # fmt: skip

    def applied_spec(self, deployment: str) -> AppliedSpec | None:
        row = self._db.execute(
            "SELECT revision, fingerprint, versions, config FROM applied_specs "
            "WHERE deployment = ?",
            (deployment,),
        ).fetchone()
        if row is None:
            return None
        return AppliedSpec(
            deployment, row[0], row[1], tuple(json.loads(row[2])), json.loads(row[3])
        )

    def last_pass(self) -> dict[str, Any] | None:
        """The latest pass: revision, when it finished, whether it was ok, its summary."""
        row = self._db.execute(
            "SELECT revision, finished_at, ok, summary FROM passes ORDER BY id DESC LIMIT 1"
        ).fetchone()
        if row is None:
            return None
        return {
            "revision": row[0],
            "finished_at": row[1],
            "ok": bool(row[2]),
            "summary": json.loads(row[3]),
        }

    def bound_source(self) -> tuple[str, str] | None:
        """The repository and manifest folder this store records (None: not bound yet, a
        new store or one from before the binding)."""
        row = self._db.execute("SELECT repo, path FROM bound_source").fetchone()
        return (str(row[0]), str(row[1])) if row else None

    def bind_source(self, repo: str, path: str) -> None:
        """Make this store the record of ``repo`` at ``path``; a store bound already keeps
        its binding."""
        with self._db:
            self._db.execute(
                "INSERT OR IGNORE INTO bound_source (id, repo, path, bound_at) VALUES (1, ?, ?, ?)",
                (repo, path, rfc3339(self._clock())),
            )

    def undelivered_alerts(self) -> dict[str, list[Any]]:
        """Per alert receiver (its key, never its URL), the deliveries still to make."""
        return {
            receiver: list(json.loads(deliveries))
            for receiver, deliveries in self._db.execute(
                "SELECT receiver, deliveries FROM undelivered_alerts"
            )
        }

    def save_undelivered_alerts(self, backlogs: Mapping[str, list[Any]]) -> None:
        """Replace the stored backlog with ``backlogs`` (empty: everything was delivered)."""
        with self._db:
            self._db.execute("BEGIN")
            self._replace_undelivered(backlogs)

    def _replace_undelivered(self, backlogs: Mapping[str, list[Any]]) -> None:
        self._db.execute("DELETE FROM undelivered_alerts")
        self._db.executemany(
            "INSERT INTO undelivered_alerts (receiver, deliveries) VALUES (?, ?)",
            [(k, json.dumps(v, default=str)) for k, v in backlogs.items() if v],
        )

    def alert_outbox(self) -> dict[tuple[str, str, str, bool], AlertEvent]:
        """The failure alerts recorded and not yet handed to the receivers, oldest first."""
        return {
            (str(m), str(s), str(r), bool(resolved)): event_from_json(json.loads(event))
            for identity, event in self._db.execute(
                "SELECT identity, event FROM alert_outbox ORDER BY rowid"
            )
            for m, s, r, resolved in [json.loads(identity)]
        }

    def alerts_handed_over(
        self, sent: Iterable[tuple[str, str, str, bool]], backlogs: Mapping[str, list[Any]]
    ) -> None:
        """``sent`` left the outbox, and ``backlogs`` is what the receivers have not taken
        (of those and earlier ones): one transaction, so each alert is in one or the other."""
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            self._leave_outbox(sent)
            self._replace_undelivered(backlogs)

    def _leave_outbox(self, keys: Iterable[tuple[str, str, str, bool]]) -> None:
        self._db.executemany(
            "DELETE FROM alert_outbox WHERE identity = ?", [(json.dumps(list(k)),) for k in keys]
        )

    def _write_outbox(
        self, events: Iterable[AlertEvent], withdrawn: Iterable[tuple[str, str, str, bool]]
    ) -> None:
        # A later event of the same identity replaces the earlier, and goes to the end.
        self._leave_outbox(withdrawn)
        self._db.executemany(
            "INSERT OR REPLACE INTO alert_outbox (identity, event) VALUES (?, ?)",
            [
                (json.dumps(list(e.identity)), json.dumps(event_json(e), default=str))
                for e in events
            ],
        )

    def open_alerts(self) -> set[tuple[str, str, str]]:
        """(model, server, kind) of the failure alerts raised and not yet resolved."""
        return {
            (model, server, kind)
            for model, server, kind in self._db.execute(
                "SELECT model, server, kind FROM open_alerts"
            )
        }

    def record_pass(self, record: PassRecord) -> None:
        """Everything one pass learned, in one transaction."""
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            for server, models in record.managed.items():
                self._db.execute("DELETE FROM managed WHERE server = ?", (server,))
                self._db.executemany(
                    "INSERT INTO managed (server, model, revision) VALUES (?, ?, ?)",
                    [(server, model, record.revision) for model in sorted(models)],
                )
            self._db.executemany(
                "DELETE FROM holds WHERE deployment = ?", [(name,) for name in record.released]
            )
            self._write_holds(record.holds)
            self._write_rollouts(record.rollouts)
            self._write_applied(record.applied)
            self._write_alerts_and_stages(record)
            self._write_outbox(record.outbox, record.outbox_withdrawn)
            self._write_transitions(record.transitions)
            now = self._clock()
            self._db.execute(
                "INSERT INTO passes (revision, finished_at, ok, summary) VALUES (?, ?, ?, ?)",
                (record.revision, now, int(record.ok), json.dumps(record.summary, sort_keys=True)),
            )
            self._prune(now)
            fault_point("state.write")  # the whole pass is written, not committed

    def _prune(self, now: float) -> None:
        """Forget what is older than ``history_days``: passes (never the latest one, nor the
        latest that succeeded: the next pass starts from it), rollouts (never a server's
        latest of a ModelDeployment, nor its latest that converged: ``status`` and ``undo``
        read them) and on-call actions. Holds, open alerts, undelivered alerts, in-flight
        records, suspensions and what is placed where are the present, not history: never
        pruned. Orders are for the rollouts in progress when they were given: a day on, none
        is."""
        self._db.execute("DELETE FROM operator_orders WHERE at_epoch < ?", (now - 86400,))
        if self.history_days <= 0:
            return
        cutoff = now - self.history_days * 86400
        last_ok = self._db.execute(
            "SELECT id FROM passes WHERE ok = 1 ORDER BY id DESC LIMIT 1"
        ).fetchone()
        self._db.execute(
            "DELETE FROM passes WHERE id IN (SELECT id FROM passes WHERE finished_at < ? "
            "AND id NOT IN (?, (SELECT MAX(id) FROM passes)) ORDER BY finished_at LIMIT ?)",
            (cutoff, last_ok[0] if last_ok else -1, _PRUNE_BATCH),
        )
        self._db.execute(
            "DELETE FROM rollouts WHERE id IN (SELECT id FROM rollouts WHERE finished_at < ? "
            "ORDER BY finished_at LIMIT ?) "
            "AND id NOT IN (SELECT MAX(id) FROM rollouts GROUP BY deployment, server) "
            "AND id NOT IN (SELECT MAX(id) FROM rollouts WHERE outcome = 'converged' "
            "GROUP BY deployment, server)",
            (cutoff, _PRUNE_BATCH),
        )
        self._db.execute(
            "DELETE FROM operator_actions WHERE id IN (SELECT id FROM operator_actions "
            "WHERE at < ? ORDER BY at LIMIT ?)",
            (rfc3339(cutoff), _PRUNE_BATCH),
        )

    def _write_transitions(self, transitions: Mapping[tuple[str, str], tuple[str, str]]) -> None:
        # A pass sees every declared ModelDeployment: one no longer declared is forgotten.
        self._db.execute("DELETE FROM condition_transitions")
        self._db.executemany(
            "INSERT INTO condition_transitions (deployment, type, status, since) "
            "VALUES (?, ?, ?, ?)",
            [(d, kind, status, since) for (d, kind), (status, since) in transitions.items()],
        )

    def _write_rollouts(self, rollouts: Iterable[Rollout]) -> None:
        """The pass's rows; one its journal wrote with a hold (same revision, deployment,
        server, model and target) is completed, not added again. Every journal row ends
        here: one of a pass killed before its record stays as that pass wrote it."""
        new = []
        for r in rollouts:
            values = self._rollout_row(r)
            row = self._db.execute(
                "SELECT id FROM rollouts WHERE id IN (SELECT rollout_id FROM rollouts_in_flight) "
                "AND revision = ? AND deployment = ? AND server = ? AND model = ? "
                "AND to_versions = ?",
                values[:4] + values[5:6],
            ).fetchone()
            if row is None:
                new.append(r)
                continue
            self._db.execute(
                "UPDATE rollouts SET from_versions = ?, outcome = ?, verdict = ?, checks = ?, "
                "error = ?, rollback_seconds = ?, finished_at = ? WHERE id = ?",
                (values[4], *values[6:], row[0]),
            )
            self._db.execute("DELETE FROM rollouts_in_flight WHERE rollout_id = ?", (row[0],))
        self._insert_rollouts(new)
        self._db.execute("DELETE FROM rollouts_in_flight")

    @staticmethod
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

    def _insert_rollouts(self, rollouts: Iterable[Rollout]) -> None:
        self._db.executemany(
            "INSERT INTO rollouts (revision, deployment, server, model, from_versions, "
            "to_versions, outcome, verdict, checks, error, rollback_seconds, finished_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [self._rollout_row(r) for r in rollouts],
        )

    def _write_applied(self, applied: Iterable[AppliedSpec]) -> None:
        self._db.executemany(
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

    def _open_alerts(self, alerts: Iterable[tuple[str, str, str]], revision: str) -> None:
        """(model, server, kind) of failure alerts raised at ``revision``, open until resolved."""
        self._db.executemany(
            "INSERT OR REPLACE INTO open_alerts VALUES (?, ?, ?, ?)",
            [(model, server, kind, revision) for model, server, kind in alerts],
        )

    def _write_alerts_and_stages(self, record: PassRecord) -> None:
        self._db.executemany(
            "INSERT OR REPLACE INTO footprints VALUES (?, ?, ?)",
            [(server, model, size) for (server, model), size in record.footprints.items()],
        )
        self._open_alerts(record.alerts_opened, record.revision)
        self._db.executemany(
            "DELETE FROM open_alerts WHERE model = ? AND server = ?", list(record.alerts_resolved)
        )
        self._db.executemany(
            "DELETE FROM staged_rollouts WHERE deployment = ?",
            [(name,) for name in record.stages_ended],
        )

    def rollouts(self, model: str | None = None, limit: int = 100) -> list[Rollout]:
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
            for row in self._db.execute(query, (*args, limit))
        ]

    # -- webhook deliveries seen (service/webhooks.py), so that a restart forgets no replay --

    def seen_deliveries(self, since: float, limit: int) -> list[tuple[str, float]]:
        """The webhook delivery keys seen after ``since`` (wall clock) with their time, the
        newest ``limit``, oldest first. A store that cannot be read gives none (logged)."""
        rows = self._rows_or_none(
            "webhook deliveries",
            "SELECT key, seen_at FROM webhook_deliveries WHERE seen_at > ? "
            "ORDER BY seen_at DESC, rowid DESC LIMIT ?",
            (since, limit),
        )
        return [(key, at) for key, at in reversed(rows)]

    def remember_deliveries(self, keys: Iterable[str], at: float, since: float, limit: int) -> None:
        """Record ``keys`` as seen at ``at``, forgetting those seen at or before ``since`` and
        all but the newest ``limit``. A failed write is logged: the service's own memory
        still refuses the replay until it restarts."""
        try:
            with self._db:
                self._db.execute("BEGIN IMMEDIATE")
                self._db.executemany(
                    "INSERT OR REPLACE INTO webhook_deliveries (key, seen_at) VALUES (?, ?)",
                    [(key, at) for key in keys],
                )
                self._db.execute("DELETE FROM webhook_deliveries WHERE seen_at <= ?", (since,))
                # By rowid too: the keys of one delivery share their time.
                self._db.execute(
                    "DELETE FROM webhook_deliveries WHERE rowid NOT IN (SELECT rowid FROM "
                    "webhook_deliveries ORDER BY seen_at DESC, rowid DESC LIMIT ?)",
                    (limit,),
                )
        except sqlite3.Error as exc:
            log.warning("state file %s: webhook deliveries cannot be written: %s", self.path, exc)
