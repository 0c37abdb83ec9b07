"""Read manifest files into a DesiredState, reporting every problem as FILE:LINE: message.

Called by the CLI's ``validate`` (files from a directory) and by every reconcile pass (files
from a Git commit). YAML is read with ruamel.yaml's round-trip loader, which is safe (it builds
only plain data) and keeps the line of every key and item; the JSON Schemas in ``schemas/`` are
the single source of structural validation; the checks that span documents (unique names,
server references, one deployment per model and server) follow them here.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import replace
from functools import cache
from importlib import resources
from pathlib import Path, PurePosixPath
from typing import Any

import jsonschema
import referencing
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.composer import Composer
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.events import AliasEvent, ScalarEvent
from ruamel.yaml.nodes import MappingNode, ScalarNode
from ruamel.yaml.reader import ReaderError

from reconciler.analysis import AnalysisSpec, Check, NoTraffic
from reconciler.errors import Problem, ValidationError
from reconciler.model_config import canonical
from reconciler.spec.model import (
    BackendSpec,
    DesiredState,
    Discovery,
    Expectation,
    Location,
    ModelDeployment,
    RolloutSpec,
    SequencePolicy,
    ShadowSpec,
    SmokeCase,
    Tensor,
    TritonServer,
)

API_VERSION = "triton-gitops/v1alpha1"
KIND_SCHEMAS = {
    "TritonServer": "triton-server.schema.json",
    "ModelDeployment": "model-deployment.schema.json",
}
MANIFEST_SUFFIXES = (".yaml", ".yml")
# Caps that keep hostile manifests (YAML bombs, deep nesting, huge files) bounded in time and
# memory. A real manifest is a few kilobytes, a few levels deep, a few hundred values.
MAX_MANIFEST_BYTES = 1 << 20  # per file, checked before parsing
MAX_YAML_DEPTH = 64  # nesting of collections, counted through aliases
MAX_YAML_VALUES = 100_000  # per file, every alias counted as the values it stands for

JsonPath = tuple[str | int, ...]


def schema_dir() -> Path:
    """Where the JSON Schemas are: inside the installed package, else the source tree's."""
    packaged = resources.files("reconciler") / "schemas"
    if packaged.is_dir():
        return Path(str(packaged))
    return Path(__file__).resolve().parents[2] / "schemas"


@cache
def _schemas() -> dict[str, Any]:
    return {p.name: json.loads(p.read_text()) for p in schema_dir().glob("*.schema.json")}


@cache
def _registry() -> referencing.Registry[Any]:
    return referencing.Registry().with_resources(
        (s["$id"], referencing.Resource.from_contents(s)) for s in _schemas().values()
    )


@cache
def _validators() -> dict[str, jsonschema.protocols.Validator]:
    return {
        kind: jsonschema.Draft202012Validator(_schemas()[name], registry=_registry())
        for kind, name in KIND_SCHEMAS.items()
    }


class UnreadFile(bytes):
    """A manifest path that was not read, and why: a symbolic link (followed, it could read
    outside the repository; skipped, its models would be unloaded) or a file too large. It
    stands in the files given to ``load_desired_state`` so the path is refused by name."""

    why: str

    def __new__(cls, why: str) -> UnreadFile:
        unread = super().__new__(cls, b"")
        unread.why = why
        return unread

    @staticmethod
    def link(target: str) -> UnreadFile:
        return UnreadFile(
            f"a symbolic link (to {target!r}); a manifest must be a regular file, not read"
        )

    @staticmethod
    def too_large() -> UnreadFile:
        return UnreadFile(f"file is larger than {MAX_MANIFEST_BYTES} bytes, not read")


