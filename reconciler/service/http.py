"""The HTTP front door of the service: the request handler (webhooks, /metrics, /healthz,
/readyz), bounded request reading (one deadline, body caps, strict framing) and the listener
with its connection cap.

http.server is kept (not a WSGI server such as waitress) because the caps are per stage of a
request: one deadline from accept to the last body byte, a bounded number of webhook bodies
read at once (the rest wait within their deadline) and a 503 at once to a connection over
the cap; waitress times out idle connections only, buffers whole bodies before the
application sees them, and stops accepting over its connection limit. What http.server
parses laxly is checked first, strictly, by service/framing.py.

``Daemon.start_http`` (service/daemon.py) serves ``handler_for(daemon, run)`` on a
``Listener``; what a webhook must pass is asked of ``WebhookGate`` (service/webhooks.py).
"""

from __future__ import annotations

import io
import json
import logging
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar, Protocol

from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from reconciler.model.settings import RunSettings
from reconciler.service.framing import (
    BadRequest,
    BodyTooLarge,
    Framing,
    body_framing,
    check_request_line,
    read_chunked,
    read_field_block,
)
from reconciler.service.operator import (
    LAST_PASS,
    LIVE_STATUS,
    reason_of,
    route,
    undo_of,
)
from reconciler.service.telemetry import ReconcilerMetrics, log_event
from reconciler.service.webhooks import WEBHOOK_ROUTES, WebhookGate

# Whether the servers serve what they should (service/serving.py): /serving, /serving/<name>.
SERVING = "/serving"


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


LINGER_SECONDS = 1.0  # at most, and never past the request's deadline
LINGER_BYTES = 256 * 1024


class Listener(ThreadingHTTPServer):
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
        self._open = 0  # connections holding a slot
        self._counting = threading.Lock()

    @property
    def connections_open(self) -> int:
        """The connections holding a slot now (a thread each, until it ends)."""
        return self._open

    def _count(self, change: int) -> None:
        with self._counting:
            self._open += change

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
        self._count(1)
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._count(-1)
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._count(-1)
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # The default prints a traceback to stderr, outside the JSON log; a client that
        # resets its connection is not worth one.
        self._on_refused("error")


class ServiceFront(Protocol):
    """What a request needs of the service (``Daemon``)."""

    @property
    def metrics(self) -> ReconcilerMetrics: ...

    @property
    def webhooks(self) -> WebhookGate: ...

    def health(self) -> tuple[int, dict[str, Any]]: ...

    def readiness(self) -> tuple[int, dict[str, Any]]: ...

    def refused(self, reason: str) -> None:
        """Count a connection refused (``reason``: 'busy', 'timeout', 'malformed', 'error')."""

    def trigger(self, why: str) -> None:
        """Run a pass as soon as possible."""

    def operator(
        self,
        verb: str,
        deployment: str | None,
        by: str,
        reason: str,
        *,
        to_revision: str | None = None,
        dry_run: bool = False,
    ) -> tuple[int, dict[str, Any]]:
        """Carry out an on-call verb asked by ``by`` (a token's name): (status, reply);
        ``to_revision`` and ``dry_run`` are undo's."""

    def last_pass(self) -> dict[str, Any]:
        """The outcome of the last pass that finished, with its number (0: none yet)."""

    def live_status(self) -> dict[str, Any]:
        """The rollouts of the pass in progress (``loop/live.py``) and the last pass."""

    def serving(self, server: str | None) -> tuple[int, dict[str, Any]]:
        """Whether every server (None) or one serves what it should (service/serving.py)."""


