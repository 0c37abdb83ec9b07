"""The configs each Triton server runs its models with, as last read, remembered from one
process to the next: a one-shot pass (``apply``, ``plan``, the service's first pass after a
restart) starts from them instead of asking every server for every loaded model's config.

Triton's index says which versions of a model are loaded, not with which config, so a
client reads each loaded model's config (``adapters.triton.TritonServerClient.observe``):
at 1,000 servers x 100 models that is 100,000 calls, 65 s of a one-shot pass (issue 46).
The service's clients keep what they read from pass to pass and read a config again when
the model's index entries change, and otherwise every ``--config-recheck`` seconds (a hand
reload with another config leaves the index as it was). This file extends that same trust
across processes: a reading is used while the model's index entries are the ones it was
read with and its recheck is not due; past that, or for a model the plan loads, the config
is read again.

A cache, nothing more: a SQLite file beside the state store (``<state>.configs``), written
without waiting for the disk; one that cannot be read or written is said in the log and
left, and the pass reads every config as before. Configs are kept once by their digest (a
model's config is the same on every server of a pool).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import random
import sqlite3
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reconciler.model.serving import VersionState

_log = logging.getLogger("triton_gitops")

_DIGESTS_KEPT = 4096  # distinct configs whose digest is kept (a fleet runs few)

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS configs (digest TEXT PRIMARY KEY, body BLOB NOT NULL)",
    "CREATE TABLE IF NOT EXISTS readings ("
    " server TEXT NOT NULL, address TEXT NOT NULL, body BLOB NOT NULL,"
    " PRIMARY KEY (server, address))",
)


@dataclass(frozen=True)
class Reading:
    """One model's config on one server, as read: the model's index entries then, the config
    (None: the server had none to give) and when it was read (seconds since the epoch)."""

    versions: tuple[VersionState, ...]
    config: dict[str, Any] | None
    read_at: float


@dataclass(frozen=True)
class CachedConfig:
    versions: tuple[VersionState, ...]  # the model's index entries when it was read
    config: dict[str, Any] | None
    generation: int  # changes when a re-read finds another config
    due: float  # when to read it again anyway (the client's clock)
    read_at: float  # when it was read (seconds since the epoch)


class ServerConfigs:
    """The configs one client read from its server, by model: one stays the model's while
    its index entries are those it was read with and its recheck is not due (``recheck``
    seconds, spread over half to one and a half, so the configs read in one pass are not all
    read again in one later pass). With a ``memory``, it starts from what was read before,
    by this process or another, and gives it back at ``remember``."""

    def __init__(
        self,
        server: str,
        address: str,
        recheck: float,
        clock: Callable[[], float],
        memory: ConfigMemory | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.server, self.address, self.recheck = server, address, recheck
        self._clock, self._wall_clock, self._memory = clock, wall_clock, memory
        self._generations = itertools.count()
        self._entries: dict[str, CachedConfig] = {}
        if memory is not None:
            now, wall = clock(), wall_clock()
            for model, reading in memory.recall(server, address).items():
                due = now + (reading.read_at + self._spread() - wall)
                self._entries[model] = CachedConfig(
                    reading.versions, reading.config, next(self._generations), due,
                    reading.read_at,
                )  # fmt: skip

    def _spread(self) -> float:
        return self.recheck * (0.5 + random.random())

    def current(self, model: str, versions: tuple[VersionState, ...]) -> CachedConfig | None:
        cached = self._entries.get(model)
        if cached is not None and cached.versions == versions and self._clock() < cached.due:
            return cached
        return None

    def of(
        self,
        loaded: Mapping[str, tuple[VersionState, ...]],
        read: Callable[[Iterable[str]], Mapping[str, dict[str, Any] | None]],
    ) -> dict[str, CachedConfig]:
        """The config each loaded model runs with (by its index entries): the one kept where
        it is ``current``, the others ``read`` from the server, together, and recorded."""
        found: dict[str, CachedConfig] = {}
        for model, versions in loaded.items():
            cached = self.current(model, versions)
            if cached is not None:
                found[model] = cached
        for model, config in read([m for m in loaded if m not in found]).items():
            found[model] = self.record(model, loaded[model], config)
        return found

    def record(
        self, model: str, versions: tuple[VersionState, ...], config: dict[str, Any] | None
    ) -> CachedConfig:
        cached = self._entries.get(model)
        generation = (
            cached.generation
            if cached is not None and cached.config == config
            else next(self._generations)
        )
        entry = CachedConfig(
            versions, config, generation, self._clock() + self._spread(), self._wall_clock()
        )
        self._entries[model] = entry
        return entry

    def forget(self, model: str) -> None:
        self._entries.pop(model, None)

    def remember(self) -> None:
        if self._memory is not None:
            readings = {
                m: Reading(c.versions, c.config, c.read_at) for m, c in self._entries.items()
            }
            self._memory.remember(self.server, self.address, readings)


def memory_path(state_path: Path) -> Path:
    return state_path.with_name(state_path.name + ".configs")


class ConfigMemory:
    """The readings of every server, read from the file once (at the first ``recall``) and
    written back per server (``remember``, at a client's close). Thread-safe: a pass observes
    its servers in parallel."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._recalled: dict[tuple[str, str], dict[str, Reading]] | None = None
        self._stored: set[str] = set()  # config digests in the file
        self._digests: dict[int, tuple[dict[str, Any], str, bytes]] = {}
        self._broken = False

    def recall(self, server: str, address: str) -> dict[str, Reading]:
        with self._lock:
            if self._recalled is None:
                self._recalled = self._read()
            return dict(self._recalled.get((server, address), {}))

    def remember(self, server: str, address: str, readings: Mapping[str, Reading]) -> None:
        with self._lock:
            if self._recalled is not None and self._recalled.get((server, address)) == readings:
                return  # nothing new: the file already says this
            try:
                self._write(server, address, readings)
            except (sqlite3.Error, OSError) as exc:
                self._give_up("written", exc)

    @contextmanager
    def _connected(self) -> Iterator[sqlite3.Connection]:
        """A connection for one read or write, closed after it: a process may hold memories
        of many state stores (the tests' passes do), and open connections would hold three
        file descriptors each for the process's life."""
        if self._broken:
            raise sqlite3.OperationalError("given up earlier")
        connection = sqlite3.connect(self.path, timeout=5.0)
        try:
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA synchronous=OFF")  # a cache: a lost write costs reads
            for statement in _SCHEMA:
                connection.execute(statement)
            yield connection
        finally:
            connection.close()

    def _read(self) -> dict[tuple[str, str], dict[str, Reading]]:
        if not self.path.exists():
            return {}
        try:
            with self._connected() as connection:
                return self._recalled_from(connection)
        except (sqlite3.Error, OSError, ValueError, KeyError, TypeError, zlib.error) as exc:
            self._give_up("read", exc)
            return {}

    def _recalled_from(
        self, connection: sqlite3.Connection
    ) -> dict[tuple[str, str], dict[str, Reading]]:
        configs = {
            digest: json.loads(zlib.decompress(body))
            for digest, body in connection.execute("SELECT digest, body FROM configs")
        }
        self._stored = set(configs)
        recalled: dict[tuple[str, str], dict[str, Reading]] = {}
        for server, address, body in connection.execute(
            "SELECT server, address, body FROM readings"
        ):
            recalled[(server, address)] = {
                model: Reading(
                    tuple(VersionState(int(v), str(s), str(r)) for v, s, r in versions),
                    None if digest is None else configs[digest],
                    float(read_at),
                )
                for model, versions, digest, read_at in json.loads(zlib.decompress(body))
            }
        return recalled

    def _write(self, server: str, address: str, readings: Mapping[str, Reading]) -> None:
        rows = []
        new_configs: list[tuple[str, bytes]] = []
        for model, reading in sorted(readings.items()):
            digest = None
            if reading.config is not None:
                digest, text = self._digest(reading.config)
                if digest not in self._stored:
                    new_configs.append((digest, zlib.compress(text)))
                    self._stored.add(digest)
            versions = [[v.version, v.state, v.reason] for v in reading.versions]
            rows.append([model, versions, digest, reading.read_at])
        body = zlib.compress(json.dumps(rows, separators=(",", ":")).encode())
        with self._connected() as connection, connection:
            connection.executemany(
                "INSERT OR IGNORE INTO configs (digest, body) VALUES (?, ?)", new_configs
            )
            connection.execute(
                "INSERT OR REPLACE INTO readings (server, address, body) VALUES (?, ?, ?)",
                (server, address, body),
            )
        if self._recalled is not None:
            self._recalled[(server, address)] = dict(readings)

    def _digest(self, config: dict[str, Any]) -> tuple[str, bytes]:
        """A config's digest and text. Kept by the config object: the servers of a pool share
        one object per config (``adapters/triton_configs``, and ``_recalled_from`` here), so
        a fleet's 100,000 readings are dumped and hashed once per distinct config."""
        known = self._digests.get(id(config))
        if known is not None and known[0] is config:
            return known[1], known[2]
        text = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
        digest = hashlib.sha256(text).hexdigest()
        if len(self._digests) >= _DIGESTS_KEPT:
            self._digests.clear()
        # The object is kept with its digest, so that its id cannot be reused meanwhile.
        self._digests[id(config)] = (config, digest, text)
        return digest, text

    def _give_up(self, doing: str, exc: Exception) -> None:
        if not self._broken:
            _log.warning(
                "the configs remembered in %s could not be %s (%s): every loaded model's "
                "config is read from its server",
                self.path,
                doing,
                exc,
            )
        self._broken = True
