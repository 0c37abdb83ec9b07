"""Durations: a manifest's (the schema's pattern) and an option's (that, or a bare number of
seconds)."""

from __future__ import annotations

import pytest

from reconciler.core.spec.durations import duration_seconds, option_seconds


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("500ms", 0.5), ("90s", 90.0), ("1m30s", 90.0), ("2h", 7200.0), ("1.5s", 1.5),
     ("1h2m3s4ms", 3723.004)],
)  # fmt: skip
def test_a_duration_as_go_writes_it(text: str, seconds: float) -> None:
    assert duration_seconds(text) == pytest.approx(seconds)
    assert option_seconds(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "1 m", "5min", "1s1m", "-1s", "m"])
def test_what_is_no_duration(text: str) -> None:
    assert duration_seconds(text) is None
    with pytest.raises(ValueError, match="is not a duration"):
        option_seconds(text)


def test_an_option_takes_a_bare_number_of_seconds_as_before() -> None:
    assert [option_seconds(t) for t in ("30", "0.5", " 2 ", "0")] == [30.0, 0.5, 2.0, 0.0]
