"""A smoke case that expects a stream on a model that does not stream, refused before anything
is loaded, naming the manifest's file and the case's line (issue 42, bad input): by
``validate`` where spec.config says so, by the plan from the config it knows (the live one,
else config.pbtxt under spec.config). The reverse, a streaming model's case without
``stream``, is accepted: its ``expect`` judges the stream reassembled.
"""

from __future__ import annotations

from typing import Any

import pytest

from reconciler.core.plan.planner import plan
from reconciler.core.spec.desired import read_manifests
from reconciler.model.history import History
from reconciler.model.plan import Plan
from reconciler.model.spec import ModelDeployment
from tests.core.fakes import FakeTriton, base_config, desired_state, observe

SERVER = (
    b"apiVersion: triton-gitops.dev/v1alpha1\nkind: TritonServer\nmetadata: {name: s1}\n"
    b"spec: {grpc: 's1:8001', modelRepository: /models/s1}\n"
)
DECOUPLED = {"model_transaction_policy": {"decoupled": True}}


def manifest(version: int, *, stream: bool = True, config: str = "") -> str:
    return (
        "apiVersion: triton-gitops.dev/v1alpha1\n"
        "kind: ModelDeployment\n"
        "metadata: {name: m}\n"
        "spec:\n"
        "  servers: {names: [s1]}\n"
        f"  versions: [{version}]\n" + (f"  config: {config}\n" if config else "") + "  verify:\n"
        "    smoke:\n"
        "      - name: plain\n"  # line 9 (10 with a config)
        "        inputs: {INPUT0: {datatype: FP32, shape: [1], data: [1]}}\n"
        "      - name: counts\n"  # line 11 (12 with a config)
        "        inputs: {INPUT0: {datatype: FP32, shape: [1], data: [1]}}\n"
        + ("        stream: {responses: 3}\n" if stream else "")
    )


def read(text: str) -> tuple[list[str], ModelDeployment | None]:
    """validate's problems as FILE:LINE: message, and the deployment it built."""
    reading = read_manifests({"models/m.yaml": text.encode(), "servers/s1.yaml": SERVER})
    found = [f"{p.file}:{p.line}: {p.message}" for p in reading.problems]
    return found, reading.desired.deployments.get("m")


def plan_of(deployment: ModelDeployment, fake: FakeTriton) -> Plan:
    return plan(
        desired_state(deployment),
        {"s1": observe(fake)},
        History(managed={"s1": frozenset({"m"})}),
        "r",
    )


def server(loaded: dict[str, Any] | None, repository: dict[str, Any]) -> FakeTriton:
    """Model m, versions 1 to 3 in the repository (``repository``: its config.pbtxt);
    version 1 serving with ``loaded`` (None: nothing loaded)."""
    fake = FakeTriton("s1", {"m": range(1, 4)}, configs={"m": repository})
    if loaded is not None:
        fake.serve("m", [1], loaded)
    return fake


@pytest.mark.parametrize(
    ("loaded", "repository", "source"),
    [
        (base_config("m"), base_config("m"), "its live config"),
        (None, base_config("m"), "config.pbtxt in the model repository"),
        # The repository says it streams, the live config (the truth) does not.
        (base_config("m"), {**base_config("m"), **DECOUPLED}, "its live config"),
    ],
)
def test_a_stream_expected_of_a_model_that_does_not_stream_is_refused_by_the_plan(
    loaded: dict[str, Any] | None, repository: dict[str, Any], source: str
) -> None:
    problems, deployment = read(manifest(2))
    assert problems == [] and deployment is not None, f"validate cannot know: {problems}"
    fake = server(loaded, repository)
    calls = len(fake.calls)

    p = plan_of(deployment, fake)

    assert not p.changes, f"a change was planned for a refused case: {p.changes}"
    assert len(p.problems) == 1, f"expected one problem, got {p.problems}"
    message = str(p.problems[0])
    assert message.startswith("server s1, model m: models/m.yaml:11: smoke case 'counts'"), (
        f"the refusal must name the server, model, file and the case's line: {message}"
    )
    assert f"m does not stream: {source} has no model_transaction_policy" in message, (
        f"the refusal must say which config decided: {message}"
    )
    assert "'plain'" not in message, f"a case without stream: is not refused: {message}"
    assert fake.calls[calls:] == [], f"the plan sent something: {fake.calls[calls:]}"


def test_a_streaming_model_takes_cases_with_and_without_stream() -> None:
    """The reverse is accepted: a case without ``stream`` judges the stream reassembled."""
    _, deployment = read(manifest(2))
    assert deployment is not None
    for loaded, repository in [
        ({**base_config("m"), **DECOUPLED}, base_config("m")),  # the live config streams
        (None, {**base_config("m"), **DECOUPLED}),  # config.pbtxt: not loaded yet
    ]:
        p = plan_of(deployment, server(loaded, repository))
        assert p.problems == () and len(p.changes) == 1, (
            f"a streaming model's cases were refused ({loaded is not None=}): {p.problems}"
        )
    # spec.config declares it streams, over a config.pbtxt that does not say.
    problems, declared = read(manifest(2, config="{model_transaction_policy: {decoupled: true}}"))
    assert problems == [] and declared is not None, problems
    p = plan_of(declared, server(None, base_config("m")))
    assert p.problems == (), f"spec.config's policy was not taken: {p.problems}"


