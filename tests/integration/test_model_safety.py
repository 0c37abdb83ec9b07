"""Model-aware safety on real Triton: ensembles, sequence models, backend library swaps,
memory headroom, interface changes and tampered artifacts."""

from __future__ import annotations

import contextlib
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as triton_grpc
from tritonclient.utils import InferenceServerException

from testkit.cli_run import CliRun, Reconciler, cli
from testkit.loadgen import WITNESS_PAUSE, LoadGenerator, SequenceClient
from testkit.local_triton import LocalTriton
from testkit.manifests import (
    ManifestRepo,
    deployment_doc,
    echo_smoke_case,
    server_doc,
    write_model_repository,
)
from testkit.tcp_proxy import TcpProxy
from tests.integration.flows import ready_versions


def _servers(manifests: ManifestRepo, *servers: tuple[str, LocalTriton, Path]) -> None:
    manifests.write(
        "servers.yaml",
        "---\n".join(
            server_doc(name, t.grpc_address, repo, "{pool: edge}", metrics=t.metrics_url)
            for name, t, repo in servers
        ),
    )


def alerted(caplog: pytest.LogCaptureFixture, kind: str) -> bool:
    """Whether an alert of ``kind`` went out (the log record every alert has: message
    "alert", the event's fields as the record's)."""
    return any(
        r.getMessage() == "alert" and vars(r).get("fields", {}).get("kind") == kind
        for r in caplog.records
    )


# -- ensembles and dependencies ---------------------------------------------------------------


def test_ensemble_loads_after_its_composing_models_and_survives_their_bump(
    manifests: ManifestRepo, triton: LocalTriton, model_repository: Path, tmp_path: Path
) -> None:
    reconciler = Reconciler(manifests.url, tmp_path / "r")
    _servers(manifests, ("edge-a", triton, model_repository))
    manifests.write("chain.yaml", deployment_doc("chain", [1], ["edge-a"]))
    manifests.write("echo.yaml", deployment_doc("echo", [1], ["edge-a"]))
    manifests.commit("an ensemble with one composing model missing")
    missing = reconciler.plan()
    assert missing.code == 1
    assert "model chain: needs other, which no ModelDeployment places on this server" in (
        missing.out
    )

    manifests.write("other.yaml", deployment_doc("other", [3], ["edge-a"]))
    manifests.commit("and its other composing model")
    planned = reconciler.plan("--output", "json")
    order = [s["model"] for s in planned.json()["steps"] if s["action"] == "load"]
    assert order.index("echo") < order.index("chain") and order.index("other") < order.index(
        "chain"
    )
    assert reconciler.apply().code == 0
    assert ready_versions(triton, "other") == {3}  # not Triton's default pick

    with LoadGenerator(triton.grpc_address, "chain", threads=2, pause=WITNESS_PAUSE) as load:
        load.wait_for_samples(100)
        manifests.write("echo.yaml", deployment_doc("echo", [2], ["edge-a"]))
        manifests.commit("bump a composing model")
        assert reconciler.apply().code == 0
        load.wait_for_samples(len(load.samples) + 100)
    assert load.failures == []
    assert {3, 6} <= load.versions_seen()  # 1*3 before, 2*3 after


def test_removing_a_composing_model_under_a_staying_ensemble_is_refused(
    manifests: ManifestRepo, triton: LocalTriton, model_repository: Path, tmp_path: Path
) -> None:
    reconciler = Reconciler(manifests.url, tmp_path / "r")
    _servers(manifests, ("edge-a", triton, model_repository))
    for name in ("chain", "echo", "other"):
        manifests.write(f"{name}.yaml", deployment_doc(name, [1], ["edge-a"]))
    manifests.commit("ensemble and its models")
    assert reconciler.apply().code == 0

    manifests.remove("echo.yaml")
    manifests.commit("echo retired, but chain still uses it")
    refused = reconciler.apply()
    assert refused.code == 1
    assert "model echo: not unloaded: chain still need(s) it here" in refused.out
    assert ready_versions(triton, "chain") == {1} and ready_versions(triton, "echo") == {1}

    manifests.remove("chain.yaml")
    manifests.commit("chain retired too")
    planned = reconciler.plan("--output", "json")
    unloads = [(s["model"], s["reason"]) for s in planned.json()["steps"]]
    assert [m for m, _ in unloads] == ["chain", "echo"]  # the ensemble goes first
    assert "after chain, which need it" in unloads[1][1]
    assert reconciler.apply().code == 0
    assert ready_versions(triton, "chain") == set() and ready_versions(triton, "echo") == set()
    assert ready_versions(triton, "other") == {1}


