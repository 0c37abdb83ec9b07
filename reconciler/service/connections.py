"""The watch's connections to the servers of the last pass, kept open from one reading of
their index to the next: the first sign of a restart (issue 41, point 3).

A restarted Triton in EXPLICIT mode holds nothing, and answers its index (empty) and its
readiness (200) about 0.1 s after its old process ended (measured here), while the watch
reads every few seconds (``--watch-interval``). The old process's end drops every connection to
it, though, and a connection kept open says so at once. ``Watch.readings``
(service/watch.py) reads each index over these connections; the serving board
(service/serving.py) hears each drop (``dropped``, from a thread of the client library)
and takes the server out of service until a reading begun after the drop says what it
serves, and asks ``up`` before it answers that a server serves (a local question, no call).
The daemon reads again at once after a drop.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from reconciler.ports import ServerConnection
from reconciler.wiring import watch_connection


class ServerConnections:
    """One kept connection per server name; thread-safe (the watch's and the pass's
    readings, the board's questions, the client library's drop events)."""

    def __init__(
        self,
        dropped: Callable[[str], None] = lambda server: None,
        connect: Callable[[str, str], ServerConnection] = watch_connection,
    ) -> None:
        self._dropped = dropped
        self._connect = connect
        self._lock = threading.Lock()
        self._open: dict[str, tuple[str, ServerConnection]] = {}

    def to(self, server: str, address: str) -> ServerConnection:
        """The connection to ``server`` at ``address``: opened at the first call and kept;
        a new one when the server moved to another address."""
        with self._lock:
            kept = self._open.get(server)
            if kept is not None and kept[0] == address:
                return kept[1]
            connection = self._connect(server, address)
            self._open[server] = (address, connection)
        if kept is not None:
            kept[1].close()
        connection.when_dropped(lambda: self._heard(server, connection))
        return connection

    def up(self, server: str) -> bool:
        """Whether the connection to ``server`` is up now (False when none is kept)."""
        with self._lock:
            kept = self._open.get(server)
        return kept is not None and kept[1].connected()

    def keep_only(self, servers: Iterable[str]) -> None:
        """Close the connections to servers the last pass no longer has."""
        keep = set(servers)
        with self._lock:
            gone = [c for s, (_, c) in self._open.items() if s not in keep]
            self._open = {s: kept for s, kept in self._open.items() if s in keep}
        for connection in gone:
            connection.close()

    def close(self) -> None:
        self.keep_only(())

    def _heard(self, server: str, connection: ServerConnection) -> None:
        # A connection replaced or closed may still report its own end: not this server's.
        with self._lock:
            kept = self._open.get(server)
        if kept is not None and kept[1] is connection:
            self._dropped(server)