def manifest_files_in(directory: Path) -> dict[str, bytes]:
    """Every *.yaml / *.yml under ``directory`` (hidden folders skipped), by relative path;
    links are never followed (see UnreadFile)."""
    if not directory.is_dir():
        raise ValidationError([Problem(str(directory), 0, "no such directory")])
    files: dict[str, bytes] = {}
    for path in sorted(directory.rglob("*")):
        relative = path.relative_to(directory)
        if any(part.startswith(".") for part in relative.parts[:-1]):
            continue
        if path.suffix not in MANIFEST_SUFFIXES:
            continue
        if path.is_symlink():
            files[relative.as_posix()] = UnreadFile.link(str(path.readlink()))
        elif path.is_file():
            too_large = path.stat().st_size > MAX_MANIFEST_BYTES
            files[relative.as_posix()] = UnreadFile.too_large() if too_large else path.read_bytes()
    return files


class _Document:
    """One YAML document of one file, with a way to find the line of any path in it."""

    def __init__(self, file: str, root: CommentedMap, start_line: int) -> None:
        self.file = file
        self.root = root
        self.start_line = start_line

    def line(self, path: JsonPath) -> int:
        node: Any = self.root
        line = self.start_line
        for step in path:
            try:
                if isinstance(node, CommentedMap) and step in node:
                    line = node.lc.key(step)[0] + 1
                    node = node[step]
                elif isinstance(node, CommentedSeq) and isinstance(step, int):
                    line = node.lc.item(step)[0] + 1
                    node = node[step]
                else:
                    break
            except (KeyError, IndexError, TypeError, AttributeError):
                break
        return line

    def problem(self, path: JsonPath, message: str) -> Problem:
        return Problem(self.file, self.line(path), message)


def plain(value: Any) -> Any:
    """ruamel's commented containers and scalar subclasses as plain JSON-like Python values."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    return value


class _Refused(MarkedYAMLError):
    """A YAML stream refused for its shape (too deep, too many values), not its syntax."""


class _BoundedComposer(Composer):
    """ruamel's composer, refusing a stream before it grows past the caps. Aliases are
    counted as what they stand for, so a billion laughs is refused while still small; an
    alias inside its own anchor (a cycle) is refused too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._values = 0
        self._level = 0  # nesting of the node being composed
        self._reach = 0  # the deepest level reached so far, aliases expanded
        self._open: set[str] = set()  # anchors being composed
        self._size: dict[str, tuple[int, int]] = {}  # anchor -> (values, levels below it)

    def _grow(self, values: int, reach: int, mark: Any) -> None:
        self._values += values
        self._reach = max(self._reach, reach)
        if self._reach > MAX_YAML_DEPTH:
            raise _Refused(None, None, f"nested deeper than {MAX_YAML_DEPTH} levels", mark)
        if self._values > MAX_YAML_VALUES:
            raise _Refused(
                None,
                None,
                f"more than {MAX_YAML_VALUES} values (aliases counted as what they stand for)",
                mark,
            )

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.parser.peek_event()
        anchor = event.anchor
        if isinstance(parent, MappingNode) and index is None:
            # ruamel cannot hash a key mapping that holds a mapping (TypeError), and JSON keys
            # are text: a key must be a scalar, or an alias of one.
            scalar = isinstance(self.anchors.get(anchor), ScalarNode)
            if not (scalar if isinstance(event, AliasEvent) else isinstance(event, ScalarEvent)):
                raise _Refused(None, None, "a list or mapping used as a key", event.start_mark)
        if isinstance(event, AliasEvent):
            if anchor in self._open:
                raise _Refused(None, None, f"alias *{anchor} refers to itself", event.start_mark)
            values, below = self._size.get(anchor, (1, 0))
            self._grow(values, self._level + 1 + below, event.start_mark)
            return super().compose_node(parent, index)
        self._level += 1
        values_before, reach_before = self._values, self._reach
        self._reach = 0
        self._grow(1, self._level, event.start_mark)
        if anchor is not None:
            self._open.add(anchor)
        node = super().compose_node(parent, index)
        if anchor is not None:
            self._open.discard(anchor)
            self._size[anchor] = (self._values - values_before, self._reach - self._level)
        self._reach = max(self._reach, reach_before)
        self._level -= 1
        return node


