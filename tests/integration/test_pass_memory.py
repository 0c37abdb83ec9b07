"""The service's passes with ``PassMemory`` on a real tritonserver: what a pass keeps for
the next never hides a change someone made to the server."""

from __future__ import annotations

import json
import time
from pathlib import Path

import tritonclient.grpc as triton_grpc

from reconciler.core.triton_config import parse_pbtxt, with_versions
from reconciler.loop.memory import PassMemory
from reconciler.loop.reconcile import reconcile
from reconciler.model.reports import PassReport
from reconciler.model.servers import TritonServer
from reconciler.model.settings import Settings, TritonSettings
from reconciler.model.source import Source
from reconciler.ports import TritonClient
from reconciler.wiring import new_client, ports
from testkit.local_triton import LocalTriton, free_port
from testkit.manifests import ManifestRepo, deployment_doc, server_doc
from tests.integration.flows import ready_versions

CONFIG = "  config:\n    instance_group: [{kind: KIND_CPU, count: 1}]\n"


def test_kept_memory_settles_and_still_restores_hand_changes(
    manifests: ManifestRepo, triton: LocalTriton, model_repository: Path, tmp_path: Path
) -> None:
    manifests.write(
        "servers/edge-a.yaml", server_doc("edge-a", triton.grpc_address, model_repository)
    )
    manifests.write("models/echo.yaml", deployment_doc("echo", [1], ["edge-a"], extra=CONFIG))
    manifests.write("models/other.yaml", deployment_doc("other", [1], ["edge-a"]))
    manifests.commit("deploy echo 1 and other 1")
    # The recheck is short so that a hand reload is seen within the test.
    settings = Settings(
        tmp_path / "cache", tmp_path / "state.db", triton=TritonSettings(config_recheck=1.0)
    )
    memory = PassMemory()

    def one_pass() -> PassReport:
        source = Source(manifests.url)
        return reconcile(
            source, settings, ports(settings, source), apply_changes=True, memory=memory
        )

    try:
        first = one_pass()
        assert first.ok and len(first.plan.changes) == 2
        assert ready_versions(triton, "echo") == {1} and ready_versions(triton, "other") == {1}
        second = one_pass()  # planned in full: the first pass had changes
        assert not second.plan.changes and memory.settled_servers == {"edge-a"}
        third = one_pass()  # settled: reported in sync without planning each model again
        assert not third.plan.changes
        assert set(third.plan.in_sync) == {("edge-a", "echo"), ("edge-a", "other")}

        with triton_grpc.InferenceServerClient(triton.grpc_address) as by_hand:
            by_hand.unload_model("other")
            deadline = time.monotonic() + 30
            while ready_versions(triton, "other"):
                assert time.monotonic() < deadline, "the hand unload never finished"
                time.sleep(0.05)
            restored = one_pass()
            assert [(c.server, c.model) for c in restored.plan.changes] == [("edge-a", "other")]
            assert restored.drift == (("edge-a", "other"),)
            assert ready_versions(triton, "other") == {1}

            # A reload by hand with two instances: Triton's index does not change,
            # the recheck (due within 1.5 s here) finds the drift and puts spec.config back.
            base = parse_pbtxt((model_repository / "echo" / "config.pbtxt").read_text())
            by_hand.load_model(
                "echo",
                config=json.dumps(
                    with_versions(
                        base | {"instance_group": [{"kind": "KIND_CPU", "count": 2}]}, "echo", [1]
                    )
                ),
            )
            time.sleep(1.6)
            corrected = [c for p in (one_pass(), one_pass()) for c in p.plan.changes]
            assert [(c.server, c.model) for c in corrected] == [("edge-a", "echo")]
            config = by_hand.get_model_config("echo", as_json=True)["config"]
            assert [int(g["count"]) for g in config["instance_group"]] == [1]
    finally:
        memory.close()


def test_a_server_that_did_not_answer_gets_a_new_client(tmp_path: Path) -> None:
    """A kept channel may still be backing off from an outage when the server is back: the
    pass after one that found the server unreachable connects afresh."""
    settings = Settings(tmp_path / "cache", tmp_path / "state.db")
    servers = {"edge-a": TritonServer("edge-a", f"127.0.0.1:{free_port()}")}
    memory = PassMemory()

    def connect(server: TritonServer) -> TritonClient:
        return new_client(server, settings)

    try:
        first = memory.clients(servers, connect)["edge-a"]
        assert memory.clients(servers, connect)["edge-a"] is first  # kept while it answers
        memory.drop_unreachable({"edge-a": first.observe(["echo"])})  # nothing listens there
        assert memory.clients(servers, connect)["edge-a"] is not first
    finally:
        memory.close()
