"""The SQLite state store: what one pass records, the next one reads."""

from __future__ import annotations

import logging
import sqlite3
import time
from dataclasses import replace
from pathlib import Path

import pytest

from reconciler.adapters.state import StateStore
from reconciler.model.history import AlertEvent, History, Hold, PassRecord, Rollout
from tests.adapters.killed import killed_at


def test_history_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "state" / "state.db"
    store = StateStore(path)
    assert store.history() == History()
    store.record_pass(
        PassRecord("a" * 40, {"edge-a": frozenset({"echo", "other"})}, True, {"n": 1})
    )
    store.record_pass(PassRecord("b" * 40, {"edge-b": frozenset({"echo"})}, False, {"n": 2}))
    store.close()

    reopened = StateStore(path)
    history = reopened.history()
    assert history.revision == "a" * 40  # the last pass that succeeded
    assert history.managed == {
        "edge-a": frozenset({"echo", "other"}),
        "edge-b": frozenset({"echo"}),
    }
    reopened.record_pass(PassRecord("c" * 40, {"edge-a": frozenset({"echo"})}, True, {}))
    assert reopened.history().managed["edge-a"] == frozenset({"echo"})
    reopened.close()
    mode = sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


def test_a_kill_inside_the_pass_transaction_keeps_the_previous_record(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from reconciler.adapters.state import StateStore\n"
        "from reconciler.model.history import Hold, PassRecord\n"
        "store = StateStore(Path(sys.argv[1]))\n"
        "store.record_pass(PassRecord('a' * 40, {'edge-a': frozenset({'echo'})}, True, {'n': 1}))\n"
        "print('first recorded', flush=True)\n"
        "store.record_pass(PassRecord('b' * 40, {'edge-a': frozenset({'other'})}, True, {'n': 2},\n"
        "                  holds=(Hold('echo', 'f', 'b' * 40, 'failed', {'edge-a': (1,)}),)))\n"
        "print('second recorded', flush=True)\n"
    )
    done = killed_at("state.write:2", script, path)
    assert done.stdout.split("\n")[:1] == ["first recorded"]
    assert (tmp_path / "state.db-wal").exists()  # killed with its WAL not checkpointed
    store = StateStore(path)
    assert store.recovered is None
    history = store.history()
    assert history.revision == "a" * 40
    assert history.managed == {"edge-a": frozenset({"echo"})}
    assert history.holds == {}  # nothing of the second pass, not half of it
    last = store.last_pass()
    assert last is not None and last["summary"] == {"n": 1}
    store.close()


