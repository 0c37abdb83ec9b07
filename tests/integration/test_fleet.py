"""A fleet found through one name: real tritonservers on 127.0.0.2-5, a hosts file the test
controls standing in for the DNS of a headless Service."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
from tritonclient.utils import InferenceServerException

from testkit.cli_run import Reconciler, cli
from testkit.loadgen import WITNESS_PAUSE, LoadGenerator
from testkit.local_triton import LocalTriton, free_port
from testkit.manifests import ManifestRepo, deployment_doc, server_doc
from tests.integration.flows import live_servers, ready_versions

ADDRESSES = ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")


@pytest.fixture
def fleet(model_repository: Path, tmp_path: Path) -> Iterator[dict[str, LocalTriton]]:
    # One gRPC and one metrics port for every instance, as a Service's pods have.
    grpc_port, metrics_port = free_port(), free_port()
    servers: dict[str, LocalTriton] = {}
    try:
        for address in ADDRESSES:
            servers[address] = LocalTriton(
                model_repository,
                host=address,
                grpc_port=grpc_port,
                metrics_port=metrics_port,
                log_file=tmp_path / f"triton-{address}.log",
            ).start()
        yield servers
    finally:
        for server in servers.values():
            server.stop()


def _manifests(manifests: ManifestRepo, fleet: dict[str, LocalTriton], repository: Path) -> None:
    any_server = next(iter(fleet.values()))
    manifests.write(
        "servers.yaml",
        "apiVersion: triton-gitops/v1alpha1\nkind: TritonServer\nmetadata:\n  name: pool\n"
        "spec:\n  discovery:\n"
        "    dns: triton-headless.models.test\n"
        f"    grpcPort: {any_server.grpc_port}\n"
        f"    metricsPort: {any_server.metrics_port}\n"
        f"  modelRepository: {repository}\n",
    )


def _echo_1_on_the_pool(
    manifests: ManifestRepo,
    fleet: dict[str, LocalTriton],
    model_repository: Path,
    tmp_path: Path,
) -> tuple[Reconciler, tuple[str, ...]]:
    """All four instances behind the name, echo 1 deployed on them; the apply options."""
    hosts = tmp_path / "hosts"
    hosts.write_text(f"triton-headless.models.test {' '.join(ADDRESSES)}\n")
    reconciler = Reconciler(manifests.url, tmp_path / "r")
    options = ("--hosts-file", str(hosts))
    _manifests(manifests, fleet, model_repository)
    manifests.write("echo.yaml", deployment_doc("echo", [1], ["pool"]))
    manifests.commit("echo 1")
    assert reconciler.apply(*options).code == 0
    return reconciler, options


def test_instances_are_discovered_added_and_dropped(
    manifests: ManifestRepo,
    fleet: dict[str, LocalTriton],
    model_repository: Path,
    tmp_path: Path,
) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text(f"triton-headless.models.test {' '.join(ADDRESSES[:3])}\n")
    reconciler = Reconciler(manifests.url, tmp_path / "r")
    options = ("--hosts-file", str(hosts))
    _manifests(manifests, fleet, model_repository)
    manifests.write("echo.yaml", deployment_doc("echo", [1], ["pool"]))
    manifests.commit("echo 1 on the pool")

    planned = reconciler.plan(*options, "--output", "json")
    assert planned.code == 2, planned.err
    assert sorted({s["server"] for s in planned.json()["steps"]}) == [
        f"pool/{a}" for a in ADDRESSES[:3]
    ]
    assert reconciler.apply(*options).code == 0
    assert [ready_versions(fleet[a], "echo") for a in ADDRESSES] == [{1}, {1}, {1}, set()]

    # A fourth instance appears in DNS: it is brought to the desired state.
    hosts.write_text(f"triton-headless.models.test {' '.join(ADDRESSES)}\n")
    assert reconciler.apply(*options).code == 0
    assert ready_versions(fleet[ADDRESSES[3]], "echo") == {1}

    # A version bump across the fleet, with clients spread over every instance.
    manifests.write("echo.yaml", deployment_doc("echo", [2], ["pool"]))
    manifests.commit("echo 2 on the pool")
    loads = [
        LoadGenerator(fleet[a].grpc_address, "echo", threads=1, pause=WITNESS_PAUSE).start()
        for a in ADDRESSES
    ]
    try:
        assert reconciler.apply(*options).code == 0
    finally:
        samples = [load.stop() for load in loads]
    assert all(s.error is None for sample in samples for s in sample)
    assert all(ready_versions(fleet[a], "echo") == {2} for a in ADDRESSES)

    # An instance leaves DNS: it is dropped, not "emptied" (nothing refused, nothing
    # unloaded there), and status no longer lists it.
    hosts.write_text(f"triton-headless.models.test {' '.join(ADDRESSES[1:])}\n")
    assert reconciler.apply(*options).code == 0
    shown = cli("status", *reconciler.options, *options, "--output", "json")
    assert sorted({m["server"] for m in shown.json()["models"]}) == [
        f"pool/{a}" for a in ADDRESSES[1:]
    ]
    assert all(m["state"] == "in-sync" for m in shown.json()["models"])


def test_a_name_that_does_not_resolve_is_an_error_naming_it(
    manifests: ManifestRepo, model_repository: Path, tmp_path: Path
) -> None:
    manifests.write(
        "servers.yaml",
        "apiVersion: triton-gitops/v1alpha1\nkind: TritonServer\nmetadata:\n  name: pool\n"
        "spec:\n  discovery: {dns: no-such-name.invalid, grpcPort: 8001}\n"
        f"  modelRepository: {model_repository}\n",
    )
    manifests.write("echo.yaml", deployment_doc("echo", [1], ["pool"]))
    manifests.commit("a pool nobody can find")
    result = Reconciler(manifests.url, tmp_path / "r").apply()
    assert result.code == 1
    assert "cannot resolve no-such-name.invalid" in result.err


@pytest.mark.parametrize(
    "spec",
    [
        "  grpc: 127.0.0.1:8001\n  discovery: {dns: pool.test, grpcPort: 8001}\n",
        "  modelRepository: /models\n",
        "  discovery: {dns: pool.test, grpcPort: 8001}\n  metrics: http://127.0.0.1:8002\n",
    ],
    ids=["both", "neither", "metrics-url-with-discovery"],
)
def test_exactly_one_of_grpc_or_discovery(spec: str, tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text(
        "apiVersion: triton-gitops/v1alpha1\nkind: TritonServer\nmetadata:\n  name: pool\n"
        "spec:\n" + spec
    )
    result = cli("validate", str(tmp_path))
    assert result.code == 1
    assert "s.yaml:5: spec: exactly one of grpc (with an optional metrics URL) or discovery" in (
        result.err
    )


def _ready_or_down(server: LocalTriton) -> list[int] | None:
    """What a hook call saw on an instance; None while it is down (a test restarts one)."""
    try:
        return sorted(ready_versions(server, "echo"))
    except InferenceServerException:
        return None


class _Hooks(BaseHTTPRequestHandler):
    calls: ClassVar[list[dict[str, object]]] = []
    refuse: ClassVar[str | None] = None  # a stage name to answer 409 for

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        body["ready_at_call"] = {
            a: _ready_or_down(self.server.fleet[a])  # type: ignore[attr-defined]
            for a in self.server.fleet  # type: ignore[attr-defined]
        }
        type(self).calls.append(body)
        self.send_response(409 if body["stage"] == type(self).refuse else 200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def hooks(fleet: dict[str, LocalTriton]) -> Iterator[str]:
    _Hooks.calls, _Hooks.refuse = [], None
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hooks)
    server.fleet = fleet  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook"
    finally:
        server.shutdown()
        server.server_close()


def _staged(versions: list[int], hook: str, analysis: str = "") -> str:
    return (
        deployment_doc("echo", versions, ["pool"])
        + (
            "  rollout:\n"
            "    steps: [{servers: 1}, {servers: 50%}, {servers: 100%}]\n"
            "    maxParallel: 50%\n"
            f"    webhooks: {{preStep: {hook}, postStep: {hook}}}\n"
        )
        + analysis
    )


def _watched(duration: str) -> str:
    """A verify analysing each step for ``duration``; it passes with no traffic."""
    return (
        f"  verify:\n    analysis:\n      interval: 1s\n      duration: {duration}\n"
        "      noTraffic: pass\n      checks: [{name: success-rate, successRate: {min: 0.5}}]\n"
    )


def test_a_good_rollout_goes_step_by_step(
    manifests: ManifestRepo,
    fleet: dict[str, LocalTriton],
    model_repository: Path,
    tmp_path: Path,
    hooks: str,
) -> None:
    reconciler, options = _echo_1_on_the_pool(manifests, fleet, model_repository, tmp_path)

    manifests.write("echo.yaml", _staged([2], hooks))
    manifests.commit("echo 2 in three steps")
    planned = reconciler.plan(*options, "--output", "json")
    stages = planned.json()["rollouts"][0]["stages"]
    assert [(s["name"], len(s["servers"]), s["max_parallel"]) for s in stages] == [
        ("step 1 of 3", 1, 1),
        ("step 2 of 3", 1, 1),
        ("step 3 of 3", 2, 1),
    ]
    loads = [
        LoadGenerator(fleet[a].grpc_address, "echo", threads=1, pause=WITNESS_PAUSE).start()
        for a in ADDRESSES
    ]
    try:
        assert reconciler.apply(*options).code == 0
    finally:
        samples = [load.stop() for load in loads]
    assert all(s.error is None for sample in samples for s in sample)
    assert all(ready_versions(fleet[a], "echo") == {2} for a in ADDRESSES)
    stage_calls = [(c["hook"], c["stage"]) for c in _Hooks.calls]
    assert stage_calls == [
        (hook, f"step {n} of 3") for n in (1, 2, 3) for hook in ("preStep", "postStep")
    ]
    # Old versions stay loaded everywhere until the last step passed.
    last = _Hooks.calls[-1]["ready_at_call"]
    assert all(v == [1, 2] for v in last.values())  # type: ignore[union-attr]


def test_a_failing_step_puts_back_every_server_touched(
    manifests: ManifestRepo,
    fleet: dict[str, LocalTriton],
    model_repository: Path,
    tmp_path: Path,
    hooks: str,
) -> None:
    reconciler, options = _echo_1_on_the_pool(manifests, fleet, model_repository, tmp_path)

    # Version 4 fails 40% of its requests. Only the step-2 instance has clients, so step 1
    # passes (noTraffic: pass) and step 2 fails; the step-3 instances have clients that must
    # never meet version 4.
    # The probes would catch version 4 on step 1 already (test_client_view.py): off here, so
    # that step 1 passes (no client, no evidence needed) and step 2 fails.
    analysis = (
        "  verify:\n    analysis:\n      interval: 1s\n      duration: 3s\n"
        "      noTraffic: pass\n      probes: {enabled: false}\n      minEvidence: 0\n"
        "      checks: [{name: success-rate, successRate: {min: 0.95}}]\n"
    )
    manifests.write("echo.yaml", _staged([4], hooks, analysis))
    manifests.commit("echo 4 in three steps")
    watched = [
        LoadGenerator(fleet[a].grpc_address, "echo", threads=1, pause=WITNESS_PAUSE).start()
        for a in ADDRESSES[1:]
    ]
    try:
        result = reconciler.apply(*options, "--output", "json")
    finally:
        seen = [load.stop() for load in watched]
    assert result.code == 1
    assert all(ready_versions(fleet[a], "echo") == {1} for a in ADDRESSES)
    step2, *step3 = seen
    assert any(s.version == 4 for s in step2)  # step 2 really served it
    assert all(s.version == 1 for sample in step3 for s in sample)  # step 3 never did
    outcomes = {c["server"]: c["outcome"] for c in result.json()["result"]["changes"]}
    assert outcomes == {
        f"pool/{ADDRESSES[0]}": "reverted",
        f"pool/{ADDRESSES[1]}": "reverted",
        f"pool/{ADDRESSES[2]}": "skipped",
        f"pool/{ADDRESSES[3]}": "skipped",
    }

    # A webhook that says no fails its step the same way.
    _Hooks.refuse = "step 1 of 3"
    manifests.write("echo.yaml", _staged([2], hooks))
    manifests.commit("echo 2, but the load balancer refuses")
    refused = reconciler.apply(*options)
    assert refused.code == 1
    assert "step webhook refused" in refused.out
    assert all(ready_versions(fleet[a], "echo") == {1} for a in ADDRESSES)


def test_a_preview_pool_catches_differing_outputs_before_production(
    manifests: ManifestRepo,
    triton: LocalTriton,
    triton_b: LocalTriton,
    model_repository: Path,
    tmp_path: Path,
) -> None:
    reconciler = Reconciler(manifests.url, tmp_path / "r")
    manifests.write(
        "servers.yaml",
        server_doc("preview-a", triton.grpc_address, model_repository, "{pool: preview}")
        + "---\n"
        + server_doc("prod-a", triton_b.grpc_address, model_repository, "{pool: prod}"),
    )
    request = {"inputs": {"INPUT0": {"datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}}}
    manifests.write("shadow/echo.jsonl", "\n".join(json.dumps(request) for _ in range(3)) + "\n")

    def echo(version: int, tolerance: float) -> str:
        return deployment_doc("echo", [version], ["preview-a", "prod-a"]) + (
            "  rollout:\n    preview: {servers: {names: [preview-a]}}\n"
            "  verify:\n    shadow:\n      requests: shadow/echo.jsonl\n"
            f"      compare: {{tolerance: {tolerance}, minAgreement: 0.99}}\n"
        )

    manifests.write("echo.yaml", echo(1, 0.001))
    manifests.commit("echo 1 with a preview pool")
    assert reconciler.apply().code == 0

    manifests.write("echo.yaml", echo(3, 0.001))  # version 3 answers x3: outputs differ
    manifests.commit("echo 3")
    with LoadGenerator(triton_b.grpc_address, "echo", threads=1, pause=WITNESS_PAUSE) as production:
        result = reconciler.apply("--output", "json")
    assert result.code == 1
    changes = {c["server"]: c for c in result.json()["result"]["changes"]}
    assert changes["preview-a"]["outcome"] == "reverted"
    assert (
        "shadow replay of 3 request(s): version 3 against version 1: disagrees on 100.0% of 3 "
        "request(s), the serving version with itself on 0.0%" in (changes["preview-a"]["error"])
    )
    assert changes["prod-a"]["outcome"] == "skipped"  # never touched
    assert production.versions_seen() == {1} and production.failures == []
    assert ready_versions(triton, "echo") == {1} and ready_versions(triton_b, "echo") == {1}

    manifests.write("echo.yaml", echo(2, 100.0))  # a tolerance the outputs meet
    manifests.commit("echo 2, close enough")
    assert reconciler.apply().code == 0
    assert ready_versions(triton, "echo") == {2} and ready_versions(triton_b, "echo") == {2}


def test_a_missing_shadow_file_is_a_validation_error(tmp_path: Path) -> None:
    (tmp_path / "all.yaml").write_text(
        server_doc("edge-a", "127.0.0.1:8001", tmp_path)
        + "---\n"
        + deployment_doc("echo", [1], ["edge-a"])
        + "  verify:\n    shadow: {requests: shadow/missing.jsonl}\n"
    )
    (tmp_path / "bad.jsonl").write_text('{"inputs": {"INPUT0": {"datatype": "FP32"}}}\n')
    result = cli("validate", str(tmp_path))
    assert result.code == 1
    assert "all.yaml:18: shadow requests file 'shadow/missing.jsonl' is not in the repository" in (
        result.err
    )
    (tmp_path / "all.yaml").write_text(
        (tmp_path / "all.yaml").read_text().replace("shadow/missing.jsonl", "bad.jsonl")
    )
    malformed = cli("validate", str(tmp_path))
    assert malformed.code == 1
    assert "bad.jsonl:1: inputs.INPUT0: 'shape' is a required property" in malformed.err


def test_a_rollout_cut_short_by_a_killed_reconciler_resumes_where_it_was(
    manifests: ManifestRepo,
    fleet: dict[str, LocalTriton],
    model_repository: Path,
    tmp_path: Path,
    hooks: str,
) -> None:
    reconciler, options = _echo_1_on_the_pool(manifests, fleet, model_repository, tmp_path)

    manifests.write("echo.yaml", _staged([2], hooks, _watched("8s")))
    manifests.commit("echo 2 in three steps, each watched for 8 s")
    command = [sys.executable, "-m", "reconciler", "apply", *reconciler.options, *options]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for_hook("preStep", "step 2 of 3", process)
        # Step 2's server is being watched: its load has ended (a load cut off by the kill
        # would go on on the server, and the next plan would wait for it, not load again).
        _wait_serving(fleet[ADDRESSES[1]], {1, 2}, process)
    finally:
        process.kill()  # the reconciler dies mid-rollout, SIGKILL: nothing runs after it
        process.wait()
    first = f"pool/{ADDRESSES[0]}"
    assert ready_versions(fleet[ADDRESSES[0]], "echo") == {1, 2}  # step 1 done, old kept

    shown = cli("status", *reconciler.options, *options, "--output", "json")
    details = {m["server"]: m["detail"] for m in shown.json()["models"]}
    assert "staged rollout stopped midway (1 server(s) passed)" in details[first]
    assert "this server: its stage passed" in details[first]
    assert "this server: its stage was cut short" in details[f"pool/{ADDRESSES[1]}"]
    assert "this server: not reached yet" in details[f"pool/{ADDRESSES[2]}"]

    # The next pass resumes: step 1's server (its stage passed) waits for the end; step 2's
    # server, cut short in its analysis, is verified and analysed again; then step 3.
    planned = reconciler.plan(*options, "--output", "json")
    stages = {s["name"]: s["servers"] for s in planned.json()["rollouts"][0]["stages"]}
    assert stages == {
        "resumed": [first],
        "step 2 of 3": [f"pool/{ADDRESSES[1]}"],
        "step 3 of 3": [f"pool/{a}" for a in ADDRESSES[2:]],
    }
    second = [s for s in planned.json()["steps"] if s["server"] == f"pool/{ADDRESSES[1]}"]
    assert [s["action"] for s in second] == ["load", "verify", "analyze", "unload"]
    _Hooks.calls.clear()
    result = reconciler.apply(*options)
    assert result.code == 0, result.out
    assert _Hooks.calls[0]["ready_at_call"][ADDRESSES[0]] == [1, 2]  # type: ignore[index]
    assert all(ready_versions(fleet[a], "echo") == {2} for a in ADDRESSES)


_WATCHED = _watched("3s")


def _apply_in_background(reconciler: Reconciler, options: tuple[str, ...]) -> subprocess.Popen[str]:
    command = [
        sys.executable, "-m", "reconciler", "apply", *reconciler.options, *options,
        "--output", "json",
    ]  # fmt: skip
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _while_applying(done: Callable[[], bool], what: str, process: subprocess.Popen[Any]) -> None:
    """Polls until ``done()``; fails if the apply in ``process`` ended first, or after 120 s."""
    deadline = time.monotonic() + 120
    while not done():
        if process.poll() is not None:
            out, err = process.communicate()
            raise AssertionError(f"the apply ended before {what}: {out}\n{err}")
        assert time.monotonic() < deadline, f"no {what} within 120 s"
        time.sleep(0.1)


def _wait_for_hook(hook: str, stage: str, process: subprocess.Popen[Any]) -> None:
    _while_applying(
        lambda: any(c["hook"] == hook and c["stage"] == stage for c in _Hooks.calls),
        f"{hook} of {stage}",
        process,
    )


def _wait_serving(server: LocalTriton, versions: set[int], process: subprocess.Popen[Any]) -> None:
    """Until ``server`` serves exactly ``versions`` of echo: a load sent there has ended."""
    _while_applying(
        lambda: ready_versions(server, "echo") == versions,
        f"echo {sorted(versions)} on {server.host}",
        process,
    )


def _wait_live(
    state: str,
    server: str,
    done: Callable[[dict[str, Any]], bool],
    process: subprocess.Popen[Any],
) -> None:
    """Until echo's entry for ``server`` in the live view the apply writes to ``state``
    satisfies ``done``."""
    _while_applying(
        lambda: done(live_servers(state, "echo").get(server, {"state": "not begun"})),
        f"the live view of {server}",
        process,
    )


def _finish(process: subprocess.Popen[str]) -> tuple[int, dict[str, Any], str]:
    """The apply's exit code, its JSON report and its stderr; killed by pid if it hangs."""
    try:
        out, err = process.communicate(timeout=180)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return process.returncode, json.loads(out), err


