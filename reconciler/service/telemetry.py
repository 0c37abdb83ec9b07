"""The service's log events (``log_event``: a message and structured fields, written as JSON
lines by ``adapters/logs.py``) and its Prometheus metrics.

Every series a shipped alert rule or dashboard panel reads (examples/deploy/kubernetes/
prometheusrule.yaml, examples/deploy/grafana/) is on ``/metrics`` before its first event,
at 0 (issue 41, point 6): ``increase()`` and ``rate()`` see nothing of a counter whose first
sample is already 1, so the first failure after a start would go unalerted, and a rule over
a series that does not exist yet has no data. The label values a pass result, a webhook or a
mirrored request can take are fixed (below), exported from the start; those of servers,
models and deployments come from the manifests, exported after each pass for what it names
(``after_pass``). The gauges of a rollout in flight (``triton_gitops_rollout_step``, the
analysis's checks) exist only while it runs, and a route's share only once the reconciler
has set it: 0 would say something false; no rule reads them, and no panel takes their rate
(tests/integration/test_alert_rules.py holds both). The probe stream histograms of a
version of a streaming model exist from the probes' first look at it, at 0, until it is
no longer served.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import platform
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    disable_created_metrics,
)

from reconciler import __version__
from reconciler.core.placement import model_states
from reconciler.model.reports import PassReport
from reconciler.model.results import Outcome

log = logging.getLogger("triton_gitops")


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


def log_event(message: str, level: int = logging.INFO, **fields: Any) -> None:
    log.log(level, message, extra={"fields": fields})


# Seconds: a generator's first response (its prefill) takes from milliseconds to seconds; a
# response follows the one before it within milliseconds (a token) to a second or so.
PROBE_FIRST_RESPONSE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
PROBE_GAP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)

# What ``triton_gitops_model_state`` reports, per model and server.
MODEL_STATES = ("in-sync", "progressing", "held", "suspended", "failed")
# Every value of the labels that do not come from the manifests, as service/daemon.py (a
# pass's result), service/http.py (a webhook's source and what became of it) and
# adapters/comparator.py (a mirrored request's outcome) write them
# (tests/service/test_metric_series.py reads those modules to hold them to it).
PASS_RESULTS = ("ok", "partial", "error", "source-unavailable", "invalid", "refused", "crashed")
WEBHOOK_SOURCES = ("github", "gitlab", "token", "operator")
WEBHOOK_RESULTS = (
    "accepted", "ping", "unauthorized", "replayed", "no-length", "too-large", "busy",
    "malformed", "timeout",
)  # fmt: skip
SHADOW_OUTCOMES = (
    "compared", "candidate_disagreed", "noise", "not_sampled", "dropped", "unparsable",
    "sequence", "primary_failed", "uncomparable", "candidate_timeouts", "other_model",
    "no_http",
)  # fmt: skip


class ReconcilerMetrics:
    """The reconciler's own Prometheus metrics, in a registry of their own."""

    def __init__(self) -> None:
        # No ``_created`` twin of every counter and histogram: nothing reads them, and they
        # double the series a scrape stores (prometheus_client's switch is process-wide).
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry()
        r = self.registry
        # What a Prometheus user expects of any process (process_resident_memory_bytes, open
        # fds, CPU seconds; python_info, python_gc_*): the default registry's collectors.
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            r.register(collector)
        self.pass_duration = Histogram(
            "triton_gitops_pass_duration_seconds",
            "Duration of reconcile passes",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
            registry=r,
        )
        self.passes = Counter(
            "triton_gitops_passes", "Reconcile passes by result", ["result"], registry=r
        )
        for result in PASS_RESULTS:
            self.passes.labels(result)
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
        # Every outcome from 0: a series that first appears at 1 shows no increase(), and the
        # rollout alerts (examples/deploy/kubernetes/prometheusrule.yaml) would miss the
        # first failure after a restart.
        for outcome in Outcome:
            self.rollouts.labels(str(outcome))
        self.reachable = Gauge(
            "triton_gitops_server_reachable",
            "1 when the server answered the last pass",
            ["server"],
            registry=r,
        )
        self.unreachable_passes = Gauge(
            "triton_gitops_server_unreachable_passes",
            "Passes in a row that found the server unreachable (0 when the last one reached "
            "it; a server backed off keeps its count until a pass tries it again)",
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
        for source in WEBHOOK_SOURCES:
            for result in WEBHOOK_RESULTS:
                self.webhooks.labels(source, result)
        self.connections_refused = Counter(
            "triton_gitops_http_connections_refused",
            "Connections closed unanswered or answered 503: busy (too many at once), timeout "
            "(request not received within the deadline), malformed (a request line, header or "
            "framing outside RFC 9112, answered 4xx/501 and closed), error",
            ["reason"],
            registry=r,
        )
        self.build = Info(
            "triton_gitops_build", "The reconciler's version and its Python", registry=r
        )
        self.build.info({"version": __version__, "python": platform.python_version()})
        self.model_state = Gauge(
            "triton_gitops_model_state",
            "1 for the state each model on each server is in after the last pass (one of "
            + ", ".join(MODEL_STATES)
            + "), 0 for the others",
            ["server", "model", "deployment", "state"],
            registry=r,
        )
        self._model_states: set[tuple[str, str, str]] = set()  # server, model, deployment
        self.serving = Gauge(
            "triton_gitops_server_serving",
            "1 when the server serves every model placed on it as the last pass intended "
            "(GET /serving says why not; the readiness gate's condition), 0 when not",
            ["server"],
            registry=r,
        )
        self.readiness_gate_errors = Counter(
            "triton_gitops_readiness_gate_errors",
            "Times the serving condition could not be set on a server's pod (no readiness "
            "gate declared, pod gone, 403, API unreachable): the log says which",
            ["server"],
            registry=r,
        )
        self.rollout_step = Gauge(
            "triton_gitops_rollout_step",
            "1 for the step of the change in progress on the server for the model (load, "
            "verify, analyze, route, unload, drain, replace-library, reverting), 0 for the "
            "others; no series when none is in progress",
            ["server", "model", "step"],
            registry=r,
        )
        self.analysis_seconds_left = Gauge(
            "triton_gitops_analysis_seconds_left",
            "Seconds left of the analysis in progress on the server for the model",
            ["server", "model"],
            registry=r,
        )
        self.check_value = Gauge(
            "triton_gitops_analysis_check_value",
            "The last value of each check of the analysis in progress (success rate, latency "
            "increase, memory growth in bytes, a promql check's value: a business metric, the "
            "shadow comparison's disagreement beyond the noise and latency increase), by kind "
            "(successRate, latency, memory, promql, shadow)",
            ["server", "model", "check", "kind"],
            registry=r,
        )
        self.check_bound = Gauge(
            "triton_gitops_analysis_check_bound",
            "Each bound of each check of the analysis in progress (bound: min, max, "
            "max_increase, max_increase_bytes)",
            ["server", "model", "check", "bound"],
            registry=r,
        )
        self.route_weight = Gauge(
            "triton_gitops_route_weight",
            "The share of the router's traffic (0 to 1) the reconciler last gave the pool",
            ["router", "pool"],
            registry=r,
        )
        self.route_mirror = Gauge(
            "triton_gitops_route_mirror",
            "The share of the router's traffic (0 to 1) the reconciler last mirrored to the pool",
            ["router", "pool"],
            registry=r,
        )
        self.shadow_requests = Counter(
            "triton_gitops_shadow_requests",
            "Live requests the router mirrored to the comparator, by what became of them: "
            "compared, candidate_disagreed, noise (the serving version disagreed with "
            "itself), not_sampled, dropped, unparsable, sequence, primary_failed, "
            "uncomparable, candidate_timeouts, other_model, no_http (an SSE copy, and no "
            "HTTP endpoint declared to ask it at)",
            ["deployment", "outcome"],
            registry=r,
        )
        self.stuck_unloads = Gauge(
            "triton_gitops_versions_stuck_unloading",
            "Versions of the model on the server UNLOADING longer than --unload-deadline "
            "(their memory is not given back)",
            ["server", "model"],
            registry=r,
        )
        self._stuck: set[tuple[str, str]] = set()  # the pairs on the gauge
        self._stuck_counts: dict[tuple[str, str], int] = {}
        self._placed: set[tuple[str, str]] = set()  # (server, model) of the last pass
        self._named: dict[Counter, set[tuple[str, ...]]] = {}  # what after_pass exported
        # The watch sets the stuck unloads, a pass's end the placements.
        self._stuck_lock = threading.Lock()
        # The probes between rollouts' streams to a streaming model (service/serving_probes.py),
        # per version: Triton 2.51 times no stream, so these are the version's only figures of
        # time to first response and between responses outside a rollout.
        self.probe_first_response = Histogram(
            "triton_gitops_probe_first_response_seconds",
            "Time to the first response of the probe streams sent between rollouts to each "
            "version of a streaming model",
            ["server", "model", "version"],
            buckets=PROBE_FIRST_RESPONSE_BUCKETS,
            registry=r,
        )
        self.probe_response_gap = Histogram(
            "triton_gitops_probe_response_gap_seconds",
            "Time between two responses of the probe streams sent between rollouts to each "
            "version of a streaming model",
            ["server", "model", "version"],
            buckets=PROBE_GAP_BUCKETS,
            registry=r,
        )
        self.webhook_reads = Gauge(
            "triton_gitops_webhook_reads_in_progress",
            "Webhook bodies being read now (bounded by the webhook read cap)",
            registry=r,
        )

    def after_pass(self, report: PassReport) -> None:
        """What a pass's report sets: each (server, model)'s state, and at 0 every series a
        rule or panel reads for the label sets the manifests name that has none yet (per
        server, placed model, deployment with a shadow phase); label sets the manifests no
        longer name leave the metrics."""
        self.set_model_states(
            model_states(report), {key: d.name for key, d in report.placed.items()}
        )
        shadowed = {
            deployment.name
            for deployment in report.placed.values()
            if (traffic := deployment.rollout.traffic) is not None and traffic.shadow is not None
        }
        self._export_named(self.readiness_gate_errors, {(server,) for server in report.servers})
        self._export_named(self.drift, set(report.placed))
        self._export_named(
            self.shadow_requests, {(d, o) for d in shadowed for o in SHADOW_OUTCOMES}
        )
        with self._stuck_lock:
            self._placed = set(report.placed)
            self._publish_stuck()

    def _export_named(self, counter: Counter, keys: set[tuple[str, ...]]) -> None:
        """Each label set in ``keys`` on ``counter``; those the last call named and this
        one does not leave it."""
        for gone in self._named.get(counter, set()) - keys:
            counter.remove(*gone)
        for key in keys:
            counter.labels(*key)  # 0 when new; a count already there stays
        self._named[counter] = keys

    def set_model_states(
        self,
        states: Mapping[tuple[str, str], str],
        deployments: Mapping[tuple[str, str], str] | None = None,
    ) -> None:
        """Each (server, model)'s state after a pass, labelled with the ModelDeployment
        that places it there (``deployments``; empty where none does); models no pass
        reports any more leave the metric."""
        named = {
            (server, model, (deployments or {}).get((server, model), ""))
            for server, model in states
        }
        for key in self._model_states - named:
            for state in MODEL_STATES:
                self.model_state.remove(*key, state)
        for server, model, deployment in named:
            current = states[(server, model)]
            for state in MODEL_STATES:
                self.model_state.labels(server, model, deployment, state).set(
                    1 if state == current else 0
                )
        self._model_states = named

    def shadow_compared(self, deployment: str, outcome: str) -> None:
        """One mirrored request's outcome at the comparator (``adapters/comparator.py``)."""
        self.shadow_requests.labels(deployment, outcome).inc()

    def probe_streams_of(self, server: str, model: str, version: int) -> None:
        """A version of a streaming model the probes between rollouts ask: its series, at 0."""
        self.probe_first_response.labels(server, model, str(version))
        self.probe_response_gap.labels(server, model, str(version))

    def probe_streamed(
        self, server: str, model: str, version: int, first: float, gaps: Sequence[float]
    ) -> None:
        """A probe stream between rollouts ended: its time to the first response and the
        times between its responses."""
        labels = (server, model, str(version))
        self.probe_first_response.labels(*labels).observe(first)
        gap = self.probe_response_gap.labels(*labels)
        for seconds in gaps:
            gap.observe(seconds)

    def probes_forgotten(self, server: str, model: str, version: int) -> None:
        """A version no longer served: its probe stream series leave the metrics."""
        for histogram in (self.probe_first_response, self.probe_response_gap):
            with contextlib.suppress(KeyError):
                histogram.remove(server, model, str(version))

    def set_stuck_unloads(self, counts: Mapping[tuple[str, str], int]) -> None:
        """Versions stuck UNLOADING per (server, model): 0 for the other pairs the last pass
        placed; pairs neither placed nor stuck leave the metric."""
        with self._stuck_lock:
            self._stuck_counts = dict(counts)
            self._publish_stuck()

    def _publish_stuck(self) -> None:
        keys = set(self._stuck_counts) | self._placed
        for key in self._stuck - keys:
            self.stuck_unloads.remove(*key)
        for key in keys:
            self.stuck_unloads.labels(*key).set(self._stuck_counts.get(key, 0))
        self._stuck = keys
