"""A tiny HTTP/1.1 server that records every request it gets: a mirror target for Envoy's
request mirror policies (tests/integration/test_sse_mirror.py).

Each request is kept whole (``Received``: method, path, headers, the body as received,
de-chunked, and whether it came chunked), and answered 200, either as server-sent events
(``text/event-stream``, a few ``data:`` events sent as chunks, as Triton's
``generate_stream`` answers) or as a short plain body; ``delay`` seconds before the answer
stand for a slow mirror target. It runs in this process, on threads, on loopback; ``stop``
(or leaving the ``with``) shuts it down, its open connections with it (a mirror target gone).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Literal

Answer = Literal["sse", "plain"]


@dataclass(frozen=True)
class Received:
    method: str
    path: str
    headers: dict[str, str]  # names lower-cased
    body: bytes
    chunked: bool  # the body came with Transfer-Encoding: chunked
    at: float  # time.monotonic() when the whole request had been read


@dataclass
class CountingServer:
    host: str = "127.0.0.1"
    answer: Answer = "sse"
    delay: float = 0.0  # seconds before answering
    received: list[Received] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _open: set[socket.socket] = field(default_factory=set)  # connections being served
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        assert self._server is not None, "start the server first"
        return f"{self.host}:{self._server.server_address[1]}"

    def start(self) -> CountingServer:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive: Envoy pools its upstream connections

            def setup(self) -> None:
                super().setup()
                with owner._lock:
                    owner._open.add(self.connection)

            def finish(self) -> None:
                with owner._lock:
                    owner._open.discard(self.connection)
                super().finish()

            def do_POST(self) -> None:
                owner._record(self)

            def do_GET(self) -> None:
                owner._record(self)

            def do_PRI(self) -> None:  # HTTP/2's preface: a copy sent in h2 to this server
                owner._record(self)
                self.close_connection = True

            def log_message(self, *_: object) -> None:
                pass

        self._server = ThreadingHTTPServer((self.host, 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening and close every open connection (a keep-alive connection would
        otherwise go on being served)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        with self._lock:
            open_connections, self._open = list(self._open), set()
        for connection in open_connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> CountingServer:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def taken(self) -> list[Received]:
        """What was received so far, and forget it."""
        with self._lock:
            taken, self.received = self.received, []
        return taken

    def _record(self, handler: BaseHTTPRequestHandler) -> None:
        headers = {k.lower(): v for k, v in handler.headers.items()}
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        h2 = handler.command == "PRI"  # recorded, not read nor answered
        body = b"" if h2 else _chunked_body(handler) if chunked else _sized_body(handler, headers)
        with self._lock:
            self.received.append(
                Received(handler.command, handler.path, headers, body, chunked, time.monotonic())
            )
        if h2:
            return
        if self.delay:
            time.sleep(self.delay)
        if self.answer == "plain":
            handler.send_response(200)
            handler.send_header("Content-Type", "text/plain")
            handler.send_header("Content-Length", "2")
            handler.end_headers()
            handler.wfile.write(b"ok")
            return
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        for token in range(3):
            event = f'data: {{"TOKEN":{token},"model_name":"mirror"}}\n\n'.encode()
            handler.wfile.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
            handler.wfile.flush()
        handler.wfile.write(b"0\r\n\r\n")


def _sized_body(handler: BaseHTTPRequestHandler, headers: dict[str, str]) -> bytes:
    return handler.rfile.read(int(headers.get("content-length", "0") or 0))


def _chunked_body(handler: BaseHTTPRequestHandler) -> bytes:
    body = b""
    while True:
        size = int(handler.rfile.readline().split(b";")[0].strip() or b"0", 16)
        if size == 0:
            # Trailers, if any, up to the empty line.
            while handler.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass
            return body
        body += handler.rfile.read(size)
        handler.rfile.readline()  # the CRLF after the chunk
