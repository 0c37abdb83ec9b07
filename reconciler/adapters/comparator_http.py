"""The comparator's HTTP listener (issue 43, point 1): where a router mirrors the copies of
Triton's HTTP ``generate_stream`` requests (server-sent events), beside the gRPC listener of
``adapters/comparator.py`` that takes the ModelInfer and ModelStreamInfer copies. It runs
while the gRPC one does (``LiveComparator`` starts and stops both), bound at
``--comparator-http-listen``.

Envoy mirrors an SSE request as any HTTP request: the copy starts with the headers, gets the
body as the client sends it (Content-Length or chunked) and its answer is thrown away
(``tests/integration/test_sse_mirror.py``). Each copy is read whole, answered at once with an
empty 200, and handed on: a ``generate_stream`` copy as a ``Generation`` for the sessions to
sample and compare; a unary ``generate`` or ``infer`` copy as not compared, with why;
anything else (health, metadata) is answered and not counted. The HTTP/1.1 framing (request
line, headers, Content-Length and chunked bodies, keep-alive, malformed input) is h11's, the
python-hyper state machine httpx's own transport runs on, over a thread per connection.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import socket
import socketserver
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass

import h11

from reconciler.adapters.comparator_calls import Generation

log = logging.getLogger(__name__)

MAX_BODY = 1 << 20  # bytes of a copy's body read, at most (a prompt's JSON); larger: 413
IDLE = 60.0  # seconds a kept-alive connection may wait for its next request
MAX_CONNECTIONS = 64  # connections served at once; more are closed at once
_CHUNK = 65_536
# KServe v2 over HTTP: /v2/models/{model}[/versions/{version}]/{endpoint}
_INFERENCE = re.compile(
    r"^/v2/models/(?P<model>[^/]+)(?:/versions/(?P<version>[^/]+))?/(?P<endpoint>[^/]+)$"
)
_UNARY = ("generate", "infer")


@dataclass(frozen=True)
class NotCompared:
    """A mirrored inference request the comparator cannot compare: its model, and why."""

    model: str
    why: str


def copy_of(method: str, target: str, body: bytes) -> Generation | NotCompared | None:
    """What a mirrored HTTP request is: a ``Generation`` (POST .../generate_stream with a
    JSON object for body), a ``NotCompared`` inference request (a unary ``generate`` or
    ``infer``, or a body that is no JSON object), or None when it is no inference request
    (health, metadata, another path): not counted. Pure."""
    path = urllib.parse.urlsplit(target).path
    found = _INFERENCE.match(path)
    if method != "POST" or found is None:
        return None
    model, endpoint = urllib.parse.unquote(found["model"]), found["endpoint"]
    if endpoint in _UNARY:
        return NotCompared(model, f"POST {path}: over HTTP only generate_stream is compared")
    if endpoint != "generate_stream":
        return None
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        return NotCompared(model, f"POST {path}: the body is not a JSON object ({len(body)} bytes)")
    return Generation(model, body)


Taker = Callable[[Generation | NotCompared], None]


class GenerationListener:
    """The HTTP/1.1 listener at ``listen`` (host:port; port 0 picks one): each mirrored
    request read whole, answered 200 with no body, and what ``copy_of`` makes of it given to
    ``take`` (not for a request that is no inference request). ``start`` raises OSError
    when it cannot bind."""

    def __init__(self, listen: str, take: Taker) -> None:
        self.listen, self._take = listen, take
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.port: int | None = None

    def start(self) -> None:
        host, port = _host_port(self.listen)
        server = _Server((host, port), self)
        self._server, self.port = server, server.server_address[1]
        self._thread = threading.Thread(
            target=server.serve_forever, name="comparator-http", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop listening, and close the connections open (the router's kept-alive ones)."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        server.close_connections()
        if self._thread is not None:
            self._thread.join(5)

    def answer(self, method: str, target: str, body: bytes) -> None:
        taken = copy_of(method, target, body)
        if taken is not None:
            self._take(taken)


def _linger(sock: socket.socket, seconds: float = 2.0) -> None:
    """Close after an early answer as servers do: stop sending, and read what the peer still
    sends for a moment, so that the answer is not lost to a reset by unread data."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(seconds)
        while sock.recv(_CHUNK):
            pass


def _host_port(listen: str) -> tuple[str, int]:
    host, port = listen.rsplit(":", 1)
    return host.strip("[]"), int(port)


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    block_on_close = False

    def __init__(self, address: tuple[str, int], listener: GenerationListener) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.listener = listener
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        super().__init__(address, _Connection)

    def verify_request(self, request: object, client_address: object) -> bool:
        """Serve the connection when fewer than MAX_CONNECTIONS are open (else it is
        closed at once), counted as open until ``served``."""
        assert isinstance(request, socket.socket)
        with self._lock:
            if len(self._open) >= MAX_CONNECTIONS:
                return False
            self._open.add(request)
            return True

    def served(self, connection: socket.socket) -> None:
        with self._lock:
            self._open.discard(connection)

    def close_connections(self) -> None:
        with self._lock:
            connections, self._open = list(self._open), set()
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)


class _Connection(socketserver.BaseRequestHandler):
    """One connection from the router: requests one after another (keep-alive)."""

    server: _Server
    request: socket.socket

    def handle(self) -> None:
        try:
            self._serve()
        except OSError:
            pass  # the router closed it, or the listener stopped
        finally:
            self.server.served(self.request)

    def _serve(self) -> None:
        connection, sock = h11.Connection(h11.SERVER), self.request
        sock.settimeout(IDLE)
        started: h11.Request | None = None
        body = bytearray()
        while True:
            try:
                event = connection.next_event()
            except h11.RemoteProtocolError as exc:
                self._respond(connection, exc.error_status_hint)
                return
            if event is h11.NEED_DATA:
                try:
                    connection.receive_data(sock.recv(_CHUNK))
                except TimeoutError:
                    return
                continue
            if isinstance(event, h11.Request):
                started, body = event, bytearray()
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > MAX_BODY:
                    self._respond(connection, 413)
                    _linger(sock)
                    return
            elif isinstance(event, h11.EndOfMessage) and started is not None:
                self.server.listener.answer(
                    started.method.decode(), started.target.decode(errors="replace"), bytes(body)
                )
                # The router throws a mirror's answer away: an empty one, once the copy is in.
                self._respond(connection, 200)
                if connection.our_state is h11.MUST_CLOSE:
                    return
                connection.start_next_cycle()
                started = None
            else:  # ConnectionClosed, PAUSED
                return

    def _respond(self, connection: h11.Connection, status: int) -> None:
        if connection.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        head = h11.Response(status_code=status, headers=[("content-length", "0")])
        try:
            data = (connection.send(head) or b"") + (connection.send(h11.EndOfMessage()) or b"")
        except h11.LocalProtocolError:
            return  # nothing more may be sent on this connection
        self.request.sendall(data)
