"""Bounded YAML reading: documents with the line of every key, refusing
bombs, deep nesting, huge or binary files and values JSON cannot hold.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.composer import Composer
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.events import AliasEvent, ScalarEvent
from ruamel.yaml.nodes import MappingNode, ScalarNode
from ruamel.yaml.reader import ReaderError

from reconciler.core.spec.plain_yaml import Lines, NotPlain, plain_documents
from reconciler.core.spec.schema import (
    API_GROUPS,
    KIND_SCHEMAS,
    JsonPath,
    foreign_value,
    json_path_text,
    yaml_type,
)
from reconciler.model.problems import Problem

# Caps that keep hostile manifests (YAML bombs, deep nesting, huge files) bounded in time and
# memory. A real manifest is a few kilobytes, a few levels deep, a few hundred values.
MAX_MANIFEST_BYTES = 1 << 20  # per file, checked before parsing
MAX_YAML_DEPTH = 64  # nesting of collections, counted through aliases
MAX_YAML_VALUES = 100_000  # per file, every alias counted as the values it stands for


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


class Document:
    """One YAML document of one file, with a way to find the line of any path in it: by
    ``lines`` where the fast reader read it (``core.spec.plain_yaml``), else by ruamel's."""

    def __init__(
        self, file: str, root: Mapping[str, Any], start_line: int, lines: Lines | None = None
    ) -> None:
        self.file = file
        self.root = root
        self.start_line = start_line
        self.lines = lines

    def line(self, path: JsonPath) -> int:
        if self.lines is not None:
            return self._plain_line(path, self.lines)
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

    def _plain_line(self, path: JsonPath, lines: Lines) -> int:
        node: Any = self.root
        line = self.start_line
        for step in path:
            if isinstance(node, dict) and step in node:
                line = lines.keys[id(node)][step]  # type: ignore[index]  # a str step
            elif isinstance(node, list) and isinstance(step, int) and 0 <= step < len(node):
                line = lines.items[id(node)][step]
            else:
                break
            node = node[step]
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


NO_API_VERSION = "none"


def other_tool(document: Mapping[str, Any]) -> str | None:
    """None for a document of this reconciler, else what it is (its apiVersion): a document
    is ours when its apiVersion's group is ours or, without an apiVersion, when its kind is
    one of ours (a forgotten apiVersion is said so, not passed over)."""
    api_version = document.get("apiVersion")
    if isinstance(api_version, str):
        return None if api_version.rpartition("/")[0] in API_GROUPS else api_version
    if api_version is None:
        kind = document.get("kind")
        return None if isinstance(kind, str) and kind in KIND_SCHEMAS else NO_API_VERSION
    return repr(api_version)


def yaml_documents(
    files: Mapping[str, bytes],
    problems: list[Problem],
    ignored: dict[str, list[str]] | None = None,
) -> Iterator[Document]:
    """The documents of this reconciler in ``files``; those of other tools are left out (what
    each is, by file, in ``ignored``), what cannot be read goes to ``problems``."""
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
        try:
            yield from _plain(file, text, ignored)
            continue
        except NotPlain:
            pass  # ruamel reads it, and says what is wrong where it always has
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
            if not _ours(file, document, ignored):
                continue
            doc = Document(file, document, _start_line(document))
            foreign = foreign_value(document, ())
            if foreign is not None:
                path, value = foreign
                problems.append(
                    doc.problem(
                        path,
                        f"{json_path_text(path)}: a YAML {yaml_type(value)} is not a manifest "
                        "value (text, number, boolean, null, list or mapping); quote it if it "
                        "is text",
                    )
                )
                continue
            yield doc


# Line breaks of YAML 1.1 (libyaml's) that YAML 1.2 (ruamel's) reads as text: a text with one
# would be read with other line numbers.
_OLD_BREAKS = re.compile("[\x85\u2028\u2029]")
# A manifest is a few kilobytes. Past this, ruamel reads it: its composer refuses a text past
# the caps while reading, where libyaml would compose every node of a megabyte first.
MAX_PLAIN_BYTES = 64 << 10


def _plain(file: str, text: str, ignored: dict[str, list[str]] | None) -> Iterator[Document]:
    """The documents of a plain manifest (``core.spec.plain_yaml``), read whole before the
    first is given: a text that is not plain raises ``NotPlain`` before any."""
    if len(text) > MAX_PLAIN_BYTES:
        raise NotPlain("a large text")
    if _OLD_BREAKS.search(text):
        raise NotPlain("a YAML 1.1 line break")
    documents = plain_documents(text, MAX_YAML_DEPTH, MAX_YAML_VALUES)
    for value, start_line, lines in documents:
        if value is None:
            continue
        if _ours(file, value, ignored):
            yield Document(file, value, start_line, lines)


def _ours(file: str, document: Any, ignored: dict[str, list[str]] | None) -> bool:
    """Whether a document is this reconciler's; another's is counted in ``ignored``. A list
    or a lone value is no tool's manifest that this reconciler could read: another tool's
    file (an Ansible playbook is a list). Both readers' mappings are dicts (ruamel's
    CommentedMap is one)."""
    other = other_tool(document) if isinstance(document, dict) else "not a mapping"
    if other is None:
        return True
    if ignored is not None:
        ignored.setdefault(file, []).append(other)
    return False


def _start_line(node: Any) -> int:
    # Some documents carry no position: a lone '=' is the YAML 1.1 value key, for one.
    line = getattr(getattr(node, "lc", None), "line", None)
    return line + 1 if isinstance(line, int) else 1
