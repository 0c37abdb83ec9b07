"""The JSON Schemas of the manifest kinds (the single source of
structural validation and of the defaults of optional fields) and messages made from
their errors.

``load_desired_state`` (core/spec/desired.py) validates with them; the builders
(core/spec/build.py) take every default from them through ``default``.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from functools import cache
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

import jsonschema
import referencing

# One API group for every kind, a DNS subdomain as a Kubernetes CRD group must be, so the
# format can become CustomResourceDefinitions unchanged.
API_GROUP = "triton-gitops.dev"
API_VERSION = f"{API_GROUP}/v1alpha1"
# The first spelling, without a DNS group: still read, with a deprecation warning.
LEGACY_API_VERSION = "triton-gitops/v1alpha1"
API_GROUPS = (API_GROUP, LEGACY_API_VERSION.partition("/")[0])
SERVER, DEPLOYMENT, ROUTER = "TritonServer", "ModelDeployment", "Router"
KIND_SCHEMAS = {
    SERVER: "triton-server.schema.json",
    DEPLOYMENT: "model-deployment.schema.json",
    ROUTER: "router.schema.json",
}


JsonPath = tuple[str | int, ...]
# Where a ModelDeployment says how its versions are judged (smoke cases, analysis, gate).
VERIFY: tuple[str, ...] = ("spec", "verify")


def schema_dir() -> Path:
    """Where the JSON Schemas are: inside the installed package, else the source tree's."""
    packaged = resources.files("reconciler") / "schemas"
    if packaged.is_dir():
        return Path(str(packaged))
    return Path(__file__).resolve().parents[3] / "schemas"


@cache
def schema_documents() -> dict[str, Any]:
    return {p.name: json.loads(p.read_text()) for p in schema_dir().glob("*.schema.json")}


@cache
def _registry() -> referencing.Registry[Any]:
    return referencing.Registry().with_resources(
        (s["$id"], referencing.Resource.from_contents(s)) for s in schema_documents().values()
    )


@cache
def kind_validators() -> dict[str, jsonschema.protocols.Validator]:
    return {
        kind: jsonschema.Draft202012Validator(schema_documents()[name], registry=_registry())
        for kind, name in KIND_SCHEMAS.items()
    }


# In a path to a default: any item of an array, any value of a map.
ANY = "*"


def default(kind: str, *path: str) -> Any:
    """The schema's ``default`` for the optional field at ``path`` in a ``kind`` document,
    e.g. ``default("ModelDeployment", "spec", "verify", "timeout")`` is ``"120s"``.

    A KeyError when the schema gives none there: a default lives in the schema only.
    """
    return schema_defaults(kind)[path]


def or_default(values: Mapping[str, Any], kind: str, *path: str) -> Any:
    """The field at ``path`` in a ``kind`` document, ``values`` being the object that holds
    it; the schema's default when it is left out (a KeyError if the schema has none, even
    when it is given: every default is the schema's)."""
    return values.get(path[-1], default(kind, *path))


@cache
def schema_defaults(kind: str) -> Mapping[tuple[str, ...], Any]:
    """Every ``default`` in the schema of ``kind``, by the path of its field."""
    schema = schema_documents()[KIND_SCHEMAS[kind]]
    found: dict[tuple[str, ...], Any] = {}
    _collect_defaults(schema, _registry().resolver(base_uri=schema["$id"]), (), found)
    return MappingProxyType(found)  # cached: shared by every caller


def _collect_defaults(
    node: Mapping[str, Any],
    resolver: Any,  # a referencing Resolver: the package does not export its type
    path: tuple[str, ...],
    found: dict[tuple[str, ...], Any],
) -> None:
    # The schemas are not recursive, so the walk ends; it follows what a document's fields
    # are declared by: properties, items and map values, through $ref.
    if "$ref" in node:
        resolved = resolver.lookup(node["$ref"])
        resolver = resolved.resolver
        node = {**resolved.contents, **{k: v for k, v in node.items() if k != "$ref"}}
    if "default" in node:
        found[path] = node["default"]
    for key, sub in node.get("properties", {}).items():
        _collect_defaults(sub, resolver, (*path, key), found)
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), Mapping):
            _collect_defaults(node[key], resolver, (*path, ANY), found)


_JSON_SCALARS = (str, int, float, type(None))


