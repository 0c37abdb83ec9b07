"""Durations as people write them. A manifest writes one as Go does (500ms, 90s, 1m30s, 2h,
1.5s: the schema's pattern, common.schema.json#/$defs/duration, which this module parses
with, so that what the schema accepts and what the code reads cannot drift apart); an
option (a flag, a config file key, a ``$TRITON_GITOPS_`` variable) takes the same, or a bare
number of seconds as it always did."""

from __future__ import annotations

import re

from reconciler.core.spec.schema import schema_documents

# Its four groups are the hours, minutes, seconds and milliseconds, each optional.
_DURATION = re.compile(schema_documents()["common.schema.json"]["$defs"]["duration"]["pattern"])
_UNITS = (3600.0, 60.0, 1.0, 0.001)


def duration_seconds(text: str) -> float | None:
    """A duration as the schema writes it, in seconds; None when it is not one."""
    match = _DURATION.match(text)
    if match is None:
        return None
    return sum(
        float(amount) * unit
        for amount, unit in zip(match.groups(), _UNITS, strict=True)
        if amount is not None
    )


def schema_seconds(text: str) -> float:
    """A duration in a manifest that validated (90s, 1m30s, 2h, 500ms, 1.5s), in seconds:
    the schema's pattern guarantees the form."""
    seconds = duration_seconds(text)
    assert seconds is not None
    return seconds


def option_seconds(text: str) -> float:
    """An option's duration: a bare number of seconds (30, 0.5) or a duration (1m, 1m30s,
    500ms). ValueError saying both forms otherwise."""
    spelled = text.strip()
    try:
        return float(spelled)
    except ValueError:
        pass
    seconds = duration_seconds(spelled)
    if seconds is None:
        raise ValueError(
            f"{text!r} is not a duration: a number of seconds (30, 0.5) or hours, minutes, "
            "seconds and milliseconds in that order (1m, 1m30s, 500ms, 2h)"
        )
    return seconds
