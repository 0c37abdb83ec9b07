"""A TCP proxy on loopback that a test can cut: every connection through it closed at once,
as a network drop or a load balancer's reset would, while new connections go on being
accepted. The reconciler is pointed at the proxy's address instead of Triton's, so a drop
lands between two of its calls, or inside one, with a real Triton behind it. While
``stalled`` is set it accepts connections and says nothing on them (a remote that hangs)."""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType


class TcpProxy:
    def __init__(self, upstream: str, host: str = "127.0.0.1", port: int = 0) -> None:
        self.upstream = upstream  # host:port
        # Port 0: a free one, no race for it; a given port: a proxy back where one went away.
        self._listener = socket.create_server((host, port))
        self.port = int(self._listener.getsockname()[1])
        self.address = f"{host}:{self.port}"
        self.stalled = threading.Event()
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self.cuts = 0  # connections closed by ``cut``
        self._accepting = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> TcpProxy:
        self._accepting.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.go_away()
        self._accepting.join(5)

    def go_away(self) -> None:
        """Stop listening (a new connection is refused) and cut every open one: the server
        gone, as far as its clients can tell."""
        # shutdown wakes the thread blocked in accept(); close alone does not (5 s lost).
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self.cut()

    def cut(self) -> int:
        """Close every connection open through the proxy (both sides); how many."""
        with self._lock:
            sockets, self._open = self._open, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        self.cuts += len(sockets) // 2
        return len(sockets) // 2

    def _accept(self) -> None:
        host, port = self.upstream.rsplit(":", 1)
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            if self.stalled.is_set():
                with self._lock:
                    self._open.append(client)  # never answered; closed by ``cut``
                continue
            try:
                server = socket.create_connection((host, int(port)), timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._open += [client, server]
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        """Bytes from ``source`` to ``sink`` until either side closes; then both close."""
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._open = [s for s in self._open if s not in (source, sink)]
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
