"""Hostile and broken manifests: each refused by name (FILE:LINE or FILE), in bounded memory
and time, and never anything but a ValidationError out of the loader.

The hostile cases run the loader in a child process under RLIMIT_AS (1 GiB) with a generous
timeout: an out-of-memory or a hang is the failure, not a measured duration. The Hypothesis
properties take their number of examples from TRITON_GITOPS_FUZZ_EXAMPLES (``./dev fuzz``
runs 10,000 each; the normal suite a couple of hundred).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ruamel.yaml import YAML

from reconciler.adapters.files import read_in_directory
from reconciler.core.spec.desired import load_desired_state
from reconciler.core.spec.schema import KIND_SCHEMAS, schema_documents
from reconciler.core.spec.shadow import attach_shadow_requests
from reconciler.core.spec.yaml import MAX_MANIFEST_BYTES, MAX_YAML_DEPTH, MAX_YAML_VALUES
from reconciler.model.errors import ValidationError
from reconciler.model.problems import Problem
from reconciler.model.spec import DesiredState
from tests.core.test_spec import DEPLOYMENTS, SERVERS

FUZZ_EXAMPLES = int(os.environ.get("TRITON_GITOPS_FUZZ_EXAMPLES", "200"))
MEMORY_LIMIT = 1 << 30
# A hang is the failure; the deadline only has to end it, on a shared and noisy machine.
CHILD_DEADLINE = 600

HEAD = """\
apiVersion: triton-gitops/v1alpha1
kind: ModelDeployment
metadata:
  name: resnet
spec:
  servers: {names: [edge-a]}
  versions: [1]
"""


def problem_lines(files: dict[str, bytes]) -> list[str]:
    """The loader's problems as printed; the loader must raise nothing else."""
    try:
        load_desired_state(files)
    except ValidationError as exc:
        return [str(p) for p in exc.problems]
    return []


def assert_located(problems: list[str], files: dict[str, bytes] | list[str]) -> None:
    """Every problem starts with one of the files, maybe a line, then ': ' and a message."""
    names = "|".join(re.escape(name) for name in files)
    for problem in problems:
        assert re.match(rf"^({names})(:\d+)?: \S", problem), problem


# -- hostile cases, each loaded in a child process under a memory limit ------------------

CHILD = """\
import json, resource, sys
from pathlib import Path
resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))
from reconciler.adapters.files import manifest_files_in
from reconciler.core.spec import load_desired_state
from reconciler.model.errors import ValidationError
try:
    load_desired_state(manifest_files_in(Path(sys.argv[1])))
    problems = []
except ValidationError as exc:
    problems = [str(p) for p in exc.problems]
print(json.dumps(problems))
"""


def load_in_child(directory: Path) -> list[str]:
    """The problems of the manifests in ``directory``, loaded by a child process that may
    use at most MEMORY_LIMIT of address space; fails the test on a crash, OOM or hang."""
    done = subprocess.run(
        [sys.executable, "-c", CHILD.format(limit=MEMORY_LIMIT), str(directory)],
        capture_output=True,
        text=True,
        timeout=CHILD_DEADLINE,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    problems: list[str] = json.loads(done.stdout)
    return problems


def billion_laughs() -> str:
    rows = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    rows += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 10)]
    return HEAD + "  config:\n" + "".join(f"    {row}\n" for row in rows)


def alias_chain() -> str:
    # Each anchor is 30 levels deep and holds the previous one: few values, deep once expanded.
    rows, nested = [], "{k: " * 30 + "1" + "}" * 30
    rows.append(f"d0: &d0 {nested}")
    for i in range(1, 5):
        rows.append(f"d{i}: &d{i} " + "{k: " * 30 + f"*d{i - 1}" + "}" * 30)
    return HEAD + "  config:\n" + "".join(f"    {row}\n" for row in rows)


def block_nesting(levels: int) -> str:
    body = "".join("  " * (i + 2) + f"k{i}:\n" for i in range(levels))
    return HEAD + "  config:\n" + body + "  " * (levels + 2) + "leaf: 1\n"


