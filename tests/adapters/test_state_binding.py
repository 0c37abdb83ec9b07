"""The state store's binding to the repository it records (``StateStore.bound_source``)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from reconciler.adapters.state import StateStore


def test_the_first_binding_stays_and_survives_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    store = StateStore(path)
    assert store.bound_source() is None
    store.bind_source("https://git.example/fleet.git", "manifests")
    store.bind_source("https://git.example/other.git", "")  # bound already: kept
    store.close()
    for read_only in (False, True):
        again = StateStore(path, read_only=read_only)
        assert again.bound_source() == ("https://git.example/fleet.git", "manifests")
        again.close()


def test_a_store_from_before_the_binding_gets_it_unbound(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    StateStore(path).close()
    with sqlite3.connect(path) as db:
        db.execute("DROP TABLE bound_source")  # as a store written by an older version
        db.execute("PRAGMA user_version = 0")
    reader = StateStore(path, read_only=True)  # plan, status: a copy migrated in memory
    assert reader.bound_source() is None
    reader.close()
    store = StateStore(path)
    assert store.recovered is None  # read as it is, not moved aside
    assert store.bound_source() is None
    store.bind_source("/srv/fleet", "")
    assert store.bound_source() == ("/srv/fleet", "")
    store.close()
