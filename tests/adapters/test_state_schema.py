"""The state store's versioned schema: a file of every earlier version, migrated; a newer one
refused; a failed or killed migration leaving the file at the version it had."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from reconciler.adapters import state_schema
from reconciler.adapters.state import StateStore
from reconciler.adapters.state_schema import LATEST, MIGRATIONS, Migration, migrate, version
from reconciler.model.errors import MigrationFailed, NewerStateFile
from reconciler.model.history import PassRecord
from testkit.cli_run import cli
from tests.adapters.killed import killed_at

FILES = Path(__file__).parent / "state_files"
UNVERSIONED = sorted(FILES.glob("unversioned-*.sql"))
A, B, C = "a" * 40, "b" * 40, "c" * 40


def _file_from(sql: Path, path: Path) -> Path:
    db = sqlite3.connect(path)
    db.executescript(sql.read_text())
    db.close()
    return path


def _tables(path: Path) -> set[str]:
    with sqlite3.connect(path) as db:
        return {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def _version_of(path: Path) -> int:
    db = sqlite3.connect(path)
    try:
        return version(db)
    finally:
        db.close()


def test_every_unversioned_layout_is_kept_in_a_file() -> None:
    # make.py writes one per layout; a layout added without its file would go untested.
    assert len(UNVERSIONED) == 12


@pytest.mark.parametrize("sql", UNVERSIONED, ids=lambda p: p.stem)
def test_a_file_from_before_versions_is_migrated_with_its_record(sql: Path, tmp_path: Path) -> None:
    path = _file_from(sql, tmp_path / "state.db")
    had = _tables(path)
    assert _version_of(path) == 0

    # A reader first: it reads the record from a copy migrated in memory; the file untouched.
    before = path.read_bytes()
    reader = StateStore(path, read_only=True)
    assert reader.history().revision == A and reader.recovered is None
    reader.close()
    assert path.read_bytes() == before

    store = StateStore(path)
    assert store.recovered is None  # migrated in place, not moved aside
    history = store.history()
    assert history.revision == A  # the last pass that succeeded
    assert history.managed == {"edge-a": frozenset({"echo"})}
    if "holds" in had:
        assert history.holds["scaler"].revision == B
        with sqlite3.connect(":memory:") as probe:
            probe.executescript(sql.read_text())
            columns = {r[1] for r in probe.execute("PRAGMA table_info(holds)")}
        # A hold from before revert push records: whether its revert was pushed is unknown,
        # so it is never pushed again; one from after keeps what its file said (not pushed).
        assert store.unreverted() == (set() if "reverted" not in columns else {"scaler"})
    if "rollouts" in had:
        assert [r.to_versions for r in store.rollouts("echo")] == [(1,)]
    if "suspensions" in had:
        assert [s.target for s in store.suspensions()] == ["other"]
    if "open_alerts" in had:
        assert store.open_alerts() == {("scaler", "edge-a", "analysis-failed")}
    # Every table and column of this release is there: a pass records and reads back.
    store.record_pass(PassRecord(C, {"edge-a": frozenset({"echo", "other"})}, True, {}))
    store.bind_source("/srv/fleet", "")
    assert store.history().revision == C
    store.close()
    assert _version_of(path) == LATEST
    again = StateStore(path)  # migrated once: opening again changes nothing
    assert again.history().managed == {"edge-a": frozenset({"echo", "other"})}
    again.close()


@pytest.mark.parametrize("earlier", [m.version for m in MIGRATIONS[:-1]])
def test_a_file_at_each_earlier_version_is_migrated_with_its_record(
    earlier: int, tmp_path: Path
) -> None:
    path = tmp_path / "state.db"
    db = sqlite3.connect(path, isolation_level=None)
    assert [m.version for m in migrate(db, str(path), to=earlier)] == list(range(1, earlier + 1))
    db.execute(
        "INSERT INTO passes (revision, finished_at, ok, summary) VALUES (?, 1.7e9, 1, '{}')", (A,)
    )
    db.execute("INSERT INTO managed VALUES ('edge-a', 'echo', ?)", (A,))
    db.execute(
        "INSERT INTO rollouts (revision, deployment, server, model, from_versions, to_versions, "
        "outcome, checks, finished_at) VALUES (?, 'echo', 'edge-a', 'echo', '[]', '[1]', "
        "'converged', '[]', 1.7e9)",
        (A,),
    )
    db.close()
    assert _version_of(path) == earlier

    store = StateStore(path)
    assert store.recovered is None
    assert store.history().revision == A
    assert store.history().managed == {"edge-a": frozenset({"echo"})}
    assert [r.to_versions for r in store.rollouts("echo")] == [(1,)]
    store.close()
    assert _version_of(path) == LATEST


def test_a_new_file_is_at_the_latest_version(tmp_path: Path) -> None:
    StateStore(tmp_path / "state.db").close()
    assert _version_of(tmp_path / "state.db") == LATEST


def test_a_file_from_a_newer_release_is_refused_and_left_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    store = StateStore(path)
    store.record_pass(PassRecord(A, {"edge-a": frozenset({"echo"})}, True, {}))
    store.close()
    with sqlite3.connect(path) as db:
        db.execute(f"PRAGMA user_version = {LATEST + 1}")
    db.close()
    before = path.read_bytes()

    for read_only in (False, True):
        with pytest.raises(NewerStateFile) as refused:
            StateStore(path, read_only=read_only)
        assert f"state file {path} has schema version {LATEST + 1}" in str(refused.value)
        assert f"knows versions up to {LATEST}" in str(refused.value)
    # What an operator sees: the reason, and no traceback; the file neither moved nor changed.
    shown = cli("history", "--state", str(path))
    assert shown.code == 1, shown.out + shown.err
    assert "written by a newer triton-gitops" in shown.err and "Traceback" not in shown.err
    # The service refuses to start on it, with the same words (a downgraded pod: its log).
    remote = tmp_path / "remote.git"
    subprocess.run(["git", "init", "-q", "--bare", str(remote)], check=True)
    service = subprocess.run(
        [sys.executable, "-m", "reconciler", "run", "--repo", remote.as_uri(), "--state",
         str(path), "--cache-dir", str(tmp_path / "cache"), "--listen", "127.0.0.1:0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert service.returncode == 1, service.stderr
    assert "written by a newer triton-gitops" in service.stderr
    assert "Traceback" not in service.stderr
    assert path.read_bytes() == before
    assert not list(tmp_path.glob("*.corrupt-*"))


def test_a_failed_migration_is_rolled_back_and_the_file_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "state.db"
    store = StateStore(path)
    store.record_pass(PassRecord(A, {"edge-a": frozenset({"echo"})}, True, {}))
    store.close()

    def half_done(db: sqlite3.Connection) -> None:
        db.execute("CREATE TABLE half (x)")
        db.execute("ALTER TABLE no_such_table ADD COLUMN y")  # a bug in a migration

    broken = Migration(LATEST + 1, "a broken step", half_done)
    monkeypatch.setattr(state_schema, "MIGRATIONS", (*MIGRATIONS, broken))
    monkeypatch.setattr(state_schema, "LATEST", LATEST + 1)
    with pytest.raises(MigrationFailed) as failed:
        StateStore(path)
    message = str(failed.value)
    assert f"from schema version {LATEST} to {LATEST + 1} (a broken step) failed" in message
    assert "no_such_table" in message and f"the file is at version {LATEST}" in message
    assert _version_of(path) == LATEST and "half" not in _tables(path)
    assert not list(tmp_path.glob("*.corrupt-*"))  # a bug, not damage: never moved aside


def test_a_kill_mid_migration_leaves_the_version_before_and_the_next_opening_finishes(
    tmp_path: Path,
) -> None:
    path = _file_from(FILES / "unversioned-3970f43.sql", tmp_path / "state.db")
    script = (
        "import sys\nfrom pathlib import Path\n"
        "from reconciler.adapters.state import StateStore\n"
        "StateStore(Path(sys.argv[1]))\n"
    )
    killed_at("state.migrate:2", script, path)
    assert _version_of(path) == 1  # migration 1 committed, migration 2 never did
    store = StateStore(path)
    assert store.recovered is None and store.history().revision == A
    store.close()
    assert _version_of(path) == LATEST


def test_each_migration_has_the_next_number() -> None:
    assert [m.version for m in MIGRATIONS] == list(range(1, LATEST + 1))
    assert all(m.summary for m in MIGRATIONS)