def _documents(files: Mapping[str, bytes], problems: list[Problem]) -> Iterator[_Document]:
    for file, content in sorted(files.items()):
        if len(content) > MAX_MANIFEST_BYTES:
            content = UnreadFile.too_large()
        if isinstance(content, UnreadFile):
            problems.append(Problem(file, 1, content.why))
            continue
        try:
            text = content.decode("utf-8")
        except UnicodeDecodeError as exc:
            problems.append(
                Problem(file, 1, f"not UTF-8 text ({exc.reason} at byte {exc.start}): binary?")
            )
            continue
        yaml = YAML(typ="rt")
        yaml.allow_duplicate_keys = False
        yaml.Composer = _BoundedComposer
        try:
            loaded = list(yaml.load_all(text))
        except _Refused as exc:
            line = exc.problem_mark.line + 1 if exc.problem_mark is not None else 1
            problems.append(Problem(file, line, f"YAML refused: {exc.problem}"))
            continue
        except MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            line = mark.line + 1 if mark is not None else 1
            problems.append(Problem(file, line, f"invalid YAML: {exc.problem or exc}"))
            continue
        except ReaderError as exc:
            line = text.count("\n", 0, exc.position) + 1
            problems.append(
                Problem(
                    file,
                    line,
                    f"not text: character U+{exc.character:04X} is not allowed in YAML: binary?",
                )
            )
            continue
        except YAMLError as exc:
            problems.append(Problem(file, 1, f"invalid YAML: {exc}"))
            continue
        for document in loaded:
            if document is None:
                continue
            if not isinstance(document, CommentedMap):
                line = _start_line(document)
                problems.append(Problem(file, line, "a manifest must be a mapping"))
                continue
            doc = _Document(file, document, _start_line(document))
            foreign = _foreign_value(document, ())
            if foreign is not None:
                path, value = foreign
                problems.append(
                    doc.problem(
                        path,
                        f"{_where(path)}: a YAML {_yaml_type(value)} is not a manifest value "
                        "(text, number, boolean, null, list or mapping); quote it if it is text",
                    )
                )
                continue
            yield doc


def _start_line(node: Any) -> int:
    # Some documents carry no position: a lone '=' is the YAML 1.1 value key, for one.
    line = getattr(getattr(node, "lc", None), "line", None)
    return line + 1 if isinstance(line, int) else 1


_JSON_SCALARS = (str, int, float, type(None))


