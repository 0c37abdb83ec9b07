"""Reading a real repository's manifests: the file selection every reader shares, documents
of other tools left alone, every problem of every stage at once in words for people, one
duration syntax, and the grouped apiVersion (the old one still read, with a warning).
"""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
from ruamel.yaml import YAML

from reconciler.core.spec.desired import _salvaged, load_desired_state, read_manifests
from reconciler.core.spec.durations import schema_seconds
from reconciler.core.spec.schema import (
    API_VERSION,
    LEGACY_API_VERSION,
    kind_validators,
    schema_dir,
    schema_documents,
)
from reconciler.core.spec.selection import ManifestSelection

SERVER = f"""\
apiVersion: {API_VERSION}
kind: TritonServer
metadata:
  name: edge-a
spec:
  grpc: edge-a:8001
  metrics: http://edge-a:8002/metrics
  modelRepository: /models
"""


def deployment(name: str, spec: str = "", api_version: str = API_VERSION) -> str:
    return (
        f"apiVersion: {api_version}\nkind: ModelDeployment\nmetadata:\n  name: {name}\n"
        "spec:\n  servers: {names: [edge-a]}\n  versions: [1]\n"
        + textwrap.indent(textwrap.dedent(spec), "  ")
    )


def encode(files: dict[str, str]) -> dict[str, bytes]:
    return {name: textwrap.dedent(text).encode() for name, text in files.items()}


KUBERNETES_DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  template:
    metadata: {creationTimestamp: 2024-01-01}
