"""The alert adapters against a real Alertmanager, a real HTTP endpoint and a real logger."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

import pytest

from reconciler.adapters.alerts import AlertmanagerAlerter, FanOut, LogAlerter, WebhookAlerter
from reconciler.adapters.logs import JsonLogFormatter
from reconciler.model.history import AlertEvent
from testkit.local_triton import free_port

if TYPE_CHECKING:
    from testkit.services import Alertmanager

pytest_plugins = ("tests.services",)

FAILED = AlertEvent(
    "rollout-failed",
    "critical",
    "echo 2 on edge-a failed its analysis; 1 serves again",
    "0123abcd",
    model="echo",
    server="edge-a",
    details={
        "checks": "success=0.5 (>= 0.99): fail",
        "action": "revert",
        "to_versions": [2],
        "rollback_seconds": 0.012,
    },
)
SUCCEEDED = AlertEvent(
    "rollout-succeeded", "info", "echo 3 serves on edge-a", "4567cdef", "echo", "edge-a",
    resolved=True,
)  # fmt: skip


def _firing(alertmanager: Alertmanager, alertname: str) -> list[dict[str, Any]]:
    return [a for a in alertmanager.alerts() if a["labels"]["alertname"] == alertname]


def test_rollout_failed_alert_fires_with_labels_and_annotations(
    alertmanager: Alertmanager,
) -> None:
    alerter = AlertmanagerAlerter(alertmanager.url)
    alerter.send(FAILED)
    assert alerter.pending == 0 and alerter.last_error is None
    [alert] = _firing(alertmanager, "TritonGitopsRolloutFailed")
    assert alert["labels"] == {
        "alertname": "TritonGitopsRolloutFailed",
        "model": "echo",
        "server": "edge-a",
        "severity": "critical",
    }
    annotations = alert["annotations"]
    assert annotations["summary"] == FAILED.summary
    assert annotations["revision"] == "0123abcd"
    assert annotations["checks"] == "success=0.5 (>= 0.99): fail"
    assert annotations["action"] == "revert"
    assert json.loads(annotations["to_versions"]) == [2]
    assert json.loads(annotations["rollback_seconds"]) == 0.012
    assert alert["status"]["state"] == "active"


def test_alert_without_model_or_server_omits_those_labels(alertmanager: Alertmanager) -> None:
    event = AlertEvent(
        "validation-failed",
        "warning",
        "the manifests are invalid",
        "89abcdef",
        details={"problems": "a.yaml:3: bad", "odd-key.1": 1},
    )
    AlertmanagerAlerter(alertmanager.url).send(event)
    [alert] = _firing(alertmanager, "TritonGitopsValidationFailed")
    assert alert["labels"] == {"alertname": "TritonGitopsValidationFailed", "severity": "warning"}
    # Annotation names must be label names; others are rewritten rather than refused.
    assert alert["annotations"]["odd_key_1"] == "1"


def test_success_resolves_the_failure_whatever_its_severity(alertmanager: Alertmanager) -> None:
    alerter = AlertmanagerAlerter(alertmanager.url)
    alerter.send(FAILED)
    other = AlertEvent("load-failed", "critical", "other failed", "0123abcd", "other", "edge-a")
    alerter.send(other)
    assert len(_firing(alertmanager, "TritonGitopsRolloutFailed")) == 1
    alerter.send(SUCCEEDED)  # severity info, where the failure was critical
    assert alerter.pending == 0 and alerter.last_error is None
    # Alertmanager lists only alerts that have not ended: the resolved one is gone...
    assert _firing(alertmanager, "TritonGitopsRolloutFailed") == []
    # ... and only it: another model's failure still fires.
    [load] = _firing(alertmanager, "TritonGitopsLoadFailed")
    assert load["labels"]["model"] == "other"


def test_resolving_ends_the_alert_in_the_past(alertmanager: Alertmanager) -> None:
    """The posted end is the event's own time, so the alert is over at once."""
    alerter = AlertmanagerAlerter(alertmanager.url, ttl=3600)
    alerter.send(FAILED)
    [alert] = _firing(alertmanager, "TritonGitopsRolloutFailed")
    ends = datetime.fromisoformat(alert["endsAt"].replace("Z", "+00:00"))
    assert (ends - datetime.now(UTC)).total_seconds() > 3000  # the ttl, not Alertmanager's 5m
    alerter.send(replace(FAILED, resolved=True))
    assert _firing(alertmanager, "TritonGitopsRolloutFailed") == []


