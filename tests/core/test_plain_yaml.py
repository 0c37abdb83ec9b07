"""The fast reader (core/spec/plain_yaml.py: libyaml composes, YAML 1.2's rules build) reads
what ruamel's round trip read, and where it cannot it leaves the text to ruamel: the same
documents, the same lines for every key and item, and the same problems at the same
file:line, on the suite's broken and hostile manifests, on YAML's odd corners and on the
examples (issue 46). ``_not_plain`` turns the fast path off: the reader as it was.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.core.spec import yaml as manifest_yaml
from reconciler.core.spec.desired import read_manifests
from reconciler.core.spec.plain_yaml import NotPlain
from reconciler.core.spec.yaml import MAX_PLAIN_BYTES, Document, plain, yaml_documents
from reconciler.model.problems import Problem
from tests.core.test_hostile_manifests import HEAD, HOSTILE, NOT_JSON_VALUES

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p for p in (ROOT / "examples").rglob("*.y*ml") if p.suffix in (".yaml", ".yml"))


def _config(value: str) -> bytes:
    return (HEAD + f"  config:\n    parameters: {value}\n").encode()


SCALARS = (
    "yes", "no", "on", "off", "y", "n", "010", "0o17", "0x1F", "0b101", "1_000", "1.5", "1.",
    ".5", "1e5", "1E+5", ".5e3", "+1", "-0", ".inf", "-.Inf", ".nan", "~", "null", "Null",
    "TRUE", "tRue", "12:30", "1:30:00", "2024-01-01", "'010'", '"yes"', "=", "v1", "1.2.3",
    "!!str 5", "!!int '5'", "!custom x", "'multi\n      line'",
)  # fmt: skip

# YAML's corners where 1.1 (libyaml's resolver) and 1.2 (ruamel's) differ, forms left to
# ruamel, and broken texts: each read both ways.
ODD: dict[str, bytes] = {
    **{f"scalar {v}": _config(f"{{k: {v}}}") for v in SCALARS},
    "a merge key": (HEAD + "  config:\n    base: &b {x: 1}\n    other: {<<: *b, y: 2}\n").encode(),
    "an anchor without alias": (HEAD + "  config: &c {x: 1}\n").encode(),
    "an integer key": (HEAD + "  config:\n    1: one\n").encode(),
    "a boolean key": (HEAD + "  config:\n    true: one\n").encode(),
    "a null key": (HEAD + "  config:\n    ~: one\n").encode(),
    "a YAML 1.1 directive": b"%YAML 1.1\n---\n" + HEAD.encode() + b"  config: {k: yes}\n",
    "a tag directive": b"%TAG !e! tag:example.com,2000:\n---\n" + HEAD.encode(),
    "a next line character": (HEAD + "  config: {k: 'a\x85b'}\n").encode(),
    "a line separator": (HEAD + "  config: {k: 'a\u2028b'}\n").encode(),
    "two documents and an empty one": (HEAD + "---\n---\n" + HEAD).encode(),
    "comments everywhere": (
        "# head\n" + HEAD.replace("\n", "  # note\n", 3) + "  # tail\n"
    ).encode(),
    "a list document": b"- a\n- b\n",
    "a scalar document": b"just text\n",
    "another tool": b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n",
    "no apiVersion": b"kind: ModelDeployment\nmetadata: {name: x}\n",
    "a tab indent": (HEAD + "  config:\n\tk: 1\n").encode(),
    "an unclosed flow": (HEAD + "  config: {k: [1, 2}\n").encode(),
    "a bad indent": (HEAD + "  config:\n    a: 1\n   b: 2\n").encode(),
    "an unclosed quote": (HEAD + "  config: {k: 'open}\n").encode(),
    "a literal block": (HEAD + "  config:\n    text: |\n      one\n      two\n").encode(),
    "a folded block": (HEAD + "  config:\n    text: >-\n      one\n      two\n").encode(),
    "a double-quoted escape": (HEAD + '  config: {k: "a\\tb\\u00e9\\/"}\n').encode(),
    "a byte order mark": "\ufeff".encode() + HEAD.encode(),
    "CRLF line ends": HEAD.replace("\n", "\r\n").encode(),
    "a complex key": (HEAD + "  config:\n    ? [a, b]\n    : 1\n").encode(),
    "an empty value": (HEAD + "  config:\n    k:\n").encode(),
    "a document end marker": (HEAD + "...\n").encode(),
}

# Hostile texts past MAX_PLAIN_BYTES are left out: ruamel reads them either way (and its
# refusal of them is tests/core/test_hostile_manifests.py's).
CORPUS: dict[str, bytes] = {
    **{
        f"hostile: {name}": text
        for name, (content, _, _) in HOSTILE.items()
        if len(text := content()) <= MAX_PLAIN_BYTES
    },
    **{f"not JSON: {name}": _config(value) for name, (value, _) in NOT_JSON_VALUES.items()},
    **{f"odd: {name}": text for name, text in ODD.items()},
    **{f"example: {p.relative_to(ROOT)}": p.read_bytes() for p in EXAMPLES},
}


def _paths(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every path into ``value``, and one past each mapping and list (a missing key)."""
    yield path
    if isinstance(value, dict):
        yield (*path, "no-such-key")
        for key, child in value.items():
            yield from _paths(child, (*path, key))
    elif isinstance(value, list):
        yield (*path, len(value))
        for index, child in enumerate(value):
            yield from _paths(child, (*path, index))