def test_garbage_state_file_is_moved_aside_and_started_empty(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "state.db"
    path.write_bytes(b"\x00garbage, not SQLite\xff" * 500)
    with caplog.at_level(logging.ERROR, logger="triton_gitops.state"):
        store = StateStore(path)
    (aside,) = tmp_path.glob("state.db.corrupt-*")
    assert aside.read_bytes().startswith(b"\x00garbage")
    assert store.history() == History()
    assert store.recovered is not None and str(path) in store.recovered
    assert str(aside) in caplog.text and "left alone (not unloaded)" in caplog.text
    store.record_pass(PassRecord("a" * 40, {"edge-a": frozenset({"echo"})}, True, {}))
    store.close()
    assert StateStore(path).history().revision == "a" * 40


def test_a_damaged_page_is_found_at_open(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    store = StateStore(path)
    for n in range(200):  # several pages of rows
        store.record_pass(
            PassRecord(f"{n:040d}", {"edge-a": frozenset({"echo"})}, True, {"pad": "x" * 200})
        )
    store.close()
    data = bytearray(path.read_bytes())
    page = 4096
    assert len(data) > 4 * page
    data[3 * page : 4 * page] = b"\xa5" * page  # the header is intact; a table page is not
    path.write_bytes(bytes(data))
    reopened = StateStore(path)
    assert reopened.recovered is not None and "moved aside" in reopened.recovered
    assert reopened.history() == History()
    reopened.close()


def test_a_missing_state_file_is_said(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "state.db"
    with caplog.at_level(logging.WARNING, logger="triton_gitops.state"):
        StateStore(path).close()
    assert f"state file {path} does not exist" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="triton_gitops.state"):
        StateStore(path).close()
    assert caplog.text == ""


def test_revert_push_records_survive_a_hold_written_again(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state.db")
    hold = Hold("echo", "f1", "a" * 40, "analysis failed", {"edge-a": (1,)})
    store.record_hold(hold)
    assert store.unreverted() == {"echo"}
    store.record_reverted(["echo"], "c" * 40)
    assert store.unreverted() == set()
    store.record_pass(PassRecord("a" * 40, {}, False, {}, holds=(hold,)))  # its own record
    assert store.unreverted() == set()
    store.record_pass(PassRecord("b" * 40, {}, False, {}, holds=(replace(hold, fingerprint="f2"),)))
    assert store.unreverted() == {"echo"}  # another spec failed: its revert is not pushed
    assert store.history().holds["echo"].fingerprint == "f2"
    store.close()


def _failed(outcome: str, rollback: float | None, at: float) -> Rollout:
    # ``at``: seconds from now (a row from 1970 would be pruned as history)
    return Rollout(
        "a" * 40, "echo", "edge-a", "echo", (1,), (4,), outcome, "failed",
        ({"check": "success-rate", "verdict": "fail"},), "analysis failed", rollback,
        time.time() + at,
    )  # fmt: skip


def test_a_hold_keeps_its_row_and_alert_which_the_pass_completes_and_hands_over(
    tmp_path: Path,
) -> None:
    store = StateStore(tmp_path / "state.db")
    hold = Hold("echo", "f1", "a" * 40, "analysis failed", {"edge-a": (1,)})
    early = AlertEvent("rollout-failed", "critical", "echo 4 failed", "a" * 40, "echo", "edge-a",
                       {"checks": "success-rate=0.6 < 0.95"})  # fmt: skip
    store.record_hold(hold, _failed("reverted", None, 1.0), early)
    # What a kill right now leaves: the row, the alert open and in the outbox.
    assert [(r.outcome, r.rollback_seconds) for r in store.rollouts()] == [("reverted", None)]
    assert store.open_alerts() == {("echo", "edge-a", "rollout-failed")}
    assert store.alert_outbox() == {early.identity: early}
    # The pass's record completes that row (one row, not two) and replaces the alert.
    final = replace(early, summary="echo 4 failed; 1 serves again")
    store.record_pass(
        PassRecord("a" * 40, {}, False, {}, rollouts=(_failed("reverted", 0.4, 2.0),),
                   holds=(hold,), outbox=(final,))
    )  # fmt: skip
    assert [(r.outcome, r.rollback_seconds) for r in store.rollouts()] == [("reverted", 0.4)]
    assert list(store.alert_outbox().values()) == [final]
    # A later pass's row of the same rollout (a retry) is a row of its own.
    store.record_pass(
        PassRecord("a" * 40, {}, False, {}, rollouts=(_failed("reverted", 0.5, 3.0),))
    )
    assert len(store.rollouts()) == 2
    # Handed over: out of the outbox and, what a receiver did not take, in its backlog.
    store.alerts_handed_over(store.alert_outbox(), {"am": [{"fire": []}]})
    assert store.alert_outbox() == {}
    assert store.undelivered_alerts() == {"am": [{"fire": []}]}
    store.close()


def test_condition_transitions_are_written_with_the_pass_and_migrated_in(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    # A state file from before condition transitions: it has no such table.
    old = StateStore(path)
    old.record_pass(PassRecord("a" * 40, {}, True, {}))
    old.close()
    with sqlite3.connect(path) as db:
        db.execute("DROP TABLE condition_transitions")
        db.execute("PRAGMA user_version = 0")  # from before versions
    db.close()

    store = StateStore(path)
    assert store.recovered is None and store.history().revision == "a" * 40
    assert store.history().transitions == {}
    first = {("echo", "Ready"): ("True", "2026-12-01T22:13:05Z"), ("gone", "Ready"): ("False", "x")}
    store.record_pass(PassRecord("b" * 40, {}, True, {}, transitions=first))
    assert store.history().transitions == first
    # The next pass's record replaces it: a ModelDeployment no longer declared is forgotten.
    second = {("echo", "Ready"): ("False", "2026-12-01T23:00:00Z")}
    store.record_pass(PassRecord("c" * 40, {}, True, {}, transitions=second))
    store.close()
    assert StateStore(path).history().transitions == second


def test_read_only_reads_the_record_and_never_writes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "state" / "state.db"
    # No file: an empty record, no file and no folder made, no warning about a lost record.
    with caplog.at_level(logging.WARNING, logger="triton_gitops.state"):
        empty = StateStore(path, read_only=True)
    assert empty.history() == History() and empty.rollouts() == []
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        empty.record_pass(PassRecord("a" * 40, {}, True, {}))
    empty.close()
    assert not path.parent.exists() and caplog.text == ""

    writer = StateStore(path)
    writer.record_pass(PassRecord("a" * 40, {"edge-a": frozenset({"echo"})}, True, {}))
    writer.close()
    # A file from before a table was added: read from a migrated copy, the file untouched.
    with sqlite3.connect(path) as db:
        db.execute("DROP TABLE condition_transitions")
        db.execute("PRAGMA user_version = 0")  # from before versions
    db.close()
    before = path.read_bytes()
    reader = StateStore(path, read_only=True)
    assert reader.history().managed == {"edge-a": frozenset({"echo"})}
    assert reader.recovered is None
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        reader.save_undelivered_alerts({"am": [{"x": 1}]})
    reader.close()
    assert path.read_bytes() == before

    path.write_bytes(b"garbage" * 1000)
    with caplog.at_level(logging.WARNING, logger="triton_gitops.state"):
        damaged = StateStore(path, read_only=True)
    assert damaged.history() == History()
    damaged.close()
    assert f"state file {path} is unreadable" in caplog.text
    assert path.read_bytes() == b"garbage" * 1000  # not moved aside: apply does that
    assert not list(path.parent.glob("*.corrupt-*"))


def test_what_runs_beside_a_rollout_reads_nothing_from_a_store_it_cannot_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "state.db"
    store = StateStore(path)
    with sqlite3.connect(path) as other:  # the tables gone under the running store
        other.execute("DROP TABLE operator_orders")
        other.execute("DROP TABLE webhook_deliveries")
    other.close()
    with caplog.at_level(logging.WARNING, logger="triton_gitops.state"):
        assert store.orders("echo", 0.0) == []
        assert store.seen_deliveries(0.0, 10) == []
    assert f"state file {path}: the operator's orders cannot be read" in caplog.text
    assert f"state file {path}: webhook deliveries cannot be read" in caplog.text
    store.close()