def test_an_instance_restarted_mid_rollout_is_put_on_the_version_the_rollout_reached(
    manifests: ManifestRepo,
    fleet: dict[str, LocalTriton],
    model_repository: Path,
    tmp_path: Path,
    hooks: str,
) -> None:
    """An instance step 1 already swapped crashes and comes back empty while step 2 runs.

    The restart says nothing about version 2 (it passed its analysis there before the
    crash), so the rollout goes on; at its end the restarted instance, which lost every
    version, is given the desired versions again and verified, and the pass says so. The
    others are not touched by it: no revert, no hold.
    """
    reconciler, options = _echo_1_on_the_pool(manifests, fleet, model_repository, tmp_path)
    manifests.write("echo.yaml", _staged([2], hooks, _WATCHED))
    manifests.commit("echo 2 in three steps, each watched for 3 s")
    restarted = ADDRESSES[0]
    others = [
        LoadGenerator(fleet[a].grpc_address, "echo", threads=1, pause=WITNESS_PAUSE).start()
        for a in ADDRESSES[1:]
    ]
    process = _apply_in_background(reconciler, options)
    try:
        _wait_for_hook("preStep", "step 2 of 3", process)
        fleet[restarted].kill()  # SIGKILL, as a crash or an OOM kill would
        fleet[restarted].start()  # same address and ports, EXPLICIT mode: empty
        empty_after_restart = ready_versions(fleet[restarted], "echo")
        code, report, err = _finish(process)
    finally:
        samples = [load.stop() for load in others]
    assert empty_after_restart == set()
    assert code == 0, err
    assert all(ready_versions(fleet[a], "echo") == {2} for a in ADDRESSES)
    assert all(s.error is None for sample in samples for s in sample)  # nobody else disturbed
    assert [(c["hook"], c["stage"]) for c in _Hooks.calls] == [
        (hook, f"step {n} of 3") for n in (1, 2, 3) for hook in ("preStep", "postStep")
    ]
    changes = {c["server"]: c for c in report["result"]["changes"]}
    assert {s: c["outcome"] for s, c in changes.items()} == {
        f"pool/{a}": "converged" for a in ADDRESSES
    }
    # The pass says what happened to the restarted instance, and only to it.
    notes = {
        server: [s["reason"] for s in c["steps"] if "lost every version" in s["reason"]]
        for server, c in changes.items()
    }
    assert notes[f"pool/{restarted}"], changes[f"pool/{restarted}"]["steps"]
    assert not any(notes[f"pool/{a}"] for a in ADDRESSES[1:])
    restored = [s["action"] for s in changes[f"pool/{restarted}"]["steps"]][-2:]
    assert restored == ["load", "verify"]

    # Nothing is left half-way: no staged record, every instance in sync, nothing held.
    shown = cli("status", *reconciler.options, *options, "--output", "json")
    assert [(m["server"], m["state"], m["detail"]) for m in shown.json()["models"]] == [
        (f"pool/{a}", "in-sync", "") for a in ADDRESSES
    ]