def _reading(files: dict[str, bytes]) -> tuple[list[Any], list[Problem], dict[str, list[str]]]:
    problems: list[Problem] = []
    ignored: dict[str, list[str]] = {}
    documents: list[Document] = list(yaml_documents(files, problems, ignored))
    read = []
    for doc in documents:
        value = plain(doc.root)
        read.append((doc.file, doc.start_line, value, [(p, doc.line(p)) for p in _paths(value)]))
    return read, problems, ignored


@pytest.mark.parametrize("case", sorted(CORPUS))
def test_the_fast_reader_reads_what_ruamel_read_at_the_same_lines(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = {"models.yaml": CORPUS[case]}
    fast = _reading(files)
    fast_manifests = read_manifests(files)
    with monkeypatch.context() as patch:
        patch.setattr(manifest_yaml, "_plain", _not_plain)
        before = _reading(files)
        before_manifests = read_manifests(files)
    assert fast[1] == before[1], f"{case}: problems differ\nfast: {fast[1]}\nruamel: {before[1]}"
    assert fast[2] == before[2], f"{case}: other tools' documents differ"
    for got, was in zip(fast[0], before[0], strict=True):
        assert got[:3] == was[:3], (
            f"{case}: the document differs\nfast: {got[:3]}\nruamel: {was[:3]}"
        )
        wrong = [
            (p, line, old)
            for (p, line), (_, old) in zip(got[3], was[3], strict=True)
            if line != old
        ]
        assert not wrong, f"{case}: (path, fast line, ruamel line): {wrong}"
    assert fast_manifests.problems == before_manifests.problems, case
    assert fast_manifests.warnings == before_manifests.warnings, case
    assert fast_manifests.desired == before_manifests.desired, case


def _not_plain(*_: Any) -> Iterator[Document]:
    raise NotPlain("the fast path turned off")


def test_plain_manifests_are_read_by_the_fast_reader() -> None:
    """The comparison above means something only if the fast path is taken: every example
    manifest of ours is plain, and those with an anchor, a tag or an odd scalar are not."""
    problems: list[Problem] = []
    examples = {str(p): p.read_bytes() for p in EXAMPLES}
    documents = list(yaml_documents(examples, problems))
    fast = [d for d in documents if d.lines is not None]
    assert documents and len(fast) == len(documents), [d.file for d in documents if d.lines is None]
    for name in ("scalar yes", "scalar 1.5", "comments everywhere", "CRLF line ends"):
        (doc,) = yaml_documents({"m.yaml": ODD[name]}, problems)
        assert doc.lines is not None, name
    for name in ("scalar 010", "a merge key", "scalar !!str 5", "a YAML 1.1 directive"):
        docs = list(yaml_documents({"m.yaml": ODD[name]}, problems))
        assert all(d.lines is None for d in docs), name
