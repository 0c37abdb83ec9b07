"""The HTTP front door: bounded request reading (deadline, body caps,
chunked bodies) and the listener with its connection cap.
"""

from __future__ import annotations

import io
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class _DeadlineReader(io.RawIOBase):
    """A socket's bytes, refused once ``deadline`` (time.monotonic) has passed.

    A per-recv timeout alone lets a client that sends a byte just before each timeout hold
    the connection forever; every recv here waits at most until the one deadline.
    """

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        super().__init__()
        self.sock = sock
        self.deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("request not received within the deadline")
        self.sock.settimeout(remaining)
        return self.sock.recv_into(buffer)


class BodyTooLarge(Exception):
    pass


def read_chunked(rfile: io.BufferedIOBase, limit: int) -> bytes:
    """A chunked request body, refused (``BodyTooLarge``) as soon as a chunk's declared size
    would take it over ``limit``: before that chunk is read. ``ValueError`` when malformed."""
    body = bytearray()
    while True:
        line = rfile.readline(1024)
        if not line.endswith(b"\n"):
            raise ValueError("chunk size line missing or too long")
        size = int(line.split(b";", 1)[0].strip(), 16)
        if size < 0:
            raise ValueError("negative chunk size")
        if len(body) + size > limit:
            raise BodyTooLarge
        if size == 0:
            break
        chunk = rfile.read(size)
        if len(chunk) != size or rfile.read(2) != b"\r\n":
            raise ValueError("chunk shorter than declared")
        body += chunk
    for _ in range(100):  # trailer fields, up to the blank line
        line = rfile.readline(1024)
        if line in (b"\r\n", b"\n", b""):
            return bytes(body)
    raise ValueError("too many trailer lines")


class _Listener(ThreadingHTTPServer):
    """A thread per connection, at most ``max_connections`` of them; one over is answered
    503 at once and closed, so a flood costs a bounded number of threads."""

    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        max_connections: int,
        on_refused: Callable[[str], None],
    ) -> None:
        super().__init__(address, handler)
        self._slots = threading.BoundedSemaphore(max_connections)
        self._on_refused = on_refused

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            try:
                # Read what the client already sent, so that closing does not reset the
                # connection and lose the answer; never wait for more.
                request.setblocking(False)
                request.recv(65536)
            except OSError:
                pass
            try:
                request.settimeout(1.0)
                request.sendall(
                    b"HTTP/1.0 503 Service Unavailable\r\nRetry-After: 5\r\n"
                    b"Content-Length: 0\r\nConnection: close\r\n\r\n"
                )
            except OSError:
                pass
            self.shutdown_request(request)
            self._on_refused("busy")
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # The default prints a traceback to stderr, outside the JSON log; a client that
        # resets its connection is not worth one.
        self._on_refused("error")