def test_dependency_cycles_are_validation_errors(tmp_path: Path) -> None:
    (tmp_path / "all.yaml").write_text(
        server_doc("edge-a", "127.0.0.1:8001", tmp_path)
        + "---\n"
        + deployment_doc("a", [1], ["edge-a"], extra="  dependsOn: [b]\n")
        + "---\n"
        + deployment_doc("b", [1], ["edge-a"], extra="  dependsOn: [a, nope]\n")
    )
    result = cli("validate", str(tmp_path))
    assert result.code == 1
    assert "dependency cycle: a -> b -> a" in result.err
    assert "ModelDeployment 'b' depends on unknown ModelDeployment 'nope'" in result.err


# -- sequence models ------------------------------------------------------------------------


def _counter(versions: list[int], drain: str) -> str:
    return deployment_doc("counter", versions, ["edge-a"], extra=f"  sequence: {drain}\n")


def test_sequence_model_is_swapped_only_once_idle(
    manifests: ManifestRepo, triton: LocalTriton, model_repository: Path, tmp_path: Path
) -> None:
    reconciler = Reconciler(manifests.url, tmp_path / "r")
    _servers(manifests, ("edge-a", triton, model_repository))
    manifests.write("counter.yaml", _counter([1], "{idle: 1s, drainTimeout: 60s}"))
    manifests.commit("counter 1")
    assert reconciler.apply().code == 0

    manifests.write("counter.yaml", _counter([2], "{idle: 1s, drainTimeout: 60s}"))
    manifests.commit("counter 2")
    planned = reconciler.plan("--output", "json")
    assert [s["action"] for s in planned.json()["steps"]][:2] == ["drain", "load"]
    client = SequenceClient(triton.grpc_address)
    result: dict[str, int] = {}
    with client:
        time.sleep(1.0)
        applying = threading.Thread(target=lambda: result.update(code=reconciler.apply().code))
        applying.start()
        time.sleep(3.0)
        assert ready_versions(triton, "counter") == {1}  # still draining: sequences run
    applying.join(90)  # the client stopped: the model goes idle, then the swap
    assert result["code"] == 0
    assert ready_versions(triton, "counter") == {2}
    assert client.broken == [] and client.completed > 0
    # The idle window is at least the config's max_sequence_idle_microseconds (5 s).
    assert "no new inference for 5s" in planned.json()["steps"][0]["reason"]


