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

import hashlib
import hmac
import io
import json
import logging
import random
import signal
import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from typing import Any

from apscheduler.events import EVENT_JOB_MAX_INSTANCES, JobEvent
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.interval import IntervalTrigger
from prometheus_client import (
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from reconciler.adapters.credentials import conceal, redact
from reconciler.adapters.triton import TritonServerClient
from reconciler.loop.memory import PassMemory
from reconciler.loop.reconcile import reconcile
from reconciler.model.errors import (
    ReconcileError,
    ServerUnavailable,
    SourceUnavailable,
    StepFailed,
    UnsafeRevision,
    ValidationError,
)
from reconciler.model.reports import PassReport
from reconciler.model.results import Outcome, StepResult
from reconciler.model.settings import RunSettings, Settings
from reconciler.model.source import Source
from reconciler.service.http import BodyTooLarge, _DeadlineReader, _Listener, read_chunked
from reconciler.service.telemetry import ReconcilerMetrics, _event, fewer_malloc_arenas, log
from reconciler.service.webhooks import WEBHOOK_ROUTES, DeliveryMemory, delivery_keys
from reconciler.wiring import resolver

# Seconds to wait before the n-th retry of a failing server or Git remote (then the last).
BACKOFF = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 120.0, 300.0)


def backoff_delay(failures: int, rng: random.Random) -> float:
    """Exponential backoff with full jitter over the upper half: never 0, never in lockstep."""
    base = BACKOFF[min(max(failures, 1), len(BACKOFF)) - 1]
    return base * (0.5 + rng.random() / 2)


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
