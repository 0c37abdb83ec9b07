"""``triton-gitops run``: the reconciler as a long-running service next to the Triton fleet.

    scheduler (APScheduler)   a pass every --interval (with jitter); never two at once
                              (max_instances=1, coalesced); an overrun is counted, not stacked
    webhooks                  GitHub (X-Hub-Signature-256), GitLab (X-Gitlab-Token) and a
                              token-authenticated POST /reconcile trigger a pass at once;
                              replays (a delivery id or signature seen within the window),
                              bodies over the cap (declared or chunked) and requests not
                              received within one whole-request deadline are refused, and
                              bounded connection counts keep a flood from starving the rest
    watch                     every few seconds, each server's repository index against what
                              the last pass left serving: a restarted server or a hand-unloaded
                              model triggers a pass without waiting for the interval
    backoff                   a failing server is skipped until its next try (exponential,
                              jittered), the others go on; a Git remote that is down keeps
                              everything serving and is retried the same way
    observability             /metrics (prometheus-client), /healthz, /readyz; JSON log lines
    shutdown                  SIGTERM/SIGINT: the change in progress finishes (an analysis in
                              progress is cut short and its old versions put back), no other
                              starts; exit 0, or 1 if the deadline passed first

The pass itself is ``loop.reconcile``; this module only decides when to run it and reports.
"""

from __future__ import annotations

import ctypes
import hashlib
import hmac
import io
import json
import logging
import os
import random
import signal
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from typing import Any

from apscheduler.events import EVENT_JOB_MAX_INSTANCES, JobEvent
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.interval import IntervalTrigger
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from reconciler.adapters.credentials import conceal, redact
from reconciler.adapters.triton import TritonServerClient
from reconciler.apply import Outcome, StepResult
from reconciler.errors import (
    ReconcileError,
    ServerUnavailable,
    SourceUnavailable,
    StepFailed,
    UnsafeRevision,
    ValidationError,
)
from reconciler.loop import PassMemory, PassReport, Settings, Source, reconcile, resolver

log = logging.getLogger("triton_gitops")

# Seconds to wait before the n-th retry of a failing server or Git remote (then the last).
BACKOFF = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 120.0, 300.0)


# Webhook endpoints and the source each is counted and verified as.
WEBHOOK_ROUTES = {"/webhook/github": "github", "/webhook/gitlab": "gitlab", "/reconcile": "token"}


