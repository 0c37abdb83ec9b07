"""Writes the unversioned state files of tests/adapters/test_state_schema.py, one per layout
the state store had before it was versioned, from this repository's own history: the
``_SCHEMA`` (and the two columns added by probing) of ``reconciler/adapters/state.py`` at each
commit below, with a few rows in the tables each had. Run from the repository's root with
``python tests/adapters/state_files/make.py``; the .sql files it writes are committed.
"""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
from pathlib import Path

# The first commit of each distinct layout, oldest first.
LAYOUTS = {
    "d9a1bc2": "managed models and passes",
    "ffee51a": "holds, rollouts, applied specs, open alerts",
    "8c8a2aa": "footprints, a backend revision per applied spec",
    "988f093": "staged rollouts",
    "221f0c1": "revert push records",
    "1b16219": "undelivered alerts",
    "ef8ef16": "suspensions, on-call actions",
    "bbba921": "condition transitions",
    "2fd0025": "operator orders, live status (a branch without condition transitions)",
    "09ac113": "the two branches merged",
    "a456646": "bound source",
    "3970f43": "webhook deliveries (the last unversioned layout)",
}
HERE = Path(__file__).parent
A, B = "a" * 40, "b" * 40


def _source(commit: str) -> str:
    for path in ("reconciler/adapters/state.py", "reconciler/state.py"):
        shown = subprocess.run(
            ["git", "show", f"{commit}:{path}"], capture_output=True, text=True, check=False
        )
        if shown.returncode == 0:
            return shown.stdout
    raise SystemExit(f"{commit}: no state.py")


def _rows(db: sqlite3.Connection) -> None:
    """A few rows in each table there is, in the columns it has."""
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}

    def insert(table: str, **values: object) -> None:
        if table not in tables:
            return
        columns = {r[1] for r in db.execute(f"PRAGMA table_info({table})")}
        kept = {k: v for k, v in values.items() if k in columns}
        marks = ", ".join("?" for _ in kept)
        db.execute(f"INSERT INTO {table} ({', '.join(kept)}) VALUES ({marks})", list(kept.values()))

    insert("managed", server="edge-a", model="echo", revision=A)
    insert("passes", revision=A, finished_at=1.7e9, ok=1, summary=json.dumps({"changes": []}))
    insert("passes", revision=B, finished_at=1.7e9 + 60, ok=0, summary=json.dumps({"n": 2}))
    previous, configs = json.dumps({"edge-a": [1]}), json.dumps({"edge-a": None})
    insert("holds", deployment="scaler", fingerprint="f" * 16, revision=B, reason="analysis "
           "failed", previous=previous, configs=configs, created_at=1.7e9 + 60)  # fmt: skip
    insert("rollouts", revision=A, deployment="echo", server="edge-a", model="echo",
           from_versions="[]", to_versions="[1]", outcome="converged", verdict="passed",
           checks="[]", error=None, rollback_seconds=None, finished_at=1.7e9)  # fmt: skip
    insert("applied_specs", deployment="echo", revision=A, fingerprint="e" * 16,
           versions="[1]", config="{}", backend=None)  # fmt: skip
    insert("footprints", server="edge-a", model="echo", bytes_per_version=1e6)
    insert("suspensions", target="other", by="alice", at="2026-11-01T00:00:00Z", reason="")
    insert("operator_actions", at="2026-11-01T00:00:00Z", verb="suspend", target="other",
           by="alice", detail="")  # fmt: skip
    insert("open_alerts", model="scaler", server="edge-a", kind="analysis-failed", revision=B)


def main() -> None:
    for commit, what in LAYOUTS.items():
        source = _source(commit)
        match = re.search(r'_SCHEMA = """(.*?)"""', source, re.S)
        assert match, commit
        db = sqlite3.connect(":memory:")
        db.executescript(match.group(1))
        if "ADD COLUMN backend" in source:
            db.execute("ALTER TABLE applied_specs ADD COLUMN backend TEXT")
        if "ADD COLUMN reverted" in source:
            db.execute("ALTER TABLE holds ADD COLUMN reverted TEXT")
        _rows(db)
        db.commit()
        dump = "\n".join(db.iterdump())
        (HERE / f"unversioned-{commit}.sql").write_text(f"-- {commit}: {what}\n{dump}\n")
        db.close()


if __name__ == "__main__":
    main()
