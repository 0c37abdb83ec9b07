"""The configs read from the servers, remembered beside the state store from one process to
the next (adapters/config_memory.py, issue 46): a one-shot pass starts from them rather than
reading every loaded model's config again, within the trust the service's kept clients
already have (the model's index entries unchanged, its recheck not due), and a file that
cannot be read costs only the reads.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from reconciler.adapters import config_memory
from reconciler.adapters.config_memory import ConfigMemory, Reading, ServerConfigs
from reconciler.adapters.triton import TritonServerClient
from reconciler.core.triton_config import parse_pbtxt, with_versions
from reconciler.model.serving import VersionState
from testkit.local_triton import LocalTriton
from tests.adapters.test_triton import config_reads

READY = (VersionState(1, "READY"),)
CONFIG = {"name": "echo", "backend": "python", "max_batch_size": 8}


def test_readings_come_back_in_another_process_and_configs_are_kept_once(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.db.configs"
    first = ConfigMemory(path)
    reading = Reading(READY, CONFIG, 1000.0)
    first.remember("a", "127.0.0.1:1", {"echo": reading, "gone": Reading((), None, 999.0)})
    first.remember("b", "127.0.0.1:2", {"echo": reading})

    again = ConfigMemory(path)  # as a new process would
    assert again.recall("a", "127.0.0.1:1") == {
        "echo": reading,
        "gone": Reading((), None, 999.0),
    }
    assert again.recall("b", "127.0.0.1:2") == {"echo": reading}
    assert again.recall("a", "127.0.0.1:9") == {}  # another address: another instance
    with sqlite3.connect(path) as db:
        (configs,) = db.execute("SELECT count(*) FROM configs").fetchone()
    assert configs == 1, "one config on two servers is kept once"


def test_a_file_that_cannot_be_read_is_said_and_every_config_is_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "state.db.configs"
    path.write_bytes(b"not a database, " * 100)
    memory = ConfigMemory(path)
    assert memory.recall("a", "127.0.0.1:1") == {}
    assert "could not be read" in caplog.text and str(path) in caplog.text
    configs = ServerConfigs("a", "127.0.0.1:1", 600.0, time.monotonic, memory)
    assert configs.current("echo", READY) is None
    configs.record("echo", READY, CONFIG)
    configs.remember()  # given up: neither raises nor warns twice
    assert caplog.text.count(str(path)) == 1


def test_a_remembered_config_holds_while_its_index_entries_do_and_its_recheck_is_not_due(
    tmp_path: Path,
) -> None:
    memory = ConfigMemory(tmp_path / "state.db.configs")
    now, wall = [0.0], [10_000.0]
    memory.remember("a", "addr", {"echo": Reading(READY, CONFIG, wall[0] - 100.0)})
    seeded = ServerConfigs("a", "addr", 600.0, lambda: now[0], memory, lambda: wall[0])
    kept = seeded.current("echo", READY)
    assert kept is not None and kept.config == CONFIG
    # Other index entries (a reload, an unload by hand): read again.
    assert seeded.current("echo", (VersionState(2, "READY"),)) is None
    # Past 1.5 rechecks from when it was read: read again, whatever the spread drew.
    now[0] = 900.0
    assert seeded.current("echo", READY) is None
    # A recheck of 0 trusts nothing remembered.
    never = ServerConfigs("a", "addr", 0.0, lambda: 0.0, memory, lambda: wall[0])
    assert never.current("echo", READY) is None


def test_a_new_client_starts_from_what_the_last_one_read(
    triton: LocalTriton, model_repository: Path, tmp_path: Path
) -> None:
    """On a real tritonserver: the second client (a new process's) reads no config; a
    reload by hand with another config leaves Triton's index as it was, so it is trusted
    until the recheck is due (the service's kept clients trust it as long), and read at once
    with ``--config-recheck 0``."""
    path = tmp_path / "state.db.configs"
    base = with_versions(
        parse_pbtxt((model_repository / "echo" / "config.pbtxt").read_text()), "echo", [1]
    )
    first = TritonServerClient("edge-a", triton.grpc_address, config_memory=ConfigMemory(path))
    first.load("echo", base)
    loaded = first.observe(["echo"]).model("echo").loaded_config
    assert loaded is not None
    first.close()  # gives what it read to the file

    def client(recheck: float = 600.0) -> tuple[TritonServerClient, list[str]]:
        fresh = TritonServerClient(
            "edge-a", triton.grpc_address, config_recheck=recheck, config_memory=ConfigMemory(path)
        )
        reads = config_reads(fresh)
        return fresh, reads

    second, reads = client()
    try:
        assert second.observe(["echo"]).model("echo").loaded_config == loaded
        assert reads == [], "a remembered config, the index unchanged: no read"
    finally:
        second.close()

    by_hand = TritonServerClient("someone", triton.grpc_address)
    try:
        by_hand.load("echo", base | {"max_batch_size": 4})
        trusting, reads = client()
        try:
            stale = trusting.observe(["echo"]).model("echo").loaded_config or {}
            assert reads == [] and stale.get("max_batch_size") == loaded.get("max_batch_size")
        finally:
            trusting.close()
        reading, reads = client(recheck=0.0)
        try:
            fresh = reading.observe(["echo"]).model("echo").loaded_config or {}
            assert reads == ["echo"] and fresh.get("max_batch_size") == 4, (reads, fresh)
        finally:
            reading.close()
    finally:
        by_hand.close()


def test_a_config_shared_by_servers_is_written_from_one_dump(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The servers of a pool share one config object per model (adapters/triton_configs):
    it is dumped and hashed once, and an equal config in another object has its digest."""
    dumps: list[object] = []
    dump = config_memory.json.dumps

    def counting(value: object, **options: Any) -> str:
        if isinstance(value, dict):
            dumps.append(value)
        return dump(value, **options)

    monkeypatch.setattr(config_memory.json, "dumps", counting)
    memory = ConfigMemory(tmp_path / "state.db.configs")
    shared = dict(CONFIG)
    for server in ("a", "b", "c"):
        memory.remember(server, f"{server}:1", {"echo": Reading(READY, shared, 1.0)})
    assert dumps == [shared], dumps
    memory.remember("d", "d:1", {"echo": Reading(READY, dict(CONFIG), 1.0)})
    with sqlite3.connect(memory.path) as db:
        (configs,) = db.execute("SELECT count(*) FROM configs").fetchone()
    assert configs == 1, "an equal config in another object: the same digest"
    again = ConfigMemory(memory.path)
    assert [again.recall(s, f"{s}:1")["echo"].config for s in "abcd"] == [CONFIG] * 4
