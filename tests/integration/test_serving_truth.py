"""The serving truth of ``triton-gitops run`` (service/serving.py) against a real
tritonserver: ``GET /serving/<server>`` next to Triton's own ``/v2/health/ready``, which a
Kubernetes readiness probe would read. Triton's answers are asserted too: they are the
failure the truth is there for (issue 30, measured on 2.51).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as triton_grpc

from testkit.loadgen import WITNESS_PAUSE, LoadGenerator, SequenceClient
from testkit.local_triton import LocalTriton
from testkit.manifests import ManifestRepo, deployment_doc, server_doc
from testkit.service_process import Service, wait_until
from tests.integration.flows import ready_versions
from tests.integration.test_daemon import echo_service, service_process

pytestmark = pytest.mark.triton


def triton_ready(triton: LocalTriton) -> int:
    """What Triton's own readiness endpoint answers (a Kubernetes probe's view)."""
    url = f"http://{triton.http_address}/v2/health/ready"
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return 0  # not answering at all (killed, starting)


def truth(service: Service, server: str = "edge-a") -> tuple[int, dict[str, Any]]:
    status, body = service.get(f"/serving/{server}")
    return status, json.loads(body)


class Sampler:
    """Reads the truth and Triton's readiness every 50 ms in a thread, until stopped."""

    def __init__(self, service: Service, triton: LocalTriton) -> None:
        self.service, self.triton = service, triton
        self.samples: list[tuple[int, int, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            status, body = truth(self.service)
            self.samples.append((status, triton_ready(self.triton), body["message"]))
            time.sleep(0.05)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def test_a_load_beside_keeps_serving_and_a_restart_is_out_until_restored(
    manifests: ManifestRepo, triton: LocalTriton, model_repository: Path, tmp_path: Path
) -> None:
    # A fresh server in EXPLICIT mode has loaded nothing, and Triton calls it ready.
    assert (triton_ready(triton), ready_versions(triton, "echo")) == (200, set())
    with echo_service(manifests, triton, model_repository, tmp_path / "service") as service:
        wait_until(lambda: truth(service)[0] == 200, 15, "edge-a serving echo 1")
        status, body = service.get("/serving")
        assert status == 200 and json.loads(body)["servers"]["edge-a"]["serving"] is True

        # Echo 7 takes 3 s to load beside 1: Triton says not ready for the whole load,
        # the truth says serving throughout (echo 1 answers all along).
        manifests.write("echo.yaml", deployment_doc("echo", [7], ["edge-a"]))
        manifests.commit("echo 7, slow to load")
        with Sampler(service, triton) as sampler:
            assert service.github_push() == 202
            wait_until(lambda: ready_versions(triton, "echo") == {7}, 30, "echo 7 serves")
            time.sleep(0.5)
        statuses = {s[0] for s in sampler.samples}
        assert statuses == {200}, sampler.samples
        assert 400 in {s[1] for s in sampler.samples}, (
            f"Triton's /v2/health/ready never said not ready during the load: {sampler.samples}"
        )

        # Restarted (EXPLICIT mode: empty, and ready by Triton's word, as above): the truth
        # says not serving until the service has loaded echo 7 again.
        with Sampler(service, triton) as sampler:
            triton.kill()
            triton.start()
            wait_until(lambda: ready_versions(triton, "echo") == {7}, 60, "echo 7 restored")
            wait_until(lambda: truth(service)[0] == 200, 15, "serving again")
        empty = [s for s in sampler.samples if s[0] == 503 and "version(s) 7 not READY" in s[2]]
        assert empty, f"never out of service for want of echo 7: {sampler.samples}"
        _, metrics = service.get("/metrics")
        assert b'triton_gitops_server_serving{server="edge-a"} 1.0' in metrics
        assert truth(service, "no-such-server")[0] == 404


def test_a_sequence_model_drained_for_its_swap_is_out_of_service(
    manifests: ManifestRepo, triton: LocalTriton, model_repository: Path, tmp_path: Path
) -> None:
    drain = "  sequence: {idle: 1s, drainTimeout: 60s}\n"
    on_edge_a(manifests, triton, model_repository, 1, drain, "counter 1", model="counter")
    service = service_process(manifests.url, tmp_path / "service").start()
    try:
        wait_until(lambda: truth(service)[0] == 200, 30, "edge-a serving counter 1")
        manifests.write("counter.yaml", deployment_doc("counter", [2], ["edge-a"], extra=drain))
        manifests.commit("counter 2")
        with SequenceClient(triton.grpc_address) as client:
            time.sleep(0.5)
            assert service.github_push() == 202
            # The drain waits for the sequences to end: out of service meanwhile.
            wait_until(lambda: truth(service)[0] == 503, 20, "out of service while draining")
            _, body = truth(service)
            assert body["reasons"] == [
                "model counter: drained for its swap (a sequence model: Triton restarts its "
                "sequence batcher)"
            ], body
            assert ready_versions(triton, "counter") == {1}
        # The client stopped: the model goes idle, the swap runs, and it serves again.
        wait_until(lambda: ready_versions(triton, "counter") == {2}, 60, "counter 2 serves")
        wait_until(lambda: truth(service)[0] == 200, 15, "serving again after the swap")
        assert client.broken == [] and client.completed > 0
    finally:
        service.stop()


def on_edge_a(
    manifests: ManifestRepo,
    triton: LocalTriton,
    model_repository: Path,
    version: int,
    extra: str,
    message: str,
    model: str = "echo",
) -> None:
    """Commit server edge-a (``triton``, its metrics URL declared) serving ``model``
    ``version``, with ``extra`` spec lines."""
    server = server_doc("edge-a", triton.grpc_address, model_repository, metrics=triton.metrics_url)
    manifests.write("servers.yaml", server)
    manifests.write(f"{model}.yaml", deployment_doc(model, [version], ["edge-a"], extra=extra))
    manifests.commit(message)


def stub_pids(triton: LocalTriton, instance: str) -> list[int]:
    """The Python backend stubs of ``triton`` running model instance ``instance`` (echo_0_0)."""
    found = subprocess.run(
        ["pgrep", "-f", f"{triton.shm_prefix}.* {instance} "], capture_output=True, text=True
    )
    return [int(pid) for pid in found.stdout.split()]


def test_a_version_whose_stub_died_is_taken_out_and_reloaded_in_place_under_load(
    manifests: ManifestRepo, triton: LocalTriton, model_repository: Path, tmp_path: Path
) -> None:
    probes = "  servingProbes: {interval: 1s, failures: 3}\n"
    on_edge_a(manifests, triton, model_repository, 1, probes, "echo 1, probed every second")
    service = service_process(manifests.url, tmp_path / "service", ("--watch-interval", "1"))
    service.start()
    try:
        wait_until(lambda: truth(service)[0] == 200, 30, "edge-a serving echo 1")
        (stub,) = stub_pids(triton, "echo_0_0")
        with (
            LoadGenerator(triton.grpc_address, "echo", threads=2, pause=WITNESS_PAUSE) as load,
            Sampler(service, triton) as sampler,
        ):
            load.wait_for_samples(50)
            # The synthesized probe judges a version only once it has answered one (sent
            # every second here): let it.
            time.sleep(2.5)
            killed = time.monotonic()
            os.kill(stub, signal.SIGKILL)
            # Triton keeps calling the version READY; every request fails until reloaded.
            wait_until(lambda: load.failures, 10, "requests fail once the stub is dead")
            assert ready_versions(triton, "echo") == {1} and triton_ready(triton) == 200

            def healed() -> bool:
                recent = [s for s in load.samples[-20:] if s.started > killed]
                return len(recent) == 20 and all(s.error is None for s in recent)

            def said() -> str:
                return "the service said: " + str(
                    [
                        {k: e.get(k) for k in ("message", "reason", "error", "kind", "summary")}
                        for e in service.events()
                        if "skipped: maximum number" not in str(e.get("message"))
                    ][-25:]
                )

            healed_at = wait_until(
                healed, 60, "requests answered again after the reload", explain=said
            )
            wait_until(lambda: truth(service)[0] == 200, 15, "serving again")
        failed = [s for s in load.samples if s.error is not None]
        # Only requests answered after the kill failed (some were in flight at the kill).
        assert failed and all(s.started + s.seconds >= killed for s in failed), failed[:3]
        assert all("is not healthy" in (s.error or "") for s in failed), failed[:3]
        new = stub_pids(triton, "echo_0_0")
        assert new and stub not in new, f"the stub was not started again: {new}"
        out = [s for s in sampler.samples if s[0] == 503]
        assert any("version 1 stopped answering (3 probes in a row" in s[2] for s in out), (
            sampler.samples
        )
        events = service.events()
        alerts = [e for e in events if e.get("kind") == "stopped-answering"]
        assert alerts, [e.get("message") for e in events][-30:]
        print(
            f"kill to healed: {healed_at - killed:.1f} s, {len(failed)} failed requests "
            f"of {len(load.samples)} (2 client threads)"
        )
    finally:
        service.stop()


def test_a_version_unloading_past_the_deadline_is_alerted_naming_it_and_resolved_when_gone(
    manifests: ManifestRepo, triton: LocalTriton, model_repository: Path, tmp_path: Path
) -> None:
    # Echo 5 answers as many milliseconds late as slow_ms says: one request in flight keeps
    # it UNLOADING that long after the pass drops it (Triton waits for it), past a 2 s
    # deadline.
    slow = "  config: {parameters: {slow_ms: {string_value: '6000'}}}\n"
    on_edge_a(manifests, triton, model_repository, 5, slow, "echo 5, 6 s a request")
    extra = ("--watch-interval", "1", "--unload-deadline", "2")
    service = service_process(manifests.url, tmp_path / "service", extra).start()
    try:
        wait_until(lambda: ready_versions(triton, "echo") == {5}, 30, "echo 5 serves")
        in_flight = LoadGenerator(triton.grpc_address, "echo", threads=1, version=5).start()
        time.sleep(0.5)
        manifests.write("echo.yaml", deployment_doc("echo", [1], ["edge-a"], extra=slow))
        manifests.commit("echo 1")
        assert service.github_push() == 202

        def alerts(resolved: bool) -> list[dict[str, Any]]:
            return [
                e for e in service.events()
                if e.get("kind") == "unload-stuck" and e.get("resolved") is resolved
            ]  # fmt: skip

        wait_until(lambda: alerts(False), 30, "the unload-stuck alert")
        (alert,) = alerts(False)[:1]
        assert (alert["server"], alert["model"], alert["details"]["version"]) == (
            "edge-a", "echo", 5
        ), alert  # fmt: skip
        assert index_state(triton, 5) == "UNLOADING"
        _, metrics = service.get("/metrics")
        assert (
            b'triton_gitops_versions_stuck_unloading{model="echo",server="edge-a"} 1.0' in metrics
        )
        in_flight.stop()  # its last request ends: Triton finishes the unload
        wait_until(lambda: alerts(True), 30, "the alert resolved once the version is gone")
        assert index_state(triton, 5) == "UNAVAILABLE"
    finally:
        service.stop()


def index_state(triton: LocalTriton, version: int) -> str | None:
    with triton_grpc.InferenceServerClient(triton.grpc_address) as client:
        index = client.get_model_repository_index(as_json=True)["models"]
    found = [m.get("state") for m in index if m.get("version") == str(version)]
    return found[0] if found else None


def test_the_rollout_in_progress_is_on_metrics_while_it_runs_and_gone_after(
    manifests: ManifestRepo, triton: LocalTriton, model_repository: Path, tmp_path: Path
) -> None:
    analysis = (
        "  verify:\n    analysis:\n      interval: 1s\n      duration: 6s\n"
        "      noTraffic: pass\n      checks:\n"
        "        - {name: success-rate, successRate: {min: 0.99}}\n"
    )
    on_edge_a(manifests, triton, model_repository, 1, analysis, "echo 1")
    service = service_process(manifests.url, tmp_path / "service").start()
    try:
        wait_until(lambda: ready_versions(triton, "echo") == {1}, 60, "echo 1 serves")
        wait_until(lambda: service.passes() >= 1, 30, "the first pass ended")
        manifests.write("echo.yaml", deployment_doc("echo", [2], ["edge-a"], extra=analysis))
        manifests.commit("echo 2, analysed")
        assert service.github_push() == 202
        step = b'triton_gitops_rollout_step{model="echo",server="edge-a",step="analyze"} 1.0'
        bound = (b'triton_gitops_analysis_check_bound{bound="min",check="success-rate",'
                 b'model="echo",server="edge-a"} 0.99')  # fmt: skip
        wait_until(lambda: step in service.get("/metrics")[1], 30, "the analysis on /metrics")
        metrics = service.get("/metrics")[1]
        assert bound in metrics, metrics.decode()[-2000:]
        assert b'triton_gitops_analysis_seconds_left{model="echo",server="edge-a"}' in metrics
        wait_until(lambda: ready_versions(triton, "echo") == {2}, 60, "echo 2 serves")
        wait_until(lambda: b"triton_gitops_rollout_step{" not in service.get("/metrics")[1],
                   15, "no rollout in progress on /metrics after the pass")  # fmt: skip
    finally:
        service.stop()


def index_of_echo(triton: LocalTriton) -> str:
    """What the test reads of echo in ``triton``'s index itself, on a channel of its own:
    "READY" (a version of it READY), "empty" (the index answers, no version READY), or
    "unreadable" (the server is down, or starting)."""
    try:
        return "READY" if ready_versions(triton, "echo") else "empty"
    except Exception:
        return "unreadable"


class RestartSampler:
    """Every 100 ms, what a load balancer's health check would read, between two reads of
    the index by the test: (seconds since ``mark``, the index before, ``/serving/edge-a``'s
    status, the gauge, the index after). A sample whose index read the same before and
    after says what the index was while the service answered (a restart passes through
    down and empty to READY, never back)."""

    EVERY = 0.1

    def __init__(self, service: Service, triton: LocalTriton) -> None:
        self.service, self.triton = service, triton
        self.mark = time.monotonic()
        self.samples: list[tuple[float, str, int, float | None, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        gauge = 'triton_gitops_server_serving{server="edge-a"}'
        while not self._stop.wait(self.EVERY):
            before = index_of_echo(self.triton)
            status, _ = self.service.get("/serving/edge-a")
            serving = self.service.metrics().get(gauge)
            after = index_of_echo(self.triton)
            self.samples.append((time.monotonic() - self.mark, before, status, serving, after))

    def serving_while(self, index: str) -> list[tuple[float, str, int, float | None, str]]:
        """The samples that said serving (200, or the gauge at 1) while the index read
        ``index`` before and after."""
        return [
            s for s in self.samples
            if s[1] == s[4] == index and (s[2] == 200 or s[3] == 1)
        ]  # fmt: skip

    def __enter__(self) -> RestartSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def test_a_restarted_empty_server_is_out_of_service_at_every_sample_until_restored(
    manifests: ManifestRepo, triton: LocalTriton, model_repository: Path, tmp_path: Path
) -> None:
    # The watch at its shipped interval (3 s), as a user runs it: before issue 41 (point 3)
    # the service heard of the restart only at its next index read, and answered 200 from
    # the old reading for up to that long while Triton, restarted, held nothing.
    extra = ("--watch-interval", "3")
    with echo_service(manifests, triton, model_repository, tmp_path / "service", extra) as service:
        wait_until(lambda: truth(service)[0] == 200, 15, "edge-a serving echo 1")
        with RestartSampler(service, triton) as sampler:
            time.sleep(1.0)
            sampler.mark = restarted = time.monotonic()
            triton.kill()
            triton.start()
            wait_until(lambda: ready_versions(triton, "echo") == {1}, 60, "echo 1 restored")
            wait_until(lambda: truth(service)[0] == 200, 15, "serving again")
            time.sleep(0.3)
        after = [s for s in sampler.samples if s[0] > 0]
        empty = [s for s in after if s[1] == s[4] == "empty"]
        assert empty, f"no sample read the restarted server empty: {sampler.samples}"
        wrong = sampler.serving_while("empty")
        window = (wrong[-1][0] - wrong[0][0] + RestartSampler.EVERY) if wrong else 0.0
        print(
            f"restart at 0 s: {len(empty)} samples read echo empty, {len(wrong)} of them "
            f"said serving (a window of {window:.1f} s); "
            f"{len(sampler.serving_while('unreadable'))} said serving while Triton was down; "
            f"restored {time.monotonic() - restarted:.1f} s after the restart"
        )
        assert not wrong, (
            f"{len(wrong)} of {len(empty)} samples said serving (/serving 200 or the gauge "
            f"at 1) while the restarted server's index held no echo READY, over "
            f"{window:.1f} s: {wrong}"
        )
        assert sampler.samples[-1][1:] == ("READY", 200, 1.0, "READY"), sampler.samples[-5:]
