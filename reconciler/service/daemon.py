"""``triton-gitops run``: the reconciler as a long-running service next to the Triton fleet.

    scheduler (APScheduler)   a pass every --interval (with jitter); never two at once
                              (max_instances=1, coalesced); an overrun is counted, not stacked
    webhooks                  GitHub (X-Hub-Signature-256), GitLab (X-Gitlab-Token) and a
                              token-authenticated POST /reconcile trigger a pass at once;
                              replays (a delivery id, signature or GitLab body digest seen
                              within the window, before a restart too: the state store),
                              bodies over the cap (declared or chunked) and requests not
                              received within one whole-request deadline are refused, and
                              bounded connection counts keep a flood from starving the rest
    watch                     every few seconds, each server's repository index against what
                              the last pass left serving: a restarted server or a hand-unloaded
                              model triggers a pass without waiting for the interval; it
                              reads at once when its connection to a server drops (a restart)
    serving                   from the watch's readings: whether each server serves what the
                              last pass left it (GET /serving, the readiness gate's condition
                              with --readiness-gate; service/serving.py)
    backoff                   a failing server is skipped until its next try (exponential,
                              jittered), the others go on; a Git remote that is down keeps
                              everything serving and is retried the same way, as is a
                              refused revision or a state file of another repository
    observability             /metrics (prometheus-client), /healthz, /readyz; JSON log lines,
                              one "failure" event per server or model a pass left failed
    shutdown                  SIGTERM/SIGINT: the change in progress finishes (an analysis in
                              progress is cut short and its old versions put back), no other
                              starts; exit 0, or 1 if the deadline passed first

The pass itself is ``loop.reconcile``; this module only decides when to run it and reports.
``Daemon`` keeps the lifecycle, the scheduler and the pass; the parts it is made of live beside
it: service/http.py (the request handler, bounded reading, the listener), service/webhooks.py
(webhook authentication and replays), service/watch.py (the watch between passes),
service/backoff.py (the backoff of failing servers), service/telemetry.py (log lines and
metrics). ``cli/service.py`` (``triton-gitops run``) makes one and calls ``serve``.
"""

from __future__ import annotations

import logging
import random
import signal
import threading
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from types import FrameType
from typing import Any

from apscheduler.events import (
    EVENT_JOB_ERROR,
    EVENT_JOB_EXECUTED,
    EVENT_JOB_MAX_INSTANCES,
    JobEvent,
)
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.interval import IntervalTrigger

from reconciler.core.undo import UndoRequest
from reconciler.credentials import conceal, redact
from reconciler.loop.memory import PassMemory
from reconciler.loop.on_call import give
from reconciler.loop.pass_log import log_step
from reconciler.loop.reconcile import reconcile
from reconciler.loop.undo import undo
from reconciler.model.errors import (
    ReconcileError,
    SourceUnavailable,
    StateFileRefused,
    UndoRefused,
    UnsafeRevision,
    ValidationError,
)
from reconciler.model.history import OrderKind
from reconciler.model.reports import PassReport
from reconciler.model.results import Outcome
from reconciler.model.settings import RunSettings, Settings
from reconciler.model.source import Source
from reconciler.ports import ReconcilerLock, RotatingSecrets
from reconciler.service.backoff import ServerBackoff, backoff_delay
from reconciler.service.http import Listener, handler_for
from reconciler.service.operator import verb_detail, verb_takes_effect
from reconciler.service.serving import ServingWatch
from reconciler.service.telemetry import ReconcilerMetrics, fewer_malloc_arenas, log, log_event
from reconciler.service.watch import Watch
from reconciler.service.webhooks import WebhookGate
from reconciler.views.passes import pass_outcome
from reconciler.wiring import ports, state_store

# The secret files that are RunSettings fields; "git_token" is the Git credentials' token.
_RUN_SECRETS = ("github_secret", "gitlab_token", "reconcile_token", "operator_tokens")
# How often a service waiting for the reconciler lock says who holds it.
_LOCK_WAIT_LOG_EVERY = 30.0