def _foreign_value(value: Any, path: JsonPath) -> tuple[JsonPath, Any] | None:
    """The first value (with its path) that JSON cannot hold: timestamps, sets, binary,
    tagged scalars. Keys are text once loaded (see ``plain``)."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            found = _foreign_value(item, (*path, str(key)))
            if found is not None:
                return found
        return None
    if isinstance(value, list):
        for index, item in enumerate(value):
            found = _foreign_value(item, (*path, index))
            if found is not None:
                return found
        return None
    return None if isinstance(value, _JSON_SCALARS) else (path, value)


def _yaml_type(value: Any) -> str:
    if isinstance(value, datetime.date):  # datetimes too
        return "timestamp"
    if isinstance(value, AbstractSet):
        return "set"
    if isinstance(value, bytes):
        return "binary value"
    return f"value tagged {getattr(value, 'tag', None) or type(value).__name__}"


def _where(path: JsonPath) -> str:
    """A path as the schema messages write it: spec.versions[0]."""
    return ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in path).replace(".[", "[")


def _specific(error: jsonschema.ValidationError) -> jsonschema.ValidationError:
    """For a oneOf between a scalar form and an object form, the error of the form the
    value was written in: "'two' is not of type 'integer'", not "valid under none"."""
    if error.validator != "oneOf" or not error.context:
        return error
    written_as_object = isinstance(error.instance, dict)
    branches = error.validator_value
    same_form = [
        e
        for e in error.context
        if (branches[e.schema_path[0]].get("type") == "object") == written_as_object
    ]
    return jsonschema.exceptions.best_match(same_form) or error if same_form else error


def _schema_message(error: jsonschema.ValidationError) -> str:
    error = _specific(error)
    where = _where(tuple(error.absolute_path))
    if error.validator == "not" and error.absolute_path and error.absolute_path[-1] == "config":
        message = "version_policy is set by the reconciler from spec.versions; remove it"
    elif error.validator == "not" and where.endswith("shadow.requests"):
        message = f"{error.instance!r} must stay inside the repository: no '..' part, no '\\'"
    elif error.validator == "oneOf" and "checks" in error.absolute_path:
        message = (
            "a check needs exactly one of successRate, latency, memory or promql "
            "(promql with min and/or max)"
        )
    elif error.validator == "oneOf" and where == "spec" and "grpc" in str(error.validator_value):
        message = "exactly one of grpc (with an optional metrics URL) or discovery is required"
    elif error.validator in ("minProperties", "maxProperties") and where.endswith("servers"):
        message = "exactly one of names or matchLabels is required"
    elif error.validator == "pattern" and isinstance(error.instance, str):
        message = f"{error.instance!r} does not match {error.validator_value!r}"
    else:
        message = error.message
    return f"{where}: {message}" if where else message


_DURATION = re.compile(r"^([0-9]+)(ms|s|m|h)$")
_SIZE = re.compile(r"^([0-9]+)(Ki|Mi|Gi|Ti)?$")


def _seconds(text: str) -> float:
    match = _DURATION.match(text)
    assert match is not None  # the schema's pattern guarantees the form
    factor = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}[match.group(2)]
    return int(match.group(1)) * factor


def _bytes(value: int | str) -> int:
    if isinstance(value, int):
        return value
    match = _SIZE.match(value)
    assert match is not None  # the schema's pattern guarantees the form
    return int(match.group(1)) << {None: 0, "Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40}[match.group(2)]


def _flat(data: list[Any]) -> list[Any]:
    out: list[Any] = []
    for item in data:
        out.extend(_flat(item) if isinstance(item, list) else [item])
    return out


def _build_server(doc: _Document, spec: dict[str, Any]) -> TritonServer:
    metadata, body = spec["metadata"], spec["spec"]
    discovery = body.get("discovery")
    return TritonServer(
        name=metadata["name"],
        labels=dict(metadata.get("labels", {})),
        grpc=body.get("grpc", ""),
        metrics=body.get("metrics"),
        model_repository=body.get("modelRepository"),
        location=Location(doc.file, doc.start_line),
        discovery=(
            Discovery(
                discovery["dns"],
                discovery["grpcPort"],
                discovery.get("metricsPort"),
                _seconds(discovery.get("refresh", "10s")),
            )
            if discovery
            else None
        ),
    )


def _build_deployment(
    doc: _Document, spec: dict[str, Any], problems: list[Problem]
) -> ModelDeployment:
    metadata, body = spec["metadata"], spec["spec"]
    model = body.get("model", metadata["name"])
    config = body.get("config", {})
    try:
        canonical(config)
    except ValueError as exc:
        # Point at the offending key when protobuf names one of spec.config's own keys.
        named = re.search(r'field named "([^"]+)"|parse (\w+) field', str(exc))
        key = next((k for k in (named.groups() if named else ()) if k in config), None)
        where: JsonPath = ("spec", "config", key) if key else ("spec", "config")
        problems.append(doc.problem(where, f"spec.config: {exc}"))
    if "name" in config and config["name"] != model:
        problems.append(
            doc.problem(
                ("spec", "config", "name"),
                f"config.name {config['name']!r} must equal the model name {model!r}",
            )
        )
    verify = body.get("verify", {})
    smoke: list[SmokeCase] = []
    for index, case in enumerate(verify.get("smoke", [])):
        path: JsonPath = ("spec", "verify", "smoke", index)
        inputs = []
        for name, tensor in case["inputs"].items():
            data = _flat(tensor["data"])
            if math.prod(tensor["shape"]) != len(data):
                problems.append(
                    doc.problem(
                        (*path, "inputs", name, "data"),
                        f"input {name}: shape {tensor['shape']} holds "
                        f"{math.prod(tensor['shape'])} values, data has {len(data)}",
                    )
                )
            inputs.append(Tensor(name, tensor["datatype"], tuple(tensor["shape"]), tuple(data)))
        expect = []
        for name, expected in case.get("expect", {}).items():
            data = _flat(expected["data"])
            shape = expected.get("shape")
            if shape is not None and math.prod(shape) != len(data):
                problems.append(
                    doc.problem(
                        (*path, "expect", name, "data"),
                        f"output {name}: shape {shape} holds {math.prod(shape)} values, "
                        f"data has {len(data)}",
                    )
                )
            expect.append(
                Expectation(
                    name,
                    tuple(data),
                    tuple(shape) if shape is not None else None,
                    float(expected.get("tolerance", 0.0)),
                )
            )
        smoke.append(SmokeCase(case.get("name", f"smoke[{index}]"), tuple(inputs), tuple(expect)))
    numbers: list[Any] = []
    digests: dict[int, str] = {}
    for entry in body["versions"]:
        number = entry["version"] if isinstance(entry, dict) else entry
        numbers.append(number)
        if isinstance(entry, dict) and isinstance(number, int):
            digests[number] = entry["digest"]
    if len(set(numbers)) != len(numbers):
        problems.append(doc.problem(("spec", "versions"), "spec.versions lists a version twice"))
    for index, version in enumerate(numbers):
        # JSON Schema's integer admits 2.0; a version number must be written as one.
        if not isinstance(version, int):
            problems.append(
                doc.problem(
                    ("spec", "versions", index),
                    f"spec.versions[{index}]: {version!r} is not a whole version number",
                )
            )
    servers = body["servers"]
    analysis = verify.get("analysis")
    return ModelDeployment(
        name=metadata["name"],
        model=model,
        versions=tuple(sorted(int(v) for v in numbers)),
        server_names=tuple(servers["names"]) if "names" in servers else None,
        match_labels=dict(servers["matchLabels"]) if "matchLabels" in servers else None,
        config=config,
        smoke=tuple(smoke),
        verify_timeout=_seconds(verify.get("timeout", "120s")),
        analysis=_analysis(analysis) if analysis is not None else None,
        suspend=bool(body.get("suspend", False)),
        digests=digests,
        depends_on=tuple(body.get("dependsOn", ())),
        sequence=(
            SequencePolicy(
                _seconds(body["sequence"].get("drainTimeout", "300s")),
                _seconds(body["sequence"].get("idle", "10s")),
                body["sequence"].get("drainWebhook"),
            )
            if "sequence" in body
            else None
        ),
        backend=(
            BackendSpec(
                body["backend"]["name"],
                body["backend"]["revision"],
                tuple(body["backend"].get("replaceLibrary", {}).get("command", ())) or None,
                body["backend"].get("replaceLibrary", {}).get("webhook"),
            )
            if "backend" in body
            else None
        ),
        memory_per_version=(
            _bytes(body["resources"]["memory"]) if "memory" in body.get("resources", {}) else None
        ),
        allow_interface_change=bool(body.get("allowInterfaceChange", False)),
        when_no_headroom=body.get("rollout", {}).get("whenNoHeadroom", "refuse"),
        rollout=_rollout(body.get("rollout", {})),
        shadow=(
            ShadowSpec(
                verify["shadow"]["requests"],
                float(verify["shadow"].get("compare", {}).get("tolerance", 0.0)),
                float(verify["shadow"].get("compare", {}).get("minAgreement", 1.0)),
                verify["shadow"].get("compare", {}).get("maxLatencyIncrease"),
                location=Location(doc.file, doc.line(("spec", "verify", "shadow", "requests"))),
            )
            if "shadow" in verify
            else None
        ),
        location=Location(doc.file, doc.start_line),
        analysis_location=(
            Location(doc.file, doc.line(("spec", "verify", "analysis")))
            if analysis is not None
            else None
        ),
        fingerprint=fingerprint_of(body),
    )


def fingerprint_of(spec: Mapping[str, Any]) -> str:
    """A short digest of a ModelDeployment's spec, stable across key order and layout."""
    text = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _rollout(spec: dict[str, Any]) -> RolloutSpec:
    preview = spec.get("preview", {}).get("servers", {})
    webhooks = spec.get("webhooks", {})
    return RolloutSpec(
        steps=tuple(step["servers"] for step in spec.get("steps", ())),
        max_parallel=spec.get("maxParallel"),
        preview_names=tuple(preview["names"]) if "names" in preview else None,
        preview_labels=dict(preview["matchLabels"]) if "matchLabels" in preview else None,
        pre_step=webhooks.get("preStep"),
        post_step=webhooks.get("postStep"),
    )


