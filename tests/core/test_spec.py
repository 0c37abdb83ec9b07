"""Manifest loading and validation: typed values out, or every problem as FILE:LINE."""

from __future__ import annotations

import textwrap

import pytest

from reconciler.core.spec.desired import load_desired_state, read_manifests
from reconciler.core.spec.schema import API_VERSION
from reconciler.model.errors import ValidationError
from reconciler.model.problems import Problem
from reconciler.model.spec import Expectation, Tensor

MARK = "# <-"  # ends the line a problem must be reported at
# Files are read in path order, so the servers come first and a later duplicate is "the" one.
FLEET = "00-servers.yaml"

SERVERS = """\
apiVersion: triton-gitops/v1alpha1
kind: TritonServer
metadata:
  name: edge-a
  labels:
    tier: edge
spec:
  grpc: edge-a.internal:8001
  metrics: http://edge-a.internal:8002/metrics
  modelRepository: /models/edge-a
---
apiVersion: triton-gitops/v1alpha1
kind: TritonServer
metadata:
  name: edge-b
  labels:
    tier: edge
    zone: b
spec:
  grpc: "[::1]:8001"
"""

DEPLOYMENTS = """\
apiVersion: triton-gitops/v1alpha1
kind: ModelDeployment
metadata:
  name: resnet
spec:
  servers:
    names: [edge-a]
  versions: [3, 1]
  config:
    max_batch_size: 8
  verify:
    timeout: 90s
    smoke:
      - name: ones
        inputs:
          INPUT0: {datatype: FP32, shape: [2, 2], data: [[1, 1], [1, 1]]}
        expect:
          OUTPUT0: {data: [2, 2, 2, 2], shape: [2, 2], tolerance: 0.01}
      - inputs:
          TEXT: {datatype: BYTES, shape: [1], data: [hello]}
---
apiVersion: triton-gitops/v1alpha1
kind: ModelDeployment
metadata:
  name: ranker-edge
spec:
  model: ranker_v2
  servers:
    matchLabels: {tier: edge}
  versions: [7]
  config:
    backend: python
  verify:
    timeout: 500ms
"""


def encode(files: dict[str, str]) -> dict[str, bytes]:
    return {name: text.replace(MARK, "").encode() for name, text in files.items()}


def marked_lines(text: str) -> list[int]:
    return [n for n, line in enumerate(text.splitlines(), 1) if line.rstrip().endswith(MARK)]


def problems_of(files: dict[str, str]) -> list[Problem]:
    with pytest.raises(ValidationError) as caught:
        load_desired_state(encode(files))
    return caught.value.problems


def test_valid_documents_become_typed_values() -> None:
    state = load_desired_state(encode({"servers.yaml": SERVERS, "apps/models.yml": DEPLOYMENTS}))

    assert sorted(state.servers) == ["edge-a", "edge-b"]
    edge_a = state.servers["edge-a"]
    assert edge_a.grpc == "edge-a.internal:8001"
    assert edge_a.model_repository == "/models/edge-a"
    assert edge_a.labels == {"tier": "edge"}
    assert str(state.servers["edge-b"].location) == "servers.yaml:12"
    assert state.servers["edge-b"].model_repository is None

    resnet = state.deployments["resnet"]
    assert resnet.model == "resnet"  # defaults to metadata.name
    assert resnet.versions == (1, 3)
    assert resnet.server_names == ("edge-a",)
    assert resnet.config == {"max_batch_size": 8}
    assert resnet.verify_timeout == 90.0
    ones, unnamed = resnet.smoke
    assert ones.name == "ones"
    assert ones.inputs == (Tensor("INPUT0", "FP32", (2, 2), (1, 1, 1, 1)),)
    assert ones.expect == (Expectation("OUTPUT0", (2, 2, 2, 2), (2, 2), 0.01),)
    assert unnamed.name == "smoke[1]"
    assert unnamed.expect == ()

    ranker = state.deployments["ranker-edge"]
    assert ranker.model == "ranker_v2"
    assert ranker.verify_timeout == 0.5
    assert str(ranker.location) == "apps/models.yml:22"

    assert {s: sorted(p) for s, p in state.placements.items()} == {
        "edge-a": ["ranker_v2", "resnet"],
        "edge-b": ["ranker_v2"],
    }
    assert state.placements["edge-b"]["ranker_v2"].deployment is ranker