def test_validate_refuses_a_stream_where_spec_config_says_the_model_does_not_stream() -> None:
    problems, _ = read(manifest(2, config="{model_transaction_policy: {decoupled: false}}"))

    assert len(problems) == 1, f"expected one problem, got {problems}"
    assert problems[0].startswith("models/m.yaml:14: ModelDeployment 'm': smoke case 'counts'"), (
        f"the problem must name the file and the stream: line of the case: {problems[0]}"
    )
    assert "spec.config declares a model that does not stream" in problems[0], problems[0]
    without, _ = read(manifest(2, stream=False, config="{model_transaction_policy: {}}"))
    assert without == [], f"cases without stream: on a unary model are fine: {without}"


def analysed(probes: bool) -> str:
    return (
        "apiVersion: triton-gitops.dev/v1alpha1\n"
        "kind: ModelDeployment\n"
        "metadata: {name: m}\n"
        "spec:\n"
        "  servers: {names: [s1]}\n"
        "  versions: [2]\n"
        "  verify:\n"
        "    analysis:\n"  # line 8
        f"      probes: {{enabled: {'true' if probes else 'false'}}}\n"  # line 9
        "      checks:\n"
        "        - {name: ok, successRate: {min: 0.99}}\n"  # line 11
        "        - {name: first, latency: {maxIncrease: 1.0}}\n"  # line 12
    )


def test_a_streaming_models_latency_check_with_the_probes_off_is_refused_by_the_plan() -> None:
    """Only the probes' streams time a stream: a latency check with them off could never
    be judged. Refused before anything is loaded, naming the check's line and the probes'."""
    _, deployment = read(analysed(probes=False))
    assert deployment is not None
    streaming = server({**base_config("m"), **DECOUPLED}, base_config("m"))
    calls = len(streaming.calls)

    p = plan_of(deployment, streaming)

    assert not p.changes and len(p.problems) == 1, (p.changes, p.problems)
    message = str(p.problems[0])
    assert message.startswith("server s1, model m: models/m.yaml:12: check 'first'"), message
    assert "models/m.yaml:9 turns the probes off" in message, message
    assert streaming.calls[calls:] == [], streaming.calls[calls:]
    # The probes on, or a model that does not stream: planned.
    _, probed = read(analysed(probes=True))
    assert probed is not None
    assert plan_of(probed, server({**base_config("m"), **DECOUPLED}, base_config("m"))).changes
    assert plan_of(deployment, server(base_config("m"), base_config("m"))).changes


def test_an_analysis_with_its_probes_off_leaves_verify_its_synthesized_stream() -> None:
    """A stream that ends with an error is a success to Triton's counters: with the probes
    off, nothing else asks the new version a question before clients do."""
    for probes, asked in ((False, 1), (True, None)):
        text = analysed(probes).replace(
            "        - {name: first, latency: {maxIncrease: 1.0}}\n", ""
        )
        _, deployment = read(text)
        assert deployment is not None
        p = plan_of(deployment, server({**base_config("m"), **DECOUPLED}, base_config("m")))
        (change,) = p.changes
        (verify,) = [s for s in change.steps if s.action.value == "verify"]
        assert verify.probe_against == asked, (probes, verify.reason)
    # A unary model's error responses show in the router's statistics: no request added.
    _, unprobed = read(
        analysed(False).replace("        - {name: first, latency: {maxIncrease: 1.0}}\n", "")
    )
    assert unprobed is not None
    p = plan_of(unprobed, server(base_config("m"), base_config("m")))
    (verify,) = [s for s in p.changes[0].steps if s.action.value == "verify"]
    assert verify.probe_against is None, verify.reason


def test_a_first_response_bound_is_read_and_one_past_the_deadline_is_refused_at_its_line() -> None:
    """``stream.firstResponse``: the case's bound on the time to the first response (the
    check of a slow first response when the probes are off), read as a duration; one longer
    than the stream's deadline could never fail, and is refused naming its line."""
    text = manifest(2).replace(
        "stream: {responses: 3}", "stream: {responses: 3, firstResponse: 150ms}"
    )
    problems, deployment = read(text)
    assert problems == [], problems
    assert deployment is not None
    assert deployment.smoke[1].stream is not None
    assert deployment.smoke[1].stream.first_response == pytest.approx(0.15)
    past = manifest(2).replace(
        "stream: {responses: 3}", "stream: {deadline: 2s, firstResponse: 3s}"
    )
    problems, _ = read(past)
    assert problems == [
        "models/m.yaml:13: 3s is past the stream's deadline (2s): the first response "
        "could never be late"
    ], problems