---
apiVersion: v1
kind: Service
metadata: {name: web}
"""


# The review's repository with four problems (review-usability.md §1 row 7), one per stage,
# plus a fifth (a shadow file): each run of the old loader showed only the first batch.
FOUR_PROBLEMS = {
    "servers.yaml": SERVER.replace("grpc: edge-a:8001", "grpc: localhost"),
    "models/echo.yaml": deployment(
        "echo",
        """\
        verify:
          timeout: 2h
          analysis:
            interval: 5
            checks: [{name: ok, successRate: {min: 0.99}}]
        """,
    ).replace("names: [edge-a]", "names: [edge-a, edge-b]"),
    "models/kpi.yaml": deployment(
        "kpi",
        """\
        verify:
          shadow: {requests: shadow/kpi.jsonl}
          analysis:
            checks: [{name: kpi, promql: 'sum(rate(kpi_total[1m]))', min: 1}]
        """,
    ),
}


def test_every_problem_of_every_stage_is_reported_at_once_sorted_and_in_words() -> None:
    reading = read_manifests(encode(FOUR_PROBLEMS), lambda name: None, prometheus=False)

    assert [str(p) for p in reading.problems] == [
        "models/echo.yaml:6: ModelDeployment 'echo' names unknown TritonServer 'edge-b'",
        "models/echo.yaml:11: spec.verify.analysis.interval: 5 is not a duration "
        "(e.g. 500ms, 30s, 1m30s, 2h)",
        "models/kpi.yaml:9: shadow requests file 'shadow/kpi.jsonl' is not in the repository "
        "as a regular file (absent, a symbolic link or over 67108864 bytes)",
        "models/kpi.yaml:10: promql check(s) kpi need --prometheus-url",
        "servers.yaml:6: spec.grpc: 'localhost' is not host:port (e.g. triton-0.triton:8001)",
    ]
    # edge-a was refused by the schema: naming it is not a second, misleading problem.
    assert not [p for p in reading.problems if "'edge-a'" in p.message]


def test_no_message_shows_a_regular_expression() -> None:
    # Every pattern in the schemas carries its words, so no message can fall back to a regex.
    def patterns(node: Any, path: str) -> list[str]:
        found = []
        if isinstance(node, dict):
            if "pattern" in node and "errorMessage" not in node:
                found.append(path)
            for key, value in node.items():
                if key != "not":  # a pattern a value must not match has its own message
                    found += patterns(value, f"{path}/{key}")
        elif isinstance(node, list):
            for index, value in enumerate(node):
                found += patterns(value, f"{path}/{index}")
        return found

    schemas = {p.name: json.loads(p.read_text()) for p in schema_dir().glob("*.json")}
    assert [where for name, s in schemas.items() for where in patterns(s, name)] == []

    bad = {
        "m.yaml": deployment(
            "bad",
            """\
            model: ../up
            resources: {memory: lots}
            verify:
              analysis: {duration: soon, checks: [{name: 'a b', latency: {maxIncrease: 1}}]}
            """,
        ).replace("versions: [1]", "versions: [1]\n  dependsOn: [Not_A_Label]")
    }
    messages = [p.message for p in read_manifests(encode(bad)).problems]
    assert len(messages) >= 4, messages
    assert not [m for m in messages if re.search(r"\^|\$'|\[0-9|does not match", m)], messages
    assert "spec.verify.analysis.duration: 'soon' is not a duration" in " ".join(messages)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            "resources: {memory: lots}",
            "spec.resources.memory: 'lots' is not a size (bytes, or e.g. 512Mi, 2Gi)",
        ),
        ("resources: {memory: 1.5}", "spec.resources.memory: 1.5 is not a whole number"),
        (
            "verify: {gate: {maxMemoryIncrease: lots}}",
            "spec.verify.gate.maxMemoryIncrease: 'lots' is not a percentage (e.g. 10%) or a "
            "size (bytes, or e.g. 512Mi, 2Gi)",
        ),
        ("suspend: 'yes'", "spec.suspend: 'yes' is not true or false"),
        (
            "rollout: {steps: [{servers: 200%}]}",
            "spec.rollout.steps[0].servers: '200%' is not a percentage from 1% to 100% (e.g. 25%)",
        ),
    ],
)
def test_a_value_of_the_wrong_form_says_what_is_expected(spec: str, message: str) -> None:
    files = {"m.yaml": SERVER + "---\n" + deployment("echo", spec + "\n")}
    assert [p.message for p in read_manifests(encode(files)).problems] == [message]


@pytest.mark.parametrize(
    ("written", "seconds"),
    [("500ms", 0.5), ("90s", 90), ("1m30s", 90), ("2h", 7200), ("1.5s", 1.5), ("1h2m3s", 3723)],
)
def test_durations_take_one_syntax_everywhere(written: str, seconds: float) -> None:
    assert schema_seconds(written) == pytest.approx(seconds)
    files = {
        "servers.yaml": SERVER
        + f"  discovery: {{dns: triton, grpcPort: 8001, refresh: {written}}}\n",
        "m.yaml": deployment(
            "echo",
            f"""\
            sequence: {{drainTimeout: {written}, idle: {written}}}
            verify:
              timeout: {written}
              smoke:
                - inputs: {{X: {{datatype: FP32, shape: [1], data: [1]}}}}
                  stream: {{deadline: {written}}}
              analysis:
                interval: {written}
                duration: {written}
                initialDelay: {written}
                probes: {{timeout: {written}}}
                earlyAbort: {{every: {written}}}
                checks: [{{name: ok, successRate: {{min: 0.9}}}}]
            """,
        ),
    }
    # (a server takes grpc and metrics, or discovery)
    files["servers.yaml"] = re.sub(r"  (grpc|metrics): .*\n", "", files["servers.yaml"])
    desired = load_desired_state(encode(files))
    echo = desired.deployments["echo"]
    assert echo.analysis is not None and echo.sequence is not None
    read = (
        echo.verify_timeout,
        echo.analysis.interval,
        echo.analysis.duration,
        echo.analysis.initial_delay,
        echo.analysis.probes.timeout,
        echo.analysis.early_abort.every,
        echo.smoke[0].stream.deadline if echo.smoke[0].stream else None,
        echo.sequence.drain_timeout,
        echo.sequence.idle,
    )
    discovery = desired.servers["edge-a"].discovery
    assert discovery is not None
    assert [*read, discovery.refresh] == [pytest.approx(seconds)] * 10


@pytest.mark.parametrize("written", ["5", "2 minutes", "1s1m", "h", "1.s", "-1s"])
def test_what_is_not_a_duration_is_refused_in_words(written: str) -> None:
    files = {"m.yaml": SERVER + "---\n" + deployment("echo", f"verify: {{timeout: '{written}'}}\n")}
    (problem,) = read_manifests(encode(files)).problems
    assert problem.message == (
        f"spec.verify.timeout: {written!r} is not a duration (e.g. 500ms, 30s, 1m30s, 2h)"
    )


def test_the_schemas_write_one_duration_pattern() -> None:
    text = "".join(p.read_text() for p in schema_dir().glob("*.json"))
    patterns = text.count('"pattern": "^(?!$)(?:([0-9]+')
    assert patterns == 1, f"the duration pattern is written {patterns} times"
    fields = text.count("common.schema.json#/$defs/duration")
    assert fields == 17, f"{fields} duration fields refer to the one pattern, 17 expected"
    assert "(ms|s|m" not in text
    assert schema_documents()["common.schema.json"]["$defs"]["duration"]["type"] == "string"


def test_documents_of_other_tools_are_left_alone_and_counted() -> None:
    files = {
        "all.yaml": SERVER + "---\n" + KUBERNETES_DEPLOYMENT,
        "mkdocs.yml": "site_name: docs\nnav: [index.md]\n",
        "playbook.yml": "- hosts: all\n",
        "m.yaml": deployment("echo"),
    }
    reading = read_manifests(encode(files))
    assert reading.problems == ()
    assert reading.ignored == {
        "all.yaml": ("apps/v1", "v1"),
        "mkdocs.yml": ("none",),
        "playbook.yml": ("not a mapping",),
    }
    assert reading.ignored_count == 4 and reading.documents == 2
    assert sorted(reading.desired.deployments) == ["echo"]


def test_our_group_or_kind_is_never_passed_over() -> None:
    files = {
        "typo.yaml": SERVER.replace(API_VERSION, "triton-gitops.dev/v1"),
        "bare.yaml": SERVER.replace(f"apiVersion: {API_VERSION}\n", ""),
    }
    assert [str(p) for p in read_manifests(encode(files)).problems] == [
        f"bare.yaml:1: apiVersion is required (apiVersion: {API_VERSION})",
        f"typo.yaml:1: unknown apiVersion 'triton-gitops.dev/v1' (expected '{API_VERSION}')",
    ]


def test_the_grouped_api_version_is_a_crd_group_and_takes_annotations() -> None:
    group = API_VERSION.split("/")[0]
    # A CRD's group is a DNS subdomain with at least one dot.
    assert "." in group and re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", group)
    annotated = deployment("echo").replace(
        "  name: echo\n",
        "  name: echo\n  annotations:\n    owner: team-search\n    example.com/ticket: 'SRCH-12'\n",
    )
    reading = read_manifests(encode({"s.yaml": SERVER, "m.yaml": annotated}))
    assert reading.problems == () and reading.warnings == ()
    plain = load_desired_state(encode({"s.yaml": SERVER, "m.yaml": deployment("echo")}))
    # Annotations are for people and tools: never part of what the reconciler compares.
    assert reading.desired.deployments["echo"].fingerprint == plain.deployments["echo"].fingerprint

    refused = annotated.replace("example.com/ticket: 'SRCH-12'", "ticket: 12")
    (problem,) = read_manifests(encode({"s.yaml": SERVER, "m.yaml": refused})).problems
    assert problem.message == "metadata.annotations.ticket: 12 is not text"


def test_the_old_api_version_still_loads_with_a_warning_naming_file_line_and_new_spelling() -> None:
    files = {
        "s.yaml": SERVER,
        "models/m.yaml": "# the first spelling\n"
        + deployment("echo", api_version=LEGACY_API_VERSION),
    }
    reading = read_manifests(encode(files))
    assert reading.problems == ()
    assert sorted(reading.desired.deployments) == ["echo"]
    assert [str(w) for w in reading.warnings] == [
        f"models/m.yaml:2: apiVersion '{LEGACY_API_VERSION}' is deprecated: write "
        f"apiVersion: {API_VERSION} (a Kubernetes API group needs a DNS name)"
    ]


ANALYSIS = """\
verify:
  analysis:
    interval: {interval}
    duration: {duration}
    checks: [{{name: ok, successRate: {{min: 0.99}}}}]