def _analysis(spec: dict[str, Any]) -> AnalysisSpec:
    checks = []
    for check in spec["checks"]:
        if "successRate" in check:
            checks.append(Check(check["name"], "successRate", min=check["successRate"]["min"]))
        elif "latency" in check:
            checks.append(
                Check(check["name"], "latency", max_increase=check["latency"]["maxIncrease"])
            )
        elif "memory" in check:
            checks.append(
                Check(
                    check["name"],
                    "memory",
                    max_increase_bytes=check["memory"]["maxIncreaseBytes"],
                )
            )
        else:
            checks.append(
                Check(
                    check["name"],
                    "promql",
                    min=check.get("min"),
                    max=check.get("max"),
                    query=check["promql"],
                )
            )
    return AnalysisSpec(
        interval=_seconds(spec.get("interval", "10s")),
        duration=_seconds(spec.get("duration", "60s")),
        failure_limit=spec.get("failureLimit", 0),
        no_traffic=NoTraffic(spec.get("noTraffic", "wait")),
        checks=tuple(checks),
    )


def load_desired_state(files: Mapping[str, bytes]) -> DesiredState:
    """Parse, validate and cross-check manifests; raise ValidationError with every problem."""
    problems: list[Problem] = []
    servers: list[tuple[_Document, TritonServer]] = []
    deployments: list[tuple[_Document, ModelDeployment]] = []
    validators = _validators()
    for doc in _documents(files, problems):
        api_version, kind = doc.root.get("apiVersion"), doc.root.get("kind")
        if api_version != API_VERSION:
            problems.append(
                doc.problem(
                    ("apiVersion",),
                    f"unknown apiVersion {api_version!r} (expected {API_VERSION!r})"
                    if api_version is not None
                    else "apiVersion is required",
                )
            )
            continue
        if not isinstance(kind, str) or kind not in KIND_SCHEMAS:
            problems.append(
                doc.problem(
                    ("kind",),
                    f"unknown kind {kind!r} (expected one of {', '.join(sorted(KIND_SCHEMAS))})",
                )
            )
            continue
        data = plain(doc.root)
        errors = sorted(
            validators[kind].iter_errors(data), key=lambda e: [str(p) for p in e.absolute_path]
        )
        if errors:
            problems.extend(doc.problem(tuple(e.absolute_path), _schema_message(e)) for e in errors)
            continue
        if kind == "TritonServer":
            servers.append((doc, _build_server(doc, data)))
        else:
            deployments.append((doc, _build_deployment(doc, data, problems)))
    problems.extend(_cross_check(servers, deployments))
    problems.extend(_dependency_problems(deployments))
    if problems:
        raise ValidationError(problems)
    return DesiredState.build([s for _, s in servers], [d for _, d in deployments])


