"""The benchmarks' reports: each scenario's Markdown template (bench/reports/) renders a saved
result (tests/bench/reports/<scenario>.json) to the text saved beside it (<scenario>.md), the
section as the scenario printed it when the result was measured. A template edit that changes
the report shows here as a diff; so does a result field the template no longer finds."""

from __future__ import annotations

import difflib
import importlib
import json
from pathlib import Path

import jinja2
import pytest

from bench.harness.report import TEMPLATES, render

SAVED = Path(__file__).resolve().parent / "reports"
SCENARIOS = sorted(path.stem for path in SAVED.glob("*.json"))


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_a_saved_result_renders_to_the_report_saved_with_it(scenario: str) -> None:
    result = json.loads((SAVED / f"{scenario}.json").read_text())
    expected = (SAVED / f"{scenario}.md").read_text()

    printed = importlib.import_module(f"bench.{scenario}").markdown(result) + "\n"

    diff = "".join(difflib.unified_diff(expected.splitlines(True), printed.splitlines(True)))
    assert printed == expected, f"bench/reports/{scenario}.md renders differently:\n{diff}"


def test_every_template_has_a_saved_result_to_render() -> None:
    templates = {path.stem for path in TEMPLATES.glob("*.md") if not path.stem.startswith("_")}

    untested = templates - set(SCENARIOS)
    assert not untested, f"templates with no saved result in tests/bench/reports: {untested}"


def test_a_field_missing_from_the_result_is_an_error_naming_it() -> None:
    result = json.loads((SAVED / "state_year.json").read_text())
    del result["upgrade"]

    with pytest.raises(jinja2.UndefinedError, match="upgrade"):
        render("state_year", result)