def fewer_malloc_arenas(arenas: int = 2) -> bool:
    """Cap glibc's malloc arenas for a process that runs for months.

    glibc gives threads that allocate at once arenas of their own (up to 8 per core), and
    memory freed in one stays there: the passes' worker threads would each keep some. Two are
    plenty for a service that is idle between passes. A MALLOC_ARENA_MAX in the environment
    wins; off glibc this does nothing. True when the cap was set.
    """
    if os.environ.get("MALLOC_ARENA_MAX"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return False
    return bool(libc.mallopt(_M_ARENA_MAX, arenas))


_M_ARENA_MAX = -8  # mallopt's parameter number, from glibc's malloc.h


def backoff_delay(failures: int, rng: random.Random) -> float:
    """Exponential backoff with full jitter over the upper half: never 0, never in lockstep."""
    base = BACKOFF[min(max(failures, 1), len(BACKOFF)) - 1]
    return base * (0.5 + rng.random() / 2)


@dataclass(frozen=True)
class RunSettings:
    interval: float = 60.0
    jitter: float = 5.0
    listen: str = "127.0.0.1:9090"
    github_secret: str | None = None
    gitlab_token: str | None = None
    reconcile_token: str | None = None
    watch_interval: float = 3.0
    shutdown_deadline: float = 60.0
    dry_run: bool = False
    max_body_bytes: int = 1 << 20
    # One deadline for the whole request (headers, waiting for a webhook slot, body), from
    # the moment the connection is accepted: a client dribbling a byte a second is cut off.
    read_timeout: float = 5.0
    max_connections: int = 128  # connections served at once; more are answered 503 at once
    max_webhook_reads: int = 16  # webhook bodies read at once; more wait within their deadline
    replay_window: float = 3600.0  # seconds a delivery is remembered
    replay_memory: int = 10_000  # deliveries remembered at most (the oldest are forgotten)


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line; every string passes through ``redact``."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "message": redact(record.getMessage()),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, Mapping):
            entry.update({k: redact(v) if isinstance(v, str) else v for k, v in fields.items()})
        if record.exc_info:
            entry["exception"] = redact(self.formatException(record.exc_info))
        return json.dumps(entry, default=str)


def _event(message: str, level: int = logging.INFO, **fields: Any) -> None:
    log.log(level, message, extra={"fields": fields})


class DeliveryMemory:
    """Webhook deliveries seen in the last ``window`` seconds, at most ``capacity`` of them.

    A delivery is known by keys (its delivery id, its signature); one whose key was seen
    within the window is a replay. Time is injected so that expiry is tested without sleeping.
    """

    def __init__(
        self, window: float, capacity: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.window = window
        self.capacity = capacity
        self.clock = clock
        self._seen: OrderedDict[str, float] = OrderedDict()  # oldest first
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._seen)

    def first_sighting(self, keys: Iterable[str]) -> bool:
        """Remember ``keys``; False (and nothing remembered) when one was seen in the window."""
        keys = list(keys)
        now = self.clock()
        with self._lock:
            while self._seen and next(iter(self._seen.values())) <= now - self.window:
                self._seen.popitem(last=False)
            if any(key in self._seen for key in keys):
                return False
            for key in keys:
                self._seen[key] = now
            while len(self._seen) > self.capacity:
                self._seen.popitem(last=False)
            return True


def delivery_keys(source: str, headers: Mapping[str, str]) -> list[str]:
    """What identifies one verified delivery, for replay detection.

    GitHub signs the body but not its X-GitHub-Delivery header, so a replayer could change
    the id: the signature (one per body, and every push body differs) is a key too. GitLab's
    token is not bound to the body, so its event UUID is all there is. POST /reconcile means
    "reconcile now" and is safe to repeat: it has no keys.
    """
    if source == "github":
        keys = [f"github-signature:{headers.get('x-hub-signature-256', '')}"]
        if headers.get("x-github-delivery"):
            keys.append(f"github-delivery:{headers['x-github-delivery']}")
        return keys
    if source == "gitlab" and headers.get("x-gitlab-event-uuid"):
        return [f"gitlab-event:{headers['x-gitlab-event-uuid']}"]
    return []


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


class ReconcilerMetrics:
    """The reconciler's own Prometheus metrics, in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.pass_duration = Histogram(
            "triton_gitops_pass_duration_seconds",
            "Duration of reconcile passes",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
            registry=r,
        )
        self.passes = Counter(
            "triton_gitops_passes", "Reconcile passes by result", ["result"], registry=r
        )
        self.skipped = Counter(
            "triton_gitops_passes_skipped",
            "Scheduled passes skipped because the previous one was still running",
            registry=r,
        )
        self.last_success = Gauge(
            "triton_gitops_last_success_timestamp_seconds",
            "When the last fully successful pass finished",
            registry=r,
        )
        self.revision = Info(
            "triton_gitops_applied_revision", "The revision the last pass applied", registry=r
        )
        self.drift = Counter(
            "triton_gitops_drift_corrections",
            "Models put back after the server drifted from an applied spec",
            ["server", "model"],
            registry=r,
        )
        self.rollouts = Counter(
            "triton_gitops_rollouts", "Rollouts by outcome", ["outcome"], registry=r
        )
        self.reachable = Gauge(
            "triton_gitops_server_reachable",
            "1 when the server answered the last pass",
            ["server"],
            registry=r,
        )
        self.git_errors = Counter(
            "triton_gitops_git_fetch_errors",
            "Failed fetches of the manifest repository",
            registry=r,
        )
        self.webhooks = Counter(
            "triton_gitops_webhooks",
            "Webhook requests by source and result",
            ["source", "result"],
            registry=r,
        )
        self.connections_refused = Counter(
            "triton_gitops_http_connections_refused",
            "Connections closed unanswered or answered 503: busy (too many at once), timeout "
            "(request not received within the deadline), error",
            ["reason"],
            registry=r,
        )
        self.webhook_reads = Gauge(
            "triton_gitops_webhook_reads_in_progress",
            "Webhook bodies being read now (bounded by the webhook read cap)",
            registry=r,
        )


class Daemon:
    def __init__(
        self,
        source: Source,
        settings: Settings,
        run: RunSettings,
        *,
        rng: random.Random | None = None,
    ) -> None:
        self.source = source
        self.settings = settings
        self.run_settings = run
        token = settings.git_credentials.token
        conceal(run.github_secret, run.gitlab_token, run.reconcile_token, token)
        self.metrics = ReconcilerMetrics()
        self.rng = rng or random.Random()
        self.stop_requested = threading.Event()
        self._pass_lock = threading.Lock()
        self.memory = PassMemory()  # what passes keep for the next: clients, manifests
        self._pending = threading.Event()
        self._fetched_once = False
        self._passed_once = False
        self._server_failures: dict[str, int] = {}
        self._server_retry_at: dict[str, float] = {}
        self._git_failures = 0
        self._last: PassReport | None = None
        self._resolved_at: dict[str, float] = {}
        self._in_progress: str | None = None
        self.scheduler = BackgroundScheduler(timezone=UTC)
        self.http: ThreadingHTTPServer | None = None
        self.deliveries = DeliveryMemory(run.replay_window, run.replay_memory)
        self._webhook_reads = threading.BoundedSemaphore(run.max_webhook_reads)

    # -- passes --------------------------------------------------------------------------

    def trigger(self, why: str) -> None:
        """Run a pass as soon as possible (after the one running, if any)."""
        _event("pass requested", trigger=why)
        self._pending.set()
        if self.scheduler.running and not self.stop_requested.is_set():
            self.scheduler.modify_job("reconcile", next_run_time=datetime.now(UTC))

    def _skip_list(self) -> dict[str, str]:
        now = time.monotonic()
        return {
            server: (
                f"backing off after {self._server_failures.get(server, 0)} failed pass(es); "
                f"next try in {retry_at - now:.0f}s"
            )
            for server, retry_at in self._server_retry_at.items()
            if retry_at > now
        }

    def _log_step(self, result: StepResult) -> None:
        step = result.step
        _event(
            "step",
            logging.INFO if result.ok else logging.WARNING,
            server=step.server,
            model=step.model,
            step=str(step.action),
            versions=list(step.versions),
            outcome="ok" if result.ok else "failed",
            revert=result.reverting,
            seconds=round(result.seconds, 4),
            error=result.error,
        )

    def run_pass(self, trigger: str = "schedule") -> PassReport | None:
        if self.stop_requested.is_set():
            return None
        if not self._pass_lock.acquire(blocking=False):
            self._pending.set()
            return None
        self._pending.clear()
        started = time.monotonic()
        result = "error"
        report: PassReport | None = None
        try:
            report = reconcile(
                self.source,
                self.settings,
                apply_changes=not self.run_settings.dry_run,
                progress=self._log_step,
                skip=self._skip_list(),
                stopping=self.stop_requested.is_set,
                memory=self.memory,
            )
            self._fetched_once = True
            self._git_failures = 0
            result = self._record(report)
        except SourceUnavailable as exc:
            self._git_failures += 1
            self.metrics.git_errors.inc()
            delay = backoff_delay(self._git_failures, self.rng)
            result = "source-unavailable"
            _event(
                "manifest repository unavailable; everything keeps serving",
                logging.WARNING,
                error=str(exc),
                retry_in_seconds=round(delay, 1),
            )
            self._retry_in(delay)
        except ValidationError as exc:
            self._fetched_once = True
            result = "invalid"
            _event(
                "manifests invalid; nothing applied",
                logging.ERROR,
                revision=exc.revision,
                problems=[str(p) for p in exc.problems],
            )
        except UnsafeRevision as exc:
            self._fetched_once = True
            result = "refused"
            _event("revision refused", logging.ERROR, error=str(exc))
        except ReconcileError as exc:
            _event("pass failed", logging.ERROR, error=str(exc))
        except Exception:
            log.exception("pass crashed", extra={"fields": {"trigger": trigger}})
            result = "crashed"
        finally:
            seconds = time.monotonic() - started
            self.metrics.pass_duration.observe(seconds)
            self.metrics.passes.labels(result).inc()
            _event(
                "pass finished",
                trigger=trigger,
                result=result,
                seconds=round(seconds, 3),
                revision=report.revision if report else None,
            )
            self._pass_lock.release()
        if self._pending.is_set() and not self.stop_requested.is_set():
            self.trigger("requested during the last pass")
        return report

    def _record(self, report: PassReport) -> str:
        self._last = report
        self.metrics.revision.info({"revision": report.revision})
        unreachable = {p.server for p in report.plan.problems if p.model is None}
        skipped = set(self._skip_list())
        for server in report.servers:
            if server in skipped:
                continue
            self.metrics.reachable.labels(server).set(0 if server in unreachable else 1)
            if server in unreachable:
                failures = self._server_failures.get(server, 0) + 1
                self._server_failures[server] = failures
                delay = backoff_delay(failures, self.rng)
                self._server_retry_at[server] = time.monotonic() + delay
                self._retry_in(delay)
            else:
                self._server_failures.pop(server, None)
                self._server_retry_at.pop(server, None)
        for server, model in report.drift:
            self.metrics.drift.labels(server, model).inc()
            _event(
                "drift corrected",
                logging.WARNING,
                server=server,
                model=model,
                revision=report.revision,
            )
        for change in report.result.changes if report.result else ():
            if change.change.deployment is not None and change.change.desired:
                self.metrics.rollouts.labels(str(change.outcome)).inc()
            _event(
                "change",
                logging.INFO if change.outcome is Outcome.CONVERGED else logging.WARNING,
                revision=report.revision,
                server=change.change.server,
                model=change.change.model,
                outcome=str(change.outcome),
                versions=list(change.change.desired),
                error=change.error,
            )
        for note in report.reverts:
            _event("revert write-back", revision=report.revision, note=note)
        if report.ok:
            self.metrics.last_success.set(time.time())
            self._passed_once = True
            return "ok"
        return "partial"

    def _retry_in(self, delay: float) -> None:
        """Bring the next pass forward to ``delay`` seconds from now if it is later."""
        if not self.scheduler.running or self.stop_requested.is_set():
            return
        job = self.scheduler.get_job("reconcile")
        at = datetime.now(UTC) + timedelta(seconds=delay)
        if job is not None and (job.next_run_time is None or job.next_run_time > at):
            self.scheduler.modify_job("reconcile", next_run_time=at)

    # -- the watch between passes ---------------------------------------------------------

    def watch(self) -> None:
        """Compare each server's index with what the last pass left serving, and each
        discovered server's DNS name with the instances the last pass found."""
        report = self._last
        if report is None or self.stop_requested.is_set() or self._pass_lock.locked():
            return
        now = time.monotonic()
        names = resolver(self.settings)
        for server, (dns, refresh, addresses) in report.discovered.items():
            if now - self._resolved_at.get(server, 0.0) < refresh:
                continue
            self._resolved_at[server] = now
            try:
                found = tuple(names.resolve(dns))
            except ReconcileError:
                continue  # the pass reports it
            if found != addresses:
                self.trigger(f"instances of {server} changed: {len(found)} address(es)")
                return
        for server, address in report.servers.items():
            expected = report.expected.get(server, {})
            retrying = server in self._server_retry_at
            if not expected and not retrying:
                continue
            try:
                with TritonServerClient(server, address, call_timeout=2.0) as client:
                    entries = client.index()
            except (ServerUnavailable, StepFailed):
                continue  # still down: the backoff handles it
            if retrying:
                self._server_retry_at.pop(server, None)
                self.trigger(f"server {server} answers again")
                return
            ready: dict[str, set[int]] = {}
            for entry in entries:
                if entry.get("state") == "READY" and entry.get("version"):
                    ready.setdefault(str(entry["name"]), set()).add(int(entry["version"]))
            drifted = sorted(m for m, v in expected.items() if ready.get(m, set()) != set(v))
            if drifted:
                self.trigger(f"server {server} drifted: {', '.join(drifted)}")
                return

    # -- HTTP: webhooks, metrics, health ----------------------------------------------------

    def verify_webhook(self, path: str, headers: Mapping[str, str], body: bytes) -> str | None:
        """The source of a verified webhook ('github', 'gitlab', 'token'), else None.

        ``headers`` are keyed in lower case (HTTP header names are case-insensitive).
        """
        run = self.run_settings
        if path == "/webhook/github" and run.github_secret:
            signature = headers.get("x-hub-signature-256", "")
            digest = hmac.new(run.github_secret.encode(), body, hashlib.sha256).hexdigest()
            return "github" if hmac.compare_digest(signature, f"sha256={digest}") else None
        if path == "/webhook/gitlab" and run.gitlab_token:
            given = headers.get("x-gitlab-token", "")
            return "gitlab" if hmac.compare_digest(given, run.gitlab_token) else None
        if path == "/reconcile" and run.reconcile_token:
            given = headers.get("authorization", "")
            return "token" if hmac.compare_digest(given, f"Bearer {run.reconcile_token}") else None
        return None

    def health(self) -> tuple[int, dict[str, Any]]:
        return 200, {"status": "alive"}

    def readiness(self) -> tuple[int, dict[str, Any]]:
        ready = self._fetched_once and self._passed_once
        return (200 if ready else 503), {
            "ready": ready,
            "fetched": self._fetched_once,
            "passed": self._passed_once,
            "revision": self._last.revision if self._last else None,
        }

    def _refused(self, reason: str) -> None:
        self.metrics.connections_refused.labels(reason).inc()
        if reason != "error":
            _event("connection refused", logging.WARNING, reason=reason)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        daemon = self
        run = self.run_settings

        class Handler(BaseHTTPRequestHandler):
            timeout = run.read_timeout
            server_version = "triton-gitops"
            # http.server's own error page quotes the request line back; ours says less.
            error_message_format = '{"error": %(code)d, "explain": "%(explain)s"}'
            error_content_type = "application/json"
            deadline = 0.0

            def setup(self) -> None:
                super().setup()
                self.deadline = time.monotonic() + run.read_timeout
                self.rfile.close()  # the plain socket file: replaced by one with the deadline
                self.rfile = io.BufferedReader(_DeadlineReader(self.connection, self.deadline))

            def send_error(
                self, code: int, message: str | None = None, explain: str | None = None
            ) -> None:
                # http.server's messages quote the client's request line, which may hold
                # anything (a token pasted in the wrong place): answer with the plain reason.
                super().send_error(code, None, explain)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # requests are reported by our own log lines

            def log_error(self, format: str, *args: Any) -> None:
                # The only errors http.server reports itself: a request line or headers not
                # received in time, or malformed (answered 400 and the like). Its message
                # quotes the client's request line, which may hold anything, a token
                # included: only the status is logged.
                if format.startswith("Request timed out"):
                    daemon._refused("timeout")
                elif format.startswith("code %d") and args:
                    _event("bad request", logging.WARNING, status=args[0])

            def _send(self, status: int, body: bytes, content_type: str) -> None:
                # Reads may have left a short timeout on the socket; a reply gets its own.
                self.connection.settimeout(run.read_timeout)
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
                daemon.metrics.webhooks.labels(source, result).inc()
                _event("webhook refused", logging.WARNING, source=source, reason=result)
                self._json(status, {"error": error})
                self.close_connection = True

            def do_GET(self) -> None:
                if self.path == "/metrics":
                    self._send(200, generate_latest(daemon.metrics.registry), CONTENT_TYPE_LATEST)
                elif self.path == "/healthz":
                    self._json(*daemon.health())
                elif self.path == "/readyz":
                    self._json(*daemon.readiness())
                else:
                    self._json(404, {"error": "not found"})

            def _body(self, source: str) -> bytes | None:
                """The request body within the size cap and the deadline; None when it was
                refused (the reply, if any, is sent)."""
                limit = run.max_body_bytes
                chunked = self.headers.get("Transfer-Encoding")
                length = self.headers.get("Content-Length")
                if chunked is not None and (
                    length is not None or chunked.strip().lower() != "chunked"
                ):
                    # Both framings at once is how requests are smuggled past proxies.
                    self._refuse(source, "bad-framing", 400, "unsupported body framing")
                    return None
                if chunked is None and (length is None or not length.isdigit()):
                    self._refuse(source, "no-length", 411, "Content-Length required")
                    return None
                if length is not None and int(length) > limit:
                    self._refuse(source, "too-large", 413, "body too large")
                    return None
                # Waiting for a slot counts against the same deadline as reading.
                if not daemon._webhook_reads.acquire(
                    timeout=max(0.0, self.deadline - time.monotonic())
                ):
                    self._refuse(source, "busy", 503, "too many webhooks at once")
                    return None
                daemon.metrics.webhook_reads.inc()
                try:
                    if length is not None:
                        body = self.rfile.read(int(length))
                        if len(body) != int(length):
                            raise ValueError("body shorter than Content-Length")
                        return body
                    return read_chunked(self.rfile, limit)
                except BodyTooLarge:
                    self._refuse(source, "too-large", 413, "body too large")
                except ValueError as exc:
                    self._refuse(source, "malformed", 400, str(exc))
                except TimeoutError:
                    daemon.metrics.webhooks.labels(source, "timeout").inc()
                    _event("webhook body not received in time", logging.WARNING, source=source)
                    self.close_connection = True
                finally:
                    daemon.metrics.webhook_reads.dec()
                    daemon._webhook_reads.release()
                return None

            def do_POST(self) -> None:
                # Only known routes, matched exactly: a path is the client's to choose, and
                # a label or log field made from it could grow without bound or carry a
                # token someone put in a query string.
                source = WEBHOOK_ROUTES.get(self.path)
                if source is None:
                    self._json(404, {"error": "not found"})
                    return
                body = self._body(source)
                if body is None:
                    return
                headers = {k.lower(): v for k, v in self.headers.items()}
                verified = daemon.verify_webhook(self.path, headers, body)
                if verified is None:
                    self._refuse(source, "unauthorized", 401, "signature or token missing or wrong")
                    return
                if not daemon.deliveries.first_sighting(delivery_keys(verified, headers)):
                    self._refuse(source, "replayed", 409, "delivery already received")
                    return
                if verified == "github" and headers.get("x-github-event") == "ping":
                    daemon.metrics.webhooks.labels(source, "ping").inc()
                    self._json(200, {"status": "pong"})
                    return
                daemon.metrics.webhooks.labels(source, "accepted").inc()
                daemon.trigger(f"webhook {verified}")
                self._json(202, {"status": "pass requested"})

        return Handler

    # -- lifecycle ------------------------------------------------------------------------

    def start_http(self) -> None:
        """Serve webhooks, /metrics and the health checks (without the scheduler: tests)."""
        host, _, port = self.run_settings.listen.rpartition(":")
        self.http = _Listener(
            (host or "127.0.0.1", int(port)),
            self._handler(),
            self.run_settings.max_connections,
            self._refused,
        )
        threading.Thread(target=self.http.serve_forever, name="http", daemon=True).start()

    def start(self) -> None:
        self.start_http()
        self.scheduler.add_listener(self._overrun, EVENT_JOB_MAX_INSTANCES)
        self.scheduler.add_job(
            self.run_pass,
            IntervalTrigger(seconds=self.run_settings.interval, jitter=self.run_settings.jitter),
            id="reconcile",
            max_instances=1,
            coalesce=True,
            misfire_grace_time=None,
            next_run_time=datetime.now(UTC),
        )
        self.scheduler.add_job(
            self.watch,
            IntervalTrigger(seconds=self.run_settings.watch_interval),
            id="watch",
            max_instances=1,
            coalesce=True,
        )
        self.scheduler.start()
        _event(
            "started",
            repo=redact(self.source.repo),
            ref=self.source.ref,
            listen=self.run_settings.listen,
            interval=self.run_settings.interval,
            dry_run=self.run_settings.dry_run,
        )

    def _overrun(self, event: JobEvent) -> None:
        if event.job_id == "reconcile":
            self.metrics.skipped.inc()
            self._pending.set()
            _event("pass overran its interval; the next one runs when it ends", logging.WARNING)

    def request_stop(self, signum: int | None = None, _: FrameType | None = None) -> None:
        if not self.stop_requested.is_set():
            _event("stopping", signal=signal.Signals(signum).name if signum else None)
        self.stop_requested.set()

    def shutdown(self) -> int:
        """Finish the change in progress (within the deadline), then stop everything."""
        self.stop_requested.set()
        self.scheduler.shutdown(wait=False)
        finished = self._pass_lock.acquire(timeout=self.run_settings.shutdown_deadline)
        if self.http is not None:
            self.http.shutdown()
            self.http.server_close()
        if finished:
            self.memory.close()
            self._pass_lock.release()
            _event("stopped")
            return 0
        _event(
            "stopped at the deadline with a pass still running",
            logging.ERROR,
            deadline_seconds=self.run_settings.shutdown_deadline,
        )
        return 1

    def serve(self) -> int:
        """Run until SIGTERM or SIGINT; the exit code for the process."""
        fewer_malloc_arenas()
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)
        self.start()
        while not self.stop_requested.wait(1.0):
            pass
        return self.shutdown()