def test_a_file_of_comments_and_empty_documents_declares_nothing() -> None:
    state = load_desired_state({"empty.yaml": b"# nothing here\n---\n"})
    assert (dict(state.servers), dict(state.deployments), dict(state.placements)) == ({}, {}, {})


def deployment(name: str, servers: str, *, spec: str = "", versions: str = "[1]") -> str:
    """One ModelDeployment; ``servers`` and ``spec`` are YAML lines indented under spec."""
    return (
        textwrap.dedent(f"""\
        apiVersion: triton-gitops/v1alpha1
        kind: ModelDeployment
        metadata:
          name: {name}
        spec:
        """)
        + textwrap.indent(textwrap.dedent(servers), "  ")
        + f"  versions: {versions}\n"
        + textwrap.indent(textwrap.dedent(spec), "  ")
    )


def docs(*documents: str) -> str:
    return "---\n".join(documents)


# Each case: a file holding one mistake, the line marked, and words the message must hold.
CASES: dict[str, tuple[str, str]] = {
    "yaml-syntax": (
        "apiVersion: triton-gitops/v1alpha1\n"
        "kind: TritonServer\n"
        "metadata:\n"
        "  name: broken\n"
        "   labels: {}  # <-\n"
        "spec:\n"
        "  grpc: broken:8001\n",
        "invalid YAML",
    ),
    "duplicate-key": (
        "apiVersion: triton-gitops/v1alpha1\n"
        "kind: TritonServer\n"
        "metadata:\n"
        "  name: twice\n"
        "spec:\n"
        "  grpc: twice:8001\n"
        "  grpc: twice:8002  # <-\n",
        'duplicate key "grpc"',
    ),
    "unknown-api-version": (
        "kind: TritonServer\napiVersion: triton-gitops/v2  # <-\nmetadata: {name: x}\n",
        "unknown apiVersion 'triton-gitops/v2'",
    ),
    "unknown-kind": (
        "# a comment first\n\napiVersion: triton-gitops/v1alpha1\nkind: Gadget  # <-\n",
        "unknown kind 'Gadget'",
    ),
    # A misspelled kind or key: one problem at its own line, with the name meant (issue 45).
    "misspelled-kind": (
        "apiVersion: triton-gitops/v1alpha1\nkind: ModelDeploymnet  # <-\nmetadata: {name: k}\n",
        "unknown kind 'ModelDeploymnet'; did you mean 'ModelDeployment'?",
    ),
    "misspelled-key": (
        "apiVersion: triton-gitops/v1alpha1\nkind: ModelDeployment\nmetadata: {name: typo}\n"
        "spec:\n  servers: {names: [edge-a]}\n  version: [1]  # <-\n",
        "spec: unknown key 'version'; did you mean 'versions'?",
    ),
    "misspelled-nested-key": (
        deployment("nested", "servers: {names: [edge-a]}\n", spec="verify:\n  timout: 30s  # <-\n"),
        "spec.verify: unknown key 'timout'; did you mean 'timeout'?",
    ),
    "unknown-key-nothing-near": (
        deployment("colour", "servers: {names: [edge-a]}\n", spec="colour: blue  # <-\n"),
        "spec: unknown key 'colour'",
    ),
    "version-not-integer": (
        deployment("typed", "servers: {names: [edge-a]}\n", versions="\n    - 1\n    - two  # <-"),
        "spec.versions[1]: 'two' is not a whole number",
    ),
    "versions-empty": (
        deployment("empty", "servers: {names: [edge-a]}\n", versions="[]  # <-"),
        "spec.versions",
    ),
    "names-and-match-labels": (
        deployment(
            "both",
            """\
            servers:  # <-
              names: [edge-a]
              matchLabels: {tier: edge}
            """,
        ),
        "exactly one of names or matchLabels is required",
    ),
    "config-with-version-policy": (
        deployment(
            "policy",
            "servers: {names: [edge-a]}\n",
            spec="""\
            config:  # <-
              backend: python
              version_policy: {latest: {num_versions: 2}}
            """,
        ),
        "version_policy is set by the reconciler",
    ),
    "duplicate-server-name": (
        "apiVersion: triton-gitops/v1alpha1\n"
        "kind: TritonServer\n"
        "metadata:\n"
        "  labels: {tier: edge}\n"
        "  name: edge-a  # <-\n"
        "spec:\n"
        "  grpc: other:8001\n",
        f"duplicate TritonServer name 'edge-a' (first defined at {FLEET}:1)",
    ),
    "duplicate-deployment-name": (
        docs(
            deployment("twin", "servers: {names: [edge-a]}\n", spec="model: one\n"),
            deployment("twin", "servers: {names: [edge-a]}\n", spec="model: two\n").replace(
                "name: twin", "name: twin  # <-"
            ),
        ),
        "duplicate ModelDeployment name 'twin'",
    ),
    "unknown-server": (
        deployment(
            "lost",
            """\
            servers:
              names:
                - edge-a
                - edge-z  # <-
            """,
        ),
        "names unknown TritonServer 'edge-z'",
    ),
    "match-labels-match-none": (
        deployment(
            "nowhere",
            """\
            servers:
              matchLabels:  # <-
                tier: cloud
            """,
        ),
        "matchLabels {'tier': 'cloud'} match no TritonServer",
    ),
    "placed-twice": (
        docs(
            deployment("first", "servers: {names: [edge-a]}\n", spec="model: shared\n"),
            deployment(
                "second",
                "servers: {matchLabels: {zone: b}}\n",
                spec="model: shared\nconfig: {backend: python}\n",
            ),
            deployment("third", "servers: {names: [edge-a]}\n", spec="model: shared\n").replace(
                "spec:\n", "spec:  # <-\n"
            ),
        ),
        "model 'shared' on server 'edge-a' is already placed by ModelDeployment 'first'",
    ),
    "no-base-config": (
        deployment(
            "blind",
            "servers: {names: [edge-a, edge-b]}\n",
            spec="config: {max_batch_size: 8}\n",
        ).replace("spec:\n", "spec:  # <-\n"),
        "server(s) edge-b declare no spec.modelRepository",
    ),
    "smoke-shape-mismatch": (
        deployment(
            "smoky",
            "servers: {names: [edge-a]}\n",
            spec="""\
            verify:
              smoke:
                - name: wrong
                  inputs:
                    INPUT0:
                      datatype: FP32
                      shape: [2, 3]
                      data: [[1, 2], [3, 4]]  # <-
            """,
        ),
        "input INPUT0: shape [2, 3] holds 6 values, data has 4",
    ),
    "smoke-expect-mismatch": (
        deployment(
            "smoky-out",
            "servers: {names: [edge-a]}\n",
            spec="""\
            verify:
              smoke:
                - inputs:
                    INPUT0: {datatype: FP32, shape: [1], data: [1]}
                  expect:
                    OUTPUT0:
                      shape: [1]
                      data: [1, 2]  # <-
            """,
        ),
        "output OUTPUT0: shape [1] holds 1 values, data has 2",
    ),
}


