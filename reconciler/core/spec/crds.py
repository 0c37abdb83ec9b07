"""CustomResourceDefinitions of the three kinds, generated from the JSON Schemas in
``schemas/`` (the one source of structural validation), so that a cluster that installs them
can ``kubectl explain modeldeployment.spec.rollout`` and ``kubectl apply --dry-run=server`` a
manifest. The reconciler never reads these objects from the API server: Git is the source
(README, *Custom resources*).

A CRD's schema must be structural (Kubernetes' "Specifying a structural schema"): a type on
every node, no ``$ref``, nothing but value checks inside ``oneOf``/``anyOf``/``allOf``/
``not``, and none of JSON Schema 2020-12's keywords that OpenAPI v3.0 lacks. The conversion
keeps every check it can and drops those it cannot express, each named in ``DROPPED`` (the
reconciler still makes them when it reads the manifests): a CRD is never stricter than the
schemas, and may be looser.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reconciler.core.spec.schema import API_GROUP, KIND_SCHEMAS, schema_documents

VERSION = "v1alpha1"
# What the conversion leaves out, and why: said in the README and in each CRD's annotation.
DROPPED = {
    "additionalProperties: false": "a CRD prunes unknown fields (kubectl warns of them)",
    "propertyNames": "no CRD keyword checks a map's keys",
    "if/then": "traffic's per-strategy requirements (canary: stablePool, canaryPool, steps; "
    "blueGreen: pools) are not expressible",
    "a value of one of several types": "an integer or a text is x-kubernetes-int-or-string, "
    "an integer or a mapping is left unchecked (x-kubernetes-preserve-unknown-fields)",
    "errorMessage": "the schemas' own words for a wrong form are the reconciler's",
}
# Kept as they are: what OpenAPI v3.0 and a structural schema allow on a node.
_VALUE_CHECKS = frozenset(
    {
        "description", "default", "enum", "pattern", "minimum", "maximum", "minLength",
        "maxLength", "minItems", "maxItems", "minProperties", "maxProperties", "multipleOf",
        "required", "format", "title",
    }
)  # fmt: skip
# What may stand inside oneOf, anyOf, allOf and not (no type, no description, no default).
_INSIDE = frozenset(
    {
        "enum", "pattern", "minimum", "maximum", "minLength", "maxLength", "minItems",
        "maxItems", "minProperties", "maxProperties", "multipleOf", "required", "format",
        "exclusiveMinimum", "exclusiveMaximum",
    }
)  # fmt: skip
_PLURALS = {"TritonServer": "tritonservers", "ModelDeployment": "modeldeployments"}


def _resolve(node: Mapping[str, Any], document: str) -> tuple[Mapping[str, Any], str]:
    """A node with its ``$ref`` followed (its sibling keywords win), and the document the
    result's own references are relative to."""
    while "$ref" in node:
        target, _, pointer = str(node["$ref"]).partition("#")
        document = target or document
        found: Any = schema_documents()[document]
        for part in pointer.strip("/").split("/") if pointer.strip("/") else ():
            found = found[part]
        node = {**found, **{k: v for k, v in node.items() if k != "$ref"}}
    return node, document


def _bounds(node: Mapping[str, Any]) -> dict[str, Any]:
    """2020-12's exclusive bounds (numbers) as OpenAPI v3.0's (flags beside the bound)."""
    out: dict[str, Any] = {}
    for exclusive, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(node.get(exclusive), int | float) and not isinstance(
            node.get(exclusive), bool
        ):
            out[bound] = node[exclusive]
            out[exclusive] = True
    return out


def _checks_only(node: Mapping[str, Any], document: str) -> dict[str, Any]:
    """What may stand inside a combinator: value checks, and combinators of them."""
    node, document = _resolve(node, document)
    out: dict[str, Any] = {k: v for k, v in node.items() if k in _INSIDE}
    out.update(_bounds(node))
    if "const" in node:
        out["enum"] = [node["const"]]
    for key in ("oneOf", "anyOf", "allOf"):
        if key in node:
            branches = [_checks_only(b, document) for b in node[key]]
            if all(branches):
                out[key] = branches
    if "not" in node:
        inner = _checks_only(node["not"], document)
        if inner:
            out["not"] = inner
    return out


