"""The terminal reports (bench/reports/rollback_latency.md, swap_under_load.md) on the
branches their saved results (tests/bench/reports/) do not take: a part of the result that
is absent or None. Each expected text is the saved one with that part left out, as the
print_result these templates replaced printed it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench import rollback_latency, swap_under_load

SAVED = Path(__file__).resolve().parent / "reports"


def saved(scenario: str) -> tuple[dict[str, Any], str]:
    """The saved result and the text printed for it."""
    result = json.loads((SAVED / f"{scenario}.json").read_text())
    return result, (SAVED / f"{scenario}.md").read_text()


def test_rollback_latency_without_hand_floors_leaves_their_rows_out() -> None:
    result, text = saved("rollback_latency")
    result["floor_ms"] |= {"reverts": 0, "load_call": None, "verify_poll": None, "client": None}

    printed = rollback_latency.markdown(result) + "\n"

    assert printed == "".join(
        line for line in text.splitlines(True) if not line.startswith("floor")
    )


def test_swap_under_load_without_a_breakdown_ends_at_the_failures_line() -> None:
    result, text = saved("swap_under_load")
    for empty in (None, {}):
        result["breakdown"] = empty

        printed = swap_under_load.markdown(result) + "\n"

        assert printed == text[: text.index("\nwhere one apply's time goes")]


def test_swap_under_load_shows_a_window_with_no_answers_as_dashes() -> None:
    result, _ = saved("swap_under_load")
    result["load"]["during_hand_swaps"] |= {"p50_ms": None, "p99_ms": None, "max_ms": None}

    printed = swap_under_load.markdown(result).splitlines()

    row = next(line for line in printed if line.startswith("during hand-floor swaps"))
    assert row.split()[-3:] == ["-", "-", "-"]


def test_swap_under_load_says_nothing_of_hidden_phases_when_none_is_hidden() -> None:
    result, text = saved("swap_under_load")
    for row in result["breakdown"]["rows"].values():
        row["median_seconds"] = max(row["median_seconds"], 0.0001)

    printed = swap_under_load.markdown(result) + "\n"

    assert "not shown" in text
    assert "not shown" not in printed
    assert printed.count("\n") == text.count("\n") - 1 + 3  # three rows shown, one line less