def test_a_model_repository_triton_cannot_read_is_reported_at_its_line() -> None:
    server = """\
apiVersion: triton-gitops/v1alpha1
kind: TritonServer
metadata:
  name: edge-c
spec:
  grpc: edge-c.internal:8001
  modelRepository: s3://http://minio.internal/models/edge-c  # <-
"""
    (line,) = marked_lines(server)

    (problem,) = problems_of({FLEET: SERVERS, "edge-c.yaml": server})

    assert (problem.file, problem.line) == ("edge-c.yaml", line), problem
    assert problem.message.startswith("TritonServer 'edge-c': spec.modelRepository "), problem
    assert "s3://http://HOST:PORT/BUCKET/PREFIX" in problem.message, problem


def one_case(case: str) -> dict[str, str]:
    return {FLEET: SERVERS, f"{case}.yaml": CASES[case][0]}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_problem_is_reported_at_its_line(case: str) -> None:
    text, words = CASES[case]
    (line,) = marked_lines(text)

    (problem,) = problems_of(one_case(case))

    assert (problem.file, problem.line) == (f"{case}.yaml", line), problem
    assert words in problem.message
    assert str(problem) == f"{case}.yaml:{line}: {problem.message}"


def test_every_problem_of_every_file_is_reported_at_once() -> None:
    files = {FLEET: SERVERS} | {f"{case}.yaml": text for case, (text, _) in CASES.items()}
    # Two schema problems in one document are both reported too.
    files["two-in-one.yaml"] = deployment(
        "two",
        """\
        servers:
          names: [edge-a]
          matchLabels: {tier: edge}  # <-
        """,
        versions="[]  # <-",
    ).replace("servers:\n", "servers:  # <-\n")
    expected = sorted((name, line) for name, text in files.items() for line in marked_lines(text))
    # (the marker on matchLabels is not where a problem is reported: servers: is)
    expected.remove(("two-in-one.yaml", marked_lines(files["two-in-one.yaml"])[1]))

    with pytest.raises(ValidationError) as caught:
        load_desired_state(encode(files))

    got = sorted((p.file, p.line) for p in caught.value.problems)
    assert got == expected
    assert str(caught.value).splitlines() == [str(p) for p in caught.value.problems]