HOSTILE: dict[str, tuple[Callable[[], bytes], str, int | None]] = {
    # name: (file content, message pattern, line or None for a file-level problem)
    "billion laughs": (
        lambda: billion_laughs().encode(),
        rf"YAML refused: more than {MAX_YAML_VALUES} values \(aliases counted",
        None,
    ),
    "alias inside its own anchor": (
        lambda: (HEAD + "  config: &loop {a: [*loop]}\n").encode(),
        r"YAML refused: alias \*loop refers to itself",
        8,
    ),
    "deep flow nesting": (
        lambda: (HEAD + "  config: " + "[" * 50_000 + "]" * 50_000 + "\n").encode(),
        rf"YAML refused: nested deeper than {MAX_YAML_DEPTH} levels",
        8,
    ),
    "deep block nesting": (
        lambda: block_nesting(200).encode(),
        rf"YAML refused: nested deeper than {MAX_YAML_DEPTH} levels",
        None,
    ),
    "deep through aliases": (
        lambda: alias_chain().encode(),
        rf"YAML refused: nested deeper than {MAX_YAML_DEPTH} levels",
        None,
    ),
    "many values under the size cap": (
        lambda: (HEAD + "  config: {x: [" + "1," * 400_000 + "1]}\n").encode(),
        rf"YAML refused: more than {MAX_YAML_VALUES} values",
        8,
    ),
    "huge file": (
        lambda: (HEAD + "# padding\n" * (MAX_MANIFEST_BYTES // 8)).encode(),
        rf"file is larger than {MAX_MANIFEST_BYTES} bytes, not read",
        1,
    ),
    "binary file": (
        lambda: bytes(range(256)) * 64,
        r"not UTF-8 text \(invalid start byte at byte 128\): binary\?",
        1,
    ),
    "UTF-16 text": (
        lambda: HEAD.encode("utf-16"),
        r"not UTF-8 text \(invalid start byte at byte 0\)",
        1,
    ),
    "NUL inside UTF-8 text": (
        lambda: (HEAD + "  config: {a: b\0c}\n").encode(),
        r"not text: character U\+0000 is not allowed in YAML: binary\?",
        8,
    ),
    "a mapping as a key": (
        lambda: (HEAD + "  config:\n    ? {a: {b: c}}\n    : 1\n").encode(),
        r"YAML refused: a list or mapping used as a key",
        9,
    ),
    "duplicate keys": (
        lambda: (HEAD + "  versions: [2]\n").encode(),
        r'invalid YAML: found duplicate key "versions"',
        8,
    ),
    "duplicate keys in a nested mapping": (
        lambda: (HEAD + "  config:\n    max_batch_size: 1\n    max_batch_size: 2\n").encode(),
        r'invalid YAML: found duplicate key "max_batch_size"',
        10,
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_manifest_is_refused_in_bounded_memory(case: str, tmp_path: Path) -> None:
    content, message, line = HOSTILE[case]
    (tmp_path / "models.yaml").write_bytes(content())

    problems = load_in_child(tmp_path)

    where = r"models\.yaml:\d+" if line is None else rf"models\.yaml:{line}"
    assert [p for p in problems if re.match(rf"^{where}: {message}", p)], problems
    assert_located(problems, ["models.yaml"])


def test_the_value_cap_is_counted_in_expanded_values_not_bytes() -> None:
    # Nine aliases of a nine-item anchor: 90 values, far below the cap; a real manifest
    # may use anchors.
    text = HEAD + "  config: {}\n  verify:\n    smoke:\n"
    text += "      - inputs: &in {X: {datatype: FP32, shape: [1], data: [1]}}\n"
    text += "      - inputs: *in\n" * 9
    servers = SERVERS.encode()
    state = load_desired_state({"00-servers.yaml": servers, "models.yaml": text.encode()})
    assert len(state.deployments["resnet"].smoke) == 10


NOT_JSON_VALUES = {
    "timestamp": ("2001-12-14t21:59:43.10-05:00", "timestamp"),
    "date": ("2002-12-14", "timestamp"),
    "set": ("!!set {a, b}", "set"),
    "binary": ("!!binary aGVsbG8=", "binary value"),
    "custom tag": ("!python/object:os.system echo", "value tagged !python/object:os.system"),
}


@pytest.mark.parametrize("case", sorted(NOT_JSON_VALUES))
def test_a_yaml_value_json_cannot_hold_is_a_problem_at_its_line(case: str) -> None:
    value, named = NOT_JSON_VALUES[case]
    files = {"models.yaml": (HEAD + f"  config:\n    parameters: {value}\n").encode()}
    assert problem_lines(files) == [
        f"models.yaml:9: spec.config.parameters: a YAML {named} is not a manifest value "
        "(text, number, boolean, null, list or mapping); quote it if it is text"
    ]


NOT_A_MODEL = "is not a Triton model name (letters, digits, '_', '.', '-', at most 128 characters)"


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ("a/b", f"spec.model: 'a/b' {NOT_A_MODEL}"),
        ("../escape", f"spec.model: '../escape' {NOT_A_MODEL}"),
        ("..", f"spec.model: '..' {NOT_A_MODEL}"),
        ("/abs", f"spec.model: '/abs' {NOT_A_MODEL}"),
        ("'a\\b'", f"spec.model: 'a\\\\b' {NOT_A_MODEL}"),
        ('"a\\0b"', f"spec.model: 'a\\x00b' {NOT_A_MODEL}"),
    ],
)
def test_model_names_with_path_separators_or_dot_dot_are_refused(model: str, message: str) -> None:
    files = {"models.yaml": (HEAD + f"  model: {model}\n").encode()}
    assert f"models.yaml:8: {message}" in problem_lines(files)


def test_metadata_names_with_path_separators_are_refused() -> None:
    files = {"models.yaml": HEAD.replace("name: resnet", "name: ../resnet").encode()}
    assert problem_lines(files) == [
        "models.yaml:4: metadata.name: '../resnet' is not a lowercase DNS label "
        "(a-z, 0-9 and '-', at most 63 characters, e.g. triton-0)"
    ]


@pytest.mark.parametrize(
    ("versions", "message"),
    [
        ("[0]", "spec.versions[0]: 0 is less than the minimum of 1"),
        ("[-3]", "spec.versions[0]: -3 is less than the minimum of 1"),
        ("[1.5]", "spec.versions[0]: 1.5 is not a whole number"),
        ("[2.0]", "spec.versions[0]: 2.0 is not a whole version number"),
        ("['1']", "spec.versions[0]: '1' is not a whole number"),
        ("[true]", "spec.versions[0]: True is not a whole number"),
        ("[null]", "spec.versions[0]: None is not a whole number"),
        ("[.inf]", "spec.versions[0]: inf is not a whole number"),
        (
            "[9223372036854775808]",
            "spec.versions[0]: 9223372036854775808 is greater than the maximum of "
            "9223372036854775807",
        ),
        ("[]", "spec.versions: [] should be non-empty"),
        ("7", "spec.versions: 7 is not a list"),
    ],
)
def test_versions_that_are_not_positive_integers_are_refused(versions: str, message: str) -> None:
    files = {"models.yaml": HEAD.replace("versions: [1]", f"versions: {versions}").encode()}
    assert f"models.yaml:7: {message}" in problem_lines(files)


def test_a_manifest_link_is_refused_and_never_followed(tmp_path: Path) -> None:
    # Outside the folder, a manifest that would load: followed, it would declare a server.
    outside = tmp_path / "outside.yaml"
    outside.write_text(SERVERS)
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "servers.yaml").symlink_to(outside)
    (manifests / "local.yaml").symlink_to("servers.yaml")

    problems = load_in_child(manifests)

    assert problems == [
        "local.yaml:1: a symbolic link (to 'servers.yaml'); a manifest must be a regular "
        "file, not read",
        f"servers.yaml:1: a symbolic link (to '{outside}'); a manifest must be a regular "
        "file, not read",
    ]


def test_a_huge_manifest_in_a_directory_is_not_read(tmp_path: Path) -> None:
    with (tmp_path / "big.yaml").open("wb") as big:
        big.truncate(8 << 30)  # sparse: 8 GiB that take no disk, and would take the memory
    assert load_in_child(tmp_path) == [
        f"big.yaml:1: file is larger than {MAX_MANIFEST_BYTES} bytes, not read"
    ]


SHADOW = HEAD.replace("servers: {names: [edge-a]}", "servers: {names: [edge-b]}") + (
    "  config: {backend: python}\n  verify:\n    shadow:\n      requests: {file}\n"
)


@pytest.mark.parametrize(
    "name", ["../outside.jsonl", "shadow/../../outside.jsonl", "a\\\\..\\\\b.jsonl"]
)
def test_a_shadow_requests_file_may_not_leave_the_repository(name: str) -> None:
    text = SHADOW.replace("{file}", f'"{name}"')
    files = {"00-servers.yaml": SERVERS.encode(), "models.yaml": text.encode()}
    shown = name.replace("\\\\", "\\")
    assert problem_lines(files) == [
        f"models.yaml:11: spec.verify.shadow.requests: {shown!r} must stay inside the "
        "repository: no '..' part, no '\\'"
    ]


def test_a_shadow_requests_file_is_never_read_through_a_link(tmp_path: Path) -> None:
    request = '{"inputs": {"X": {"datatype": "FP32", "shape": [1], "data": [1]}}}\n'
    (tmp_path / "secret.jsonl").write_text(request)
    repo = tmp_path / "repo"
    (repo / "real").mkdir(parents=True)
    (repo / "real" / "requests.jsonl").write_text(request)
    (repo / "file.jsonl").symlink_to(tmp_path / "secret.jsonl")
    (repo / "folder").symlink_to(tmp_path)
    (repo / "inside.jsonl").symlink_to("real/requests.jsonl")

    read = {n: read_in_directory(repo, n, 1 << 20) for n in ("file.jsonl", "folder/secret.jsonl")}
    assert read == {"file.jsonl": None, "folder/secret.jsonl": None}
    assert read_in_directory(repo, "inside.jsonl", 1 << 20) is None  # a link, even inside
    assert read_in_directory(repo, "real/requests.jsonl", 1 << 20) == request.encode()
    assert read_in_directory(repo, "real/requests.jsonl", 10) is None  # over the limit

    text = SHADOW.replace("{file}", "file.jsonl")
    desired = load_desired_state({"00-servers.yaml": SERVERS.encode(), "m.yaml": text.encode()})
    with pytest.raises(ValidationError) as caught:
        attach_shadow_requests(desired, lambda name: read_in_directory(repo, name, 1 << 20))
    assert [str(p) for p in caught.value.problems] == [
        "m.yaml:11: shadow requests file 'file.jsonl' is not in the repository as a regular "
        f"file (absent, a symbolic link or over {64 << 20} bytes)"
    ]


def test_a_shadow_request_nested_too_deeply_is_a_problem_at_its_line() -> None:
    text = SHADOW.replace("{file}", "r.jsonl")
    desired = load_desired_state({"00-servers.yaml": SERVERS.encode(), "m.yaml": text.encode()})
    bomb = b'{"inputs": {}}\n' + b"[" * 200_000 + b"]" * 200_000 + b"\n\xff\xfe\n"
    with pytest.raises(ValidationError) as caught:
        attach_shadow_requests(desired, lambda name: bomb)
    lines = [str(p) for p in caught.value.problems]
    assert "r.jsonl:2: not JSON: nested too deeply" in lines
    assert [p for p in lines if p.startswith("r.jsonl:3: not JSON: ")], lines
    assert_located(lines, ["r.jsonl"])


# -- properties: whatever the input, problems located or a valid DesiredState ------------

FUZZ = settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
NAMES = ("edge-a", "edge-b", "resnet", "ranker", "bert")  # few names, so references often resolve


def _ref(ref: str) -> dict[str, Any]:
    file, _, pointer = ref.partition("#")
    node: Any = schema_documents()[file.rsplit("/", 1)[-1]]
    for part in pointer.strip("/").split("/"):
        node = node[part]
    result: dict[str, Any] = node
    return result


json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=12)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)


