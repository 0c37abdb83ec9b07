"""The gate's latency chart: old against new, one panel per concurrency level, as an SVG a
reviewer opens from the CI job's artifacts.

Each panel draws latency against percentile for both versions, every round as a thin line (so
the spread shows) and the round-by-round median as a thick one. Drawn with matplotlib, an
optional dependency (``pip install 'triton-gitops[chart]'``): without it, ``latency_chart``
says so and the gate's other reports are unchanged.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from statistics import median

from reconciler.model.gate import LoadFigures, ModelGate


class ChartUnavailable(RuntimeError):
    """matplotlib is not installed."""


def _curve(rounds: Sequence[LoadFigures]) -> tuple[list[float], list[float]]:
    """The median, percentile by percentile, of the rounds' latency distributions."""
    by_percentile: dict[float, list[float]] = {}
    for figures in rounds:
        for percentile, ms in figures.quantiles:
            by_percentile.setdefault(percentile, []).append(ms)
    points = sorted(by_percentile)
    return points, [median(by_percentile[p]) for p in points]


def latency_chart(gate: ModelGate) -> str:
    """The SVG text of ``gate``'s chart; ChartUnavailable without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("svg")  # no display, no GUI toolkit
        from matplotlib import pyplot
    except ImportError as exc:
        raise ChartUnavailable(
            "the latency chart needs matplotlib: pip install 'triton-gitops[chart]'"
        ) from exc
    levels = sorted({f.concurrency for f in gate.new_figures})
    figure, axes = pyplot.subplots(
        1, max(1, len(levels)), figsize=(4.2 * max(1, len(levels)), 3.4), squeeze=False
    )
    sides = (("old", gate.old_version, gate.old_figures, "#4c72b0"),
             ("new", gate.new_version, gate.new_figures, "#dd8452"))  # fmt: skip
    for axis, level in zip(axes[0], levels, strict=False):
        for label, version, figures, colour in sides:
            rounds = [f for f in figures if f.concurrency == level and f.quantiles]
            for one in rounds:
                axis.plot(*zip(*one.quantiles, strict=True), color=colour, alpha=0.25, lw=0.8)
            if rounds:
                x, y = _curve(rounds)
                axis.plot(x, y, color=colour, lw=2, label=f"{label}: version {version}")
        axis.set_title(f"concurrency {level}")
        axis.set_xlabel("percentile")
        axis.set_ylabel("latency (ms)")
        axis.grid(alpha=0.3)
        axis.legend(loc="upper left", fontsize="small")
    figure.suptitle(f"{gate.model}: latency, old against new ({gate.verdict})")
    figure.tight_layout()
    out = io.StringIO()
    # A fixed hash salt and no date: the same figures draw the same bytes.
    matplotlib.rcParams["svg.hashsalt"] = "triton-gitops"
    figure.savefig(out, format="svg", metadata={"Date": None})
    pyplot.close(figure)
    return out.getvalue()
