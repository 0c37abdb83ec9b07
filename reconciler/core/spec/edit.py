"""Round-trip edits of manifest files: restore a ModelDeployment's versions and config (the
revert write-back, ``--revert-mode commit|branch``), or its whole spec (``undo``).

ruamel.yaml's round-trip mode finds where things are; the versions list and every scalar are
edited in place, so comments, key order, quoting and flow style stay. Pure: text in, text out.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Mapping
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import YAMLError
from ruamel.yaml.util import load_yaml_guess_indent

from reconciler.core.spec.build import fingerprint_of
from reconciler.core.spec.yaml import plain


def _yaml(text: str) -> YAML:
    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    yaml.width = 4096  # never re-wrap a user's long lines
    # Keep the file's own indentation. The guesser reads one document at a time and reports
    # the block sequences' indent and dash offset; mappings' indent is the smallest indent of
    # a key line.
    sequence, offset = None, None
    for chunk in re.split(r"(?m)^---.*$", text):
        try:
            _, sequence, offset = load_yaml_guess_indent(chunk)
        except YAMLError:
            continue
        if offset is not None:
            break
    keys = [len(m.group(1)) for m in re.finditer(r"(?m)^( +)[^\s#-][^:\n]*:", text)]
    mapping = min(keys) if keys else 2
    yaml.indent(mapping=mapping, sequence=sequence or mapping, offset=offset or 0)
    return yaml


def _deployment_spec(text: str, name: str) -> CommentedMap | None:
    """The spec of ModelDeployment ``name`` in ``text`` (round-trip), or None."""
    for document in _yaml(text).load_all(text):
        if (
            isinstance(document, CommentedMap)
            and document.get("kind") == "ModelDeployment"
            and isinstance(document.get("metadata"), Mapping)
            and document["metadata"].get("name") == name
            and isinstance(document.get("spec"), CommentedMap)
        ):
            spec: CommentedMap = document["spec"]
            return spec
    return None


def restore_deployment(
    text: str,
    name: str,
    expected_fingerprint: str,
    versions: tuple[int, ...],
    config: Mapping[str, Any] | None,
) -> str | None:
    """``text`` with ModelDeployment ``name`` set back to ``versions`` (and ``config``).

    Returns None when the file has no such ModelDeployment or its spec is no longer the one
    that failed (someone changed it meanwhile: that newer change is theirs to keep).

    ruamel.yaml (round-trip) finds where things are; the edit is made on the text itself:
    only the characters of the versions list and of config values that differ change, so
    every comment, blank line and layout choice stays. When spec.config changes shape (a
    key or a list item added or removed), its value is re-written as a whole in the file's
    indentation, and comments inside that value go with it.
    """
    spec = _deployment_spec(text, name)
    if spec is None or fingerprint_of(plain(spec)) != expected_fingerprint:
        return None
    edits = _versions_edits(text, spec, versions)
    if config is not None and plain(spec.get("config", {})) != dict(config):
        edits.extend(_value_edits(text, spec, "config", dict(config) or None))
    return _apply_edits(text, edits)


def restore_spec(
    text: str, name: str, expected_fingerprint: str, wanted: Mapping[str, Any]
) -> str | None:
    """``text`` with the whole spec of ModelDeployment ``name`` set to ``wanted`` (``undo``).

    None as for ``restore_deployment``. Each top-level key of the spec is edited as the
    revert edits versions and config: a list of plain versions and every scalar in place; a
    value whose shape changes is re-written as a whole; a key ``wanted`` lacks is removed
    and one it adds is written after the versions. metadata and every other document of the
    file stay as they are.
    """
    spec = _deployment_spec(text, name)
    if spec is None or fingerprint_of(plain(spec)) != expected_fingerprint:
        return None
    current = plain(spec)
    edits: list[_Edit] = []
    for key in [*current, *(k for k in wanted if k not in current)]:
        if key not in wanted:
            edits.append(_block_edit(text, spec, key, None))
        elif current.get(key) == wanted[key]:
            continue
        elif key == "versions" and all(isinstance(v, int) for v in [*current[key], *wanted[key]]):
            edits.extend(_versions_edits(text, spec, tuple(wanted[key])))
        else:
            edits.extend(_value_edits(text, spec, key, wanted[key]))
    return _apply_edits(text, edits)


# An edit: (start offset, end offset, replacement) in the text.
_Edit = tuple[int, int, str]


def _offsets(text: str) -> list[int]:
    starts, position = [0], 0
    for line in text.splitlines(keepends=True):
        position += len(line)
        starts.append(position)
    return starts


def _offset(text: str, line: int, column: int) -> int:
    return _offsets(text)[line] + column


def _apply_edits(text: str, edits: list[_Edit]) -> str:
    for start, end, replacement in sorted(edits, reverse=True):
        text = text[:start] + replacement + text[end:]
    return text


def _flow_end(text: str, start: int) -> int:
    """The offset just past the flow collection that opens at ``start``."""
    depth, quote = 0, ""
    for index in range(start, len(text)):
        char = text[index]
        if quote:
            if char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
            if depth == 0:
                return index + 1
    raise ValueError("unterminated flow collection")


def _versions_edits(text: str, spec: CommentedMap, versions: tuple[int, ...]) -> list[_Edit]:
    current = spec["versions"]
    if list(current) == list(versions):
        return []
    line, column = spec.lc.value("versions")
    start = _offset(text, line, column)
    if text[start] == "[":
        return [(start, _flow_end(text, start), "[" + ", ".join(map(str, versions)) + "]")]
    # A block sequence, item by item: kept positions get the new number in place (an inline
    # comment on the line stays), extra old items lose their line, extra new items get a
    # line like the first item's.
    offsets = _offsets(text)
    lines = text.splitlines(keepends=True)
    edits: list[_Edit] = []
    for index, old in enumerate(current):
        item_line, item_column = current.lc.item(index)
        at = offsets[item_line] + item_column
        if index < len(versions):
            edits.append((at, at + len(str(old)), str(versions[index])))
        else:
            edits.append((offsets[item_line], offsets[item_line + 1], ""))
    if len(versions) > len(current):
        first_line, first_column = current.lc.item(0)
        prefix = lines[first_line][:first_column]
        last_line = current.lc.item(len(current) - 1)[0]
        added = "".join(f"{prefix}{v}\n" for v in versions[len(current) :])
        edits.append((offsets[last_line + 1], offsets[last_line + 1], added))
    return edits


def _scalar_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if (
        isinstance(value, str)
        and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_./-]*", value)
        and (value.lower() not in ("true", "false", "null", "yes", "no", "on", "off", "~"))
    ):
        return value
    return json.dumps(value)  # a JSON string is a valid YAML double-quoted scalar


def _scalar_end(text: str, start: int, in_flow: bool) -> int:
    if text[start] in "'\"":
        quote, index = text[start], start + 1
        while index < len(text):
            if text[index] == quote and not (quote == "'" and text[index + 1 : index + 2] == "'"):
                return index + 1
            index += 2 if quote == "'" and text[index] == "'" else 1
        raise ValueError("unterminated quoted scalar")
    index = start
    stops = ",]}" if in_flow else ""
    while index < len(text) and text[index] != "\n" and text[index] not in stops:
        if text[index] == "#" and text[index - 1] in " \t":
            break
        index += 1
    while index > start and text[index - 1] in " \t":
        index -= 1
    return index


def _value_edits(text: str, spec: CommentedMap, key: str, wanted: Any) -> list[_Edit]:
    """Edits turning spec[key] into ``wanted`` (None: the key removed): scalar by scalar
    when the shape is the same, else the value re-written as a whole."""
    if wanted is not None and key in spec:
        scalars = _scalar_edits(text, spec, key, wanted)
        if scalars is not None:
            return scalars
    return [_block_edit(text, spec, key, wanted)]


def _scalar_edits(text: str, spec: CommentedMap, key: str, wanted: Any) -> list[_Edit] | None:
    """Scalar-by-scalar edits turning spec[key] into ``wanted``, or None when its shape
    differs (a key or a list item added or removed): that needs a structural rewrite."""
    edits: list[_Edit] = []

    def walk(pairs: list[tuple[Any, Any, tuple[int, int]]], flow: bool) -> bool:
        # (value, wanted value, where the value starts) for a mapping or a sequence alike.
        for value, want, (line, column) in pairs:
            if plain(value) == want:
                continue
            if isinstance(value, CommentedMap) and isinstance(want, dict):
                if set(value) != set(want):
                    return False
                inner = [(v, want[k], value.lc.value(k)) for k, v in value.items()]
            elif isinstance(value, CommentedSeq) and isinstance(want, list):
                if len(value) != len(want):
                    return False
                inner = [(v, want[i], value.lc.item(i)) for i, v in enumerate(value)]
            elif isinstance(value, CommentedMap | CommentedSeq) or isinstance(want, dict | list):
                return False
            else:
                at = _offset(text, line, column)
                edits.append((at, _scalar_end(text, at, flow), _scalar_text(want)))
                continue
            if not walk(inner, flow or bool(value.fa.flow_style())):
                return False
        return True

    return (
        edits
        if walk([(spec[key], wanted, spec.lc.value(key))], bool(spec.fa.flow_style()))
        else None
    )


def _dump(value: Any, text: str) -> str:
    out = io.StringIO()
    _yaml(text).dump(value, out)
    return out.getvalue()


def _document_end(text: str, line: int) -> int:
    """The line where the document holding ``line`` ends (a '---' or '...' line, or EOF)."""
    lines = text.splitlines()
    for index in range(line + 1, len(lines)):
        if lines[index].startswith(("---", "...")):
            return index
    return len(lines)


def _block_edit(text: str, spec: CommentedMap, key: str, value: Any) -> _Edit:
    """Replace, remove (``value`` None) or add spec[key] as a whole, keeping every line
    around it."""
    lines = text.splitlines(keepends=True)
    keys = list(spec)
    key_line, key_column = spec.lc.key(key) if key in spec else spec.lc.key("versions")
    indent = " " * key_column
    if key not in spec:
        # Insert after the versions value, with the same indentation as its key.
        at = _versions_end_line(spec) + 1
        body = _dump({key: value}, text)
        block = "".join(indent + line for line in body.splitlines(keepends=True))
        return _offsets(text)[at], _offsets(text)[at], block
    # The value ends before the next key of spec (or the document's end), less the
    # comments and blank lines just above that: they belong to what follows.
    following = keys.index(key) + 1
    end = (
        spec.lc.key(keys[following])[0] if following < len(keys) else _document_end(text, key_line)
    )
    while (end - 1 > key_line and lines[end - 1].strip().startswith("#")) or (
        end - 1 > key_line and not lines[end - 1].strip()
    ):
        end -= 1
    if value is None:
        return _offsets(text)[key_line], _offsets(text)[end], ""
    body = _dump({key: value}, text)
    block = "".join(indent + line for line in body.splitlines(keepends=True))
    return _offsets(text)[key_line], _offsets(text)[end], block


def _versions_end_line(spec: CommentedMap) -> int:
    current = spec["versions"]
    if isinstance(current, CommentedSeq) and not current.fa.flow_style() and len(current):
        return int(current.lc.item(len(current) - 1)[0])
    return int(spec.lc.value("versions")[0])
