"""The CustomResourceDefinitions generated from schemas/ (issue 45, point 4;
reconciler/core/spec/crds.py): structural as Kubernetes requires (checked here by its rules,
no API server runs here), never stricter than the schemas (every manifest of the examples and
the docs that the schemas accept, a CRD accepts), still refusing what a type or an enum
refuses, and committed as generated (examples/deploy/crds/crds.yaml)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from ruamel.yaml import YAML

from reconciler.core.spec.crds import crd, crds
from reconciler.core.spec.schema import (
    API_GROUP,
    API_GROUPS,
    API_VERSION,
    KIND_SCHEMAS,
    kind_validators,
    schema_documents,
)
from testkit.manifests import router_doc, sequence_deployment_doc
from tests.core import test_spec_defaults

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "examples" / "deploy" / "crds" / "crds.yaml"

# Keywords a CRD's schema refuses (apiextensions.k8s.io/v1), or that OpenAPI v3.0 lacks.
FORBIDDEN = {
    "$ref", "$defs", "$schema", "$id", "definitions", "id", "const", "if", "then", "else",
    "propertyNames", "patternProperties", "dependencies", "additionalItems", "uniqueItems",
    "errorMessage", "examples",
}  # fmt: skip
# What may not stand inside oneOf, anyOf, allOf and not in a structural schema.
NOT_INSIDE = {"type", "description", "default", "additionalProperties", "nullable", "items"}
UNCHECKED = ("x-kubernetes-preserve-unknown-fields", "x-kubernetes-int-or-string")


def structural_problems(node: Mapping[str, Any], path: str = "", inside: bool = False) -> list[str]:
    """Where ``node`` breaks Kubernetes' rules for a structural schema."""
    problems = [f"{path}: {key}" for key in FORBIDDEN & set(node)]
    if inside:
        problems += [f"{path}: {key} inside a combinator" for key in NOT_INSIDE & set(node)]
        problems += [f"{path}: properties inside a combinator" for _ in node.get("properties", ())]
    elif "type" not in node and not any(node.get(flag) for flag in UNCHECKED):
        problems.append(f"{path}: no type")
    if "properties" in node and "additionalProperties" in node:
        problems.append(f"{path}: properties and additionalProperties")
    if node.get("additionalProperties") is False:
        problems.append(f"{path}: additionalProperties false")
    for bound in ("exclusiveMinimum", "exclusiveMaximum"):
        if bound in node and not isinstance(node[bound], bool):
            problems.append(f"{path}: {bound} is no flag")
    if node.get("x-kubernetes-list-type") == "set" and node["items"].get("type") not in (
        "string",
        "integer",
    ):
        problems.append(f"{path}: a set of other than scalars")
    for name, sub in node.get("properties", {}).items():
        problems += structural_problems(sub, f"{path}.{name}", inside)
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), Mapping):
            problems += structural_problems(node[key], f"{path}.{key}", inside)
    for key in ("oneOf", "anyOf", "allOf"):
        for index, sub in enumerate(node.get(key, ())):
            problems += structural_problems(sub, f"{path}.{key}[{index}]", True)
    if "not" in node:
        problems += structural_problems(node["not"], f"{path}.not", True)
    return problems


