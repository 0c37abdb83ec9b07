"""Continuous operation: ``triton-gitops run`` as a real service, measured from outside.

One real tritonserver (``LocalTriton``, from the nvidia-pytriton wheel, EXPLICIT mode) and a
bare Git remote (``ManifestRepo``, reached over file://). The service is ``python -m reconciler
run`` in its own process, with a long ``--interval`` (so only webhooks, the watch and our own
``POST /reconcile`` trigger passes) and a short ``--watch-interval``. Three measurements:

1. Webhook-to-serving. ``echo`` is deployed at version 1; each change commits the other version
   (1 <-> 2), posts a signed GitHub push webhook, and times from the POST until the repository
   index shows exactly the new version READY (tritonclient gRPC, polled every 10 ms). Triton's
   own time for the same change is measured interleaved, on the same server, on ``echo-floor``
   (the same model under another name, which no manifest declares): load with the whole config
   and versions [old, new], poll until new is READY, load with [new], poll until exactly new is
   READY. Our overhead = webhook-to-serving minus that floor, pair by pair. The service's own
   log lines split the rest: webhook to pass start, pass start to the first step, the steps.
2. Restart-to-restored. ``tritonserver`` is killed with SIGKILL and started again on the same
   ports; from ``/v2/health/live`` answering 200 (polled every 10 ms) until the index shows
   echo READY at the desired version again (HTTP index, every 10 ms); ``/v2/health/ready`` is
   polled too and reported, but is no fair reference: with strict readiness (Triton's
   default) it stays 503 while the restoring load runs. The service notices the restart
   through its watch. The floor, afterwards with the service stopped: the same restart, then
   a hand load of echo at the same version as soon as the server is live, until READY.
3. Idle passes. A fresh server and a fresh service; the manifests declare ``--models`` copies of
   the test model (each a Python-backend model, so one backend stub process per model), all
   deployed by the service's first pass. Then ``--passes`` passes with nothing to change,
   triggered back to back with ``POST /reconcile`` (bearer token from
   $TRITON_GITOPS_RECONCILE_TOKEN), each awaited on the ``triton_gitops_passes_total`` counter
   of ``/metrics``. Every ``--sample-every`` passes: the service's RSS (``VmRSS``), CPU time
   (utime+stime of the process; its children, ``git fetch``, separately), threads, open files
   and child processes. The cost of our own ``/metrics`` scrapes is measured first and
   reported so it can be taken off the CPU per pass. Stops after ``--idle-max-seconds`` (the
   number actually run is reported; nothing is extrapolated).

Then, for explanations, a few idle passes run in this process (``reconciler.loop.reconcile``
against the same server, its own cache and state) under cProfile and tracemalloc, and the RSS
of a bare interpreter importing the service's dependencies one after another.

Targets (issue "continuous reconciliation"): under 1 s of our own overhead per change; under
80 MB RSS, flat over the idle passes.

    python -m bench.daemon [--changes N] [--restarts N] [--models N] [--passes N]

Every process started here (tritonserver and its backend stubs, each service) is stopped in
``finally``, by its process id.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import cProfile
import gc
import itertools
import json
import os
import pstats
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.harness.cli import markdown_main
from bench.harness.errors import VOID, BenchError
from bench.harness.passes import pass_settings, run_pass
from bench.harness.probe import Probe
from bench.harness.procfs import children, cpu_seconds, status_kb
from bench.harness.provenance import machine, other_tritonservers, provenance, tree_digest
from bench.harness.report import render, short_path
from bench.harness.service import measured_service
from bench.harness.stats import slope_per_100, summary
from bench.harness.triton import Index, wait_for
from reconciler.core.triton_config import parse_pbtxt
from reconciler.model.settings import Settings
from reconciler.model.source import Source
from testkit.local_triton import LocalTriton
from testkit.manifests import (
    MODELS,
    ManifestRepo,
    deployment_doc,
    server_doc,
    write_model_repository,
)
from testkit.service_process import Service

MODEL = "echo"
FLOOR_MODEL = "echo-floor"  # echo under another name, loaded by hand only
SERVER = "edge-a"
OVERHEAD_TARGET_S = 1.0
RSS_TARGET_MB = 80.0
FLAT_KB_PER_1000 = 1024.0  # "flat": under 1 MB per 1,000 passes once warmed up
WARM_PASSES = 100  # samples before this pass are left out of the "after warm-up" slope
RESULTS = Path(__file__).parent / "results"


# -- the model repository and the manifests --------------------------------------------------


def idle_name(index: int) -> str:
    return f"idle-{index:03d}"


def model_repository(root: Path, idle_models: int) -> Path:
    """The test models (echo, other), echo-floor (versions 1 and 2) and ``idle_models`` copies
    of echo with version 1 only; every copy's config.pbtxt carries its own name."""
    repository = write_model_repository(root)
    source = MODELS / "echo"
    for name, versions in [(FLOOR_MODEL, (1, 2))] + [
        (idle_name(i), (1,)) for i in range(idle_models)
    ]:
        folder = repository / name
        folder.mkdir()
        config = (source / "config.pbtxt").read_text().replace('"echo"', f'"{name}"')
        (folder / "config.pbtxt").write_text(config)
        for version in versions:
            (folder / str(version)).mkdir()
            shutil.copy(source / "model.py", folder / str(version) / "model.py")
    compileall.compile_dir(repository, quiet=1)  # no __pycache__ written at load time
    return repository


