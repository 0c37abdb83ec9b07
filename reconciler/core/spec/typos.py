"""A manifest's misspelled keys and kinds, said as one problem at the key's own line with the
name that was meant (``kind: ModelDeploymnet``, ``version:`` for ``versions:``), where the
schema alone gives two messages at the parent's line: an unexpected property, and the
required one it stood for missing."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Sequence

import jsonschema

from reconciler.core.spec.schema import JsonPath, as_mapping, json_path_text, schema_message

_CUTOFF = 0.75  # difflib's ratio: 'version' -> 'versions', 'sever' -> 'servers'; not 'spec'


def nearest(name: str, known: Iterable[str], cutoff: float = _CUTOFF) -> str | None:
    """The known name ``name`` was most likely meant to be, if one is near enough (by
    difflib's ratio; the config file's keys and variables use cutoffs of their own)."""
    found = difflib.get_close_matches(name, sorted(known), n=1, cutoff=cutoff)
    return found[0] if found else None


def did_you_mean(name: str, known: Iterable[str], cutoff: float = _CUTOFF) -> str:
    """ "; did you mean 'x'?" for the nearest known name, else nothing."""
    near = nearest(name, known, cutoff)
    return f"; did you mean {near!r}?" if near else ""


def _unexpected(error: jsonschema.ValidationError) -> list[str]:
    """The keys an ``additionalProperties: false`` refused, in the order written."""
    schema = as_mapping(error.schema)
    named = as_mapping(schema.get("properties"))
    patterns = list(as_mapping(schema.get("patternProperties")))
    instance = error.instance if isinstance(error.instance, dict) else {}
    return [
        key for key in instance if key not in named and not any(re.search(p, key) for p in patterns)
    ]


def schema_problems(
    errors: Sequence[jsonschema.ValidationError],
) -> list[tuple[JsonPath, str]]:
    """Each schema error as (path, message): an unknown key at its own path, with the known
    key it was likely meant as; a required key's absence left out where an unknown key was
    meant as it (one mistake, one problem); any other error as ``schema_message`` says it."""
    said: list[tuple[JsonPath, str]] = []
    meant: set[tuple[JsonPath, str]] = set()  # (the parent's path, the key meant there)
    for error in errors:
        if error.validator != "additionalProperties" or error.validator_value is not False:
            continue
        parent = tuple(error.absolute_path)
        known = as_mapping(as_mapping(error.schema).get("properties"))
        for key in _unexpected(error):
            near = nearest(key, known)
            if near is not None and near not in error.instance:
                meant.add((parent, near))
            where = json_path_text(parent)
            message = f"unknown key {key!r}{did_you_mean(key, known)}"
            said.append(((*parent, key), f"{where}: {message}" if where else message))
    for error in errors:
        if error.validator == "additionalProperties" and error.validator_value is False:
            continue
        parent = tuple(error.absolute_path)
        if error.validator == "required" and any(
            (parent, name) in meant for name in _missing(error)
        ):
            continue
        said.append((parent, schema_message(error)))
    return said


def _missing(error: jsonschema.ValidationError) -> list[str]:
    """The key a ``required`` error says is missing (jsonschema gives one error a key)."""
    required = error.validator_value if isinstance(error.validator_value, list) else []
    return [name for name in required if error.message.startswith(f"{name!r} ")]
