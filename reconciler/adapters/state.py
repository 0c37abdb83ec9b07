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
rollouts and on-call actions older than ``history_days`` (``state_tables.prune``); the present
(holds, open alerts, in-flight records) is never pruned. This class decides the transactions;
``state_file.py`` opens the file and ``state_tables.py`` maps the records to rows.

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

from reconciler.adapters.alerts import event_from_json
from reconciler.adapters.state_file import open_for_writing, open_read_only
from reconciler.adapters.state_tables import (
    AlertKey,
    insert_rollouts,
    leave_outbox,
    open_alerts,
    prune,
    read_history,
    read_rollouts,
    replace_undelivered,
    write_holds,
    write_outbox,
    write_pass,
)
from reconciler.core.records import rfc3339
from reconciler.faults import fault_point
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
    Suspension,
)
from reconciler.model.settings import DEFAULT_HISTORY_DAYS

log = logging.getLogger("triton_gitops.state")


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
        ever; see ``state_tables.prune``); ``clock``: the wall clock the record is written with."""
        self.path = path
        self.history_days = history_days
        self._clock = clock
        self.recovered: str | None = None  # what happened to an unreadable or missing file
        if read_only:
            self._db = open_read_only(path)
        else:
            self._db, self.recovered = open_for_writing(path)

    def close(self) -> None:
        self._db.close()

    def history(self) -> History:
        return read_history(self._db, self.suspensions())

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

    def record_hold(
        self, hold: Hold, rollout: Rollout | None = None, alert: AlertEvent | None = None
    ) -> None:
        """A rollout failed and its revert is about to run: held at once, in its own
        transaction, so a reconciler killed mid-revert does not try the failed spec again;
        with it the rollout's row as far as it is known (the pass's record completes it) and
        its failure alert, open and in the outbox, so that a kill loses neither."""
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            write_holds(self._db, [hold], self._clock())
            if rollout is not None:
                insert_rollouts(self._db, [rollout])
                self._db.execute(
                    "INSERT INTO rollouts_in_flight (rollout_id) VALUES (last_insert_rowid())"
                )
            if alert is not None:
                write_outbox(self._db, [alert], ())
                open_alerts(
                    self._db, [(alert.model or "", alert.server or "", alert.kind)], alert.revision
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
            replace_undelivered(self._db, backlogs)

    def alert_outbox(self) -> dict[AlertKey, AlertEvent]:
        """The failure alerts recorded and not yet handed to the receivers, oldest first."""
        return {
            (str(m), str(s), str(r), bool(resolved)): event_from_json(json.loads(event))
            for identity, event in self._db.execute(
                "SELECT identity, event FROM alert_outbox ORDER BY rowid"
            )
            for m, s, r, resolved in [json.loads(identity)]
        }

    def alerts_handed_over(
        self, sent: Iterable[AlertKey], backlogs: Mapping[str, list[Any]]
    ) -> None:
        """``sent`` left the outbox, and ``backlogs`` is what the receivers have not taken
        (of those and earlier ones): one transaction, so each alert is in one or the other."""
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            leave_outbox(self._db, sent)
            replace_undelivered(self._db, backlogs)

    def open_alerts(self) -> set[tuple[str, str, str]]:
        """(model, server, kind) of the failure alerts raised and not yet resolved."""
        return {
            (model, server, kind)
            for model, server, kind in self._db.execute(
                "SELECT model, server, kind FROM open_alerts"
            )
        }

    def record_pass(self, record: PassRecord) -> None:
        """Everything one pass learned, in one transaction, and what is older than
        ``history_days`` forgotten in it (``state_tables.prune``)."""
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            now = self._clock()
            write_pass(self._db, record, now)
            prune(self._db, now, self.history_days)
            fault_point("state.write")  # the whole pass is written, not committed

    def rollouts(self, model: str | None = None, limit: int = 100) -> list[Rollout]:
        """The latest rollouts, newest first, optionally of one model."""
        return read_rollouts(self._db, model, limit)

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