def test_a_sequence_version_that_breaks_sequences_midway_is_caught_by_probe_sequences(
    manifests: ManifestRepo, triton: LocalTriton, model_repository: Path, tmp_path: Path
) -> None:
    """Issue 44, point 3: version 2 answers every request but a sequence's START with an
    error response, which Triton 2.51 counts a success. A lone probe request was refused by
    both versions (no correlation ID) and left out; the probes now send whole sequences of
    their own, START to END, and the second request of the first ones fails: reverted,
    version 1 serving alone."""
    reconciler = Reconciler(manifests.url, tmp_path / "r")
    _servers(manifests, ("edge-a", triton, model_repository))
    served = (
        "  sequence: {idle: 1s, drainTimeout: 60s}\n"
        "  config: {parameters: {fail_later: {string_value: '2:1'}}}\n"
    )
    watched = (
        served + "  verify:\n"
        "    analysis:\n"
        "      interval: 1s\n"
        "      duration: 4s\n"
        "      checks:\n"
        "        - name: success-rate\n"
        "          successRate: {min: 0.99}\n"
    )
    # (A first deployment is probed by its smoke cases only: version 1 goes unwatched.)
    manifests.write("counter.yaml", deployment_doc("counter", [1], ["edge-a"], extra=served))
    manifests.commit("counter 1")
    first = reconciler.apply()
    assert first.code == 0, first.explain()
    manifests.write("counter.yaml", deployment_doc("counter", [2], ["edge-a"], extra=watched))
    manifests.commit("counter 2, which loses its sequences")
    planned = reconciler.plan("--output", "json").json()["steps"]
    verify = next(s for s in planned if s["action"] == "verify")
    assert "each question asked as a whole sequence of its own" in verify["reason"], verify
    result = reconciler.apply("--output", "json")
    assert result.code != 0, result.explain()
    assert "request 2 of 3 of a sequence" in result.out, result.out[-3000:]
    assert "lost sequence" in result.out, result.out[-3000:]
    assert ready_versions(triton, "counter") == {1}


