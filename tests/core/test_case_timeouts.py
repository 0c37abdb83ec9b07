"""A smoke case's own ``timeout``: how long a request/response model's answer may take, in
verify and in the probes, instead of the reconciler's call timeout (which, since a call out
of time on a server that answers fails the version, a slow model needs to say)."""

from __future__ import annotations

from reconciler.core.probes import MAX_RESPONSES, limits
from reconciler.core.spec.desired import read_manifests
from reconciler.model.spec import ModelDeployment

SERVER = (
    b"apiVersion: triton-gitops.dev/v1alpha1\nkind: TritonServer\nmetadata: {name: s1}\n"
    b"spec: {grpc: 's1:8001', modelRepository: /models/s1}\n"
)


def read(case: str) -> tuple[list[str], ModelDeployment | None]:
    """validate's problems as FILE:LINE: message, and the deployment, for one smoke case
    (its lines after ``inputs``; the case's ``timeout`` is on line 10)."""
    text = (
        "apiVersion: triton-gitops.dev/v1alpha1\nkind: ModelDeployment\nmetadata: {name: m}\n"
        "spec:\n  servers: {names: [s1]}\n  versions: [2]\n  verify:\n    smoke:\n"
        "      - inputs: {INPUT0: {datatype: FP32, shape: [1], data: [1]}}\n" + case
    )
    reading = read_manifests({"models/m.yaml": text.encode(), "servers/s1.yaml": SERVER})
    found = [f"{p.file}:{p.line}: {p.message}" for p in reading.problems]
    return found, reading.desired.deployments.get("m")


def test_a_cases_timeout_is_its_deadline_and_the_call_timeout_is_the_default() -> None:
    problems, deployment = read("        timeout: 1m30s\n")
    assert problems == [] and deployment is not None
    (case,) = deployment.smoke
    assert case.timeout == 90.0
    assert limits(case, 10.0) == (90.0, MAX_RESPONSES)  # its own, over the caller's

    problems, deployment = read("")
    assert problems == [] and deployment is not None
    (case,) = deployment.smoke
    assert case.timeout is None and limits(case, 10.0) == (10.0, MAX_RESPONSES)


def test_a_timeout_of_nothing_or_beside_a_stream_is_a_problem_on_its_line() -> None:
    assert read("        timeout: 0s\n")[0] == ["models/m.yaml:10: 0s is not above 0"]
    problems, _ = read("        timeout: 5s\n        stream: {deadline: 20s}\n")
    assert problems == [
        "models/m.yaml:10: a streaming case's time is its stream.deadline: set that, not timeout"
    ]
    assert read("        timeout: soon\n")[0][0].startswith("models/m.yaml:10: ")
