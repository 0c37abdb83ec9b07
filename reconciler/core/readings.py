"""Figures read at two moments, and what happened between them: the requests the new
versions answered since READY (Triton's counters, the router's), several servers read as
one, the old versions' baseline. Pure: the analysis (``core/analysis.py``) and the executor
(``engine/``) call them with readings an adapter made.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from reconciler.model.analysis import Baseline, Figures


def pooled(readings: Sequence[Figures]) -> Figures:
    """Several servers' figures for the same versions as one: counters summed over the
    servers that could be read (a server that could not be read is left out; all unread is
    the first error). Memory and queries are per server, so none."""
    read = [f for f in readings if f.error is None]
    if not read:
        return Figures(error=readings[0].error if readings else "no server to read")

    def total(values: Sequence[float | None]) -> float | None:
        known = [v for v in values if v is not None and math.isfinite(v)]
        return sum(known) if known else None

    return Figures(
        success=total([f.success for f in read]),
        failure=total([f.failure for f in read]),
        duration_us=total([f.duration_us for f in read]),
        pending=total([f.pending for f in read]),
        inferences=total([f.inferences for f in read]),
    )


def before_ready(figures: Figures) -> Figures:
    """A reading of new versions taken before they load: where they have no series yet
    (Triton reports none for a version it does not serve), their counts are zero, so that the
    first window counts every request from the moment they are READY."""

    def zero(value: float | None) -> float:
        return 0.0 if value is None else value

    return Figures(
        success=zero(figures.success),
        # Left absent: Triton has no failure series before the first failure, and an absent
        # series on both sides already counts as none (``evaluate``).
        failure=figures.failure,
        duration_us=zero(figures.duration_us),
        memory_bytes=figures.memory_bytes,
        pending=figures.pending,
        inferences=zero(figures.inferences),
        memory_total_bytes=figures.memory_total_bytes,
        memory_host_wide=figures.memory_host_wide,
        gpu_used=figures.gpu_used,
        gpu_total=figures.gpu_total,
    )


def since_ready(origin: Figures, current: Figures) -> tuple[float, float] | None:
    """Triton's (successes, failures) on the new versions between two readings; None when
    either could not be read or a counter went backwards."""
    if origin.error or current.error:
        return None
    success = delta(origin.success, current.success)
    failure = (
        0.0
        if origin.failure is None and current.failure is None
        else delta(origin.failure or 0.0, current.failure)
    )
    if success is None or failure is None:
        return None
    return success, failure


def routed_since(origin: Figures | None, current: Figures | None) -> tuple[float, float] | None:
    """The router's (answered OK, failed) requests to the new versions' pool between two
    readings; None outside a traffic rollout, or when a counter went backwards (a
    restarted Envoy starts its statistics again)."""
    if origin is None or current is None or origin.routed is None or current.routed is None:
        return None
    before, after = origin.routed, current.routed
    total = delta(before.total, after.total)
    success = delta(before.success, after.success)
    if total is None or success is None or success > total:
        return None
    return success, total - success


def baseline_from(old: Figures | None, at_start: Figures) -> Baseline:
    """The old versions' cumulative mean latency, and the memory as analysis begins.

    ``old`` is None when no old versions served (a first deployment).
    """
    if old is None:
        return Baseline(None, finite(at_start.memory_bytes), has_old=False)
    return Baseline(ratio(old.duration_us, old.success), finite(at_start.memory_bytes))


def finite(value: float | None) -> float | None:
    """``value``, or None when it is absent or not a finite number (NaN, infinity)."""
    return value if value is not None and math.isfinite(value) else None


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator; None unless both are finite and the denominator positive."""
    numerator, denominator = finite(numerator), finite(denominator)
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def delta(before: float | None, after: float | None) -> float | None:
    """How much a counter grew between two readings; None when either is absent."""
    before, after = finite(before), finite(after)
    if before is None or after is None or after < before:  # absent, or counters were reset
        return None
    return after - before


def free_memory(figures: Figures) -> float | None:
    """The room a version has on the server: the fullest GPU device's free memory where the
    server reports devices, else its memory in all less in use (the host's on a CPU server);
    None without figures."""
    fullest = figures.fullest_device()
    if fullest is not None:
        return fullest[1]
    if figures.memory_total_bytes is None or figures.memory_bytes is None:
        return None
    return figures.memory_total_bytes - figures.memory_bytes


def footprint(before: Figures, after: Figures) -> float | None:
    """What a load cost the server between two readings: the most any one GPU device grew
    (a version needs that much on each device it runs on), else the growth of the memory in
    use; None without figures on both sides."""
    devices = set(before.gpu_used) & set(after.gpu_used)
    if devices:
        return max(0.0, max(after.gpu_used[d] - before.gpu_used[d] for d in devices))
    if before.memory_bytes is None or after.memory_bytes is None:
        return None
    return max(0.0, after.memory_bytes - before.memory_bytes)


def room_in_all(figures: Figures) -> float:
    """The most a version could ever have on the server: the fullest GPU device's memory in
    all where the server reports devices, else its memory in all; infinity when unknown."""
    fullest = figures.fullest_device()
    if fullest is not None:
        return figures.gpu_total[fullest[0]]
    if figures.memory_total_bytes is None:
        return math.inf
    return figures.memory_total_bytes
