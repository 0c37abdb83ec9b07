"""The SQLite state store: what one pass records, the next one reads."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from reconciler.adapters.state import StateStore
from reconciler.plan import History


def test_history_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "state" / "state.db"
    store = StateStore(path)
    assert store.history() == History()
    store.record_pass("a" * 40, {"edge-a": frozenset({"echo", "other"})}, True, {"n": 1})
    store.record_pass("b" * 40, {"edge-b": frozenset({"echo"})}, False, {"n": 2})
    store.close()

    reopened = StateStore(path)
    history = reopened.history()
    assert history.revision == "a" * 40  # the last pass that succeeded
    assert history.managed == {
        "edge-a": frozenset({"echo", "other"}),
        "edge-b": frozenset({"echo"}),
    }
    reopened.record_pass("c" * 40, {"edge-a": frozenset({"echo"})}, True, {})
    assert reopened.history().managed["edge-a"] == frozenset({"echo"})
    reopened.close()
    mode = sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"
