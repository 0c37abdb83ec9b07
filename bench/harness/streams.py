"""What a streaming rollout's client streams and its ``apply --output json`` report say
(``bench.streaming``): the streams failed, cut, mixed and affected by a bad version, the
unload step's wait for the streams in flight, the probe streams sent. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from bench.harness.rollouts import masked
from testkit.loadgen import Stream


class BadVersion(Protocol):
    """A bad version as ``stream_figures`` reads it."""

    @property
    def version(self) -> int: ...

    @property
    def effect(self) -> str: ...  # error: its streams fail or are cut; slow: they are late


def stream_figures(
    streams: Sequence[Stream], tokens: int, bad: BadVersion | None = None
) -> dict[str, Any]:
    """The client streams: ``failed`` (ended with an error), ``cut`` (no final flag within
    the client's 30 s, or fewer tokens than asked), ``mixed`` (answered by two versions);
    with ``bad``: ``on_bad`` (streams its version answered, or whose error names it) and
    ``affected`` (failed or cut, and for a slow version every stream it answered)."""
    failed = [s for s in streams if s.error is not None and not s.error.startswith("no final")]
    cut = [
        s
        for s in streams
        if (s.error or "").startswith("no final") or (s.error is None and len(s.tokens) != tokens)
    ]
    mixed = [s for s in streams if len(set(s.versions)) > 1]
    figures: dict[str, Any] = {
        "streams": len(streams),
        "failed": len(failed),
        "cut": len(cut),
        "mixed": len(mixed),
        "messages": sorted({masked(s.error) for s in failed + cut if s.error})[:3],
    }
    if bad is not None:
        mark = str(bad.version)
        on_bad = [
            s
            for s in streams
            if (s.versions and s.versions[0] == mark) or f"version {mark} " in (s.error or "")
        ]
        whole = [s for s in on_bad if s.error is None and len(s.tokens) == tokens]
        late = whole if bad.effect == "slow" else []
        figures |= {"on_bad": len(on_bad), "affected": len(failed) + len(cut) + len(late)}
    return figures


def unload_wait(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each change's unload step: ok, its seconds and ``stream_wait_seconds`` (None when the
    report has none)."""
    steps = []
    for change in (report.get("result") or {}).get("changes", []):
        for step in change.get("steps", []):
            if step.get("action") == "unload":
                steps.append(
                    {
                        "server": change.get("server"),
                        "ok": step.get("ok"),
                        "seconds": step.get("seconds"),
                        "stream_wait_seconds": step.get("stream_wait_seconds"),
                        "error": step.get("error"),
                    }
                )
    return steps


def probes_sent(report: Mapping[str, Any]) -> int:
    """Probe streams sent, summed over the evaluations of every change's analysis."""
    sent = 0
    for change in (report.get("result") or {}).get("changes", []):
        for evaluation in (change.get("analysis") or {}).get("evaluations", []):
            sent += (evaluation.get("probes") or {}).get("sent", 0)
    return sent
