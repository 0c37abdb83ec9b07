"""Round-trip edits of manifest files: restore a ModelDeployment's versions and config.

Used by the revert write-back (``--revert-mode commit|branch``). ruamel.yaml's round-trip mode
keeps comments, key order, quoting and flow style; the versions list is edited in place so it
keeps its layout too. Pure: text in, text out.
"""

from __future__ import annotations

import io
import re
from collections.abc import Mapping
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import YAMLError
from ruamel.yaml.util import load_yaml_guess_indent

from reconciler.spec.load import fingerprint_of, plain


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
    """
    yaml = _yaml(text)
    documents = list(yaml.load_all(text))
    found = False
    for document in documents:
        if not (
            isinstance(document, CommentedMap)
            and document.get("kind") == "ModelDeployment"
            and isinstance(document.get("metadata"), Mapping)
            and document["metadata"].get("name") == name
        ):
            continue
        spec = document["spec"]
        if fingerprint_of(plain(spec)) != expected_fingerprint:
            return None
        current = spec["versions"]
        if isinstance(current, CommentedSeq):
            del current[:]
            current.extend(versions)
        else:
            spec["versions"] = list(versions)
        if config is not None and plain(spec.get("config", {})) != dict(config):
            if config:
                spec["config"] = dict(config)
            else:
                del spec["config"]
        found = True
    if not found:
        return None
    out = io.StringIO()
    yaml.explicit_start = text.lstrip().startswith("---")
    yaml.dump_all(documents, out)
    return out.getvalue()