"""


@pytest.mark.parametrize(
    ("interval", "duration", "warning"),
    [
        ("10s", "60s", None),  # the defaults: a model answering within 300ms passes on probes
        (
            "5s",
            "10s",
            "minEvidence 10: with no client traffic the probes reach it in 10s only for a "
            "model that answers within 50ms (duration x probes.maxShare 0.05 / minEvidence); "
            "a slower good version would end inconclusive: raise duration or "
            "probes.maxShare, or lower minEvidence",
        ),
        (
            "100ms",
            "400ms",
            "minEvidence 10: the probes send at most 8 in 0.4s (probes.rate 20/s); with no "
            "client traffic no version can pass: raise duration or lower minEvidence",
        ),
    ],
)
def test_an_evidence_requirement_only_fast_models_meet_is_warned_about(
    interval: str, duration: str, warning: str | None
) -> None:
    spec = ANALYSIS.format(interval=interval, duration=duration)
    reading = read_manifests(encode({"s.yaml": SERVER, "m.yaml": deployment("m", spec)}))
    assert reading.problems == ()
    expected = [] if warning is None else [f"m.yaml:9: {warning}"]
    assert [str(w) for w in reading.warnings] == expected


@pytest.mark.parametrize(
    ("path", "selected"),
    [
        ("servers.yaml", True),
        ("models/echo.yml", True),
        (".gitlab-ci.yml", False),  # hidden file
        (".github/workflows/ci.yaml", False),  # hidden folder
        ("models/.draft.yaml", False),
        ("notes.txt", False),
        ("k8s/deployment.yaml", False),  # the root's .sourceignore: k8s/
        ("charts/a/values.yaml", False),  # the root's .sourceignore: values.yaml anywhere
        ("models/draft-x.yaml", False),  # the folder's .sourceignore: draft-*
        ("models/draft-keep.yaml", True),  # and its ! re-includes
    ],
)
def test_which_files_are_manifests(path: str, selected: bool) -> None:
    selection = ManifestSelection("", "k8s/\n!k8s/keep.yaml\nvalues.yaml\n# a comment\n", None)
    in_folder = ManifestSelection("", None, "draft-*\n!draft-keep.yaml\n")
    verdict = selection.selects(path) and in_folder.selects(path.replace("models/", ""))
    assert verdict is selected


def test_the_path_folder_sourceignore_overrides_the_root_one() -> None:
    selection = ManifestSelection("deploy/prod", "*.yaml\n", "!*.yaml\nold/*.yaml\n")
    assert selection.selects("deploy/prod/a.yaml")  # re-included by the folder's file
    assert not selection.selects("deploy/prod/old/a.yaml")
    assert not selection.selects("deploy/staging/a.yaml")  # outside --path
    assert not selection.selects("deploy/prod/.hidden/a.yaml")
    # the folder's own patterns are relative to it, the root's to the root
    anchored = ManifestSelection("deploy/prod", "/deploy/prod/x.yaml\n", "/y.yaml\n")
    assert not anchored.selects("deploy/prod/x.yaml")
    assert not anchored.selects("deploy/prod/y.yaml")
    assert anchored.selects("deploy/prod/sub/y.yaml")


def test_a_refused_value_is_taken_out_and_the_rest_still_checked() -> None:
    names = [f"d{i}" for i in range(12)]
    names[9], names[10] = "Bad_9", "Bad_10"  # list indices past 9: taken out from the end
    text = deployment("echo").replace("versions: [1]", f"versions: [1]\n  dependsOn: {names}")
    data = plain_document(text)
    validator = kind_validators()["ModelDeployment"]
    salvaged = _salvaged(validator, data, list(validator.iter_errors(data)))
    assert salvaged is not None
    assert salvaged["spec"]["dependsOn"] == [n for n in names if not n.startswith("Bad")]
    # two errors about one list item (a key missing, a key unknown): it goes once
    case = "{inputs: {X: {datatype: FP32, shape: [1], data: [1]}}}"
    twice = deployment("echo", f"verify: {{smoke: [{case}, {case}, {{bogus: 1}}]}}\n")
    data = plain_document(twice)
    errors = list(validator.iter_errors(data))
    assert len({tuple(e.absolute_path) for e in errors}) < len(errors)  # two about smoke[2]
    salvaged = _salvaged(validator, data, errors)
    assert salvaged is not None
    assert salvaged["spec"]["verify"]["smoke"] == [data["spec"]["verify"]["smoke"][0]] * 2
    # a required part that is wrong cannot be taken out: the document is given up on
    broken = plain_document(text.replace("  versions: [1]\n", "  versions: seven\n"))
    assert _salvaged(validator, broken, list(validator.iter_errors(broken))) is None


def test_an_unhashable_kind_without_api_version_is_another_tools() -> None:
    reading = read_manifests({"odd.yaml": b"kind: [TritonServer]\n"})
    assert (reading.problems, reading.ignored) == ((), {"odd.yaml": ("none",)})


def plain_document(text: str) -> dict[str, Any]:
    loaded: dict[str, Any] = YAML(typ="safe").load(text)
    return loaded


def _undescribed(node: Any, path: str) -> Iterator[str]:
    """Every property (not a ``$ref`` to a described definition, not the condition of an
    ``if``) without a description, as a path through the schema."""
    if isinstance(node, dict):
        for name, value in node.get("properties", {}).items():
            if isinstance(value, dict) and "description" not in value and "$ref" not in value:
                yield f"{path}/{name}"
        for key, value in node.items():
            if key != "if":
                yield from _undescribed(value, f"{path}/{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _undescribed(value, f"{path}/{index}")


def test_every_field_a_user_writes_has_a_description() -> None:
    """Editors show the schemas' descriptions as help (the YAML language server): a field
    without one is a field the user must look up in the README."""
    missing = [
        where
        for name, document in sorted(schema_documents().items())
        for where in _undescribed(document, name)
    ]
    assert missing == []


def test_a_servers_http_endpoint_is_read_for_the_comparators_sse_copies() -> None:
    """``spec.http`` (one instance) and ``discovery.httpPort`` (each instance): where the
    live comparator asks generate_stream; a discovered server with ``http`` is refused."""
    one = SERVER + "  http: edge-a:8000\n"
    found = SERVER.replace("  grpc: edge-a:8001\n  metrics: http://edge-a:8002/metrics\n", "")
    found += "  discovery: {dns: triton, grpcPort: 8001, httpPort: 8000}\n"
    assert load_desired_state(encode({"s.yaml": one})).servers["edge-a"].http == "edge-a:8000"
    desired = load_desired_state(encode({"s.yaml": found.replace("edge-a", "edge-b")}))
    instances = desired.with_instances({"edge-b": ["10.0.0.7", "fd00::7"]}).servers
    assert [s.http for s in instances.values()] == ["10.0.0.7:8000", "[fd00::7]:8000"]
    both = found + "  http: edge-a:8000\n"
    assert read_manifests(encode({"s.yaml": both})).problems
    (problem,) = read_manifests(encode({"s.yaml": SERVER + "  http: 8000\n"})).problems
    assert "is not host:port (e.g. triton-0.triton:8000)" in problem.message