def test_delivery_to_a_stopped_alertmanager_is_queued_then_delivered(
    alertmanager: Alertmanager,
) -> None:
    alerter = AlertmanagerAlerter(alertmanager.url, timeout=2.0)
    alertmanager.stop()
    started = time.monotonic()
    alerter.send(FAILED)
    assert time.monotonic() - started < 2.0
    assert alerter.pending == 1
    assert alerter.last_error is not None and "Connection refused" in alerter.last_error
    assert not alerter.flush()

    alertmanager.start()  # the same port; Alertmanager keeps no alerts across restarts
    assert _firing(alertmanager, "TritonGitopsRolloutFailed") == []
    assert alerter.flush()
    assert alerter.pending == 0
    assert len(_firing(alertmanager, "TritonGitopsRolloutFailed")) == 1


def test_a_receiver_that_never_answers_does_not_block_past_the_timeout() -> None:
    with socket.socket() as listener:  # accepts connections, never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        alerter = AlertmanagerAlerter(url, timeout=0.5)
        started = time.monotonic()
        alerter.send(FAILED)
        alerter.send(SUCCEEDED)
        assert time.monotonic() - started < 1.5
        assert alerter.pending == 2
        assert alerter.last_error is not None and "timed out" in alerter.last_error


class Receiver:
    """A tiny webhook endpoint: records every request, answers ``status``."""

    def __init__(self, port: int = 0) -> None:
        self.requests: list[tuple[dict[str, str], Any]] = []
        self.status = 200
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if receiver.status == 200:
                    receiver.requests.append((dict(self.headers), json.loads(body)))
                self.send_response(receiver.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    try:
        yield server
    finally:
        server.close()


def test_webhook_posts_the_event_as_json(receiver: Receiver) -> None:
    alerter = WebhookAlerter(receiver.url)
    alerter.send(FAILED)
    [(headers, body)] = receiver.requests
    assert headers["Content-Type"] == "application/json"
    assert {k: body[k] for k in ("kind", "severity", "summary", "revision", "model", "server")} == {
        "kind": "rollout-failed",
        "severity": "critical",
        "summary": FAILED.summary,
        "revision": "0123abcd",
        "model": "echo",
        "server": "edge-a",
    }
    assert body["details"]["to_versions"] == [2]
    assert body["resolved"] is False
    assert datetime.fromisoformat(body["at"].replace("Z", "+00:00")).tzinfo is not None


def test_webhook_retries_a_5xx_and_drops_a_4xx(receiver: Receiver) -> None:
    alerter = WebhookAlerter(receiver.url, timeout=2.0)
    receiver.status = 503
    alerter.send(FAILED)
    assert alerter.pending == 1 and "HTTP 503" in (alerter.last_error or "")
    receiver.status = 200
    alerter.send(SUCCEEDED)  # the queued one goes first
    assert [body["kind"] for _, body in receiver.requests] == [
        "rollout-failed",
        "rollout-succeeded",
    ]
    receiver.status = 400
    alerter.send(FAILED)
    assert alerter.pending == 0 and alerter.dropped == 1


def test_webhook_queue_is_bounded_and_keeps_the_newest() -> None:
    port = free_port()
    alerter = WebhookAlerter(f"http://127.0.0.1:{port}/hook", timeout=1.0, queue_limit=3)
    for n in range(5):
        alerter.send(AlertEvent("load-failed", "critical", f"failure {n}", "r"))
    assert alerter.pending == 3 and alerter.dropped == 2
    receiver = Receiver(port)
    try:
        assert alerter.flush()
        assert [body["summary"] for _, body in receiver.requests] == [
            "failure 2",
            "failure 3",
            "failure 4",
        ]
    finally:
        receiver.close()


def test_log_alerter_logs_the_event_as_fields_of_one_json_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    logger = logging.getLogger("tests.alerts")
    with caplog.at_level(logging.INFO, logger="tests.alerts"):
        LogAlerter(logger).send(FAILED)
        LogAlerter(logger).send(SUCCEEDED)
    failed, succeeded = caplog.records
    assert failed.levelno == logging.WARNING and succeeded.levelno == logging.INFO
    line = JsonLogFormatter().format(failed)
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["message"] == "alert"  # the event's fields are fields, not JSON in a string
    assert (entry["kind"], entry["model"], entry["server"]) == ("rollout-failed", "echo", "edge-a")
    assert entry["details"]["checks"] == FAILED.details["checks"]
    assert entry["details"]["to_versions"] == [2]
    assert json.loads(JsonLogFormatter().format(succeeded))["resolved"] is True


def test_fan_out_sends_to_every_alerter(
    receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    down = WebhookAlerter(f"http://127.0.0.1:{free_port()}/", timeout=1.0)
    fan_out = FanOut(
        [down, LogAlerter(logging.getLogger("tests.alerts")), WebhookAlerter(receiver.url)]
    )
    with caplog.at_level(logging.INFO, logger="tests.alerts"):
        fan_out.send(FAILED)
    assert len(receiver.requests) == 1
    assert [r.name for r in caplog.records if r.name == "tests.alerts"] == ["tests.alerts"]
    assert down.pending == 1 and not fan_out.flush()


def test_credentials_travel_in_a_header_and_never_in_logs_or_errors(
    receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "s3cr3t-pw"
    leaky = AlertEvent(
        "load-failed",
        "critical",
        f"fetch of https://bot:{secret}@git.example/x.git failed",
        "r",
        details={"source": f"https://bot:{secret}@git.example/x.git"},
    )
    url = f"http://alerts:{secret}@127.0.0.1:{receiver.port}/hook"
    with caplog.at_level(logging.DEBUG):
        WebhookAlerter(url).send(leaky)
        LogAlerter(logging.getLogger("tests.alerts")).send(leaky)
        down = AlertmanagerAlerter(f"http://alerts:{secret}@127.0.0.1:{free_port()}", timeout=1)
        down.send(leaky)
    [(headers, body)] = receiver.requests
    assert headers["Authorization"].startswith("Basic ")
    assert secret not in json.dumps(body)
    assert body["details"]["source"] == "https://***@git.example/x.git"
    assert down.last_error is not None and "127.0.0.1" in down.last_error
    assert secret not in down.last_error
    assert secret not in repr(down)
    assert caplog.records and secret not in caplog.text
    # the log alerter's event travels as fields: hidden there too, as the service writes them
    logged = [JsonLogFormatter().format(r) for r in caplog.records if r.name == "tests.alerts"]
    assert logged and all(secret not in line for line in logged)
    assert json.loads(logged[0])["details"]["source"] == "https://***@git.example/x.git"


@dataclass(frozen=True)
class CoreEvent:
    """An event type of the reconcile core's own, with the same fields."""

    kind: str
    severity: str
    summary: str
    revision: str
    model: str | None = None
    server: str | None = None
    details: Mapping[str, Any] | None = None
    resolved: bool = False


class Broken:
    def send(self, event: object) -> None:
        raise RuntimeError("broken alerter")


def test_any_event_with_the_same_fields_is_sent(
    receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    event = CoreEvent("load-failed", "critical", "echo 2 failed to load", "r", "echo", "edge-a")
    fan_out = FanOut([Broken(), WebhookAlerter(receiver.url)])
    with caplog.at_level(logging.ERROR):
        fan_out.send(event)
    [(_, body)] = receiver.requests
    assert body["details"] == {} and body["kind"] == "load-failed"
    assert "broken alerter" in caplog.text


def test_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown alert kind"):
        AlertEvent("deployed", "info", "x", "r")