def _cross_check(
    servers: list[tuple[_Document, TritonServer]],
    deployments: list[tuple[_Document, ModelDeployment]],
) -> Iterator[Problem]:
    seen_servers: dict[str, TritonServer] = {}
    for doc, server in servers:
        if server.name in seen_servers:
            first = seen_servers[server.name].location
            yield doc.problem(
                ("metadata", "name"),
                f"duplicate TritonServer name {server.name!r} (first defined at {first})",
            )
        else:
            seen_servers[server.name] = server
    seen_deployments: dict[str, ModelDeployment] = {}
    placed: dict[tuple[str, str], ModelDeployment] = {}
    for doc, deployment in deployments:
        if deployment.name in seen_deployments:
            first = seen_deployments[deployment.name].location
            yield doc.problem(
                ("metadata", "name"),
                f"duplicate ModelDeployment name {deployment.name!r} (first defined at {first})",
            )
            continue
        seen_deployments[deployment.name] = deployment
        if deployment.server_names is not None:
            for index, name in enumerate(deployment.server_names):
                if name not in seen_servers:
                    yield doc.problem(
                        ("spec", "servers", "names", index),
                        f"ModelDeployment {deployment.name!r} names unknown TritonServer {name!r}",
                    )
        targets = [s for s in seen_servers.values() if deployment.selects(s)]
        if deployment.match_labels is not None and not targets:
            yield doc.problem(
                ("spec", "servers", "matchLabels"),
                f"ModelDeployment {deployment.name!r}: matchLabels "
                f"{dict(deployment.match_labels)} match no TritonServer",
            )
        for server in targets:
            other = placed.get((server.name, deployment.model))
            if other is not None:
                yield doc.problem(
                    ("spec",),
                    f"model {deployment.model!r} on server {server.name!r} is already placed by "
                    f"ModelDeployment {other.name!r} ({other.location})",
                )
            else:
                placed[(server.name, deployment.model)] = deployment
        complete = "backend" in deployment.config or "platform" in deployment.config
        blind = [s.name for s in targets if s.model_repository is None]
        if blind and not complete:
            yield doc.problem(
                ("spec",),
                f"ModelDeployment {deployment.name!r}: server(s) {', '.join(blind)} declare no "
                "spec.modelRepository to read the base config from, so spec.config must be "
                "complete (at least backend or platform, inputs and outputs)",
            )