def _type_of(node: Mapping[str, Any], document: str) -> str | None:
    node, _ = _resolve(node, document)
    if isinstance(node.get("type"), str):
        return str(node["type"])
    if "properties" in node or "required" in node:
        return "object"
    if "const" in node:
        return {bool: "boolean", int: "integer", float: "number", str: "string"}.get(
            type(node["const"])
        )
    return None


def structural(node: Mapping[str, Any], document: str) -> dict[str, Any]:
    """One JSON Schema node (2020-12, with references into ``schemas/``) as a structural
    OpenAPI v3.0 schema node."""
    node, document = _resolve(node, document)
    out: dict[str, Any] = {k: v for k, v in node.items() if k in _VALUE_CHECKS}
    out.update(_bounds(node))
    if "const" in node:
        out["enum"] = [node["const"]]
    kind = _type_of(node, document)
    alternatives = [b for key in ("oneOf", "anyOf") for b in node.get(key, ())]
    typed = {_type_of(b, document) for b in alternatives} - {None}
    if typed:
        # A value of one of several forms: the forms' types decide what a CRD can say.
        if len(typed) == 1 and kind in (None, *typed):
            kind = typed.pop()
            for branch in alternatives:
                branch, where = _resolve(branch, document)
                for name, sub in branch.get("properties", {}).items():
                    out.setdefault("properties", {})[name] = structural(sub, where)
            for key in ("oneOf", "anyOf"):
                checks = [_checks_only(b, document) for b in node.get(key, ())]
                if key in node and all(checks):
                    out[key] = checks
        elif typed == {"integer", "string"}:
            out["x-kubernetes-int-or-string"] = True
            return out
        else:
            out["x-kubernetes-preserve-unknown-fields"] = True
            return out
    else:
        for key in ("oneOf", "anyOf", "allOf"):
            checks = [_checks_only(b, document) for b in node.get(key, ())]
            if key in node and checks and all(checks):
                out[key] = checks
    if "not" in node:
        inner = _checks_only(node["not"], document)
        if inner:
            out["not"] = inner
    if kind is None:
        out["x-kubernetes-preserve-unknown-fields"] = True
        return out
    out["type"] = kind
    if kind == "object":
        for name, sub in node.get("properties", {}).items():
            out.setdefault("properties", {})[name] = structural(sub, document)
        extra = node.get("additionalProperties")
        if isinstance(extra, Mapping) and "properties" not in out:
            out["additionalProperties"] = structural(extra, document)
        elif extra is not False and "properties" not in out:
            out["x-kubernetes-preserve-unknown-fields"] = True  # free-form (spec.config)
    if kind == "array" and "items" in node:
        out["items"] = structural(node["items"], document)
        if node.get("uniqueItems") and out["items"].get("type") in ("string", "integer"):
            out["x-kubernetes-list-type"] = "set"
    return out


def crd(kind: str) -> dict[str, Any]:
    """The CustomResourceDefinition of ``kind`` (apiextensions.k8s.io/v1)."""
    document = KIND_SCHEMAS[kind]
    root = schema_documents()[document]
    spec = structural(root["properties"]["spec"], document)
    plural = _PLURALS.get(kind, kind.lower() + "s")
    schema = {
        "description": root.get("description", kind),
        "type": "object",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{API_GROUP}",
            "annotations": {
                "triton-gitops.dev/generated-from": f"schemas/{document}",
                "triton-gitops.dev/not-checked-here": "; ".join(sorted(DROPPED)),
            },
        },
        "spec": {
            "group": API_GROUP,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "categories": ["triton-gitops"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }


def crds() -> list[dict[str, Any]]:
    """Every kind's CustomResourceDefinition, in the order of ``KIND_SCHEMAS``."""
    return [crd(kind) for kind in KIND_SCHEMAS]
