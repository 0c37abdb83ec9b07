"""The log formats (text and JSON) and the logging set-up, on real LogRecords and loggers."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from reconciler.adapters.logs import JsonLogFormatter, TextLogFormatter, configure_logging
from reconciler.credentials import conceal


def record(
    message: str = "failure", level: int = logging.WARNING, **extra: object
) -> logging.LogRecord:
    logger = logging.getLogger("triton_gitops.pass")
    return logger.makeRecord(logger.name, level, __file__, 1, message, (), None, extra=extra)


def test_a_json_line_has_time_level_logger_message_then_the_fields() -> None:
    line = JsonLogFormatter().format(
        record(fields={"server": "edge-a", "versions": (2,), "checks": [{"value": 0.3}]}, kind="x")
    )

    entry = json.loads(line)
    assert list(entry)[:4] == ["time", "level", "logger", "message"]
    assert entry["time"].endswith("Z")  # RFC 3339 in UTC
    assert datetime.fromisoformat(entry["time"]).tzinfo == UTC
    assert (entry["level"], entry["logger"], entry["message"]) == (
        "warning",
        "triton_gitops.pass",
        "failure",
    )
    # fields={...} (the service's way) and any other extra key alike
    assert (entry["server"], entry["versions"], entry["checks"], entry["kind"]) == (
        "edge-a",
        [2],
        [{"value": 0.3}],
        "x",
    )


def test_a_field_cannot_replace_the_lines_own_keys() -> None:
    entry = json.loads(JsonLogFormatter().format(record(fields={"level": "info", "time": 0})))
    assert entry["level"] == "warning" and entry["time"] != 0


def test_credentials_are_hidden_in_nested_fields_and_messages() -> None:
    conceal("s3cr3t-value")
    leaky = record(
        "fetch of https://bot:pw@git.example failed",
        fields={"details": {"source": ["https://bot:pw@git.example", "s3cr3t-value"]}},
    )
    for formatter in (JsonLogFormatter(), TextLogFormatter()):
        line = formatter.format(leaky)
        assert "pw@" not in line and "s3cr3t-value" not in line
        assert "https://***@git.example" in line


def test_text_is_the_message_then_key_value_fields_that_have_a_value() -> None:
    line = TextLogFormatter().format(
        record(
            fields={
                "server": "edge-a",
                "model": None,
                "reason": 'said "no"',
                "versions": [2],
                "revert": False,
            }
        )
    )
    assert line == 'failure server=edge-a reason="said \\"no\\"" versions=[2] revert=false'
    assert TextLogFormatter().format(record("plain")) == "plain"


def test_a_traceback_follows_the_line() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        failed = record("pass crashed", logging.ERROR)
        failed.exc_info = sys.exc_info()
    entry = json.loads(JsonLogFormatter().format(failed))
    assert "ValueError: boom" in entry["exception"]
    first, *rest = TextLogFormatter().format(failed).splitlines()
    assert first == "pass crashed" and "ValueError: boom" in rest[-1]


@pytest.fixture
def scheduler_level() -> Iterator[None]:
    """configure_logging sets the scheduler's logger; put it back after the test."""
    scheduler = logging.getLogger("apscheduler")
    saved = scheduler.level
    yield
    scheduler.setLevel(saved)


@pytest.mark.parametrize(
    ("level", "scheduler"),
    [("debug", logging.DEBUG), ("info", logging.WARNING), ("error", logging.ERROR)],
)
def test_the_schedulers_per_run_lines_show_only_at_debug(
    scheduler_level: None, level: str, scheduler: int
) -> None:
    configure_logging("json", level)  # pytest's handlers stay: nothing is added to them
    logger = logging.getLogger("apscheduler.executors.default")
    assert logger.getEffectiveLevel() == scheduler
    assert logger.isEnabledFor(logging.INFO) is (level == "debug")