def analysis_source_problems(desired: DesiredState, *, prometheus: bool) -> list[Problem]:
    """Analyses that cannot read their metrics: PromQL checks without Prometheus, any check
    on a server without a metrics URL."""
    problems = []
    for deployment in desired.deployments.values():
        spec, where = deployment.analysis, deployment.analysis_location
        if spec is None or where is None:
            continue
        if spec.needs_prometheus and not prometheus:
            names = ", ".join(c.name for c in spec.checks if c.kind == "promql")
            problems.append(
                Problem(where.file, where.line, f"promql check(s) {names} need --prometheus-url")
            )
        # Metrics are located by each server's metrics URL, scraped directly or as the
        # Prometheus target's instance label.
        blind = sorted(
            s.name
            for s in desired.servers.values()
            if deployment.selects(s)
            and s.metrics is None
            and not (s.discovery and s.discovery.metrics_port)
        )
        if blind:
            problems.append(
                Problem(
                    where.file,
                    where.line,
                    f"the analysis of {deployment.name!r} needs metrics: set spec.metrics on "
                    f"TritonServer(s) {', '.join(blind)}",
                )
            )
    return problems


def dependency_cycle(edges: Mapping[str, Iterable[str]]) -> list[str] | None:
    """A cycle in ``edges`` (node -> the nodes it depends on), as [a, b, ..., a], or None."""
    done: set[str] = set()
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return None
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            found = visit(nxt)
            if found:
                return found
        path.pop()
        done.add(node)
        return None

    for node in sorted(edges):
        found = visit(node)
        if found:
            return found
    return None


