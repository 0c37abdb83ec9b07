"""Versions stuck UNLOADING (issue 30): Triton unloads a version once its last in-flight
request ends, and some never end (server#7481, #7626; on 2.51 a Python version that raised
from ``execute`` stays UNLOADING for good, its stub still running: bench.soak). Nothing
serves from such a version, but its memory is not given back. The service's watch reads the
index every few seconds; this says which versions have been UNLOADING past a deadline (an
alert names the server, model and version) and which of those are gone since (the alert
ends). Pure: the clock is passed in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

Key = tuple[str, str, int]  # server, model, version


@dataclass(frozen=True)
class Unloads:
    """What the readings so far say: since when each version has been UNLOADING (seen in
    every reading since), and which of them were found stuck (alerted)."""

    since: Mapping[Key, float]
    stuck: frozenset[Key] = frozenset()


def after_reading(
    before: Unloads, unloading: Iterable[Key], now: float, deadline: float
) -> tuple[Unloads, frozenset[Key], frozenset[Key]]:
    """The record after a reading that found ``unloading``, with the versions newly stuck
    (UNLOADING ``deadline`` seconds or more) and those stuck before that are gone now."""
    seen = frozenset(unloading)
    since = {key: before.since.get(key, now) for key in seen}
    stuck = frozenset(key for key, began in since.items() if now - began >= deadline)
    return Unloads(since, stuck), stuck - before.stuck, before.stuck - seen