# -- the service -----------------------------------------------------------------------------


def _event_time(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(str(event["time"])).timestamp()


# -- the process, as /proc sees it -------------------------------------------------------------


def sample_process(pid: int, passes: int, started: float) -> dict[str, Any]:
    own, kids = cpu_seconds(pid)
    living = children(pid)
    child_rss = 0
    for child in living:
        with contextlib.suppress(OSError):
            child_rss += status_kb(child, "VmRSS")
    return {
        "pass": passes,
        "seconds": time.monotonic() - started,
        "rss_kb": status_kb(pid, "VmRSS"),
        "hwm_kb": status_kb(pid, "VmHWM"),
        "rss_anon_kb": status_kb(pid, "RssAnon"),
        "rss_file_kb": status_kb(pid, "RssFile"),
        "cpu_s": own,
        "children_cpu_s": kids,
        "threads": int(status_kb(pid, "Threads")),
        "open_files": len(os.listdir(f"/proc/{pid}/fd")),
        "child_processes": len(living),
        "child_rss_kb": child_rss,
        "load_average": os.getloadavg()[0],
    }


def slope_kb_per_100(samples: Sequence[dict[str, Any]]) -> float | None:
    """RSS growth per 100 passes over ``samples`` (least squares)."""
    return slope_per_100([float(x["pass"]) for x in samples], [float(x["rss_kb"]) for x in samples])


# -- Triton, as the benchmark sees it -----------------------------------------------------------


def http_ok(server: LocalTriton, path: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{server.http_address}{path}", timeout=0.5) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


def http_ready_versions(server: LocalTriton, model: str) -> set[int]:
    request = urllib.request.Request(
        f"http://{server.http_address}/v2/repository/index", b"{}", method="POST"
    )
    with urllib.request.urlopen(request, timeout=2) as response:
        index = json.load(response)
    return {
        int(m["version"])
        for m in index
        if m.get("name") == model and m.get("state") == "READY" and m.get("version")
    }


class Restart:
    """SIGKILL the server (and its backend stubs), start it again on the same ports.

    ``LocalTriton.start`` runs on a thread (it polls readiness every 100 ms and returns once
    ready) while ``begin`` polls ``/v2/health/live`` every 10 ms. Liveness, not readiness, is
    the reference: with Triton's default strict readiness, ``/v2/health/ready`` stays 503
    while any model is LOADING, so a reconciler that starts the restoring load before the
    first readiness poll holds readiness back until its own load is done."""

    def __init__(self, server: LocalTriton) -> None:
        self.server = server
        self.failure: list[BaseException] = []
        self.thread: threading.Thread | None = None

    def _start(self) -> None:
        try:
            self.server.start()
        except BaseException as exc:  # reported by end()
            self.failure.append(exc)

    def begin(self) -> float:
        """The monotonic time at which the restarted server first answered /v2/health/live."""
        self.server.kill()
        self.thread = threading.Thread(target=self._start, name="tritonserver-start", daemon=True)
        self.thread.start()
        return wait_for(lambda: http_ok(self.server, "/v2/health/live"), 120, "server live")

    def end(self) -> None:
        if self.thread is not None:
            self.thread.join(180)
        if self.failure:
            raise BenchError(f"tritonserver did not start again: {self.failure[0]}")


# -- 1. webhook to serving --------------------------------------------------------------------


def hand_change(index: Index, old: int, new: int) -> dict[str, float]:
    """Triton's own time for the change the reconciler makes, on echo-floor."""
    config = index.config(FLOOR_MODEL)  # read before timing, as the reconciler's observe does
    t0 = time.monotonic()
    index.load(FLOOR_MODEL, config, [old, new])
    t1 = time.monotonic()
    t2 = wait_for(lambda: new in index.ready(FLOOR_MODEL), 120, "echo-floor new version READY")
    index.load(FLOOR_MODEL, config, [new])
    t3 = time.monotonic()
    t4 = wait_for(index.serves_alone(FLOOR_MODEL, new), 120, "echo-floor new version alone")
    return {
        "total": t4 - t0,
        "load_call": t1 - t0,
        "verify_poll": t2 - t1,
        "unload_call": t3 - t2,
        "unload_poll": t4 - t3,
    }


def pass_breakdown(
    events: list[dict[str, Any]], posted_wall: float, served_wall: float, until_wall: float
) -> dict[str, Any]:
    """The service's own account of the pass a webhook triggered (from its log lines)."""
    window = [e for e in events if posted_wall - 0.005 <= _event_time(e) <= until_wall + 0.005]
    finished = next((e for e in window if e.get("message") == "pass finished"), None)
    steps = {
        str(e["step"]): e
        for e in window
        if e.get("message") == "step" and e.get("model") == MODEL and not e.get("revert")
    }
    if finished is None or not {"load", "verify", "unload"} <= set(steps):
        return {"complete": False}
    pass_end = _event_time(finished)
    pass_start = pass_end - float(finished["seconds"])
    load_end = _event_time(steps["load"])
    load_start = load_end - float(steps["load"]["seconds"])
    unload_end = _event_time(steps["unload"])
    return {
        "complete": True,
        "result": finished.get("result"),
        "webhook_to_pass_start": pass_start - posted_wall,
        "pass_start_to_first_step": load_start - pass_start,
        "load_step": float(steps["load"]["seconds"]),
        "verify_step": float(steps["verify"]["seconds"]),
        "unload_step": float(steps["unload"]["seconds"]),
        "unload_end_to_observed": served_wall - unload_end,
        "after_serving_in_pass": pass_end - unload_end,
        "pass_seconds": float(finished["seconds"]),
    }


def webhook_changes(
    service: Service,
    manifests: ManifestRepo,
    index: Index,
    count: int,
    warmup: int,
    gap: float,
) -> list[dict[str, Any]]:
    current = 1
    runs = []
    for number in range(-warmup, count):
        new = 2 if current == 1 else 1
        manifests.write("echo.yaml", deployment_doc(MODEL, [new], [SERVER]))
        sha = manifests.commit(f"echo {new}")
        before = service.pass_count()
        posted_wall = time.time()
        t0 = time.monotonic()
        status = service.github_push(sha)
        if status != 202:
            raise BenchError(f"signed webhook answered {status}")
        served = wait_for(index.serves_alone(MODEL, new), 120, f"echo {new} alone READY")
        served_wall = posted_wall + (served - t0)
        service.wait_passes(before, 120, "the webhook's pass is counted")
        until_wall = time.time()
        index.settle(MODEL, new)
        time.sleep(gap)
        floor = hand_change(index, current, new)
        index.settle(FLOOR_MODEL, new)
        time.sleep(gap)
        run: dict[str, Any] = {
            "change": number,
            "from": current,
            "to": new,
            "revision": sha,
            "webhook_to_serving": served - t0,
            "floor": floor,
            "overhead": served - t0 - floor["total"],
            "service": pass_breakdown(service.events(), posted_wall, served_wall, until_wall),
        }
        if number >= 0:
            runs.append(run)
        print(
            f"  change {number:>3} {current}->{new}  webhook-to-serving "
            f"{run['webhook_to_serving']:6.3f} s  floor {floor['total']:6.3f} s  overhead "
            f"{run['overhead'] * 1000:7.1f} ms" + ("  (warm-up)" if number < 0 else ""),
            file=sys.stderr,
        )
        current = new
    return runs


# -- 2. restart to restored ---------------------------------------------------------------------


def restarts(
    service: Service, server: LocalTriton, count: int, version: int, gap: float
) -> list[dict[str, Any]]:
    runs = []
    for number in range(count):
        before = service.pass_count()
        killed_wall = time.time()
        restart = Restart(server)
        try:
            live = restart.begin()
            live_wall = time.time() - (time.monotonic() - live)
            ready: float | None = None
            restored: float | None = None

            def both() -> bool:
                nonlocal ready, restored
                if ready is None and http_ok(server, "/v2/health/ready"):
                    ready = time.monotonic()
                if restored is None and http_ready_versions(server, MODEL) == {version}:
                    restored = time.monotonic()
                return ready is not None and restored is not None

            wait_for(both, 120, "echo restored and the server ready")
        finally:
            restart.end()
        assert ready is not None and restored is not None
        service.wait_passes(before, 120, "the restoring pass is counted")
        until_wall = time.time()
        events = [e for e in service.events() if killed_wall <= _event_time(e) <= until_wall]
        requested = next(
            (
                e
                for e in events
                if e.get("message") == "pass requested" and "drifted" in str(e.get("trigger"))
            ),
            None,
        )
        finished = next((e for e in events if e.get("message") == "pass finished"), None)
        load = next(
            (e for e in events if e.get("message") == "step" and e.get("step") == "load"), None
        )
        run = {
            "restart": number,
            "live_to_restored": restored - live,
            "live_to_ready": ready - live,
            "ready_to_restored": restored - ready,
            "watch_triggered_after_live": _event_time(requested) - live_wall if requested else None,
            "watch_trigger": requested.get("trigger") if requested else None,
            "pass_seconds": float(finished["seconds"]) if finished else None,
            "load_step": float(load["seconds"]) if load else None,
            "drift_corrections": service.metrics().get(
                f'triton_gitops_drift_corrections_total{{model="{MODEL}",server="{SERVER}"}}'
            ),
        }
        runs.append(run)
        print(
            f"  restart {number:>2}  live-to-restored {run['live_to_restored']:6.3f} s  "
            f"(ready after {run['live_to_ready']:5.3f} s; watch triggered after "
            f"{run['watch_triggered_after_live'] or 0:5.3f} s, pass "
            f"{run['pass_seconds'] or 0:5.3f} s, load {run['load_step'] or 0:5.3f} s)",
            file=sys.stderr,
        )
        time.sleep(gap)
    return runs


def restart_floors(
    server: LocalTriton, repository: Path, count: int, version: int
) -> list[dict[str, float]]:
    """With the service stopped: restart, then load echo by hand as soon as the server is
    live, until it is READY."""
    config = parse_pbtxt((repository / MODEL / "config.pbtxt").read_text())
    floors = []
    for _ in range(count):
        restart = Restart(server)
        try:
            live = restart.begin()
            index = Index(server.grpc_address, own_subchannel=True)
            try:
                index.load(MODEL, config, [version])
                loaded = time.monotonic()
                done = wait_for(index.serves_alone(MODEL, version), 120, "echo READY by hand")
            finally:
                index.close()
        finally:
            restart.end()
        floors.append({"total": done - live, "until_load_returned": loaded - live})
        print(f"  floor restart  live-to-READY by hand {done - live:6.3f} s", file=sys.stderr)
    return floors


# -- 3. idle passes -----------------------------------------------------------------------------


def scrape_cost(service: Service, scrapes: int) -> dict[str, float]:
    """The service's CPU for one GET /metrics (the benchmark's own way of waiting)."""
    before, _ = cpu_seconds(service.pid)
    started = time.monotonic()
    for _ in range(scrapes):
        service.metrics()
    seconds = time.monotonic() - started
    after, _ = cpu_seconds(service.pid)
    return {"scrapes": scrapes, "cpu_s_per_scrape": (after - before) / scrapes, "wall_s": seconds}


def idle_passes(
    service: Service,
    server_pid: int,
    passes: int,
    sample_every: int,
    max_seconds: float,
) -> dict[str, Any]:
    metrics = service.metrics()
    count = int(sum(service.passes_by_result(metrics).values()))
    results_before = service.passes_by_result(metrics)
    histogram_before = (
        metrics["triton_gitops_pass_duration_seconds_sum"],
        metrics["triton_gitops_pass_duration_seconds_count"],
    )
    scrapes_before = service.scrapes
    triton_cpu_before = sum(cpu_seconds(server_pid))
    started = time.monotonic()
    started_wall = time.time()
    samples = [sample_process(service.pid, 0, started)]
    walls: list[float] = []
    extra = 0
    last = 0.2
    done = 0
    for number in range(1, passes + 1):
        t0 = time.monotonic()
        status = service.reconcile_now()
        if status != 202:
            raise BenchError(f"POST /reconcile answered {status}")
        # Poll the counter from a little before the pass is expected to end: few scrapes.
        time.sleep(max(0.0, 0.8 * last - (time.monotonic() - t0)))
        now = service.wait_passes(count, 120, f"idle pass {number} is counted")
        last = time.monotonic() - t0
        walls.append(last)
        extra += now - count - 1
        count = now
        done = number
        if number % sample_every == 0:
            samples.append(sample_process(service.pid, number, started))
            rss = samples[-1]["rss_kb"] / 1024
            print(
                f"  pass {number:>5}  RSS {rss:6.1f} MB  CPU {samples[-1]['cpu_s']:7.2f} s  "
                f"last pass {last * 1000:6.1f} ms",
                file=sys.stderr,
            )
        if time.monotonic() - started > max_seconds:
            print(f"  stopped after {number} passes: --idle-max-seconds", file=sys.stderr)
            break
    if samples[-1]["pass"] != done:
        samples.append(sample_process(service.pid, done, started))
    elapsed = time.monotonic() - started
    metrics = service.metrics()
    histogram = (
        metrics["triton_gitops_pass_duration_seconds_sum"] - histogram_before[0],
        metrics["triton_gitops_pass_duration_seconds_count"] - histogram_before[1],
    )
    results = {
        k: v - results_before.get(k, 0.0)
        for k, v in service.passes_by_result(metrics).items()
        if v - results_before.get(k, 0.0)
    }
    events = [e for e in service.events() if _event_time(e) >= started_wall]
    logged = [float(e["seconds"]) for e in events if e.get("message") == "pass finished"]
    changed = [e for e in events if e.get("message") in ("step", "change", "drift corrected")]
    return {
        "requested": passes,
        "run": done,
        "extra_passes": extra,  # passes the watch (or anything else) started meanwhile
        "seconds": elapsed,
        "results": results,
        "steps_or_changes_logged": len(changed),
        "scrapes": service.scrapes - scrapes_before,
        "histogram_mean_s": histogram[0] / histogram[1] if histogram[1] else None,
        "histogram_count": histogram[1],
        "logged_pass_s": summary(logged),
        "request_to_counted_s": summary(walls),
        "triton_cpu_s_per_pass": (sum(cpu_seconds(server_pid)) - triton_cpu_before) / done,
        "samples": samples,
    }


# -- diagnosis, in this process -----------------------------------------------------------------


def _where(key: tuple[str, int, str]) -> str:
    file, line, function = key
    return f"{short_path(file)}:{line}({function})" if line else function


def profile_passes(source: Source, settings: Settings, passes: int) -> dict[str, Any]:
    run_pass(source, settings)  # first pass: a fresh state store, clone
    walls = []
    profiler = cProfile.Profile()
    probe = Probe()  # the phases, as the pass reports them (under the profiler, as the rest)
    for _ in range(passes):
        t0 = time.monotonic()
        profiler.enable()
        report = run_pass(source, settings, probe=probe)
        profiler.disable()
        walls.append(time.monotonic() - t0)
        if report.plan.has_changes or not report.ok:
            raise BenchError(f"an in-process idle pass was not idle: {report.plan}")
    stats = pstats.Stats(profiler)
    table: dict[tuple[str, int, str], tuple[int, int, float, float, Any]] = stats.stats  # type: ignore[attr-defined]

    def top(index: int, n: int) -> list[dict[str, Any]]:
        rows = sorted(table.items(), key=lambda kv: kv[1][index], reverse=True)[:n]
        return [
            {
                "function": _where(key),
                "calls_per_pass": value[1] / passes,
                "own_ms_per_pass": value[2] / passes * 1000,
                "cumulative_ms_per_pass": value[3] / passes * 1000,
            }
            for key, value in rows
        ]

    named = {
        label: seconds / passes * 1000
        for label, seconds in probe.seconds.items()
        if " > " not in label  # the phases and the calls between them, not calls within
    }
    return {
        "passes": passes,
        "wall_s": summary(walls),
        "note": "cProfile sees the calling thread only: observe's gRPC calls run in a pool, "
        "so 'observe' is the wait for them",
        "phases_cumulative_ms_per_pass": dict(sorted(named.items(), key=lambda kv: -kv[1])),
        "top_cumulative": top(3, 15),
        "top_own": top(2, 15),
    }


def direct_timings(source: Source, settings: Settings, repeats: int) -> dict[str, Any]:
    """The big parts of an idle pass, without a profiler, as the pass reports its phases:
    fetch, read (the manifests' blobs, parsed and validated), observe the server (index,
    configs, config.pbtxt)."""
    probe = Probe()
    times: dict[str, list[float]] = {"fetch": [], "parse_validate": [], "observe": []}
    for _ in range(repeats):
        probe.reset()
        run_pass(source, settings, probe=probe)
        for key, phase in (("fetch", "fetch"), ("parse_validate", "read"), ("observe", "observe")):
            times[key].append(probe.seconds[phase])
    return {"repeats": repeats} | {k: summary(v, 1000) for k, v in times.items()}


def tracemalloc_passes(source: Source, settings: Settings, passes: int) -> dict[str, Any]:
    """The Python heap over idle passes: traced memory after 10 warm-up passes, after half
    the passes and after all of them (garbage collected before each reading); a leak grows
    in both halves."""

    def reading() -> tuple[tracemalloc.Snapshot, int]:
        gc.collect()
        snapshot = tracemalloc.take_snapshot().filter_traces(
            (tracemalloc.Filter(False, tracemalloc.__file__),)
        )
        return snapshot, tracemalloc.get_traced_memory()[0]

    def top(
        new: tracemalloc.Snapshot, old: tracemalloc.Snapshot, n: int = 5
    ) -> list[dict[str, Any]]:
        return [
            {
                "where": str(d.traceback[0]),
                "size_diff_kb": d.size_diff / 1024,
                "count": d.count_diff,
            }
            for d in new.compare_to(old, "lineno")[:n]
        ]

    half = max(1, passes // 2)
    tracemalloc.start(12)
    try:
        for _ in range(10):  # warm up caches first
            run_pass(source, settings)
        first, at_first = reading()
        for _ in range(half):
            run_pass(source, settings)
        middle, at_half = reading()
        for _ in range(passes - half):
            run_pass(source, settings)
        last, at_last = reading()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    biggest = middle.compare_to(first, "traceback")[:1]
    return {
        "passes": passes,
        "traced_kb": [at_first / 1024, at_half / 1024, at_last / 1024],
        "growth_kb_per_100_passes": {
            "first_half": (at_half - at_first) / 1024 / half * 100,
            "second_half": (at_last - at_half) / 1024 / max(1, passes - half) * 100,
        },
        "peak_kb": peak / 1024,
        "top_growth_first_half": top(middle, first),
        "top_growth_second_half": top(last, middle),
        "biggest_first_half_traceback": [str(f) for f in biggest[0].traceback] if biggest else [],
    }


IMPORT_STEPS = (
    ("python (bare)", ""),
    ("+ numpy", "numpy"),
    ("+ grpc", "grpc"),
    ("+ tritonclient.grpc", "tritonclient.grpc"),
    ("+ git (GitPython)", "git"),
    ("+ apscheduler", "apscheduler.schedulers.background"),
    ("+ prometheus_client", "prometheus_client"),
    ("+ ruamel.yaml", "ruamel.yaml"),
    ("+ jsonschema", "jsonschema"),
    ("+ requests, prometheus_api_client", "prometheus_api_client.prometheus_connect"),
    ("+ reconciler.cli (everything)", "reconciler.cli"),
)


def import_rss() -> list[dict[str, Any]]:
    """RSS of a fresh interpreter as it imports the service's dependencies, one after another."""
    script = (
        "import importlib, json, sys\n"
        "def rss():\n"
        "    found = {}\n"
        "    for line in open('/proc/self/status'):\n"
        "        if line.startswith(('VmRSS:', 'RssAnon:')):\n"
        "            found[line.split(':')[0]] = int(line.split()[1])\n"
        "    return found['VmRSS'], found['RssAnon']\n"
        "out = []\n"
        f"for label, module in {list(IMPORT_STEPS)!r}:\n"
        "    if module:\n"
        "        importlib.import_module(module)\n"
        "    total, anon = rss()\n"
        "    out.append({'step': label, 'rss_kb': total, 'rss_anon_kb': anon})\n"
        "print(json.dumps(out))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    return list(json.loads(done.stdout))


# -- the run ------------------------------------------------------------------------------------


@dataclass
class Bench:
    """What the three measurements share: one server, one manifest remote, the services."""

    args: argparse.Namespace
    root: Path
    repository: Path
    server: LocalTriton
    manifests: ManifestRepo
    code: dict[str, Any]  # digests of the code each service started from
    services: list[Service] = field(default_factory=list)

    def start_service(self, name: str) -> Service:
        service = measured_service(self.manifests.url, self.root / name, self.args.watch_interval)
        self.code[f"{name.replace('-', '_')}_tree"] = tree_digest()
        self.services.append(service.start())
        return service


def webhook_part(bench: Bench) -> tuple[Service, list[dict[str, Any]]]:
    """1. Webhook to serving: service A deploys echo 1, then the changes; A keeps running."""
    args, server, manifests = bench.args, bench.server, bench.manifests
    print("1. webhook to serving", file=sys.stderr)
    manifests.write("servers.yaml", server_doc(SERVER, server.grpc_address, bench.repository))
    manifests.write("echo.yaml", deployment_doc(MODEL, [1], [SERVER]))
    manifests.commit("deploy echo 1")
    service = bench.start_service("service-a")
    index = Index(server.grpc_address, own_subchannel=True)
    try:
        wait_for(lambda: index.ready(MODEL) == {1}, 120, "echo 1")
        service.wait_passes(0, 120, "the first pass")
        index.settle(MODEL, 1)
        floor_config = parse_pbtxt((bench.repository / FLOOR_MODEL / "config.pbtxt").read_text())
        index.load(FLOOR_MODEL, floor_config, [1])
        index.settle(FLOOR_MODEL, 1)
        return service, webhook_changes(
            service, manifests, index, args.changes, args.warmup, args.gap
        )
    finally:
        index.close()


def idle_part(bench: Bench) -> tuple[dict[str, Any], int]:
    """3. Idle passes: a fresh server and service B over ``--models`` models; B's exit code."""
    args, server, manifests = bench.args, bench.server, bench.manifests
    print(f"3. idle passes over {args.models} models", file=sys.stderr)
    server.kill()
    server.start()  # nothing loaded
    manifests.remove("echo.yaml")
    manifests.write(
        "idle/models.yaml",
        "---\n".join(deployment_doc(idle_name(i), [1], [SERVER]) for i in range(args.models)),
    )
    manifests.commit(f"{args.models} idle models")
    service = bench.start_service("service-b")
    at_start = sample_process(service.pid, 0, time.monotonic())
    t0 = time.monotonic()
    service.wait_passes(0, 60 + 30 * args.models, "the deploying pass")
    deploy_seconds = time.monotonic() - t0
    index = Index(server.grpc_address, own_subchannel=True)
    try:
        expected = {idle_name(i) for i in range(args.models)}
        if not expected <= index.ready_models():
            missing = sorted(expected - index.ready_models())
            raise BenchError(f"not deployed: {', '.join(missing[:5])} ({len(missing)})")
    finally:
        index.close()
    assert server.process is not None
    stubs = len(children(server.process.pid))
    after_deploy = sample_process(service.pid, 0, time.monotonic())
    cost = scrape_cost(service, args.scrapes)
    idle = idle_passes(
        service, server.process.pid, args.passes, args.sample_every, args.idle_max_seconds
    )
    return idle | {
        "models": args.models,
        "backend_stub_processes": stubs,
        "deploy_pass_s": deploy_seconds,
        "service_at_start": at_start,
        "service_after_deploy": after_deploy,
        "scrape_cost": cost,
    }, service.stop()


def diagnosis(bench: Bench) -> dict[str, Any]:
    """In this process: where a pass goes, and whether its Python heap grows."""
    args = bench.args
    print("diagnosis: in-process passes under cProfile and tracemalloc", file=sys.stderr)
    source = Source(bench.manifests.url)
    settings = pass_settings(bench.root / "inproc" / "cache", bench.root / "inproc.db")
    profile = profile_passes(source, settings, args.profile_passes)
    traced = tracemalloc_passes(source, settings, args.tracemalloc_passes)
    direct = direct_timings(source, settings, args.profile_passes)
    return {
        "direct_ms": direct,
        "profile": profile,
        "tracemalloc": traced,
        "import_rss": import_rss(),
    }


def keep_logs(bench: Bench) -> list[str]:
    """The server's and the services' logs, copied to bench/results/ (the run failed)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    kept = []
    for name, path in [("tritonserver", bench.server.log_file)] + [
        (f"service-{i}", s.log) for i, s in enumerate(bench.services)
    ]:
        if path is not None and path.exists():
            target = RESULTS / f"daemon-{name}.log"
            shutil.copyfile(path, target)
            kept.append(str(target))
    return kept


def run(args: argparse.Namespace) -> dict[str, Any]:
    started = time.monotonic()
    busy_before = {"load_average": os.getloadavg(), "other_tritonservers": other_tritonservers()}
    code: dict[str, Any] = {"at_start": provenance() | {"tree": tree_digest()}}
    with tempfile.TemporaryDirectory(prefix="bench-daemon-") as tmp:
        root = Path(tmp)
        repository = model_repository(root / "models", args.models)
        server = LocalTriton(repository, log_file=root / "tritonserver.log")
        bench = Bench(args, root, repository, server, ManifestRepo(root / "git"), code)
        try:
            server.start()
            index = Index(server.grpc_address, own_subchannel=True)
            try:
                version = index.server_version()
            finally:
                index.close()
            machine_info = machine(version) | {
                "load_average_at_start": os.getloadavg(),
                "busy_at_start": busy_before,
            }
            service, changes = webhook_part(bench)
            final = changes[-1]["to"] if changes else 1
            print("2. restart to restored", file=sys.stderr)  # on the same server, service A
            restored = restarts(service, server, args.restarts, final, args.gap)
            service_a_exit = service.stop()
            floors = restart_floors(server, repository, args.restarts, final)
            idle, service_b_exit = idle_part(bench)
            result = {
                "machine": machine_info,
                "webhook": changes,
                "restart": {"runs": restored, "floors": floors},
                "idle": idle,
                "diagnosis": diagnosis(bench),
                "code": code,
                "service_exit_codes": [service_a_exit, service_b_exit],
            }
        except VOID as exc:
            raise BenchError(f"{exc}\nlogs kept: {', '.join(keep_logs(bench))}") from exc
        finally:
            for service in bench.services:
                service.stop()
            server.stop()
    return report(args, result, time.monotonic() - started)


def report(args: argparse.Namespace, raw: dict[str, Any], seconds: float) -> dict[str, Any]:
    changes = raw["webhook"]
    complete = [c["service"] for c in changes if c["service"].get("complete")]

    def part(name: str) -> dict[str, float] | None:
        return summary([c[name] for c in complete], 1000)

    overhead = summary([c["overhead"] for c in changes], 1000)
    e2e = summary([c["webhook_to_serving"] for c in changes], 1000)
    floor = summary([c["floor"]["total"] for c in changes], 1000)
    assert overhead is not None and e2e is not None and floor is not None
    restart_runs = raw["restart"]["runs"]
    idle = raw["idle"]
    samples = idle["samples"]
    run_passes = idle["run"]
    second_half = [s for s in samples if s["pass"] >= run_passes / 2]
    slope_all = slope_kb_per_100(samples)
    slope_warm = slope_kb_per_100([s for s in samples if s["pass"] >= WARM_PASSES])
    slope_second = slope_kb_per_100(second_half)
    rss = [s["rss_kb"] for s in samples]
    grew = [b["pass"] for a, b in itertools.pairwise(samples) if b["rss_kb"] - a["rss_kb"] > 64]
    cpu = samples[-1]["cpu_s"] - samples[0]["cpu_s"]
    children_cpu = samples[-1]["children_cpu_s"] - samples[0]["children_cpu_s"]
    scrape_cpu = idle["scrape_cost"]["cpu_s_per_scrape"] * idle["scrapes"]
    max_rss_mb = max(rss) / 1024
    flat = None if slope_second is None else slope_second * 10 < FLAT_KB_PER_1000
    code = raw["code"] | {"at_end": provenance() | {"tree": tree_digest()}}
    trees = {code["at_start"]["tree"], code["at_end"]["tree"]}
    trees |= {code[k] for k in ("service_a_tree", "service_b_tree") if k in code}
    code["changed_during_run"] = len(trees) > 1
    return {
        "benchmark": "daemon",
        "command": " ".join(["python -m bench.daemon", *sys.argv[1:]]),
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
        "settings": {k: v for k, v in vars(args).items() if k != "output"}
        | {"service": "--interval 3600 --jitter 0, --watch-interval as given"},
        "machine": raw["machine"]
        | {
            "load_average_at_end": os.getloadavg(),
            "other_tritonservers_at_end": other_tritonservers(),
        },
        "code": code,
        "run_seconds": seconds,
        "webhook_to_serving_ms": {
            "changes": len(changes),
            "webhook_to_serving": e2e,
            "floor": floor,
            "floor_parts": {
                k: summary([c["floor"][k] for c in changes], 1000)
                for k in ("load_call", "verify_poll", "unload_call", "unload_poll")
            },
            "overhead": overhead,
            "overhead_of_medians": e2e["median"] - floor["median"],
            "service_parts": {
                "complete": len(complete),
                "webhook_to_pass_start": part("webhook_to_pass_start"),
                "pass_start_to_first_step": part("pass_start_to_first_step"),
                "load_step": part("load_step"),
                "verify_step": part("verify_step"),
                "unload_step": part("unload_step"),
                "unload_end_to_observed": part("unload_end_to_observed"),
                "after_serving_in_pass": part("after_serving_in_pass"),
                "pass": part("pass_seconds"),
            },
        },
        "restart_ms": {
            "restarts": len(restart_runs),
            "live_to_restored": summary([r["live_to_restored"] for r in restart_runs], 1000),
            "live_to_ready": summary([r["live_to_ready"] for r in restart_runs], 1000),
            "ready_to_restored": summary([r["ready_to_restored"] for r in restart_runs], 1000),
            "watch_triggered_after_live": summary(
                [r["watch_triggered_after_live"] for r in restart_runs], 1000
            ),
            "restoring_pass": summary([r["pass_seconds"] for r in restart_runs], 1000),
            "load_step": summary([r["load_step"] for r in restart_runs], 1000),
            "floor_live_to_ready_by_hand": summary(
                [f["total"] for f in raw["restart"]["floors"]], 1000
            ),
            "drift_corrections_counted": restart_runs[-1]["drift_corrections"]
            if restart_runs
            else None,
        },
        "idle": {
            "models": idle["models"],
            "backend_stub_processes": idle["backend_stub_processes"],
            "deploy_pass_s": idle["deploy_pass_s"],
            "passes_requested": idle["requested"],
            "passes_run": run_passes,
            "extra_passes": idle["extra_passes"],
            "results": idle["results"],
            "steps_or_changes_logged": idle["steps_or_changes_logged"],
            "seconds": idle["seconds"],
            "rss_mb": {
                "service_start": idle["service_at_start"]["rss_kb"] / 1024,
                "after_deploy": idle["service_after_deploy"]["rss_kb"] / 1024,
                "start": rss[0] / 1024,
                "end": rss[-1] / 1024,
                "max": max_rss_mb,
                "min": min(rss) / 1024,
                "peak_hwm": samples[-1]["hwm_kb"] / 1024,
                "anon_start_end": [
                    samples[0]["rss_anon_kb"] / 1024,
                    samples[-1]["rss_anon_kb"] / 1024,
                ],
                "file_start_end": [
                    samples[0]["rss_file_kb"] / 1024,
                    samples[-1]["rss_file_kb"] / 1024,
                ],
            },
            "rss_last_grew_by_over_64_kb_at_pass": grew[-1] if grew else None,
            "rss_slope_kb_per_100_passes": {
                "all": slope_all,
                f"from_pass_{WARM_PASSES}": slope_warm,
                "second_half": slope_second,
            },
            "cpu_s_per_pass": cpu / run_passes,
            "cpu_s_per_pass_without_scrapes": (cpu - scrape_cpu) / run_passes,
            "children_cpu_s_per_pass": children_cpu / run_passes,
            "scrape_cost": idle["scrape_cost"] | {"scrapes_during_passes": idle["scrapes"]},
            "triton_cpu_s_per_pass": idle["triton_cpu_s_per_pass"],
            "pass_s_histogram_mean": idle["histogram_mean_s"],
            "pass_s_logged": idle["logged_pass_s"],
            "request_to_counted_s": idle["request_to_counted_s"],
            "threads": [samples[0]["threads"], samples[-1]["threads"]],
            "open_files": [samples[0]["open_files"], samples[-1]["open_files"]],
            "child_processes": [samples[0]["child_processes"], samples[-1]["child_processes"]],
            "child_rss_mb": [samples[0]["child_rss_kb"] / 1024, samples[-1]["child_rss_kb"] / 1024],
            "samples": samples,
        },
        "diagnosis": raw["diagnosis"],
        "service_exit_codes": raw["service_exit_codes"],
        "targets_met": {
            "overhead_per_change_under_1_s": overhead["max"] < OVERHEAD_TARGET_S * 1000,
            "rss_under_80_mb": max_rss_mb < RSS_TARGET_MB,
            "rss_flat": flat,
        },
        "webhook_changes": changes,
        "restart_runs": restart_runs,
        "restart_floors": raw["restart"]["floors"],
    }


# -- output -------------------------------------------------------------------------------------


def markdown(result: dict[str, Any]) -> str:
    """The section BENCHMARKS.md carries: question, method, machine, results, diagnosis
    (``bench/reports/daemon.md``)."""
    floor_parts = result["webhook_to_serving_ms"]["floor_parts"]
    frames = result["diagnosis"]["tracemalloc"]["biggest_first_half_traceback"]
    return render(
        "daemon",
        result,
        floor_unload=_sum_stats(floor_parts, "unload_call", "unload_poll"),
        origin=_allocated_at(frames),
        rss_target_mb=RSS_TARGET_MB,
        warm_passes=WARM_PASSES,
    )


def _sum_stats(parts: dict[str, Any], a: str, b: str) -> dict[str, float] | None:
    if parts.get(a) is None or parts.get(b) is None:
        return None
    return {k: parts[a][k] + parts[b][k] for k in ("median", "p90", "max", "min")}


def _allocated_at(frames: list[str]) -> list[str]:
    """Where a block was allocated: its frame, then the last three frames of our own code
    that led to it (innermost first)."""
    ours = [f for f in frames if "/reconciler/" in f][-3:]
    return list(reversed(ours + frames[-1:]))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.daemon",
        description="triton-gitops run as a service: webhook-to-serving latency against "
        "Triton's own load time, restart-to-restored time, and RSS and CPU over idle passes.",
    )
    parser.add_argument("--changes", type=int, default=10, help="webhook changes (default 10)")
    parser.add_argument("--warmup", type=int, default=1, help="warm-up changes (default 1)")
    parser.add_argument("--restarts", type=int, default=5, help="kill -9 restarts (default 5)")
    parser.add_argument("--models", type=int, default=100, help="idle models (default 100)")
    parser.add_argument("--passes", type=int, default=1000, help="idle passes (default 1000)")
    parser.add_argument(
        "--sample-every", type=int, default=50, help="passes between samples (default 50)"
    )
    parser.add_argument(
        "--idle-max-seconds",
        type=float,
        default=600,
        help="stop the idle passes after this long; the number run is reported (default 600)",
    )
    parser.add_argument(
        "--watch-interval", type=float, default=0.5, help="the service's (default 0.5)"
    )
    parser.add_argument(
        "--gap", type=float, default=0.5, help="pause between changes and restarts (default 0.5)"
    )
    parser.add_argument(
        "--scrapes", type=int, default=200, help="/metrics scrapes to cost first (default 200)"
    )
    parser.add_argument(
        "--profile-passes", type=int, default=20, help="in-process passes under cProfile (20)"
    )
    parser.add_argument(
        "--tracemalloc-passes",
        type=int,
        default=50,
        help="in-process passes under tracemalloc (default 50)",
    )
    parser.add_argument("--output", type=Path, default=RESULTS / "daemon.json", help="JSON result")
    parser.add_argument(
        "--report",
        type=Path,
        metavar="JSON",
        help="print the Markdown section from a saved result and run nothing",
    )
    args = parser.parse_args(argv)
    if min(args.changes, args.restarts, args.models, args.passes, args.sample_every) < 1:
        parser.error("--changes, --restarts, --models, --passes and --sample-every must be >= 1")
    if min(args.profile_passes, args.tracemalloc_passes, args.scrapes) < 1 or args.warmup < 0:
        parser.error("--profile-passes, --tracemalloc-passes and --scrapes must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    return markdown_main(parse_args(argv), run, markdown)


if __name__ == "__main__":
    sys.exit(main())