def _dependency_problems(
    deployments: list[tuple[_Document, ModelDeployment]],
) -> Iterator[Problem]:
    """dependsOn naming unknown ModelDeployments; cycles through dependsOn and ensembles."""
    names = {d.name for _, d in deployments}
    by_model: dict[str, set[str]] = {}
    for _, d in deployments:
        by_model.setdefault(d.model, set()).add(d.name)
    edges: dict[str, set[str]] = {}
    where: dict[str, _Document] = {}
    for doc, d in deployments:
        where[d.name] = doc
        for index, other in enumerate(d.depends_on):
            if other not in names:
                yield doc.problem(
                    ("spec", "dependsOn", index),
                    f"ModelDeployment {d.name!r} depends on unknown ModelDeployment {other!r}",
                )
        edges[d.name] = {o for o in d.depends_on if o in names} | {
            n for m in d.composing_models for n in by_model.get(m, ())
        }
    cycle = dependency_cycle(edges)
    if cycle:
        yield where[cycle[0]].problem(
            ("spec",), f"dependency cycle: {' -> '.join(cycle)} (through dependsOn and ensembles)"
        )


MAX_SHADOW_REQUESTS = 10_000
MAX_SHADOW_FILE_BYTES = 64 << 20


def read_in_directory(directory: Path, name: str, limit: int) -> bytes | None:
    """The regular file ``name`` under ``directory`` (at most ``limit + 1`` bytes), or None
    when it is absent, escapes the directory or passes through a symbolic link: what a Git
    tree gives for the same name (GitSource.read_file)."""
    path = directory
    for part in PurePosixPath(name).parts:
        if part in ("/", "..") or path.is_symlink():
            return None
        path = path / part
    if path.is_symlink() or not path.is_file() or path.stat().st_size > limit:
        return None
    return path.read_bytes()


def attach_shadow_requests(
    desired: DesiredState, read: Callable[[str], bytes | None]
) -> DesiredState:
    """Read every ModelDeployment's shadow requests file (``read`` gives a file of the
    revision, or None) into its spec; every problem as FILE:LINE."""
    problems: list[Problem] = []
    tensor = {"$ref": _schemas()["common.schema.json"]["$id"] + "#/$defs/tensor"}
    validator = jsonschema.Draft202012Validator(
        {"type": "object", "required": ["inputs"],
         "properties": {"inputs": {"type": "object", "minProperties": 1,
                                   "additionalProperties": tensor}}},
        registry=_validators()["ModelDeployment"]._registry,
    )  # fmt: skip
    deployments = []
    for deployment in desired.deployments.values():
        shadow = deployment.shadow
        if shadow is None:
            deployments.append(deployment)
            continue
        content = read(shadow.requests_file)
        if content is None or len(content) > MAX_SHADOW_FILE_BYTES:
            problems.append(
                Problem(
                    shadow.location.file,
                    shadow.location.line,
                    f"shadow requests file {shadow.requests_file!r} is not in the repository "
                    f"as a regular file (absent, a symbolic link or over {MAX_SHADOW_FILE_BYTES} "
                    "bytes)",
                )
            )
            continue
        requests = []
        for number, line in enumerate(content.decode("utf-8", "replace").splitlines(), 1):
            if not line.strip():
                continue
            try:
                request = json.loads(line)
            except (ValueError, RecursionError) as exc:
                # json refuses deep nesting with RecursionError: a bomb, not a crash.
                why = "nested too deeply" if isinstance(exc, RecursionError) else exc
                problems.append(Problem(shadow.requests_file, number, f"not JSON: {why}"))
                continue
            errors = list(validator.iter_errors(request))
            if errors:
                problems.extend(
                    Problem(shadow.requests_file, number, _schema_message(e)) for e in errors
                )
                continue
            requests.append(
                tuple(
                    Tensor(name, t["datatype"], tuple(t["shape"]), tuple(_flat(t["data"])))
                    for name, t in request["inputs"].items()
                )
            )
        if len(requests) > MAX_SHADOW_REQUESTS:
            problems.append(
                Problem(shadow.requests_file, 1, f"more than {MAX_SHADOW_REQUESTS} requests")
            )
        deployments.append(replace(deployment, shadow=replace(shadow, requests=tuple(requests))))
    if problems:
        raise ValidationError(problems)
    return DesiredState.build(list(desired.servers.values()), deployments)
