"""The Triton adapter against a real tritonserver: observation, control, error mapping."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tritonclient.grpc import service_pb2

from reconciler.adapters.triton import TritonServerClient
from reconciler.core.triton_config import parse_pbtxt, with_versions
from reconciler.model.errors import LoadFailed, ServerUnavailable, VerifyFailed
from reconciler.model.serving import DeviceMemory, version_cost
from reconciler.model.spec import Tensor
from testkit.local_triton import LocalTriton, free_port


@pytest.fixture
def client(triton: LocalTriton, model_repository: Path) -> Iterator[TritonServerClient]:
    with TritonServerClient(
        "edge-a", triton.grpc_address, model_repository=str(model_repository)
    ) as client:
        yield client


def config_reads(client: TritonServerClient) -> list[str]:
    """The models whose config ``client`` asks its server for, from now on, in order."""
    reads: list[str] = []
    loaded_configs = client._loaded_configs

    def counting(models: Iterable[str]) -> dict[str, dict[str, Any] | None]:
        models = list(models)
        reads.extend(models)
        return loaded_configs(models)

    client._loaded_configs = counting  # type: ignore[method-assign]
    return reads


def _config(model_repository: Path, versions: list[int]) -> dict[str, object]:
    base = parse_pbtxt((model_repository / "echo" / "config.pbtxt").read_text())
    return with_versions(base, "echo", versions)


def test_observe_before_and_after_loads(client: TritonServerClient, model_repository: Path) -> None:
    before = client.observe(["echo"])
    assert before.reachable
    assert {"echo", "other"} <= before.in_repository
    echo = before.model("echo")
    assert echo.ready == frozenset()
    assert echo.loaded_config is None
    assert echo.repository_versions == frozenset({1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13})
    assert echo.repository_config is not None and echo.repository_config["backend"] == "python"

    client.load("echo", _config(model_repository, [1, 2]))
    after = client.observe(["echo"]).model("echo")
    assert after.ready == frozenset({1, 2})
    assert after.loaded_config is not None
    assert after.loaded_config["input"][0]["dims"] == ["-1", "4"]

    client.load("echo", _config(model_repository, [2]))
    assert client.model_state("echo").ready == frozenset({2})
    client.unload("echo")
    assert client.model_state("echo").ready == frozenset()


def test_failed_load_raises_with_tritons_message_and_keeps_old(
    client: TritonServerClient, model_repository: Path
) -> None:
    client.load("echo", _config(model_repository, [1]))
    with pytest.raises(LoadFailed, match="version 9 is broken on purpose"):
        client.load("echo", _config(model_repository, [1, 9]))
    state = client.model_state("echo")
    assert state.ready == frozenset({1})
    assert "broken on purpose" in state.reason(9)


def test_infer_by_version(client: TritonServerClient, model_repository: Path) -> None:
    client.load("echo", _config(model_repository, [2, 3]))
    tensor = Tensor("INPUT0", "FP32", (1, 4), (1.0, 2.0, 3.0, 4.0))
    for version in (2, 3):
        answer = client.infer("echo", version, (tensor,), ("OUTPUT0",))
        assert answer["OUTPUT0"].tolist() == [[version * x for x in (1, 2, 3, 4)]]
    with pytest.raises(VerifyFailed, match="version 1"):
        client.infer("echo", 1, (tensor,), ("OUTPUT0",))


def test_unreachable_server_is_data_for_observe_and_an_error_for_control() -> None:
    address = f"127.0.0.1:{free_port()}"
    with TritonServerClient("edge-z", address, call_timeout=2, load_timeout=2) as client:
        observed = client.observe(["echo"])
        assert not observed.reachable
        # The state names the server; its error says why, without the name again (a plan
        # problem shows "server edge-z: <error>").
        assert observed.server == "edge-z"
        assert observed.error == f"{address} did not answer (reading the repository index)"
        with pytest.raises(ServerUnavailable, match="edge-z"):
            client.load("echo", {"backend": "python"})
        with pytest.raises(ServerUnavailable, match="edge-z"):
            client.model_state("echo")


def test_a_kept_client_reads_configs_again_only_when_they_may_have_changed(
    triton: LocalTriton, model_repository: Path
) -> None:
    now = [0.0]
    ours = TritonServerClient(
        "edge-a", triton.grpc_address, config_recheck=60.0, clock=lambda: now[0]
    )
    by_hand = TritonServerClient("someone", triton.grpc_address)
    reads = config_reads(ours)
    try:
        ours.load("echo", _config(model_repository, [1]))
        first = ours.observe(["echo"])
        assert reads == ["echo"]
        again = ours.observe(["echo"])
        assert reads == ["echo"] and again.token == first.token  # index unchanged: no read

        # A reload by hand with another config leaves the index as it was: seen once the
        # recheck is due (at most 1.5 intervals), not before.
        changed = _config(model_repository, [1]) | {"max_batch_size": 4}
        by_hand.load("echo", changed)
        assert ours.observe(["echo"]).token == first.token
        now[0] = 91.0
        rechecked = ours.observe(["echo"])
        assert reads == ["echo", "echo"]
        assert rechecked.token != first.token
        assert rechecked.model("echo").loaded_config["max_batch_size"] == 4  # type: ignore[index]

        # An unload by hand changes the index: a new token at once.
        by_hand.unload("echo")
        deadline = time.monotonic() + 30
        while ours.observe(["echo"]).token == rechecked.token:
            assert time.monotonic() < deadline, "the unload never showed in the token"
            time.sleep(0.05)
        assert reads == ["echo", "echo"]

        # Our own load forgets what we read: the next observation reads the config.
        ours.load("echo", _config(model_repository, [1]))
        ours.observe(["echo"])
        assert reads == ["echo", "echo", "echo"]
        # Another client never shares a token, even for the same state.
        assert by_hand.observe(["echo"]).token != ours.observe(["echo"]).token
    finally:
        ours.close()
        by_hand.close()


def test_memory_usage_is_each_versions_statistics_and_nothing_for_the_python_backend(
    client: TritonServerClient, model_repository: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client.load("echo", _config(model_repository, [1, 2]))
    # Triton 2.51's Python backend reports no memory_usage: every version holds nothing known.
    assert client.memory_usage("echo") == {1: (), 2: ()}
    assert client.memory_usage("not-loaded") == {}
    # What a backend that measures its load (ONNX Runtime, TensorRT) reports, in Triton's own
    # statistics message (extension_statistics.md: type CPU, CPU_PINNED or GPU, id, bytes).
    answer = service_pb2.ModelStatisticsResponse(
        model_stats=[
            service_pb2.ModelStatistics(
                name="resnet", version="3",
                memory_usage=[
                    service_pb2.MemoryUsage(type="GPU", id=0, byte_size=2_147_483_648),
                    service_pb2.MemoryUsage(type="GPU", id=1, byte_size=2_147_483_648),
                    service_pb2.MemoryUsage(type="CPU", id=0, byte_size=104_857_600),
                ],
            )
        ]
    )  # fmt: skip
    monkeypatch.setattr(client._client, "get_inference_statistics", lambda *a, **k: answer)
    usage = client.memory_usage("resnet")
    assert usage == {
        3: (
            DeviceMemory("GPU", 0, 2_147_483_648),
            DeviceMemory("GPU", 1, 2_147_483_648),
            DeviceMemory("CPU", 0, 104_857_600),
        )
    }
    # One version needs 2 GiB on each GPU it runs on: the most on any one device.
    assert version_cost(usage[3]) == 2_147_483_648
    assert version_cost((DeviceMemory("CPU", 0, 100), DeviceMemory("CPU_PINNED", 0, 28))) == 128
    assert version_cost(()) is None


def test_a_kept_connection_tells_each_restart_once_before_the_new_server_answers(
    triton: LocalTriton,
) -> None:
    # What the service's watch keeps (wiring.watch_connection): a restart ends the old
    # process and with it the connection, which says so before the new process answers.
    drops: list[float] = []
    with TritonServerClient("edge-a", triton.grpc_address, keep_connection=True) as kept:
        kept.when_dropped(lambda: drops.append(time.monotonic()))
        assert not kept.connected() and drops == [], "connected, or dropped, before any call"
        kept.version_states()
        assert kept.connected(), "not connected after a call"
        for restart in (1, 2):
            # Up for a while, as between the watch's readings: gRPC's own event tells.
            time.sleep(0.5)
            killed = time.monotonic()
            triton.kill()
            triton.start()
            answered = time.monotonic()
            deadline = answered + 10
            while len(drops) < restart and time.monotonic() < deadline:
                time.sleep(0.01)
            assert len(drops) == restart, f"restart {restart}: drops told {drops}"
            assert drops[-1] < answered, (
                f"restart {restart}: the drop was told {drops[-1] - killed:.3f} s after the "
                f"kill, after the new server answered ({answered - killed:.3f} s)"
            )
            print(
                f"restart {restart}: drop told {drops[-1] - killed:.3f} s after the kill, "
                f"the new server ready {answered - killed:.3f} s after it"
            )
            # Nothing connects the channel again before the next call on it.
            assert not kept.connected() and len(drops) == restart, drops
            assert kept.version_states() == {} and kept.connected()  # the new, empty one
        # Killed a moment after the connection was made: gRPC's event may miss it, and
        # asking tells it then; once either way.
        triton.kill()
        triton.start()
        assert not kept.connected(), "up again before any call"
        time.sleep(0.3)  # gRPC's event, if it saw it, has come by now
        assert len(drops) == 3, f"the third restart told {len(drops) - 2} times: {drops}"
        assert not kept.connected() and len(drops) == 3, f"told again when asked: {drops}"
    assert len(drops) == 3, f"closing the client was told as a drop: {drops}"