def foreign_value(value: Any, path: JsonPath) -> tuple[JsonPath, Any] | None:
    """The first value (with its path) that JSON cannot hold: timestamps, sets, binary,
    tagged scalars. Keys are text once loaded (see ``plain``)."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            found = foreign_value(item, (*path, str(key)))
            if found is not None:
                return found
        return None
    if isinstance(value, list):
        for index, item in enumerate(value):
            found = foreign_value(item, (*path, index))
            if found is not None:
                return found
        return None
    return None if isinstance(value, _JSON_SCALARS) else (path, value)


def yaml_type(value: Any) -> str:
    if isinstance(value, datetime.date):  # datetimes too
        return "timestamp"
    if isinstance(value, AbstractSet):
        return "set"
    if isinstance(value, bytes):
        return "binary value"
    return f"value tagged {getattr(value, 'tag', None) or type(value).__name__}"


def json_path_text(path: JsonPath) -> str:
    """A path as the schema messages write it: spec.versions[0]."""
    return ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in path).replace(".[", "[")


def _same_form(error: jsonschema.ValidationError) -> list[jsonschema.ValidationError]:
    """For a oneOf, the errors of the branches of the form the value was written in: an
    object's for an object; for a scalar, the branches of its type (a size written as text
    is judged as text, not as a number), else every scalar branch."""
    branches = error.validator_value
    scalar = [e for e in error.context if branches[e.schema_path[0]].get("type") != "object"]
    if isinstance(error.instance, dict):
        return [e for e in error.context if e not in scalar]
    typed = [e for e in scalar if _of_type(error.instance, branches[e.schema_path[0]].get("type"))]
    return typed or scalar


def _of_type(value: Any, declared: Any) -> bool:
    kinds: dict[str, type | tuple[type, ...]] = {
        "string": str,
        "integer": int,
        "number": (int, float),
        "boolean": bool,
        "array": list,
        "null": type(None),
    }
    if not isinstance(declared, str) or declared not in kinds:
        return False
    if isinstance(value, bool) and declared != "boolean":
        return False  # JSON's true is no number
    return isinstance(value, kinds[declared])


def _specific(error: jsonschema.ValidationError) -> jsonschema.ValidationError:
    """For a oneOf between forms (a scalar or an object, a number or a text), the error of
    the form the value was written in: "'two' is not a whole number", not "valid under
    none"."""
    if error.validator != "oneOf" or not error.context:
        return error
    same_form = _same_form(error)
    return jsonschema.exceptions.best_match(same_form) or error if same_form else error


def _alternatives(error: jsonschema.ValidationError) -> str | None:
    """For a text that fits none of a oneOf's text forms, each form's words at once:
    "'lots' is not a percentage (e.g. 10%) or a size (...)"."""
    if error.validator != "oneOf" or not error.context or not isinstance(error.instance, str):
        return None
    words = [
        str(e.schema["errorMessage"]).removeprefix("is not ")
        for e in _same_form(error)
        if e.validator == "pattern" and "errorMessage" in as_mapping(e.schema)
    ]
    if len(words) < 2:
        return None
    return f"{error.instance!r} is not {' or '.join(dict.fromkeys(words))}"


def schema_message(error: jsonschema.ValidationError) -> str:
    alternatives = _alternatives(error)
    error = _specific(error)
    where = json_path_text(tuple(error.absolute_path))
    if alternatives is not None:
        message = alternatives
    elif error.validator == "not" and error.absolute_path and error.absolute_path[-1] == "config":
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
    elif error.validator == "oneOf" and where == "spec" and "envoy" in str(error.validator_value):
        message = "exactly one of envoy or gatewayAPI is required"
    elif error.validator in ("minProperties", "maxProperties") and where.endswith("servers"):
        message = "exactly one of names or matchLabels is required"
    elif error.validator in ("pattern", "type", "not") and "errorMessage" in as_mapping(
        error.schema
    ):
        # The schema's own words for a value of the wrong form: never its regular expression.
        words = error.schema["errorMessage"]
        scalar = not isinstance(error.instance, dict | list)
        message = f"{error.instance!r} {words}" if scalar else words
    elif error.validator == "pattern":
        message = f"{error.instance!r} is not in the form this field takes"
    elif error.validator == "type":
        expected = error.validator_value
        types: list[str] = expected if isinstance(expected, list) else [expected]
        words = [_TYPE_WORDS.get(t, t) for t in types]
        message = f"{error.instance!r} is not {' or '.join(words)}"
    else:
        message = error.message
    return f"{where}: {message}" if where else message


def as_mapping(schema: Any) -> Mapping[str, Any]:
    return schema if isinstance(schema, Mapping) else {}  # a schema may be true or false


_TYPE_WORDS = {
    "string": "text",
    "integer": "a whole number",
    "number": "a number",
    "boolean": "true or false",
    "object": "a mapping",
    "array": "a list",
    "null": "null",
}