def test_a_drain_that_times_out_swaps_nothing(
    manifests: ManifestRepo,
    triton: LocalTriton,
    model_repository: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    reconciler = Reconciler(manifests.url, tmp_path / "r")
    _servers(manifests, ("edge-a", triton, model_repository))
    manifests.write("counter.yaml", _counter([1], "{idle: 1s, drainTimeout: 3s}"))
    manifests.commit("counter 1")
    assert reconciler.apply().code == 0
    manifests.write("counter.yaml", _counter([2], "{idle: 1s, drainTimeout: 3s}"))
    manifests.commit("counter 2")
    with SequenceClient(triton.grpc_address) as client:
        result = reconciler.apply()
    assert result.code == 1
    assert "did not go idle within 3s" in result.out and "not swapped" in result.out
    assert alerted(caplog, "drain-timeout")
    assert ready_versions(triton, "counter") == {1}
    assert client.broken == []


# -- backend library swaps ------------------------------------------------------------------


@pytest.fixture
def two_servers(
    model_repository: Path, tmp_path: Path
) -> Iterator[tuple[LocalTriton, LocalTriton]]:
    a = LocalTriton(model_repository, log_file=tmp_path / "a.log").start()
    b = LocalTriton(model_repository, log_file=tmp_path / "b.log").start()
    try:
        yield a, b
    finally:
        a.stop()
        b.stop()


def test_backend_change_swaps_one_server_at_a_time(
    manifests: ManifestRepo,
    two_servers: tuple[LocalTriton, LocalTriton],
    model_repository: Path,
    tmp_path: Path,
) -> None:
    a, b = two_servers
    reconciler = Reconciler(manifests.url, tmp_path / "r")
    _servers(manifests, ("edge-a", a, model_repository), ("edge-b", b, model_repository))
    marker = tmp_path / "replaced.txt"
    hook = tmp_path / "replace.py"
    hook.write_text(
        "import os, time\n"
        f"with open({str(marker)!r}, 'a') as f:\n"
        "    f.write(f\"{os.environ['TRITON_GITOPS_SERVER']} {os.environ['TRITON_GITOPS_BACKEND']}"
        " {os.environ['TRITON_GITOPS_REVISION']}\\n\")\n"
        "time.sleep(1)\n"
    )

    def echo(revision: str) -> str:
        return deployment_doc("echo", [1], ["edge-a", "edge-b"]) + (
            f"  backend:\n    name: python\n    revision: '{revision}'\n"
            f"    replaceLibrary: {{command: ['{sys.executable}', '{hook}']}}\n"
        )

    manifests.write("echo.yaml", echo("2026.10"))
    manifests.commit("echo on the python backend 2026.10")
    assert reconciler.apply().code == 0
    manifests.write("echo.yaml", echo("2026.11"))
    manifests.commit("python backend 2026.11")
    planned = reconciler.plan("--output", "json")
    assert [s["action"] for s in planned.json()["steps"] if s["server"] == "edge-a"] == [
        "drain", "unload", "replace-library", "load", "verify",
    ]  # fmt: skip

    down_together: list[float] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            if ready_versions(a, "echo") == set() and ready_versions(b, "echo") == set():
                down_together.append(time.monotonic())
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        result = reconciler.apply()
    finally:
        stop.set()
        watcher.join()
    assert result.code == 0, result.out
    assert down_together == []  # never both instances of the pool out at once
    assert sorted(marker.read_text().splitlines()) == [
        "edge-a python 2026.11",
        "edge-b python 2026.11",
    ]
    assert ready_versions(a, "echo") == {1} and ready_versions(b, "echo") == {1}
    assert reconciler.plan().code == 0  # the new revision is recorded as applied


# -- memory headroom ------------------------------------------------------------------------


def test_no_headroom_is_refused_or_replaced(
    manifests: ManifestRepo,
    triton: LocalTriton,
    model_repository: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    reconciler = Reconciler(manifests.url, tmp_path / "r")
    _servers(manifests, ("edge-a", triton, model_repository))
    huge = "  resources: {memory: 64Ti}\n"
    manifests.write("echo.yaml", deployment_doc("echo", [1], ["edge-a"], extra=huge))
    manifests.commit("echo 1")
    assert reconciler.apply().code == 0  # nothing served before: nothing to fit beside
    manifests.write("echo.yaml", deployment_doc("echo", [2], ["edge-a"], extra=huge))
    manifests.commit("echo 2, far too big to sit beside 1")
    # Triton's memory figures come from its own metrics endpoint.
    refused = reconciler.apply()
    assert refused.code == 1
    assert "no memory headroom: 1 new version(s) need 67108864 MiB beside the old" in refused.out
    assert alerted(caplog, "no-headroom")
    assert ready_versions(triton, "echo") == {1}

    replace = huge + "  rollout: {whenNoHeadroom: replace}\n"
    manifests.write("echo.yaml", deployment_doc("echo", [2], ["edge-a"], extra=replace))
    manifests.commit("echo 2, swapped in place")
    planned = reconciler.plan("--output", "json")
    assert [s["action"] for s in planned.json()["steps"]] == ["unload", "load", "verify"]
    assert reconciler.apply().code == 0
    assert ready_versions(triton, "echo") == {2}


# -- interface changes ----------------------------------------------------------------------


def _echo_index(triton: LocalTriton) -> dict[int, str]:
    """echo's versions in Triton's repository index, with their state: a version appears
    there once a load has asked for it, and stays (UNAVAILABLE) after it is unloaded."""
    with triton_grpc.InferenceServerClient(triton.grpc_address) as client:
        index = client.get_model_repository_index(as_json=True).get("models", [])
    return {int(m["version"]): m.get("state", "") for m in index if m.get("name") == "echo"}


def _echo_config(triton: LocalTriton) -> dict[str, Any]:
    with triton_grpc.InferenceServerClient(triton.grpc_address) as client:
        config: dict[str, Any] = client.get_model_config("echo", as_json=True)["config"]
    return config


def test_a_version_that_hangs_past_the_call_timeout_is_put_back_and_held(
    manifests: ManifestRepo, triton: LocalTriton, model_repository: Path, tmp_path: Path
) -> None:
    """Version 2 answers 4 s late; the reconciler's calls time out after 2 s. The timeout
    read as a lost server before: version 2 was left loaded beside 1 (a client that names no
    version got it), nothing was held, and the next pass promoted it without a verify."""
    reconciler = Reconciler(manifests.url, tmp_path / "r")
    late = "  config: {parameters: {delay_ms: {string_value: '2:4000'}}}\n"
    _servers(manifests, ("edge-a", triton, model_repository))
    manifests.write("echo.yaml", deployment_doc("echo", [1], ["edge-a"], extra=late))
    manifests.commit("echo 1")
    assert reconciler.apply("--call-timeout", "2").code == 0
    manifests.write(
        "echo.yaml", deployment_doc("echo", [2], ["edge-a"], expect_factor=2, extra=late)
    )
    manifests.commit("echo 2, which hangs past the call timeout")

    hung = reconciler.apply("--call-timeout", "2", "--output", "json")

    why = hung.explain()
    assert hung.code == 1, why
    (change,) = hung.json()["result"]["changes"]
    assert change["outcome"] == "reverted", why
    assert "no answer within 2s (--call-timeout) while the server answers" in why, why
    assert ready_versions(triton, "echo") == {1}
    again = reconciler.apply("--call-timeout", "2")
    assert again.code == 0 and "edge-a/echo: ModelDeployment echo at revision" in again.out, (
        again.out + again.err
    )
    assert "held at 1: server edge-a: inference on echo version 2: no answer" in again.out
    assert ready_versions(triton, "echo") == {1}  # held: neither tried again nor promoted

    # A model that slow on purpose says how long its case may take: a commit releases the
    # hold, and the case's own timeout, not --call-timeout, bounds its answer.
    patient = "        timeout: 6s\n"
    manifests.write(
        "echo.yaml",
        deployment_doc("echo", [2], ["edge-a"], expect_factor=2) + patient + late,
    )
    manifests.commit("echo 2, its smoke case given 6 s")
    slow = reconciler.apply("--call-timeout", "2", "--output", "json")
    assert slow.code == 0, slow.explain()
    assert ready_versions(triton, "echo") == {2}


def _verify_cut(
    manifests: ManifestRepo,
    triton: LocalTriton,
    model_repository: Path,
    reconciler: Reconciler,
    proxy: TcpProxy,
    cut: Callable[[], object],
) -> CliRun:
    """echo 1 applied with edge-a reached through ``proxy``; then the apply of echo 2, which
    answers 1.5 s late and whose verify asks it three times, with ``cut`` called inside
    that verify. Before (fixes of 9c08889 and b371a85, tested with fakes then), a verify
    that lost its server left 2 loaded beside 1 (a client that names no version got it),
    and the next pass dropped 1 without verifying 2."""
    late = "  config: {parameters: {delay_ms: {string_value: '2:1500'}}}\n"
    cases = "".join(echo_smoke_case(name, 2) + "\n" for name in ("first", "second", "third"))
    verify = "  verify:\n    smoke:\n" + cases
    manifests.write(
        "servers.yaml", server_doc("edge-a", proxy.address, model_repository, "{pool: edge}")
    )
    manifests.write("echo.yaml", deployment_doc("echo", [1], ["edge-a"], extra=late))
    manifests.commit("echo 1")
    assert reconciler.apply().code == 0
    manifests.write("echo.yaml", deployment_doc("echo", [2], ["edge-a"], extra=verify + late))
    manifests.commit("echo 2, asked three times")
    done: list[float] = []

    def answered_by_2() -> int:
        with triton_grpc.InferenceServerClient(triton.grpc_address) as client:
            stats = client.get_inference_statistics("echo", "2", as_json=True)
        return int(stats["model_stats"][0].get("inference_count", 0))

    def cut_inside_the_verify() -> None:
        # Once version 2 has answered the first case, the verify asks the second (1.5 s):
        # half a second on, the cut lands inside that call. (At once, it can land before
        # the call is sent, and gRPC sends it on a new connection: one run of ten here.)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(InferenceServerException):
                if answered_by_2() >= 1:
                    break
            time.sleep(0.02)
        time.sleep(0.5)
        cut()
        done.append(time.monotonic())

    cutter = threading.Thread(target=cut_inside_the_verify)
    cutter.start()
    dropped = reconciler.apply("--output", "json")
    cutter.join()
    assert done and proxy.cuts >= 1, f"no connection was cut: {dropped.explain()}"
    return dropped


def test_a_verify_cut_by_a_network_drop_puts_the_old_version_back_and_holds_nothing(
    manifests: ManifestRepo, triton: LocalTriton, model_repository: Path, tmp_path: Path
) -> None:
    """Every connection through the proxy is cut inside the verify, and the server answers
    again at once (a new connection): the old version is put back in the same pass, not
    held, and the next apply promotes 2 after a verify of its own."""
    reconciler = Reconciler(manifests.url, tmp_path / "r")
    with TcpProxy(triton.grpc_address) as proxy:
        dropped = _verify_cut(manifests, triton, model_repository, reconciler, proxy, proxy.cut)
        why = dropped.explain()
        assert dropped.code == 1, why
        (change,) = dropped.json()["result"]["changes"]
        # The server lost inside the verify (the version not blamed), then put back.
        assert change["outcome"] == "reverted", why
        assert "did not answer (inferring echo version 2)" in change["error"], why
        assert [(r["action"], r["versions"], r["ok"]) for r in change["revert"]] == [
            ("load", [1], True),
            ("verify", [1], True),
        ], why
        assert ready_versions(triton, "echo") == {1}, why  # put back in the same pass

        again = reconciler.apply("--output", "json")
        assert again.code == 0, again.explain()
        (change,) = again.json()["result"]["changes"]
        assert change["outcome"] == "converged", again.explain()  # not held: verified, then 2
        assert ready_versions(triton, "echo") == {2}


def test_a_verify_whose_server_stays_gone_leaves_the_next_pass_to_verify_first(
    manifests: ManifestRepo, triton: LocalTriton, model_repository: Path, tmp_path: Path
) -> None:
    """The proxy goes away inside the verify (connections cut, new ones refused) and does
    not come back within the 2 s the pass asks for: nothing can be put back, nothing is
    held, and version 2 stays loaded beside 1. Once the server is reachable again, the next
    apply verifies 2 before it drops 1."""
    reconciler = Reconciler(manifests.url, tmp_path / "r")
    with TcpProxy(triton.grpc_address) as proxy:
        dropped = _verify_cut(manifests, triton, model_repository, reconciler, proxy, proxy.go_away)
    why = dropped.explain()
    assert dropped.code == 1, why
    (change,) = dropped.json()["result"]["changes"]
    assert (change["outcome"], change["revert"]) == ("failed", []), why
    assert "did not answer (inferring echo version 2)" in change["error"], why
    assert ready_versions(triton, "echo") == {1, 2}, why  # 2 stays, unverified

    with TcpProxy(triton.grpc_address, port=proxy.port):  # the server reachable again
        again = reconciler.apply("--output", "json")
    why = again.explain()
    assert again.code == 0, why
    (change,) = again.json()["result"]["changes"]
    assert change["outcome"] == "converged", why
    steps = [(r["action"], r["versions"]) for r in change["steps"]]
    assert steps[:2] == [("load", [1, 2]), ("verify", [2])], why  # verified before 1 goes
    assert ready_versions(triton, "echo") == {2}


def test_a_renamed_output_is_refused_before_anything_is_loaded_unless_allowed(
    manifests: ManifestRepo,
    triton: LocalTriton,
    model_repository: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Triton applies a config to the whole model: loading [1, 2] with a config that renames
    OUTPUT0 would make version 1 answer with the new name too. The plan refuses the change
    before anything is loaded, so clients of version 1, pinned or not, never see it."""
    reconciler = Reconciler(manifests.url, tmp_path / "r")
    _servers(manifests, ("edge-a", triton, model_repository))
    manifests.write("echo.yaml", deployment_doc("echo", [1], ["edge-a"]))
    manifests.commit("echo 1")
    assert reconciler.apply().code == 0
    config_before = _echo_config(triton)
    assert [t["name"] for t in config_before["output"]] == ["OUTPUT0"]
    assert _echo_index(triton) == {1: "READY"}
    renamed = "  config:\n    output: [{name: SCORES, data_type: TYPE_FP32, dims: [-1, 4]}]\n"
    manifests.write("echo.yaml", deployment_doc("echo", [2], ["edge-a"]) + renamed)
    manifests.commit("echo 2 names its output SCORES")

    planned = reconciler.plan()
    assert planned.code == 1
    assert "version 2 changes the model's interface" in planned.out
    assert "refused before anything is loaded" in planned.out

    assert triton.log_file is not None
    log_before = triton.log_file.read_text(errors="replace")
    with (
        LoadGenerator(triton.grpc_address, "echo", threads=2, pause=WITNESS_PAUSE) as unversioned,
        LoadGenerator(
            triton.grpc_address, "echo", threads=2, version=1, pause=WITNESS_PAUSE
        ) as pinned,
    ):
        unversioned.wait_for_samples(100)
        pinned.wait_for_samples(100)
        caught = reconciler.apply()
        unversioned.wait_for_samples(len(unversioned.samples) + 100)
        pinned.wait_for_samples(len(pinned.samples) + 100)
    assert caught.code == 1
    assert "version 2 changes the model's interface" in caught.out
    assert "output OUTPUT0 removed" in caught.out and "output SCORES added" in caught.out
    assert alerted(caplog, "interface-change")
    # No client failed, and every answer came from version 1 under its old output name.
    assert unversioned.failures == [] and pinned.failures == []
    assert unversioned.versions_seen() == {1} and pinned.versions_seen() == {1}
    # Nothing was loaded: version 2 was never asked for, version 1 runs the config it had,
    # and Triton logged no load at all during the refused apply.
    assert ready_versions(triton, "echo") == {1}
    assert _echo_index(triton) == {1: "READY"}
    assert _echo_config(triton) == config_before
    during = triton.log_file.read_text(errors="replace")[len(log_before) :]
    assert "echo" not in during, during

    allowed = deployment_doc("echo", [2], ["edge-a"]) + renamed + "  allowInterfaceChange: true\n"
    manifests.write("echo.yaml", allowed)
    manifests.commit("echo 2, the new output name is intended")
    assert reconciler.apply().code == 0
    assert ready_versions(triton, "echo") == {2}
    assert [t["name"] for t in _echo_config(triton)["output"]] == ["SCORES"]


# -- artifact digests -----------------------------------------------------------------------


def test_a_tampered_artifact_is_refused(
    manifests: ManifestRepo, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    repository = write_model_repository(tmp_path / "models")
    with LocalTriton(repository, log_file=tmp_path / "t.log") as triton:
        reconciler = Reconciler(manifests.url, tmp_path / "r")
        _servers(manifests, ("edge-a", triton, repository))
        shown = cli("digest", str(repository / "echo" / "2"))
        assert shown.code == 0
        digest = shown.out.strip()
        assert digest.startswith("sha256:") and len(digest) == 71
        pinned = "  versions: [{version: 2, digest: '" + digest + "'}]\n"
        echo_2 = deployment_doc("echo", [2], ["edge-a"]).replace("  versions: [2]\n", pinned)
        manifests.write("echo.yaml", echo_2)
        manifests.commit("echo 2, pinned")
        assert reconciler.apply().code == 0
        assert ready_versions(triton, "echo") == {2}

        reconciler.apply()  # nothing to do
        triton_model = repository / "echo" / "2" / "model.py"
        triton_model.write_text(triton_model.read_text() + "\n# changed after release\n")
        shutil.rmtree(repository / "echo" / "2" / "__pycache__", ignore_errors=True)
        manifests.write("echo.yaml", deployment_doc("echo", [1], ["edge-a"]))
        manifests.commit("back to 1")
        assert reconciler.apply().code == 0
        manifests.write("echo.yaml", echo_2)
        manifests.commit("echo 2 again: its folder was changed meanwhile")
        refused = reconciler.apply()
        assert refused.code == 1
        assert "artifact changed under a released version number" in refused.out
        assert alerted(caplog, "artifact-mismatch")
        assert ready_versions(triton, "echo") == {1}
