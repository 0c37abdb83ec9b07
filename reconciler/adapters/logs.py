"""How every command writes its log to stderr: one line a record, as text or as JSON.

    text   the message, then the record's structured fields as key=value (strings with
           spaces, lists and mappings in JSON): the one-shot commands' default
    json   one object a line: time (RFC 3339, UTC), level, logger, message, then the fields;
           the service's default (``triton-gitops run``), and any command's with
           ``--log-format json``

A record's structured fields are ``extra={"fields": {...}}`` (the service's
``telemetry.log_event``, the pass's ``loop/pass_log.py``, ``LogAlerter``) or any other key given
in ``extra``. Credentials are hidden in both formats (``redact``). ``cli.main`` calls
``configure_logging`` once, before the command runs.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from reconciler.credentials import redact, redact_all

LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")

# What every LogRecord has of its own; any other attribute came from ``extra``.
_RECORD_ATTRIBUTES = frozenset(vars(logging.makeLogRecord({}))) | {
    "message",
    "asctime",
    "taskName",
    "fields",
}
# The keys a JSON line always has; a field of the same name cannot replace them.
_OWN_KEYS = ("time", "level", "logger", "message")


def record_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The record's structured fields, credentials hidden."""
    fields = {k: v for k, v in vars(record).items() if k not in _RECORD_ATTRIBUTES}
    nested = getattr(record, "fields", None)
    if isinstance(nested, Mapping):
        fields.update(nested)
    return {str(k): redact_all(v) for k, v in fields.items()}


def rfc3339(timestamp: float) -> str:
    """``2026-12-01T22:15:05.123Z``: UTC, milliseconds."""
    moment = datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="milliseconds")
    return moment.replace("+00:00", "Z")


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line; every string passes through ``redact``."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": rfc3339(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": redact(record.getMessage()),
        }
        for key, value in record_fields(record).items():
            if key not in _OWN_KEYS:
                entry[key] = value
        if record.exc_info:
            entry["exception"] = redact(self.formatException(record.exc_info))
        return json.dumps(entry, default=str)


class TextLogFormatter(logging.Formatter):
    """The message, then ``key=value`` for each field that has a value (a traceback, when
    there is one, on the lines after)."""

    def format(self, record: logging.LogRecord) -> str:
        fields = record_fields(record)
        line = redact(record.getMessage()) + "".join(
            f" {key}={_text(value)}"
            for key, value in fields.items()
            if value is not None and value != "" and value != [] and value != {}
        )
        if record.exc_info:
            line += "\n" + redact(self.formatException(record.exc_info))
        return line


def _text(value: Any) -> str:
    if isinstance(value, str) and value and not any(c in value for c in ' "=\n\t'):
        return value
    return json.dumps(value, default=str)


def configure_logging(log_format: str, level: str = "info", *, replace: bool = False) -> None:
    """Log records at ``level`` and above to stderr in ``log_format`` (``LOG_FORMATS``).

    As ``logging.basicConfig``: when the root logger has handlers already (a program that
    embeds the CLI, a test runner) they are kept and none is added, unless ``replace`` (the
    service owns its process's log).
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLogFormatter() if log_format == "json" else TextLogFormatter())
    threshold = logging.getLevelNamesMapping()[level.upper()]
    logging.basicConfig(level=threshold, handlers=[handler], force=replace)
    # APScheduler logs two INFO lines for every run of a job ("Running job ...", "Job ...
    # executed successfully"): the service's watch runs every few seconds, which would bury
    # everything else. Its warnings (a missed run, a job that raised) stay; its INFO and
    # DEBUG lines only at --log-level debug.
    scheduler = threshold if threshold <= logging.DEBUG else max(threshold, logging.WARNING)
    logging.getLogger("apscheduler").setLevel(scheduler)