@pytest.mark.parametrize(
    ("analysis", "refuse", "last_good"),
    [(_WATCHED, None, {2}), ("", "step 2 of 3", {1})],
    ids=["rollout-passes", "rollout-fails"],
)
def test_an_instance_added_to_dns_during_a_rollout_waits_for_its_outcome(
    manifests: ManifestRepo,
    fleet: dict[str, LocalTriton],
    model_repository: Path,
    tmp_path: Path,
    hooks: str,
    analysis: str,
    refuse: str | None,
    last_good: set[int],
) -> None:
    """A pass resolves the name once, as it starts: an instance that appears while its
    rollout runs is not part of it and gets nothing from it (its version has not finished
    its analysis). The next pass brings it to what the fleet ended on: the new version after
    a rollout that passed (through a rollout of its own, verified and analysed), the last
    good one after a rollout that failed and is held."""
    reconciler, options = _echo_1_on_the_pool(manifests, fleet, model_repository, tmp_path)
    any_server = next(iter(fleet.values()))
    newcomer = "127.0.0.6"
    fleet[newcomer] = LocalTriton(
        model_repository,
        host=newcomer,
        grpc_port=any_server.grpc_port,
        metrics_port=any_server.metrics_port,
        log_file=tmp_path / f"triton-{newcomer}.log",
    ).start()  # the fleet fixture stops it with the others
    _Hooks.refuse = refuse
    manifests.write("echo.yaml", _staged([2], hooks, analysis))
    manifests.commit("echo 2 in three steps")
    process = _apply_in_background(reconciler, options)
    _wait_for_hook("preStep", "step 1 of 3", process)
    (tmp_path / "hosts").write_text(
        f"triton-headless.models.test {' '.join((*ADDRESSES, newcomer))}\n"
    )
    code, report, err = _finish(process)

    # The running rollout went on over the four instances it started with.
    assert code == (0 if refuse is None else 1), err
    assert sorted(c["server"] for c in report["result"]["changes"]) == [
        f"pool/{a}" for a in ADDRESSES
    ]
    stages = [c["stage"] for c in _Hooks.calls if c["hook"] == "preStep"]
    assert stages == (
        ["step 1 of 3", "step 2 of 3"] if refuse else ["step 1 of 3", "step 2 of 3", "step 3 of 3"]
    )
    assert all(c["ready_at_call"][newcomer] == [] for c in _Hooks.calls)  # type: ignore[index]
    assert ready_versions(fleet[newcomer], "echo") == set()
    assert all(ready_versions(fleet[a], "echo") == last_good for a in ADDRESSES)

    # The next pass finds it and gives it what the fleet serves.
    _Hooks.calls.clear()
    planned = reconciler.plan(*options, "--output", "json")
    assert [(s["server"], s["action"]) for s in planned.json()["steps"]][:1] == [
        (f"pool/{newcomer}", "load")
    ]
    assert {s["server"] for s in planned.json()["steps"]} == {f"pool/{newcomer}"}
    again = reconciler.apply(*options)
    assert again.code == 0, again.out
    assert ready_versions(fleet[newcomer], "echo") == last_good
    assert all(ready_versions(fleet[a], "echo") == last_good for a in ADDRESSES)
    if refuse is None:  # the new version reached it through its own analysed rollout
        assert [(c["hook"], c["stage"]) for c in _Hooks.calls] == [
            ("preStep", "step 1 of 3"),
            ("postStep", "step 1 of 3"),
        ]
        analyse = [s for s in planned.json()["steps"] if s["action"] == "analyze"]
        assert [s["server"] for s in analyse] == [f"pool/{newcomer}"]
    shown = cli("status", *reconciler.options, *options, "--output", "json")
    states = {m["server"]: m["state"] for m in shown.json()["models"]}
    # After a failed rollout the one instance it had swapped is held at what it served.
    held = {f"pool/{ADDRESSES[0]}"} if refuse else set()
    assert states == {
        f"pool/{a}": "held" if f"pool/{a}" in held else "in-sync" for a in (*ADDRESSES, newcomer)
    }