def test_documents_that_are_not_mappings_and_bad_bytes() -> None:
    files = {
        "list.yaml": "- a\n- b\n",  # an Ansible playbook, say: another tool's file
        "value-key.yaml": "=",  # a document with no position (the YAML 1.1 value key)
        "missing.yaml": "kind: TritonServer\nmetadata: {name: q}\n",
        "empty.yaml": "",
    }
    reading = read_manifests(encode(files))
    assert [(p.file, p.line, p.message) for p in reading.problems] == [
        ("missing.yaml", 1, f"apiVersion is required (apiVersion: {API_VERSION})"),
    ]
    assert reading.ignored == {
        "list.yaml": ("not a mapping",),
        "value-key.yaml": ("not a mapping",),
    }
    with pytest.raises(ValidationError) as caught:
        load_desired_state({"bad.yaml": b"\xff\xfe"})
    assert [(p.file, p.line) for p in caught.value.problems] == [("bad.yaml", 1)]
    assert "not UTF-8" in caught.value.problems[0].message


def test_config_name_must_equal_the_model() -> None:
    text = deployment(
        "named",
        "servers: {names: [edge-a]}\n",
        spec="config:\n  backend: python\n  name: other  # <-\n",
    )
    (problem,) = problems_of({FLEET: SERVERS, "named.yaml": text})
    assert (problem.file, problem.line) == ("named.yaml", marked_lines(text)[0])
    assert "must equal the model name 'named'" in problem.message


def test_versions_written_as_floats_are_rejected() -> None:
    text = deployment("floaty", "servers: {names: [edge-a]}\n", versions="[2.0]")
    with pytest.raises(ValidationError) as caught:
        load_desired_state(encode({FLEET: SERVERS, "floaty.yaml": text}))
    (problem,) = caught.value.problems
    assert problem.file == "floaty.yaml"
    assert "spec.versions[0]: 2.0 is not a whole version number" in problem.message


def test_a_gateway_api_router_may_declare_sequence_affinity() -> None:
    """Issue 44, point 1: through the Gateway API the reconciler writes the rule's
    sessionPersistence (adapters/gateway.py), so validation no longer refuses it."""
    router = textwrap.dedent("""\
        apiVersion: triton-gitops.dev/v1alpha1
        kind: Router
        metadata: {name: edge}
        spec:
          gatewayAPI: {namespace: serving, grpcRoute: triton}
          sequenceAffinity: {header: x-sequence-id}
          pools:
            - {name: stable, servers: {names: [edge-a]}}
            - {name: canary, servers: {names: [edge-b]}}
        """)
    state = load_desired_state(encode({FLEET: SERVERS, "router.yaml": router}))
    affinity = state.routers["edge"].sequence_affinity
    assert affinity is not None and affinity.header == "x-sequence-id", affinity