class Daemon:
    """The service: passes on a schedule and on request, never two at once, and an orderly
    stop. Tests start only its HTTP side (``start_http``); ``serve`` runs the whole."""

    def __init__(
        self,
        source: Source,
        settings: Settings,
        run: RunSettings,
        *,
        rng: random.Random | None = None,
        lock: ReconcilerLock | None = None,
        secrets: RotatingSecrets | None = None,
    ) -> None:
        self.source = source
        self.settings = settings
        self.run_settings = run
        # Held from before the first pass until the last: one reconciler at a time.
        self.lock = lock
        self._lock_lost = False
        self.secrets = secrets  # re-read when their files change (a rotated Secret)
        token = settings.git.credentials.token
        conceal(
            run.github_secret, run.gitlab_token, run.reconcile_token, token,
            *run.operator_tokens.values(),
        )  # fmt: skip
        self.metrics = ReconcilerMetrics()
        self.rng = rng or random.Random()
        self.stop_requested = threading.Event()
        self._pass_lock = threading.Lock()
        self.memory = PassMemory()  # what passes keep for the next: clients, manifests
        self._pending = threading.Event()
        self._fetched_once = False
        # A pass read the manifests and reached a server (or none is declared): ready, even
        # if some server or model failed, so one flaky instance keeps no restarted pod out.
        self._reached_once = False
        self._passed_once = False  # a fully successful pass (last_success_timestamp's too)
        self.backoff = ServerBackoff(self.rng)
        self._git_failures = 0
        self._last: PassReport | None = None
        # Passes started, and the last one's outcome (``reconcile`` waits for a later one).
        self._started = 0
        self._outcome: dict[str, Any] = {"number": 0}
        self.serving_watch = ServingWatch.of_service(
            settings, run, self.metrics, self.memory, lambda: self._bring_forward("watch")
        )
        self.serving_board = self.serving_watch.board
        self._watch = Watch(settings, self.backoff, self.serving_watch.connections)
        self.scheduler = BackgroundScheduler(timezone=UTC)
        self.http: Listener | None = None
        self.webhooks = WebhookGate(run, settings.state_path, self.run_now)

    # -- secrets that rotate ------------------------------------------------------------

    def run_now(self) -> RunSettings:
        """The service's settings with the webhook secrets and operator tokens as their
        files say now."""
        if self.secrets is None:
            return self.run_settings
        current = self.secrets.current()
        return replace(self.run_settings, **{k: v for k, v in current.items() if k in _RUN_SECRETS})

    def settings_now(self) -> Settings:
        """A pass's settings with the Git token as its file says now."""
        token = self.secrets.current().get("git_token") if self.secrets else None
        if token is None:
            return self.settings
        git = self.settings.git
        credentials = replace(git.credentials, token=token)
        return replace(self.settings, git=replace(git, credentials=credentials))

    # -- passes --------------------------------------------------------------------------

    def trigger(self, why: str) -> None:
        """Run a pass as soon as possible (after the one running, if any)."""
        log_event("pass requested", trigger=why)
        self._pending.set()
        if self.scheduler.running and not self.stop_requested.is_set():
            self.scheduler.modify_job("reconcile", next_run_time=datetime.now(UTC))

    def _skip_list(self) -> dict[str, str]:
        return self.backoff.skip_list()

    def run_pass(self, trigger: str = "schedule") -> PassReport | None:
        if self.stop_requested.is_set() or self._lost_the_lock():
            return None
        if not self._pass_lock.acquire(blocking=False):
            self._pending.set()
            return None
        self._pending.clear()
        started = time.monotonic()
        result = "error"
        report: PassReport | None = None
        self._started += 1
        number = self._started
        settings = self.settings_now()
        try:
            observer = self.metrics.shadow_compared
            with ports(settings, self.source, shadow_observer=observer) as pass_ports:
                report = reconcile(
                    self.source,
                    settings,
                    pass_ports,
                    apply_changes=not self.run_settings.dry_run,
                    progress=log_step,
                    skip=self._skip_list(),
                    stopping=self.stop_requested.is_set,
                    memory=self.memory,
                    events=self.serving_watch.events,  # /serving and the rollout metrics
                )
            self._fetched_once = True
            self._git_failures = 0
            result = self._record(report)
        except SourceUnavailable as exc:
            self.metrics.git_errors.inc()
            delay = self._git_backoff()
            result = "source-unavailable"
            log_event(
                "manifest repository unavailable; everything keeps serving",
                logging.WARNING,
                error=str(exc),
                retry_in_seconds=round(delay, 1),
            )
        except ValidationError as exc:
            self._fetched_once = True
            result = "invalid"
            log_event(
                "manifests invalid; nothing applied",
                logging.ERROR,
                revision=exc.revision,
                problems=[str(p) for p in exc.problems],
            )
        except (UnsafeRevision, StateFileRefused) as exc:
            # Only an operator ends these (--accept-rewrite, the right --state, a new commit):
            # retried on the Git remote's backoff, alerted once by the pass (its memory).
            self._fetched_once = True
            result = "refused"
            delay = self._git_backoff()
            log_event(
                "state file refused" if isinstance(exc, StateFileRefused) else "revision refused",
                logging.ERROR,
                error=str(exc),
                retry_in_seconds=round(delay, 1),
            )
        except ReconcileError as exc:
            log_event("pass failed", logging.ERROR, error=str(exc))
        except Exception:
            log.exception("pass crashed", extra={"fields": {"trigger": trigger}})
            result = "crashed"
        finally:
            seconds = time.monotonic() - started
            self.metrics.pass_duration.observe(seconds)
            self.metrics.passes.labels(result).inc()
            self._outcome = pass_outcome(number, trigger, result, seconds, report, time.time())
            log_event(
                "pass finished",
                trigger=trigger,
                result=result,
                seconds=round(seconds, 3),
                revision=report.revision if report else None,
                # each one logged as a "failure" event just before (loop/pass_log.py)
                failed=len(self._outcome["failed"]),
            )
            self._pass_lock.release()
            self.serving_watch.pass_ended()
        if report is not None and not self.stop_requested.is_set():
            # What serves now, without waiting for the watch's next round.
            self.serving_watch.after_pass(report, self._watch)
        # A pass asked for meanwhile runs once this job has returned (``_job_ended``): asked
        # from inside it, the scheduler would skip it as running, to the next interval.
        return report

    def _record(self, report: PassReport) -> str:
        self._last = report
        self.metrics.revision.info({"revision": report.revision})
        # A server lost in the middle of a change counts as one found down when planning:
        # the backoff tries it again, and the watch brings the next pass forward once it
        # answers. Otherwise nothing the pass left expected is on it to notice it is back,
        # and the unfinished change would wait for the interval.
        unreachable = report.unreachable
        skipped = set(self._skip_list())
        # Readiness: a server lost mid-change had answered when the pass planned.
        if not report.servers or set(report.servers) - report.down_when_planned - skipped:
            self._reached_once = True
        for server in report.servers:
            if server in skipped:
                continue
            self.metrics.reachable.labels(server).set(0 if server in unreachable else 1)
            if server in unreachable:
                self._bring_forward("reconcile", self.backoff.server_failed(server))
            else:
                self.backoff.server_answered(server)
            self.metrics.unreachable_passes.labels(server).set(self.backoff.failed_passes(server))
        self.metrics.after_pass(report)  # model states; the series rules read, at 0
        for server, model in report.drift:
            self.metrics.drift.labels(server, model).inc()
            log_event(
                "drift corrected",
                logging.WARNING,
                server=server,
                model=model,
                revision=report.revision,
            )
        for change in report.result.changes if report.result else ():
            if change.change.deployment is not None and change.change.desired:
                self.metrics.rollouts.labels(str(change.outcome)).inc()
            log_event(
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
            log_event("revert write-back", revision=report.revision, note=note)
        if report.ok:
            self.metrics.last_success.set(time.time())
            self._passed_once = True
            return "ok"
        return "partial"

    def _git_backoff(self) -> float:
        """Count a pass the Git side failed or refused; the next one comes after the
        backoff's delay (sooner than the interval), in seconds."""
        self._git_failures += 1
        delay = backoff_delay(self._git_failures, self.rng)
        self._bring_forward("reconcile", delay)
        return delay

    def _bring_forward(self, job_id: str, delay: float = 0.0) -> None:
        """Bring the next run of ``job_id`` (the pass, the watch) forward to ``delay``
        seconds from now if it is later."""
        if not self.scheduler.running or self.stop_requested.is_set():
            return
        job = self.scheduler.get_job(job_id)
        at = datetime.now(UTC) + timedelta(seconds=delay)
        if job is not None and (job.next_run_time is None or job.next_run_time > at):
            self.scheduler.modify_job(job_id, next_run_time=at)

    # -- the watch between passes ---------------------------------------------------------

    def watch(self) -> None:
        """Compare each server's index with what the last pass left serving, and each
        discovered server's DNS name with the instances the last pass found."""
        report = self._last
        if self._lost_the_lock():
            return
        if report is None or self.stop_requested.is_set() or self._pass_lock.locked():
            return
        why = self.serving_watch.round(report, self._watch)
        if why is not None:
            self.trigger(why)

    # -- one reconciler at a time ---------------------------------------------------------

    def take_lock(self) -> bool:
        """Wait for the reconciler lock (another service, an apply), saying who holds it
        every little while; False when asked to stop first."""
        lock = self.lock
        if lock is None:
            return True
        began, told = time.monotonic(), None
        while not self.stop_requested.is_set():
            # A couple of seconds a try: a Lease is tried about as often as client-go does
            # (every 2 s), and SIGTERM is heard within that.
            if lock.acquire(timeout=2.0):
                if told is not None:
                    log_event("reconciler lock taken", lock=lock.where,
                           waited_seconds=round(time.monotonic() - began, 1))  # fmt: skip
                return True
            if told is None or time.monotonic() - told >= _LOCK_WAIT_LOG_EVERY:
                told = time.monotonic()
                holder = lock.holder()
                log_event(
                    "waiting for the reconciler lock", logging.WARNING, lock=lock.where,
                    holder=str(holder) if holder else None,
                    holder_pid=holder.pid if holder else None,
                    holder_command=holder.command if holder else None,
                )  # fmt: skip
        return False

    def _lost_the_lock(self) -> bool:
        """A Lease that could not be renewed: another replica may lead now, so this one
        stops (exit 1: Kubernetes restarts it, and it waits as a follower)."""
        if self.lock is None or self._lock_lost or self.stop_requested.is_set():
            return self._lock_lost  # stopping: shutdown lets it go itself
        if self.lock.held():
            return False
        self._lock_lost = True
        log_event("reconciler lock lost; stopping", logging.ERROR, lock=self.lock.where)
        self.request_stop()
        return True

    # -- what the HTTP front door asks (http.ServiceFront) --------------------------------

    def health(self) -> tuple[int, dict[str, Any]]:
        return 200, {"status": "alive"}

    def readiness(self) -> tuple[int, dict[str, Any]]:
        ready = self._fetched_once and self._reached_once
        return (200 if ready else 503), {
            "ready": ready,
            "leading": self.lock is None or self.lock.held(),
            "fetched": self._fetched_once,
            "reached": self._reached_once,
            "passed": self._passed_once,
            "revision": self._last.revision if self._last else None,
        }

    def serving(self, server: str | None) -> tuple[int, dict[str, Any]]:
        return self.serving_board.answer(server)

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
        """An on-call verb on the state store the passes read; resume, retry and undo ask
        for a pass at once. Recorded in history as ``token:<name>``."""
        who = f"token:{by}"
        if verb == "undo" and deployment is not None:
            return self._undo(UndoRequest(deployment, who, to_revision, reason, dry_run))
        if verb == "reconcile" and self.lock is not None and not self.lock.held():
            return 503, {"verb": verb, "error": f"this reconciler does not hold {self.lock.where}"}
        after = self._started  # a pass numbered above this started after the request
        with state_store(self.settings.state_path) as store:
            done = give(store, verb, deployment, who, reason)
        log_event("operator verb", logging.WARNING, verb=verb, target=done.target, by=who,
                  reason=reason, given=not done.refused)  # fmt: skip
        if done.refused:
            what = f"{done.target} is {done.refused}"
            if verb in set(OrderKind):
                what = f"no rollout of {done.target} is in progress"
            return 409, {"error": what, "verb": verb, "target": done.target}
        if done.asks_for_a_pass:
            self.trigger(f"{verb} by {who}")
        if verb == "reconcile":
            return 202, {"verb": verb, "by": who, "after": after, "pass": "requested"}
        return 200, {
            "verb": verb,
            "target": done.target,
            "by": who,
            "detail": verb_detail(done),
            "pass": verb_takes_effect(verb),
        }

    def _undo(self, request: UndoRequest) -> tuple[int, dict[str, Any]]:
        """``undo`` through the service: the commit is pushed from here (with the service's
        Git credentials and revert author), and a pass applies it at once."""
        reply: dict[str, Any] = {"verb": "undo", "target": request.deployment, "by": request.by}
        if self.lock is not None and not self.lock.held():
            # A replica waiting for the lock pushes nothing: the one holding it reconciles.
            return 503, {**reply, "error": f"this reconciler does not hold {self.lock.where}"}
        settings = self.settings_now()
        try:
            with ports(settings, self.source) as undo_ports:
                done = undo(request, self.source, settings, undo_ports)
        except UndoRefused as exc:
            return 409, {**reply, "error": str(exc)}
        except ReconcileError as exc:
            return 502, {**reply, "error": str(exc)}
        log_event(
            "operator verb",
            logging.WARNING,
            verb="undo",
            target=request.deployment,
            by=request.by,
            revision=done.revision,
            commit=done.commit,
            dry_run=request.dry_run,
        )
        if not request.dry_run:
            self.trigger(f"undo by {request.by}")
        return 200, {
            **reply,
            "detail": str(done),
            "revision": done.revision,
            "commit": done.commit,
            "patch": done.patch,
            "pass": "the dry run changes nothing" if request.dry_run else "requested",
        }

    def last_pass(self) -> dict[str, Any]:
        return dict(self._outcome)

    def live_status(self) -> dict[str, Any]:
        with state_store(self.settings.state_path) as store:
            live = store.live()
        return {"in_progress": live or {"rollouts": []}, "last_pass": self.last_pass()}

    def refused(self, reason: str) -> None:
        self.metrics.connections_refused.labels(reason).inc()
        if reason != "error":
            log_event("connection refused", logging.WARNING, reason=reason)

    # -- lifecycle ------------------------------------------------------------------------

    def start_http(self) -> None:
        """Serve webhooks, /metrics and the health checks (without the scheduler: tests)."""
        self.webhooks.recall()  # replays of deliveries seen before a restart are refused too
        host, _, port = self.run_settings.listen.rpartition(":")
        self.http = Listener(
            (host or "127.0.0.1", int(port)),
            handler_for(self, self.run_settings),
            self.run_settings.max_connections,
            self.refused,
        )
        threading.Thread(target=self.http.serve_forever, name="http", daemon=True).start()

    def start(self) -> None:
        self.start_http()
        self.start_passes()

    def start_passes(self) -> None:
        """The scheduled passes and the watch between them."""
        self.scheduler.add_listener(self._overrun, EVENT_JOB_MAX_INSTANCES)
        self.scheduler.add_listener(self._job_ended, EVENT_JOB_EXECUTED | EVENT_JOB_ERROR)
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
        log_event(
            "started",
            repo=redact(self.source.repo),
            ref=self.source.ref,
            listen=self.run_settings.listen,
            interval=self.run_settings.interval,
            dry_run=self.run_settings.dry_run,
        )

    def _job_ended(self, event: JobEvent) -> None:
        """A pass job has returned: run the pass asked for while it ran, if one was."""
        wanted = self._pending.is_set() and not self.stop_requested.is_set()
        if event.job_id == "reconcile" and wanted:
            self.trigger("requested during the last pass")

    def _overrun(self, event: JobEvent) -> None:
        if event.job_id == "reconcile":
            self.metrics.skipped.inc()
            self._pending.set()
            log_event("pass overran its interval; the next one runs when it ends", logging.WARNING)

    def request_stop(self, signum: int | None = None, _: FrameType | None = None) -> None:
        if not self.stop_requested.is_set():
            log_event("stopping", signal=signal.Signals(signum).name if signum else None)
        self.stop_requested.set()

    def shutdown(self) -> int:
        """Finish the change in progress (within the deadline), then stop everything."""
        self.stop_requested.set()
        if self.scheduler.running:  # not yet when stopped while waiting for the lock
            self.scheduler.shutdown(wait=False)
        finished = self._pass_lock.acquire(timeout=self.run_settings.shutdown_deadline)
        if self.http is not None:
            self.http.shutdown()
            self.http.server_close()
            self.webhooks.close()
        self.serving_watch.connections.close()
        if finished:
            self.memory.close()
            if self.lock is not None:
                self.lock.release()
            self._pass_lock.release()
            log_event("stopped")
            return 1 if self._lock_lost else 0
        log_event(
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
        # Health checks and the on-call verbs that only write the state store are served
        # while waiting for the lock; passes start once it is taken.
        self.start_http()
        if self.take_lock():
            self.start_passes()
        while not self.stop_requested.wait(1.0):
            pass
        return self.shutdown()