def test_an_abort_during_a_staged_rollout_puts_back_every_server_touched_at_once(
    manifests: ManifestRepo,
    fleet: dict[str, LocalTriton],
    model_repository: Path,
    tmp_path: Path,
    hooks: str,
) -> None:
    """``abort`` one-shot on the state store of an apply running elsewhere, during step 2's
    half-minute analysis: both servers touched are back on 1 within seconds, step 3 is never
    reached, the spec is held (Stalled: Aborted)."""
    reconciler, options = _echo_1_on_the_pool(manifests, fleet, model_repository, tmp_path)
    state = reconciler.options[3]
    manifests.write("echo.yaml", _staged([2], hooks, _watched("30s")))
    manifests.commit("echo 2 in three steps, each watched for 30 s")
    early = cli("abort", "echo", "--state", state)
    assert early.code == 1 and "no rollout of ModelDeployment echo is in progress" in early.err
    # Step 1's analysis, promoted: the rollout goes on to step 2 (analysed in full).
    process = _apply_in_background(reconciler, options)
    try:
        # Into step 1's analysis, past its first evaluation (the live view says when: a
        # sleep was too short on a loaded machine, and the promote came before the analysis).
        _wait_live(state, f"pool/{ADDRESSES[0]}", lambda e: "evaluation" in e, process)
        assert cli("promote", "echo", "--state", state, "--as", "oncall").code == 0
        _wait_for_hook("preStep", "step 2 of 3", process)
        _wait_live(state, f"pool/{ADDRESSES[1]}", lambda e: e["state"] == "analyzing", process)
        aborted = cli("abort", "echo", "--state", state, "--as", "oncall", "--reason", "paged")
        asked = time.monotonic()
        assert aborted.code == 0, aborted.err
        while any(ready_versions(fleet[a], "echo") != {1} for a in ADDRESSES[:2]):
            assert time.monotonic() - asked < 10, "the old version is not back within 10 s"
            time.sleep(0.05)
    finally:
        code, report, err = _finish(process)
    assert code == 1
    assert all(ready_versions(fleet[a], "echo") == {1} for a in ADDRESSES)
    outcomes = {c["server"]: c["outcome"] for c in report["result"]["changes"]}
    assert outcomes == {
        f"pool/{ADDRESSES[0]}": "reverted",
        f"pool/{ADDRESSES[1]}": "reverted",
        f"pool/{ADDRESSES[2]}": "skipped",
        f"pool/{ADDRESSES[3]}": "skipped",
    }
    # apply's lines on stderr (not a terminal): each step as it begins, each evaluation.
    assert f"pool/{ADDRESSES[1]}/echo: analyze [2] ..." in err
    assert f"pool/{ADDRESSES[0]}/echo: evaluation 1 at " in err
    history = cli("history", "--state", state, "--output", "json").json()
    verdicts = {r["server"]: r["verdict"] for r in history["rollouts"] if r["to_versions"] == [2]}
    assert verdicts[f"pool/{ADDRESSES[0]}"] == "promoted"
    assert verdicts[f"pool/{ADDRESSES[1]}"] == "aborted"
    shown = cli("status", *reconciler.options, *options, "--output", "json").json()
    (echo,) = [d for d in shown["deployments"] if d["name"] == "echo"]
    stalled = {c["type"]: c for c in echo["conditions"]}["Stalled"]
    assert (stalled["status"], stalled["reason"]) == ("True", "Aborted")
    assert f"echo 2 on pool/{ADDRESSES[1]} was aborted by an operator; 1 serves again" in err
    assert "aborted by oncall" in stalled["message"] and "paged" in stalled["message"]
