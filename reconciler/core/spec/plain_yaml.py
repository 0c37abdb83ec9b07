"""The fast reading of plain manifests: libyaml (PyYAML's C parser) composes the nodes, with
the line of each, and the values are built here by YAML 1.2's core rules, as ruamel.yaml's
round trip builds them (``yes`` is text, ``1.0`` a number).

A manifest is read here only when it is plain: no alias, no explicit tag, no ``%YAML``
directive, no merge key, no duplicate or non-text key, text, whole numbers in decimal,
decimals, booleans and nulls only, within the caps of ``core.spec.yaml``. Anything else, and
any error of the text, is left to ruamel.yaml's reader (``NotPlain`` says so), which says
what is wrong in the words and at the lines it always has: errors and odd manifests are few,
plain manifests are thousands. ruamel's round trip composes about 9 ms a small manifest in
pure Python (issue 46: 10.7 s to validate 1,000); libyaml under 1 ms.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import yaml

# What libyaml tags a node that carries no tag of its own: a plain scalar is resolved below
# by YAML 1.2's rules (PyYAML's own resolver is YAML 1.1's: ``yes`` a boolean, ``010`` 8).
# Tags no YAML text can write, so that a tag written in the text (``!!str 5``, which ruamel
# keeps as a tagged value) is told apart and left to ruamel.
_PLAIN = "?plain"
_STR = "?text"
_SEQ = "?list"
_MAP = "?mapping"

# YAML 1.2's core schema as ruamel.yaml (0.18, 0.19: resolver.py) resolves a plain scalar,
# its regular expressions copied. Of what they match, whole numbers in decimal and decimals
# without underscores are built here; other bases, underscores, infinities, NaN, timestamps,
# merge keys and ``=`` are left to ruamel.
_NULL = re.compile(r"^(?:~|null|Null|NULL|)$")
_BOOL = {"true": True, "True": True, "TRUE": True, "false": False, "False": False, "FALSE": False}
_RUAMEL_INT = re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0o?[0-7_]+|[-+]?[0-9_]+|[-+]?0x[0-9a-fA-F_]+)$")
_RUAMEL_FLOAT = re.compile(
    r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |[-+]?\.[0-9_]+(?:[eE][-+][0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.X,
)
_RUAMEL_OTHER = re.compile(
    r"""^(?:[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]
    |[0-9][0-9][0-9][0-9] -[0-9][0-9]? -[0-9][0-9]?
    (?:[Tt]|[ \t]+)[0-9][0-9]?
    :[0-9][0-9] :[0-9][0-9] (?:\.[0-9]*)?
    (?:[ \t]*(?:Z|[-+][0-9][0-9]?(?::[0-9][0-9])?))?
    |<<|=)$""",
    re.X,
)
_DECIMAL = re.compile(r"^[-+]?(?:0|[1-9][0-9]*)$")
_DIRECTIVE = re.compile(r"^%", re.M)


class _Loader(yaml.CSafeLoader):
    """libyaml's composer, every untagged node tagged for the rules here (``_PLAIN`` ...)."""

    def resolve(self, kind: Any, value: Any, implicit: Any) -> str:
        if kind is yaml.ScalarNode:
            return _PLAIN if implicit[0] else _STR
        return _SEQ if kind is yaml.SequenceNode else _MAP


class NotPlain(Exception):
    """The text is not a plain manifest: ruamel.yaml reads it instead."""


@dataclass
class Lines:
    """Where each key and item of one document is: per mapping (by ``id``), the line of each
    key; per sequence, the line of each item (1-based, as ``Document.line`` gives them)."""

    keys: dict[int, dict[str, int]] = field(default_factory=dict)
    items: dict[int, list[int]] = field(default_factory=dict)


@dataclass
class _Count:
    values: int = 0


def plain_documents(text: str, max_depth: int, max_values: int) -> list[tuple[Any, int, Lines]]:
    """Each document of ``text``: its value (None for an empty one), the line it starts at and
    where its keys and items are. Raises ``NotPlain`` for a text ruamel must read."""
    if _DIRECTIVE.search(text):
        raise NotPlain("a directive")
    try:
        nodes = list(yaml.compose_all(text, Loader=_Loader))
    except yaml.YAMLError as exc:
        raise NotPlain(str(exc)) from exc
    count = _Count()
    documents = []
    for node in nodes:
        lines = Lines()
        value = _value(node, 1, set(), lines, count, max_depth, max_values)
        documents.append((value, node.start_mark.line + 1, lines))
    return documents


def _value(
    node: Any,
    depth: int,
    seen: set[int],
    lines: Lines,
    count: _Count,
    max_depth: int,
    max_values: int,
) -> Any:
    # An alias is a node met twice (libyaml shares it): ruamel counts and refuses them.
    if id(node) in seen:
        raise NotPlain("an alias")
    seen.add(id(node))
    count.values += 1
    if depth > max_depth or count.values > max_values:
        raise NotPlain("past the caps")
    tag = node.tag
    if tag == _PLAIN:
        return _scalar(node.value)
    if tag == _STR and isinstance(node, yaml.ScalarNode):
        return node.value
    if tag == _SEQ and isinstance(node, yaml.SequenceNode):
        values = []
        at = []
        for item in node.value:
            at.append(item.start_mark.line + 1)
            values.append(_value(item, depth + 1, seen, lines, count, max_depth, max_values))
        lines.items[id(values)] = at
        return values
    if tag == _MAP and isinstance(node, yaml.MappingNode):
        mapping: dict[str, Any] = {}
        keys: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = _value(key_node, depth + 1, seen, lines, count, max_depth, max_values)
            if not isinstance(key, str) or key in mapping:
                raise NotPlain("a key that is not text, or twice")
            keys[key] = key_node.start_mark.line + 1
            mapping[key] = _value(value_node, depth + 1, seen, lines, count, max_depth, max_values)
        lines.keys[id(mapping)] = keys
        return mapping
    raise NotPlain(f"the tag {tag}")


def _scalar(text: str) -> Any:
    """A plain scalar by YAML 1.2's core schema."""
    if _NULL.match(text):
        return None
    if text in _BOOL:
        return _BOOL[text]
    if _RUAMEL_INT.match(text):
        if _DECIMAL.match(text):
            return int(text)
        raise NotPlain(f"the whole number {text!r}")
    if _RUAMEL_FLOAT.match(text):
        if "_" in text or text.lstrip("+-").lower() in (".inf", ".nan"):
            raise NotPlain(f"the number {text!r}")
        return float(text)
    if _RUAMEL_OTHER.match(text):
        raise NotPlain(f"the scalar {text!r}")
    return text
