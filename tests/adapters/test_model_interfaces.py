"""Model interfaces, ensembles and sequence models on a real tritonserver.

Besides the adapter's ``interface`` and the pure ``interface_difference``, these tests pin the
Triton behaviours the planner relies on for ensembles (``chain`` over ``echo`` and ``other``)
and sequence models (``counter``), as observed on Triton 2.51 in explicit mode.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from tritonclient.utils import InferenceServerException

from reconciler.adapters.triton import TritonServerClient
from reconciler.core.interface import config_interface
from reconciler.core.triton_config import parse_pbtxt, with_versions
from reconciler.model.errors import ServerUnavailable, VerifyFailed
from reconciler.model.serving import (
    ModelInterface,
    TensorSignature,
    interface_difference,
    ready_in,
)
from reconciler.model.spec import Tensor
from testkit.local_triton import LocalTriton, free_port
from testkit.manifests import ENSEMBLE, SEQUENCE_MODEL

ONES = Tensor("INPUT0", "FP32", (1, 4), (1.0, 1.0, 1.0, 1.0))
ECHO_INTERFACE = ModelInterface(
    inputs=(TensorSignature("INPUT0", "FP32", (-1, 4)),),
    outputs=(TensorSignature("OUTPUT0", "FP32", (-1, 4)),),
)


@pytest.fixture
def client(triton: LocalTriton, model_repository: Path) -> Iterator[TritonServerClient]:
    with TritonServerClient(
        "edge-a", triton.grpc_address, model_repository=str(model_repository)
    ) as client:
        yield client


@pytest.fixture
def raw(triton: LocalTriton) -> Iterator[triton_grpc.InferenceServerClient]:
    """tritonclient itself, for what the adapter does not do (sequences, plain loads)."""
    client = triton_grpc.InferenceServerClient(triton.grpc_address)
    try:
        yield client
    finally:
        client.close()


def _config(model_repository: Path, model: str, versions: list[int]) -> dict[str, Any]:
    base = parse_pbtxt((model_repository / model / "config.pbtxt").read_text())
    return with_versions(base, model, versions)


def _states(client: TritonServerClient, model: str) -> dict[int, str]:
    return {v.version: v.state for v in client.model_state(model).versions}


def _wait_state(client: TritonServerClient, model: str, version: int, state: str) -> None:
    deadline = time.monotonic() + 10
    while _states(client, model).get(version) != state:
        assert time.monotonic() < deadline, f"{model} {version}: {_states(client, model)}"
        time.sleep(0.05)


def _answer(client: TritonServerClient, model: str, version: int) -> list[list[float]]:
    result: list[list[float]] = client.infer(model, version, (ONES,), ("OUTPUT0",))[
        "OUTPUT0"
    ].tolist()
    return result


def _ones() -> triton_grpc.InferInput:
    tensor = triton_grpc.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
    return tensor


# -- interfaces ----------------------------------------------------------------------------


def test_interface_of_loaded_echo_versions(
    client: TritonServerClient, model_repository: Path
) -> None:
    client.load("echo", _config(model_repository, "echo", [1, 2]))
    first, second = client.interface("echo", 1), client.interface("echo", 2)
    assert first == second == ECHO_INTERFACE
    assert interface_difference(first, second) == []
    with pytest.raises(VerifyFailed, match="echo version 3"):
        client.interface("echo", 3)
    with pytest.raises(VerifyFailed, match="absent version 1"):
        client.interface("absent", 1)


def test_interface_of_an_unreachable_server_is_server_unavailable() -> None:
    address = f"127.0.0.1:{free_port()}"
    with (
        TritonServerClient("edge-z", address, call_timeout=2) as client,
        pytest.raises(ServerUnavailable, match="edge-z"),
    ):
        client.interface("echo", 1)


def test_renamed_output_is_named_by_the_difference(
    client: TritonServerClient, model_repository: Path
) -> None:
    client.load("echo", _config(model_repository, "echo", [1]))
    old = client.interface("echo", 1)

    renamed = _config(model_repository, "echo", [1, 2])
    renamed["output"][0]["name"] = "OUTPUT1"
    client.load("echo", renamed)
    new = client.interface("echo", 2)

    assert interface_difference(old, new) == ["output OUTPUT0 removed", "output OUTPUT1 added"]
    # The model emits the name its config declares: the new interface is what it serves.
    answer = client.infer("echo", 2, (ONES,), ("OUTPUT1",))
    assert answer["OUTPUT1"].tolist() == [[2.0] * 4]
    # A config change reloads every version with the new config: the old version's
    # interface changed too, so the gate must read it before the load.
    assert client.interface("echo", 1) == new


def test_interface_of_a_sequence_model_leaves_out_its_control_inputs(
    client: TritonServerClient, model_repository: Path
) -> None:
    client.load(SEQUENCE_MODEL, _config(model_repository, SEQUENCE_MODEL, [1]))
    assert client.interface(SEQUENCE_MODEL, 1) == ModelInterface(
        inputs=(TensorSignature("INPUT0", "FP32", (-1, 1)),),  # the batch dimension included
        outputs=(TensorSignature("OUTPUT0", "FP32", (-1, 1)),),
    )


def test_a_sequence_model_is_asked_a_whole_sequence_of_its_own(
    client: TritonServerClient, model_repository: Path
) -> None:
    """Issue 44, point 3: a lone call names no sequence and Triton refuses it; ``sequence``
    sends START, a request within and END under a fresh correlation ID, each answered
    before the next: the counter's running sums say each reached the same sequence, and a
    second exchange starts afresh (its own ID: a reused one would have summed on)."""
    client.load(SEQUENCE_MODEL, _config(model_repository, SEQUENCE_MODEL, [1, 2]))
    two = Tensor("INPUT0", "FP32", (1, 1), (2.0,))
    with pytest.raises(VerifyFailed, match="correlation ID"):
        client.infer(SEQUENCE_MODEL, 2, (two,), ("OUTPUT0",))
    for version in (2, 2, 1):
        reply = client.sequence(SEQUENCE_MODEL, version, (two,), ("OUTPUT0",), 3, timeout=5.0)
        sums = [float(answer["OUTPUT0"].reshape(-1)[0]) for answer in reply.responses]
        assert sums == [2.0 * version, 4.0 * version, 6.0 * version], (version, sums)
        assert len(reply.seconds) == 3 and 0 < reply.seconds[0] <= reply.seconds[-1]
        assert not reply.streamed


@pytest.mark.parametrize(
    ("model", "changes"),
    [
        ("echo", {}),
        ("echo", {"max_batch_size": 8}),  # a batch dimension before the declared dims
        ("echo", {"output": [{"name": "SCORES", "data_type": "TYPE_FP32", "dims": [-1, 4]}]}),
        (SEQUENCE_MODEL, {}),  # its control inputs are not the config's inputs either
    ],
)
def test_the_planner_reads_a_config_as_triton_metadata_does(
    client: TritonServerClient,
    raw: triton_grpc.InferenceServerClient,
    model_repository: Path,
    model: str,
    changes: dict[str, Any],
) -> None:
    """The interface gate compares configs before they are loaded (``config_interface``):
    what it reads from the config it sends must be what the model metadata shows once
    loaded, the config sent and the config Triton reports alike."""
    sent = {**_config(model_repository, model, [1]), **changes}
    client.load(model, sent)
    reported = raw.get_model_config(model, as_json=True)["config"]
    served = client.interface(model, 1)
    assert config_interface(sent) == config_interface(reported) == served


def _signature(name: str, datatype: str = "FP32", shape: tuple[int, ...] = (-1, 4)) -> Any:
    return TensorSignature(name, datatype, shape)


@pytest.mark.parametrize(
    ("old", "new", "lines"),
    [
        (ECHO_INTERFACE, ECHO_INTERFACE, []),
        (
            ECHO_INTERFACE,
            ModelInterface((_signature("INPUT0", "FP16"),), ECHO_INTERFACE.outputs),
            ["input INPUT0 datatype FP32 -> FP16"],
        ),
        (
            ECHO_INTERFACE,
            ModelInterface((_signature("INPUT0", shape=(-1, 8)),), ECHO_INTERFACE.outputs),
            ["input INPUT0 shape [-1, 4] -> [-1, 8]"],
        ),
        (
            ECHO_INTERFACE,
            ModelInterface(
                (_signature("INPUT0", "INT8", (4,)),),
                (_signature("OUTPUT1"), _signature("OUTPUT0")),
            ),
            [
                "input INPUT0 datatype FP32 -> INT8",
                "input INPUT0 shape [-1, 4] -> [4]",
                "output OUTPUT1 added",
            ],
        ),
        (
            ModelInterface((_signature("B"), _signature("A")), ()),
            ModelInterface((), (_signature("A"),)),
            ["input A removed", "input B removed", "output A added"],
        ),
    ],
)
def test_interface_difference(old: ModelInterface, new: ModelInterface, lines: list[str]) -> None:
    assert interface_difference(old, new) == lines
    assert (interface_difference(new, old) == []) == (lines == [])


def test_interfaces_compare_whatever_order_the_tensors_came_in() -> None:
    a, b = _signature("A"), _signature("B")
    assert ModelInterface((a, b), (b, a)) == ModelInterface((b, a), (a, b))
    assert ModelInterface((b, a)).inputs == (a, b)


# -- ensembles -----------------------------------------------------------------------------


def test_chain_answers_input_times_both_versions(
    client: TritonServerClient, raw: triton_grpc.InferenceServerClient, model_repository: Path
) -> None:
    client.load("echo", _config(model_repository, "echo", [2]))
    client.load("other", _config(model_repository, "other", [3]))
    raw.load_model(ENSEMBLE)
    # Loading the ensemble keeps the composing models as they were loaded (overrides and all).
    assert _states(client, "echo") == {2: "READY"}
    assert _states(client, "other") == {3: "READY"}
    assert _answer(client, ENSEMBLE, 1) == [[6.0] * 4]
    assert client.interface(ENSEMBLE, 1) == ECHO_INTERFACE

    # model_version -1 in the steps: the ensemble follows the latest ready version at once.
    client.load("other", _config(model_repository, "other", [3, 7]))
    assert _answer(client, ENSEMBLE, 1) == [[14.0] * 4]
    client.load("other", _config(model_repository, "other", [3]))
    assert _answer(client, ENSEMBLE, 1) == [[6.0] * 4]


def test_unloading_a_composing_model_takes_the_ensemble_out_until_it_is_back(
    client: TritonServerClient, raw: triton_grpc.InferenceServerClient, model_repository: Path
) -> None:
    client.load("echo", _config(model_repository, "echo", [2]))
    client.load("other", _config(model_repository, "other", [3]))
    raw.load_model(ENSEMBLE)

    client.unload("echo")
    # At once, before echo itself has finished unloading.
    assert _states(client, ENSEMBLE)[1] in ("UNLOADING", "UNAVAILABLE")
    _wait_state(client, ENSEMBLE, 1, "UNAVAILABLE")
    with pytest.raises(InferenceServerException, match="version 1 is not at ready state") as no:
        raw.infer(ENSEMBLE, [_ones()], model_version="1")
    # Triton refuses with the code an unreachable server gives: only the message tells.
    assert no.value.status() == "StatusCode.UNAVAILABLE"
    with pytest.raises(VerifyFailed, match="'chain' version 1 is not at ready state"):
        client.interface(ENSEMBLE, 1)
    _wait_state(client, "echo", 2, "UNAVAILABLE")

    # Loading the composing model again brings the ensemble back, with no load of its own.
    client.load("echo", _config(model_repository, "echo", [2]))
    _wait_state(client, ENSEMBLE, 1, "READY")
    assert _answer(client, ENSEMBLE, 1) == [[6.0] * 4]

    # Unloading the ensemble leaves its composing models serving (unload_dependents unset),
    # and an ensemble unloaded on purpose stays out when a composing model reloads.
    client.unload(ENSEMBLE)
    _wait_state(client, ENSEMBLE, 1, "UNAVAILABLE")
    assert _answer(client, "echo", 2) == [[2.0] * 4]
    assert _answer(client, "other", 3) == [[3.0] * 4]
    client.unload("echo")
    _wait_state(client, "echo", 2, "UNAVAILABLE")
    client.load("echo", _config(model_repository, "echo", [2]))
    time.sleep(0.5)
    assert _states(client, ENSEMBLE) == {1: "UNAVAILABLE"}


def test_a_composing_model_change_that_breaks_the_ensemble_unloads_it_silently(
    client: TritonServerClient, raw: triton_grpc.InferenceServerClient, model_repository: Path
) -> None:
    client.load("echo", _config(model_repository, "echo", [2]))
    client.load("other", _config(model_repository, "other", [3]))
    raw.load_model(ENSEMBLE)

    renamed = _config(model_repository, "echo", [2])
    renamed["output"][0]["name"] = "OUTPUT1"  # the ensemble maps echo's OUTPUT0
    client.load("echo", renamed)  # succeeds: nothing tells the caller
    _wait_state(client, ENSEMBLE, 1, "UNAVAILABLE")
    # The index says only "unloaded"; the reason is in the server's log alone.
    assert client.model_state(ENSEMBLE).reason(1) == "UNAVAILABLE: unloaded"

    client.load("echo", _config(model_repository, "echo", [2]))
    _wait_state(client, ENSEMBLE, 1, "READY")
    assert _answer(client, ENSEMBLE, 1) == [[6.0] * 4]


def test_a_failed_composing_load_leaves_the_ensemble_serving(
    client: TritonServerClient, raw: triton_grpc.InferenceServerClient, model_repository: Path
) -> None:
    client.load("echo", _config(model_repository, "echo", [2]))
    client.load("other", _config(model_repository, "other", [3]))
    raw.load_model(ENSEMBLE)
    with pytest.raises(Exception, match="broken on purpose"):
        client.load("echo", _config(model_repository, "echo", [2, 9]))
    assert _states(client, ENSEMBLE) == {1: "READY"}
    assert _answer(client, ENSEMBLE, 1) == [[6.0] * 4]


def test_loading_the_ensemble_alone_loads_composing_models_from_the_repository(
    client: TritonServerClient, raw: triton_grpc.InferenceServerClient
) -> None:
    # Their config.pbtxt has no version policy: Triton picks the latest folder, 9, which fails.
    with pytest.raises(InferenceServerException, match="version 9 is broken on purpose"):
        raw.load_model(ENSEMBLE)
    assert ENSEMBLE not in ready_in(client.version_states())
    assert "broken on purpose" in client.model_state("other").reason(9)


# -- sequence models -----------------------------------------------------------------------


def _send(
    raw: triton_grpc.InferenceServerClient,
    value: float,
    sequence: int,
    *,
    start: bool = False,
    end: bool = False,
    version: int | None = None,
) -> float:
    tensor = triton_grpc.InferInput("INPUT0", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.array([[value]], dtype=np.float32))
    result = raw.infer(
        SEQUENCE_MODEL,
        [tensor],
        model_version="" if version is None else str(version),
        sequence_id=sequence,
        sequence_start=start,
        sequence_end=end,
        client_timeout=10,
    )
    output = result.as_numpy("OUTPUT0")
    assert output is not None
    return float(output.reshape(-1)[0])


def test_counter_keeps_state_per_sequence(
    client: TritonServerClient, raw: triton_grpc.InferenceServerClient, model_repository: Path
) -> None:
    client.load(SEQUENCE_MODEL, _config(model_repository, SEQUENCE_MODEL, [2]))
    # Two sequences interleaved: each keeps its own running sum (x2, the version).
    assert _send(raw, 1, 101, start=True) == 2
    assert _send(raw, 10, 102, start=True) == 20
    assert _send(raw, 2, 101) == 6
    assert _send(raw, 20, 102) == 60
    assert _send(raw, 3, 101, end=True) == 12
    # A new sequence under a used ID starts from zero again.
    assert _send(raw, 5, 101, start=True, end=True) == 10
    assert _send(raw, 30, 102, end=True) == 120
    # A request of an ended (or unknown) sequence without START is refused by Triton.
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        _send(raw, 1, 101)


def test_a_new_version_breaks_unversioned_sequences_but_not_pinned_ones(
    client: TritonServerClient, raw: triton_grpc.InferenceServerClient, model_repository: Path
) -> None:
    client.load(SEQUENCE_MODEL, _config(model_repository, SEQUENCE_MODEL, [1]))
    assert _send(raw, 1, 201, start=True) == 1  # unversioned: lands on version 1
    assert _send(raw, 1, 202, start=True, version=1) == 1  # pinned to version 1

    client.load(SEQUENCE_MODEL, _config(model_repository, SEQUENCE_MODEL, [1, 2]))
    # The unversioned sequence's next request goes to version 2, which never saw its start:
    # Triton refuses it (the client sees the broken sequence as an error, not a wrong sum).
    with pytest.raises(InferenceServerException, match=r"sequence 201 .* START flag"):
        _send(raw, 1, 201)
    # Version 1 was kept in place by the policy-only change: the pinned sequence goes on.
    assert _send(raw, 1, 202, version=1) == 2

    # Dropping version 1 does not wait for its open sequence: the next request is refused.
    client.load(SEQUENCE_MODEL, _config(model_repository, SEQUENCE_MODEL, [2]))
    with pytest.raises(InferenceServerException, match="version 1 is not"):
        _send(raw, 1, 202, version=1)
    _wait_state(client, SEQUENCE_MODEL, 1, "UNAVAILABLE")
    assert _send(raw, 4, 203, start=True, end=True) == 8


def test_a_config_reload_gives_a_fresh_sequence_batcher(
    client: TritonServerClient, raw: triton_grpc.InferenceServerClient, model_repository: Path
) -> None:
    client.load(SEQUENCE_MODEL, _config(model_repository, SEQUENCE_MODEL, [1]))
    assert _send(raw, 1, 301, start=True, version=1) == 1
    changed = _config(model_repository, SEQUENCE_MODEL, [1])
    changed["sequence_batching"]["max_sequence_idle_microseconds"] = "6000000"
    client.load(SEQUENCE_MODEL, changed)  # not a policy-only change: version 1 reloads
    with pytest.raises(InferenceServerException, match="START flag"):
        _send(raw, 1, 301, version=1)


def test_counter_config_is_what_the_fixture_writes(model_repository: Path) -> None:
    config = _config(model_repository, SEQUENCE_MODEL, [1])
    batching = config["sequence_batching"]
    assert batching["max_sequence_idle_microseconds"] == "5000000"
    # Triton's JSON form drops enum fields at their default: CONTROL_SEQUENCE_START is 0.
    kinds = {c["name"]: c["control"][0].get("kind") for c in batching["control_input"]}
    assert kinds == {"START": None, "CORRID": "CONTROL_SEQUENCE_CORRID"}
    assert sorted(p.name for p in (model_repository / SEQUENCE_MODEL).iterdir()) == [
        "1",
        "2",
        "config.pbtxt",
    ]
    assert list((model_repository / ENSEMBLE / "1").iterdir()) == []