def schema_of(kind: str) -> dict[str, Any]:
    schema: dict[str, Any] = crd(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


@pytest.mark.parametrize("kind", sorted(KIND_SCHEMAS))
def test_each_crd_is_structural(kind: str) -> None:
    definition = crd(kind)
    assert definition["spec"]["group"] == API_GROUP
    assert definition["metadata"]["name"] == f"{definition['spec']['names']['plural']}.{API_GROUP}"
    problems = structural_problems(schema_of(kind), kind)
    assert problems == [], "\n".join(problems)
    # The check bites: the JSON Schema as written is no CRD schema.
    written = schema_documents()[KIND_SCHEMAS[kind]]["properties"]["spec"]
    assert structural_problems(written, kind), written


def documents() -> Iterator[tuple[str, dict[str, Any]]]:
    """Every manifest of the examples' YAML files and of the docs' YAML blocks."""
    yaml = YAML(typ="safe")
    texts = [(str(p.relative_to(ROOT)), p.read_text()) for p in ROOT.glob("examples/**/*.yaml")]
    for page in [ROOT / "README.md", *ROOT.glob("docs/*.md")]:
        blocks = re.findall(r"```yaml\n(.*?)```", page.read_text(), re.S)
        texts += [(f"{page.name} block {i + 1}", block) for i, block in enumerate(blocks)]
    # The doc exercising every optional object, and the tests' manifests of the richer kinds.
    texts.append(("test_spec_defaults.MANIFESTS", test_spec_defaults.MANIFESTS))
    canary = "{router: edge, strategy: canary, stablePool: s, canaryPool: c, steps: [10%, 50%]}"
    texts.append(("sequence_deployment_doc", sequence_deployment_doc(2, canary, "2:1")))
    blue = "{router: edge, strategy: blueGreen, pools: [s, c]}"
    texts.append(("sequence_deployment_doc", sequence_deployment_doc(1, blue)))
    pools = {"s": ["a"], "c": ["b"]}
    texts.append(("router_doc", router_doc("http://e:9901", pools, "cmp", Path("/r.json"), "h")))
    for where, text in texts:
        try:
            loaded = list(yaml.load_all(text))
        except Exception:  # a block with placeholders: not a manifest to check
            continue
        for doc in loaded:
            if isinstance(doc, dict) and str(doc.get("apiVersion", "")).startswith(API_GROUPS):
                yield where, {**doc, "apiVersion": API_VERSION}  # the legacy group alike


def test_a_crd_accepts_every_manifest_the_schemas_accept() -> None:
    validators = kind_validators()
    checked: dict[str, int] = {}
    refused = []
    for where, doc in documents():
        kind = doc.get("kind")
        if kind not in KIND_SCHEMAS or next(validators[kind].iter_errors(doc), None):
            continue  # the schemas refuse it (a doc's deliberate mistake): nothing to hold
        checked[kind] = checked.get(kind, 0) + 1
        # OpenAPI v3.0's bounds are Draft 4's (exclusiveMinimum a flag beside minimum).
        for error in jsonschema.Draft4Validator(schema_of(kind)).iter_errors(doc):
            refused.append(f"{where} ({kind} {doc['metadata']['name']}): {error.message}")
    assert refused == [], "\n".join(refused)
    assert set(checked) == set(KIND_SCHEMAS) and checked["ModelDeployment"] >= 6, checked


@pytest.mark.parametrize(
    ("kind", "spec", "words"),
    [
        ("ModelDeployment", {"servers": {"names": "edge-a"}, "versions": [1]}, "is not of type"),
        ("ModelDeployment", {"servers": {"names": ["a"]}}, "'versions' is a required"),
        (
            "ModelDeployment",
            {"servers": {"names": ["a"]}, "versions": [1], "rollout": {"traffic": {
                "router": "edge", "strategy": "rainbow"}}},
            "is not one of",
        ),
        ("Router", {"pools": [{"name": "p", "servers": {"names": ["a"]}}]}, "is not valid under"),
        ("TritonServer", {"grpc": 8001}, "is not of type"),
    ],
)  # fmt: skip
def test_a_crd_still_refuses_a_wrong_type_a_missing_key_or_value(
    kind: str, spec: dict[str, Any], words: str
) -> None:
    doc = {"apiVersion": f"{API_GROUP}/v1alpha1", "kind": kind, "metadata": {"name": "x"}}
    errors = [e.message for e in jsonschema.Draft4Validator(schema_of(kind)).iter_errors(
        {**doc, "spec": spec}
    )]  # fmt: skip
    assert any(words in e for e in errors), errors


def test_the_committed_crds_are_as_generated() -> None:
    committed = list(YAML(typ="safe").load_all(COMMITTED.read_text()))
    assert committed == crds(), (
        f"{COMMITTED.relative_to(ROOT)} is not what the schemas give: run "
        "triton-gitops crds > examples/deploy/crds/crds.yaml"
    )