def from_schema(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values shaped by a JSON Schema, mostly valid: ``oneOf`` branches on an object become
    its required keys; ``not`` on a value is ignored, so some break the rules on purpose."""
    key = json.dumps(schema, sort_keys=True)
    if key not in _STRATEGIES:  # built once: regex strategies are costly to build
        _STRATEGIES[key] = st.deferred(lambda: _from_schema(schema))
    return _STRATEGIES[key]


_STRATEGIES: dict[str, st.SearchStrategy[Any]] = {}


def _from_schema(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    if "$ref" in schema:
        if schema["$ref"].endswith("dnsLabel"):
            return st.sampled_from(NAMES) | st.from_regex(
                _ref(schema["$ref"])["pattern"], fullmatch=True
            )
        return from_schema(
            {**_ref(schema["$ref"]), **{k: v for k, v in schema.items() if k != "$ref"}}
        )
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if "oneOf" in schema and schema.get("type") != "object":
        return st.one_of([from_schema(branch) for branch in schema["oneOf"]])
    kind = schema.get("type")
    if kind == "object":
        return _object(schema)
    if kind == "array":
        items = from_schema(schema["items"]) if "items" in schema else json_scalars
        low = schema.get("minItems", 0)
        high = min(schema.get("maxItems", 3), low + 3)
        return st.lists(items, min_size=low, max_size=high, unique=schema.get("uniqueItems", False))
    if kind == "string":
        if "pattern" in schema:
            return st.from_regex(schema["pattern"], fullmatch=True).filter(
                lambda s: len(s) >= schema.get("minLength", 0)
            )
        return st.text(min_size=schema.get("minLength", 0), max_size=12)
    if kind == "integer":
        return st.integers(schema.get("minimum"), schema.get("maximum"))
    if kind == "number":
        return st.floats(schema.get("minimum"), schema.get("maximum"), allow_nan=False)
    if kind == "boolean":
        return st.booleans()
    return json_values


def _required_sets(schema: dict[str, Any]) -> list[list[str]]:
    """The key sets one ``anyOf`` or ``not`` clause names."""
    return [b.get("required", []) for b in schema.get("anyOf", [schema])]


def _object(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    properties = schema.get("properties", {})
    low, high = schema.get("minProperties", 0), schema.get("maxProperties", 3)
    if not properties:  # a map (labels) or free-form (spec.config)
        extra = schema.get("additionalProperties")
        values = from_schema(extra) if isinstance(extra, dict) else json_values
        if "propertyNames" in schema:
            keys = from_schema({"type": "string", **schema["propertyNames"]})
        else:
            keys = st.sampled_from(["X", "b", "backend", "max_batch_size"])
        return st.dictionaries(keys, values, min_size=low, max_size=max(low, min(high, 2)))
    branches = schema.get("oneOf", [{}])

    @st.composite
    def build(draw: st.DrawFn) -> dict[str, Any]:
        branch = draw(st.sampled_from(branches))
        required = set(schema.get("required", [])) | set(branch.get("required", []))
        if "anyOf" in branch:
            required |= set(draw(st.sampled_from(_required_sets(branch))))
        # Keys the branch forbids, or only other branches ask for, stay out (mostly valid).
        forbidden = {k for r in _required_sets(branch.get("not", {})) for k in r}
        forbidden |= {k for b in branches for k in b.get("required", [])} - required
        optional = [k for k in properties if k not in required and k not in forbidden]
        if high == 1 and not required:
            required = {draw(st.sampled_from(optional))}
        value = {}
        for key, sub in properties.items():
            if key in required or (key in optional and high > 1 and draw(st.integers(0, 3)) == 0):
                value[key] = draw(from_schema(sub))
        return value

    return build()


@st.composite
def revisions_from_schema(draw: st.DrawFn) -> list[Any]:
    """TritonServers and ModelDeployments from the schemas. Half the time the rules that no
    schema can say are then kept (unique names, deployments naming a server drawn, config
    complete, smoke data that fills its shape), so whole revisions are valid too."""
    server, deployment = (
        schema_documents()[KIND_SCHEMAS[k]] for k in ("TritonServer", "ModelDeployment")
    )
    servers = draw(st.lists(from_schema(server), max_size=2))
    deployments = draw(st.lists(from_schema(deployment), max_size=2))
    if servers and draw(st.booleans()):
        for index, document in enumerate(servers + deployments):
            document["metadata"]["name"] = f"{NAMES[index]}"
        for document in deployments:
            spec = document["spec"]
            spec["servers"] = {"names": [servers[0]["metadata"]["name"]]}
            spec["config"] = {"backend": "python"}
            spec.pop("dependsOn", None)
            spec.pop("model", None)
            spec.get("verify", {}).pop("smoke", None)
    documents: list[Any] = draw(st.permutations(servers + deployments))
    return documents


def dump(documents: list[Any]) -> bytes:
    yaml = YAML(typ="safe", pure=True)
    yaml.width = 4096
    out = StringIO()
    yaml.dump_all(documents, out)
    return out.getvalue().encode()


def check_loader(files: dict[str, bytes]) -> DesiredState | None:
    """The property itself: problems all located, or a valid DesiredState."""
    try:
        state = load_desired_state(files)
    except ValidationError as exc:
        assert exc.problems
        assert all(isinstance(p, Problem) and p.file in files for p in exc.problems)
        assert_located([str(p) for p in exc.problems], files)
        return None
    assert isinstance(state, DesiredState)
    for deployment in state.deployments.values():
        assert deployment.versions and all(
            type(v) is int and 1 <= v < 1 << 63 for v in deployment.versions
        )
        assert "/" not in deployment.model and deployment.model not in (".", "..")
        for server in state.servers.values():
            assert (server.name in state.placements) and (
                deployment.selects(server) == (deployment.model in state.placements[server.name])
            )
    return state


@FUZZ
@given(revisions_from_schema())
def test_documents_from_the_schema_load_or_are_located(documents: list[Any]) -> None:
    check_loader({"a.yaml": dump(documents[:2]), "b/c.yml": dump(documents[2:])})


def test_the_schema_strategy_reaches_valid_states() -> None:
    # The property above is weak if it never produces a valid revision: make sure it does.
    # With a fixed seed: over random ones, a clean run of the suite once met 150 examples with
    # no valid ModelDeployment among them (a rare draw, not a change of the strategy).
    valid = []

    @settings(max_examples=150, deadline=None, database=None, derandomize=True)
    @given(revisions_from_schema())
    def collect(documents: list[Any]) -> None:
        if check_loader({"a.yaml": dump(documents)}) is not None:
            valid.append(documents)

    collect()
    kinds = [sorted({str(d.get("kind")) for d in docs}) for docs in valid]
    assert any("ModelDeployment" in k for k in kinds), f"{len(valid)} valid, kinds: {kinds}"


@FUZZ
@given(st.lists(json_values, max_size=3), st.lists(json_values, max_size=3))
def test_any_yaml_values_are_located(first: list[Any], second: list[Any]) -> None:
    check_loader({"x.yaml": dump(first), "y/z.yaml": dump(second)})


SEEDS = [doc for text in (SERVERS, DEPLOYMENTS) for doc in YAML(typ="safe").load_all(text)]


def _paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [path]
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _paths(item, (*path, index))
    return found


@st.composite
def mutated_manifests(draw: st.DrawFn) -> list[Any]:
    """The valid seed manifests with a few keys dropped, values swapped for wrong types or
    random text, keys added."""
    documents = json.loads(json.dumps(SEEDS))
    for _ in range(draw(st.integers(1, 4))):
        index = draw(st.integers(0, len(documents) - 1))
        path = draw(st.sampled_from(_paths(documents[index])[1:]))
        parent: Any = documents[index]
        for step in path[:-1]:
            parent = parent[step]
        action = draw(st.sampled_from(["drop", "replace", "text", "add"]))
        if action == "drop":
            del parent[path[-1]]
        elif action == "replace":
            parent[path[-1]] = draw(json_values)
        elif action == "text":
            parent[path[-1]] = draw(st.text(max_size=20))
        elif isinstance(parent[path[-1]], dict):
            parent[path[-1]][draw(st.text(max_size=8))] = draw(json_values)
    return documents


@FUZZ
@given(mutated_manifests())
def test_mutated_valid_manifests_load_or_are_located(documents: list[Any]) -> None:
    check_loader({"00-servers.yaml": dump(documents[:2]), "models.yaml": dump(documents[2:])})


@FUZZ
@given(st.data())
def test_mutated_yaml_text_and_random_bytes_are_located(data: st.DataObject) -> None:
    lines = (SERVERS + "---\n" + DEPLOYMENTS).splitlines(keepends=True)
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(lines) - 1))
        action = data.draw(st.sampled_from(["drop", "repeat", "insert", "splice"]))
        if action == "drop":
            del lines[at]
        elif action == "repeat":
            lines.insert(at, lines[at])
        elif action == "insert":
            lines.insert(at, data.draw(st.text(max_size=30)) + "\n")
        else:
            cut = data.draw(st.integers(0, len(lines[at])))
            lines[at] = lines[at][:cut] + data.draw(st.text(max_size=5)) + lines[at][cut:]
    files = {"m.yaml": "".join(lines).encode(), "raw.yaml": data.draw(st.binary(max_size=200))}
    check_loader(files)
