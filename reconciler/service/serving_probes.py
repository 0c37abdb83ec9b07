"""The probes between rollouts (issue 30): one request at a time to each version the last
pass left serving, at each deployment's ``spec.servingProbes`` interval, so that a version
Triton still calls READY but that no longer answers (a Python stub that died or hangs) is
found, taken out of service (service/serving.py) and reloaded in place by the next pass
(core/plan/heal.py). The record of each version is ``core.answering``.

A probe is the deployment's first smoke case (judged by its expectations, from the first
probe on), else a request synthesized from the version's inputs (any answer passes; judged
only once the version has answered one, as a model may reject zeros); it is pinned to the
version, with the case's own time (``timeout``, a stream's ``deadline``) where it has one,
else the deployment's ``servingProbes.timeout``. A server that does not answer at all is the
backoff's business, not the version's: its probes are not counted. Started by the watch
(``Daemon.watch``), never during a pass, in a thread of their own (``round_aside``): a round
begun before a pass may run into it, and a probe still out when the pass ends is not
counted. A probe stream to a streaming model gives its version's time to the first
response and between responses to ``ReconcilerMetrics``
(``triton_gitops_probe_first_response_seconds``, ``..._response_gap_seconds``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

from reconciler.core.answering import Answering, after_probe, after_reload
from reconciler.core.probes import ProbeRequest, declared, synthesized, wrong
from reconciler.core.triton_config import exchange_of
from reconciler.engine.exchange import ask
from reconciler.model.errors import ServerUnavailable, StepFailed
from reconciler.model.plan import Exchange
from reconciler.model.reports import PassReport
from reconciler.model.results import Outcome
from reconciler.model.spec import ModelDeployment
from reconciler.ports import TritonClient
from reconciler.service.telemetry import ReconcilerMetrics
from reconciler.service.watch import Reading
from reconciler.wiring import watch_client

Key = tuple[str, str, int]  # server, model, version


class ServingProbes:
    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        metrics: ReconcilerMetrics | None = None,
    ) -> None:
        self.clock = clock
        self.metrics = metrics
        self._records: dict[Key, Answering] = {}
        # Each version's probe, and whether its model answers by streams.
        self._requests: dict[Key, tuple[ProbeRequest, Exchange] | None] = {}
        # A round runs in a thread of its own (``round_aside``) while the watch and the
        # passes go on: the records are read and written under this.
        self._lock = threading.Lock()
        self._passes_ended = 0  # by ``reloaded``: a probe out across a pass's end is not counted
        self._aside: threading.Thread | None = None

    def round_aside(
        self, report: PassReport, readings: Mapping[str, Reading], found: Callable[[], None]
    ) -> bool:
        """``round`` in a thread of its own, unless the last one still runs (False: its
        versions are due again next time); ``found`` is called when it changed which
        versions are out of service. A probe may take its smoke case's own time (a stream's
        deadline is 30 s unless it says): what the watch reads of every server (a restart,
        the truth of GET /serving) must not wait on a version that hangs."""
        if self._aside is not None and self._aside.is_alive():
            return False

        def probe() -> None:
            before = self.out_of_service(report)
            self.round(report, readings)
            if self.out_of_service(report) != before:
                found()

        self._aside = threading.Thread(target=probe, name="serving-probes", daemon=True)
        self._aside.start()
        return True

    def wait_aside(self, timeout: float | None = None) -> None:
        """Until the round in its own thread (if any) has ended, or ``timeout``."""
        if self._aside is not None:
            self._aside.join(timeout)

    def round(self, report: PassReport, readings: Mapping[str, Reading]) -> None:
        """Probe every version READY now whose probe is due; forget versions gone."""
        now = self.clock()
        seen: set[Key] = set()
        due: dict[str, list[tuple[Key, ModelDeployment]]] = {}
        for (server, model), deployment in sorted(report.placed.items()):
            reading = readings.get(server)
            probes = deployment.serving_probes
            if not probes.enabled or reading is None or isinstance(reading, str):
                continue
            for version in sorted(reading.get(model, ())):
                key = (server, model, version)
                seen.add(key)
                with self._lock:
                    record = self._records.get(key, Answering())
                if record.due(now, probes.interval):
                    due.setdefault(server, []).append((key, deployment))
        with self._lock:
            for gone in set(self._records) - seen:
                self._records.pop(gone)
                if self._requests.pop(gone, None) and self.metrics is not None:
                    self.metrics.probes_forgotten(*gone)
        for server, keys in due.items():
            address = report.servers.get(server)
            if address is not None:
                self._probe_server(server, address, keys)

    def _probe_server(
        self, server: str, address: str, keys: list[tuple[Key, ModelDeployment]]
    ) -> None:
        try:
            with watch_client(server, address) as client:
                for key, deployment in keys:
                    _, model, version = key
                    if key not in self._requests:
                        self._requests[key] = _request(client, model, version, deployment)
                    probe = self._requests[key]
                    if probe is None:
                        continue  # nothing to ask it: not judged
                    request, exchange = probe
                    if exchange is Exchange.STREAM and self.metrics is not None:
                        self.metrics.probe_streams_of(server, model, version)
                    if request.case is not None:
                        # A smoke case is a request the version must answer: judged from
                        # the first probe, not only once it has answered one.
                        with self._lock:
                            self._records.setdefault(key, Answering(answered=True))
                    # A smoke case's own time (its timeout, its stream's deadline and cap)
                    # holds here as in verify: a model slow by design would otherwise fail
                    # every probe and be reloaded again and again.
                    deadline, cap = request.limits(deployment.serving_probes.timeout)
                    with self._lock:
                        ended = self._passes_ended
                    sent = self.clock()
                    try:
                        reply = ask(
                            client,
                            model,
                            version,
                            request.inputs,
                            request.outputs,
                            exchange=exchange,
                            timeout=deadline,
                            max_responses=cap,
                        )
                        error = wrong(request, reply)
                        if reply.streamed and reply.first_seconds is not None and self.metrics:
                            self.metrics.probe_streamed(
                                server, model, version, reply.first_seconds, reply.gaps
                            )
                    except StepFailed as exc:
                        error = str(exc)
                    with self._lock:
                        if self._passes_ended != ended:
                            # A pass ended while this probe was out: it may have reloaded
                            # or unloaded the version it asked. The next round asks again.
                            continue
                        record = self._records.get(key, Answering())
                        self._records[key] = after_probe(record, sent, error)
        except ServerUnavailable:
            return  # the server, not the version: the backoff and the watch handle it

    def reloads_wanted(self, report: PassReport) -> dict[tuple[str, str], dict[int, str]]:
        """Per (server, model), the versions the next pass should reload in place, with
        the last error."""
        wanted: dict[tuple[str, str], dict[int, str]] = {}
        with self._lock:
            records = sorted(self._records.items())
        for (server, model, version), record in records:
            deployment = report.placed.get((server, model))
            if deployment and record.reload_wanted(deployment.serving_probes.failures):
                wanted.setdefault((server, model), {})[version] = record.last_error
        return wanted

    def out_of_service(self, report: PassReport) -> dict[tuple[str, str], str]:
        """Per (server, model), why it is out of service: versions that stopped answering
        (being reloaded, or reloaded in vain too often)."""
        out: dict[tuple[str, str], list[str]] = {}
        with self._lock:
            records = sorted(self._records.items())
        for (server, model, version), record in records:
            deployment = report.placed.get((server, model))
            probes = deployment.serving_probes if deployment else None
            if probes is None or not record.stopped(probes.failures):
                continue
            state = (
                "reloading in place"
                if record.reload_wanted(probes.failures)
                else f"reloaded {record.reloads} times in vain, left out"
            )
            out.setdefault((server, model), []).append(
                f"version {version} stopped answering ({record.failures} probes in a row: "
                f"{record.last_error}); {state}"
            )
        return {key: "; ".join(reasons) for key, reasons in out.items()}

    def reloaded(self, report: PassReport) -> None:
        """A pass ended: the versions it reloaded in place are judged afresh."""
        with self._lock:
            self._passes_ended += 1
        for change in report.result.changes if report.result else ():
            if change.change.heals and change.outcome is Outcome.CONVERGED:
                for version in change.change.heals:
                    key = (change.change.server, change.change.model, version)
                    with self._lock:
                        if key in self._records:
                            self._records[key] = after_reload(self._records[key])


def _request(
    client: TritonClient, model: str, version: int, deployment: ModelDeployment
) -> tuple[ProbeRequest, Exchange] | None:
    """The probe of a version: its deployment's first smoke case, else one synthesized from
    its inputs, and how it is sent (a stream, a whole sequence: its live config says;
    ``observe`` reads it, the index alone does not); None when no probe can be made."""
    observed = client.observe((model,))
    if observed.error is not None:
        raise ServerUnavailable(observed.server, observed.error)  # asked again next round
    try:
        exchange = exchange_of(observed.model(model).loaded_config)
        smoke = declared(deployment.smoke[:1], None, ())
        made = smoke[0] if smoke else synthesized(client.interface(model, version))
    except StepFailed:
        return None
    return None if made is None else (made, exchange)