class RequestHandler(BaseHTTPRequestHandler):
    """One request: GET /metrics, /healthz, /readyz, /serving, /status; POST to a webhook
    route or an on-call verb (/v1/...).

    Bound to a service by ``handler_for``; http.server makes one instance per connection.
    Everything from accepting the connection to the last body byte shares one deadline.
    """

    service: ClassVar[ServiceFront]
    run: ClassVar[RunSettings]
    server_version = "triton-gitops"
    # http.server's own error page quotes the request line back; ours says less.
    error_message_format = '{"error": %(code)d, "explain": "%(explain)s"}'
    error_content_type = "application/json"
    deadline = 0.0
    raw_requestline: bytes  # set by http.server before ``parse_request``
    framing = Framing()  # how this request's body is delimited (``parse_request``)
    refusal: str | None = None  # why service/framing.py refused it, when it did
    unread = False  # refused or answered with bytes of it maybe unread: linger on close

    def setup(self) -> None:
        super().setup()
        self.deadline = time.monotonic() + self.run.read_timeout
        self.rfile.close()  # the plain socket file: replaced by one with the deadline
        self.rfile = io.BufferedReader(_DeadlineReader(self.connection, self.deadline))

    def parse_request(self) -> bool:
        """The request line and header, each line checked against RFC 9112 before
        http.server parses them, and the body's framing; False (answered, the connection to
        be closed) when refused."""
        if self.raw_requestline in (b"\r\n", b"\n"):
            return super().parse_request()  # an empty line: closed unanswered, as before
        # What send_error needs before http.server has parsed anything (it would set them).
        self.command, self.request_version, self.requestline = "", "HTTP/1.0", ""
        self.close_connection = True
        try:
            check_request_line(self.raw_requestline)
            head = read_field_block(self.rfile)
        except BadRequest as exc:
            return self._bad(exc)
        # http.server reads the header from ``rfile``: give it the lines just checked.
        reader, self.rfile = self.rfile, io.BytesIO(head)
        try:
            if not super().parse_request():
                return False
        finally:
            self.rfile = reader
        try:
            self.framing = body_framing(self.command, self.request_version, self.headers.items())
        except BadRequest as exc:
            return self._bad(exc)
        return True

    def _bad(self, refused: BadRequest) -> bool:
        self.refusal = refused.reason
        self.send_error(refused.status, None, refused.reason)
        return False

    def finish(self) -> None:
        super().finish()  # the answer is flushed
        if not self.unread:
            return
        # A lingering close: closing a socket with unread bytes (a refused body, a request
        # behind it) resets the connection, and the client (or a proxy) may lose the answer.
        # Say we are done, then read what the client still sends, for a bounded time.
        try:
            self.connection.shutdown(socket.SHUT_WR)
            until = min(self.deadline, time.monotonic() + LINGER_SECONDS)
            drained = 0
            while drained < LINGER_BYTES and (left := until - time.monotonic()) > 0:
                self.connection.settimeout(left)
                chunk = self.connection.recv(65536)
                if not chunk:
                    break
                drained += len(chunk)
        except OSError:
            pass

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        # http.server's messages quote the client's request line, which may hold
        # anything (a token pasted in the wrong place): answer with the plain reason.
        self.unread = True
        super().send_error(code, None, explain)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # requests are reported by our own log lines

    def log_error(self, format: str, *args: Any) -> None:
        # The only errors http.server reports itself: a request line or headers not
        # received in time, or malformed (answered 400 and the like). Its message
        # quotes the client's request line, which may hold anything, a token
        # included: only the status is logged.
        if format.startswith("Request timed out"):
            self.service.refused("timeout")
        elif format.startswith("code %d") and args:
            # The reason is ours (service/framing.py), never the client's bytes.
            log_event("bad request", logging.WARNING, status=args[0], reason=self.refusal)
            self.service.refused("malformed")

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        # Reads may have left a short timeout on the socket; a reply gets its own.
        self.connection.settimeout(self.run.read_timeout)
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if status == 503:
            self.send_header("Retry-After", "5")
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, data: Mapping[str, Any]) -> None:
        self._send(status, json.dumps(data).encode(), "application/json")

    def _refuse(self, source: str, result: str, status: int, error: str) -> None:
        self.service.metrics.webhooks.labels(source, result).inc()
        log_event("webhook refused", logging.WARNING, source=source, reason=result)
        self._json(status, {"error": error})
        self.close_connection = True
        self.unread = True

    def do_GET(self) -> None:
        if self.path in (LAST_PASS, LIVE_STATUS):
            # What the service is doing, per model and server: for an operator's token only.
            headers = {k.lower(): v for k, v in self.headers.items()}
            if self.service.webhooks.operator(headers) is None:
                self._refuse("operator", "unauthorized", 401, "operator token missing or wrong")
                return
            if self.path == LAST_PASS:
                self._json(200, self.service.last_pass())
            else:
                self._json(200, self.service.live_status())
        elif self.path == "/metrics":
            self._send(200, generate_latest(self.service.metrics.registry), CONTENT_TYPE_LATEST)
        elif self.path == "/healthz":
            self._json(*self.service.health())
        elif self.path == "/readyz":
            self._json(*self.service.readiness())
        elif self.path == SERVING or self.path.startswith(SERVING + "/"):
            # For load balancers: no token (it says only what serves, as /readyz does).
            server = urllib.parse.unquote(self.path[len(SERVING) + 1 :]) or None
            self._json(*self.service.serving(server))
        else:
            self._json(404, {"error": "not found"})

    def _body(self, source: str) -> bytes | None:
        """The request body within the size cap and the deadline; None when it was
        refused (the reply, if any, is sent)."""
        limit = self.run.max_body_bytes
        length = self.framing.length  # its syntax was checked with the header (framing.py)
        if not self.framing.chunked and length is None:
            self._refuse(source, "no-length", 411, "Content-Length required")
            return None
        if length is not None and length > limit:
            self._refuse(source, "too-large", 413, "body too large")
            return None
        # Waiting for a slot counts against the same deadline as reading.
        reads = self.service.webhooks.reads
        if not reads.acquire(timeout=max(0.0, self.deadline - time.monotonic())):
            self._refuse(source, "busy", 503, "too many webhooks at once")
            return None
        self.service.metrics.webhook_reads.inc()
        try:
            if length is not None:
                body = self.rfile.read(length)
                if len(body) != length:
                    raise BadRequest(400, "body shorter than Content-Length")
                return body
            return read_chunked(self.rfile, limit)
        except BodyTooLarge:
            self._refuse(source, "too-large", 413, "body too large")
        except BadRequest as exc:
            self._refuse(source, "malformed", exc.status, exc.reason)
        except TimeoutError:
            self.service.metrics.webhooks.labels(source, "timeout").inc()
            log_event("webhook body not received in time", logging.WARNING, source=source)
            self.close_connection = True
        finally:
            self.service.metrics.webhook_reads.dec()
            reads.release()
        return None

    def _operator(self, verb: str, deployment: str | None) -> None:
        """An on-call verb (service/operator.py): a named token, a small JSON body."""
        body = self._body("operator")
        if body is None:
            return
        headers = {k.lower(): v for k, v in self.headers.items()}
        by = self.service.webhooks.operator(headers)
        if by is None:
            self._refuse("operator", "unauthorized", 401, "operator token missing or wrong")
            return
        try:
            reason = reason_of(body)
            to_revision, dry_run = undo_of(body) if verb == "undo" else (None, False)
        except ValueError as exc:
            self._refuse("operator", "malformed", 400, str(exc))
            return
        self.service.metrics.webhooks.labels("operator", "accepted").inc()
        self._json(
            *self.service.operator(
                verb, deployment, by, reason, to_revision=to_revision, dry_run=dry_run
            )
        )

    def do_POST(self) -> None:
        # Only known routes, matched exactly: a path is the client's to choose, and
        # a label or log field made from it could grow without bound or carry a
        # token someone put in a query string.
        verb = route(self.path)
        if verb is not None:
            self._operator(*verb)
            return
        source = WEBHOOK_ROUTES.get(self.path)
        if source is None:
            self._json(404, {"error": "not found"})
            self.close_connection = self.unread = True  # its body is unread: never a request
            return
        body = self._body(source)
        if body is None:
            return
        headers = {k.lower(): v for k, v in self.headers.items()}
        gate = self.service.webhooks
        verified = gate.verify(self.path, headers, body)
        if verified is None:
            self._refuse(source, "unauthorized", 401, "signature or token missing or wrong")
            return
        if not gate.first_sighting(verified, headers, body):
            self._refuse(source, "replayed", 409, "delivery already received")
            return
        if verified == "github" and headers.get("x-github-event") == "ping":
            self.service.metrics.webhooks.labels(source, "ping").inc()
            self._json(200, {"status": "pong"})
            return
        self.service.metrics.webhooks.labels(source, "accepted").inc()
        self.service.trigger(f"webhook {verified}")
        self._json(202, {"status": "pass requested"})


def handler_for(service: ServiceFront, run: RunSettings) -> type[RequestHandler]:
    """The handler class for ``Listener``, bound to ``service`` and its settings."""

    class Handler(RequestHandler):
        # The socket's timeout until ``setup`` hands reading to the deadline reader.
        timeout = run.read_timeout

    Handler.service = service
    Handler.run = run
    return Handler
