"""Alert delivery: what the reconciler tells people when a rollout fails, and when it recovers.

The reconciler builds one ``AlertEvent`` per thing worth telling (a failed rollout, a refused
load, manifests that do not validate, a rollout that succeeded after a failure) and hands it
to an ``Alerter``:

- ``AlertmanagerAlerter`` posts it to Alertmanager's v2 API as an alert, and resolves the
  matching firing alert when a rollout succeeds;
- ``WebhookAlerter`` posts the event itself as JSON to any endpoint;
- ``LogAlerter`` logs one record per event, its fields structured (``message`` "alert");
- ``FanOut`` sends to several.

Alerting must never stop a reconcile: an alerter never raises to its caller and never blocks
longer than its timeout. A delivery that fails for a reason that may pass (the receiver is
down, slow or answers 5xx) stays queued in memory, bounded, and is retried before the next
event and on ``flush()``; one the receiver refuses (4xx) is logged and dropped. What is still
queued at the end of a pass goes to the state store (``backlog``) and is queued again by the
next pass, in this process or the next (``restore``), ahead of new events. Credentials in
URLs (user:password@) travel only in an Authorization header, and never appear in logs,
errors, payloads or the state store.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, Protocol, TypeVar

from reconciler.credentials import basic_auth, redact, redact_all
from reconciler.model.history import KINDS, AlertEvent

log = logging.getLogger(__name__)

ROLLOUT_FAILED = "rollout-failed"
LOAD_FAILED = "load-failed"
VALIDATION_FAILED = "validation-failed"
ROLLOUT_SUCCEEDED = "rollout-succeeded"
UNLOAD_FAILED = "unload-failed"
REVISION_REFUSED = "revision-refused"
assert {ROLLOUT_FAILED, LOAD_FAILED, VALIDATION_FAILED, ROLLOUT_SUCCEEDED} <= set(KINDS)

# The Alertmanager alert each kind fires, or (a success) resolves.
ALERT_NAMES = {
    ROLLOUT_FAILED: "TritonGitopsRolloutFailed",
    LOAD_FAILED: "TritonGitopsLoadFailed",
    VALIDATION_FAILED: "TritonGitopsValidationFailed",
    UNLOAD_FAILED: "TritonGitopsUnloadFailed",
    REVISION_REFUSED: "TritonGitopsRevisionRefused",
    ROLLOUT_SUCCEEDED: "TritonGitopsRolloutFailed",
}

# The labels that say which failure a success resolves; severity may differ between the two.
_IDENTITY = ("alertname", "model", "server")
QUEUE_LIMIT = 1000
_RETRY_STATUSES = frozenset({408, 425, 429})
_INVALID_NAME_CHARACTERS = re.compile(r"[^a-zA-Z0-9_]")


def alert_name(kind: str) -> str:
    """The Alertmanager alertname for ``kind``; an unknown kind is named after itself."""
    known = ALERT_NAMES.get(kind)
    if known:
        return known
    return "TritonGitops" + "".join(w.capitalize() for w in re.split(r"[^a-zA-Z0-9]+", kind))


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _rfc3339(at: datetime) -> str:
    return at.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def resolves(event: AlertEvent) -> bool:
    """True when ``event`` ends a failure instead of reporting one."""
    return event.resolved or event.kind == ROLLOUT_SUCCEEDED


def event_json(event: AlertEvent) -> dict[str, Any]:
    """The event as a JSON object, credentials hidden."""
    return {
        "kind": event.kind,
        "severity": event.severity,
        "summary": redact(event.summary),
        "revision": event.revision,
        "model": event.model,
        "server": event.server,
        "details": redact_all(event.details or {}),
        "resolved": event.resolved,
    }


def event_from_json(value: Mapping[str, Any]) -> AlertEvent:
    """An event back from ``event_json``'s object (the state store's alert outbox)."""
    return AlertEvent(
        str(value["kind"]),
        str(value["severity"]),
        str(value["summary"]),
        str(value["revision"]),
        value.get("model"),
        value.get("server"),
        dict(value.get("details") or {}),
        bool(value.get("resolved", False)),
    )


class Alerter(Protocol):
    def send(self, event: AlertEvent) -> None:
        """Deliver ``event`` or queue it; never raises, never blocks past a timeout."""
        ...


class _Undelivered(Exception):
    """A delivery failed; ``retry`` tells whether trying again later may succeed."""

    def __init__(self, message: str, retry: bool) -> None:
        super().__init__(message)
        self.retry = retry


def _exchange(method: str, url: str, body: Any, deadline: float) -> Any:
    """One JSON request that must finish by ``deadline`` (monotonic); its JSON answer or None."""
    timeout = deadline - time.monotonic()
    if timeout <= 0:
        raise _Undelivered(f"{method} {redact(url)}: out of time", retry=True)
    plain, headers = basic_auth(url)
    data = None
    if body is not None:
        data = json.dumps(body, default=str).encode()
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(plain, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = bytes(response.read())
    except urllib.error.HTTPError as exc:
        detail = exc.read(300).decode(errors="replace").strip()
        retry = exc.code >= 500 or exc.code in _RETRY_STATUSES
        raise _Undelivered(
            redact(f"{method} {plain}: HTTP {exc.code} {detail}".strip()), retry
        ) from exc
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        raise _Undelivered(redact(f"{method} {plain}: {reason}"), retry=True) from exc
    try:
        return json.loads(raw) if raw.strip() else None
    except ValueError:
        return None


Delivery = TypeVar("Delivery")


class _QueuedAlerter(ABC, Generic[Delivery]):
    """Deliveries to one URL, oldest first, retried until made, refused or pushed out."""

    def __init__(
        self,
        url: str,
        timeout: float = 5.0,
        queue_limit: int = QUEUE_LIMIT,
        clock: Callable[[], datetime] = _utcnow,
    ) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.queue_limit = queue_limit
        self.clock = clock
        self.last_error: str | None = None
        self.dropped = 0  # pushed out of a full queue, or refused by the receiver
        self._queue: deque[Delivery] = deque()
        self._queue_lock = threading.Lock()  # held only to touch the queue
        self._delivery_lock = threading.Lock()  # one sender delivers at a time, in order

    def __repr__(self) -> str:
        return f"{type(self).__name__}({redact(self.url)!r})"

    @property
    def pending(self) -> int:
        """Deliveries still queued."""
        return len(self._queue)

    @property
    def key(self) -> str:
        """Names this receiver in the state store without its URL (it may hold credentials)."""
        return f"{type(self).__name__}:{hashlib.sha256(self.url.encode()).hexdigest()[:16]}"

    def backlog(self) -> list[Any]:
        """The deliveries still queued, as JSON values, oldest first."""
        with self._queue_lock:
            return [self._to_json(d) for d in self._queue]

    def restore(self, backlog: Iterable[Any]) -> None:
        """Queue deliveries an earlier pass could not make, ahead of any queued since."""
        restored = []
        for item in backlog:
            try:
                restored.append(self._from_json(item))
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                log.error("a stored alert for %s is unreadable, dropped: %s", self, exc)
                self.dropped += 1
        with self._queue_lock:
            self._queue.extendleft(reversed(restored))
            while len(self._queue) > self.queue_limit:
                self._queue.popleft()
                self.dropped += 1

    @abstractmethod
    def _to_json(self, delivery: Delivery) -> Any:
        """One delivery as a JSON value, for the state store."""

    @abstractmethod
    def _from_json(self, value: Any) -> Delivery:
        """A delivery back from ``_to_json``'s value."""

    @abstractmethod
    def _deliveries(self, event: AlertEvent) -> list[Delivery]:
        """What to deliver for ``event``."""

    @abstractmethod
    def _deliver(self, delivery: Delivery, deadline: float) -> None:
        """Make one delivery by ``deadline`` (monotonic); raises ``_Undelivered``."""

    def send(self, event: AlertEvent) -> None:
        try:
            deliveries = self._deliveries(event)
        except Exception as exc:  # a malformed event must not stop a reconcile either
            log.error("alert for %s not sent, the event is malformed: %s", self, exc)
            return
        with self._queue_lock:
            for delivery in deliveries:
                if len(self._queue) >= self.queue_limit:
                    self._queue.popleft()
                    self.dropped += 1
                    log.warning("alert queue for %s full: the oldest was dropped", self)
                self._queue.append(delivery)
        self.flush()

    def flush(self) -> bool:
        """Try the queued deliveries in order, within the timeout; True when none is left."""
        deadline = time.monotonic() + self.timeout
        if not self._delivery_lock.acquire(timeout=self.timeout):
            return False
        try:
            while True:
                with self._queue_lock:
                    if not self._queue:
                        return True
                    delivery = self._queue[0]
                try:
                    self._deliver(delivery, deadline)
                except _Undelivered as exc:
                    self.last_error = str(exc)
                    if exc.retry:
                        log.warning(
                            "alert not delivered, %d queued for retry: %s", self.pending, exc
                        )
                        return False
                    log.error("alert refused by the receiver, dropped: %s", exc)
                    self.dropped += 1
                except Exception as exc:  # a receiver's odd answer: never retried forever
                    self.last_error = redact(f"{type(exc).__name__}: {exc}")
                    log.error("alert to %s dropped: %s", self, self.last_error)
                    self.dropped += 1
                with self._queue_lock:
                    if self._queue and self._queue[0] is delivery:
                        self._queue.popleft()
        finally:
            self._delivery_lock.release()


@dataclass(frozen=True)
class _Fire:
    """Alerts to post as they are."""

    alerts: tuple[dict[str, Any], ...]


@dataclass(frozen=True)
class _Resolve:
    """End every firing alert with these labels (whatever its severity), as of ``at``."""

    matchers: tuple[tuple[str, str], ...]
    at: str
    annotations: dict[str, str]


def _annotation_name(key: str) -> str:
    name = _INVALID_NAME_CHARACTERS.sub("_", key)
    return name if name and not name[0].isdigit() else f"_{name}"


def _annotation_value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


def _matcher(name: str, value: str) -> str:
    """An Alertmanager matcher; its values escape only backslash, quote and newline."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'{name}="{escaped}"'


class AlertmanagerAlerter(_QueuedAlerter[_Fire | _Resolve]):
    """Alerts posted to Alertmanager's ``/api/v2/alerts``.

    A failure fires ``ALERT_NAMES[kind]`` with labels alertname, model, server and severity
    (those that are set) and the summary, revision and details as annotations. A resolving
    event ends the firing alerts with the same alertname, model and server: they are looked
    up first, so a success resolves the failure whatever severity either was sent with.

    Alertmanager ends an alert it is not told about again within its ``resolve_timeout``
    (5 minutes by default); ``ttl`` sets a firing alert's end explicitly instead, for a
    caller that does not send a failure again while it lasts.
    """

    def __init__(
        self,
        url: str,
        timeout: float = 5.0,
        queue_limit: int = QUEUE_LIMIT,
        clock: Callable[[], datetime] = _utcnow,
        ttl: float | None = None,
    ) -> None:
        super().__init__(url, timeout, queue_limit, clock)
        self.ttl = ttl

    @property
    def alerts_url(self) -> str:
        return f"{self.url}/api/v2/alerts"

    @staticmethod
    def labels(event: AlertEvent) -> dict[str, str]:
        labels = {
            "alertname": alert_name(event.kind),
            "model": event.model,
            "server": event.server,
            "severity": event.severity,
        }
        return {name: value for name, value in labels.items() if value}

    @staticmethod
    def annotations(event: AlertEvent) -> dict[str, str]:
        annotations = {"summary": redact(event.summary), "revision": event.revision}
        for key, value in redact_all(event.details or {}).items():
            annotations[_annotation_name(key)] = _annotation_value(value)
        return annotations

    def _deliveries(self, event: AlertEvent) -> list[_Fire | _Resolve]:
        at = self.clock()
        if resolves(event):
            labels = self.labels(event)
            matchers = tuple((name, labels.get(name, "")) for name in _IDENTITY)
            annotations = {
                "resolution": redact(event.summary),
                "resolvedRevision": event.revision,
            }
            return [_Resolve(matchers, _rfc3339(at), annotations)]
        alert: dict[str, Any] = {
            "labels": self.labels(event),
            "annotations": self.annotations(event),
            "startsAt": _rfc3339(at),
        }
        if self.ttl is not None:
            alert["endsAt"] = _rfc3339(at + timedelta(seconds=self.ttl))
        return [_Fire((alert,))]

    def _to_json(self, delivery: _Fire | _Resolve) -> Any:
        if isinstance(delivery, _Fire):
            return {"fire": list(delivery.alerts)}
        return {
            "resolve": {
                "matchers": [list(m) for m in delivery.matchers],
                "at": delivery.at,
                "annotations": delivery.annotations,
            }
        }

    def _from_json(self, value: Any) -> _Fire | _Resolve:
        if "fire" in value:
            return _Fire(tuple(dict(a) for a in value["fire"]))
        resolve = value["resolve"]
        return _Resolve(
            tuple((str(n), str(v)) for n, v in resolve["matchers"]),
            str(resolve["at"]),
            {str(k): str(v) for k, v in resolve["annotations"].items()},
        )

    def _deliver(self, delivery: _Fire | _Resolve, deadline: float) -> None:
        if isinstance(delivery, _Fire):
            _exchange("POST", self.alerts_url, list(delivery.alerts), deadline)
            return
        # ``name=""`` matches alerts without that label, as an event without a model fired.
        query = urllib.parse.urlencode(
            [("filter", _matcher(name, value)) for name, value in delivery.matchers]
        )
        firing = _exchange("GET", f"{self.alerts_url}?{query}", None, deadline) or []
        ended = [
            {
                "labels": alert["labels"],
                "annotations": {**alert.get("annotations", {}), **delivery.annotations},
                # Alertmanager refuses an end before the start; the stored start is kept.
                "startsAt": delivery.at,
                "endsAt": delivery.at,
            }
            for alert in firing
            if isinstance(alert, dict) and isinstance(alert.get("labels"), dict)
        ]
        if ended:
            _exchange("POST", self.alerts_url, ended, deadline)


class WebhookAlerter(_QueuedAlerter[dict[str, Any]]):
    """Each event POSTed as a JSON object (``event_json`` and its time, ``at``)."""

    def _deliveries(self, event: AlertEvent) -> list[dict[str, Any]]:
        return [{**event_json(event), "at": _rfc3339(self.clock())}]

    def _to_json(self, delivery: dict[str, Any]) -> Any:
        return delivery

    def _from_json(self, value: Any) -> dict[str, Any]:
        return dict(value)

    def _deliver(self, delivery: dict[str, Any], deadline: float) -> None:
        _exchange("POST", self.url, delivery, deadline)


class LogAlerter:
    """One log record per event: WARNING for a failure, INFO for a recovery. The message
    is "alert" (the service names its events by their message) and the event's fields
    (``event_json``) travel as the record's structured fields, so a JSON log line holds
    them as fields of its own, not as JSON inside a string (``adapters/logs.py``)."""

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self.logger = logger or log

    def send(self, event: AlertEvent) -> None:
        level = logging.INFO if resolves(event) else logging.WARNING
        self.logger.log(level, "alert", extra={"fields": event_json(event)})


class FanOut:
    """Every event to every alerter; one alerter's trouble never reaches the others."""

    def __init__(self, alerters: Iterable[Alerter]) -> None:
        self.alerters = tuple(alerters)

    def send(self, event: AlertEvent) -> None:
        for alerter in self.alerters:
            try:
                alerter.send(event)
            except Exception as exc:  # an alerter must not stop a reconcile
                log.error("alerter %r failed: %s", alerter, redact(str(exc)))

    def backlog(self) -> dict[str, list[Any]]:
        """Per receiver (``key``), what it has not taken yet."""
        return {
            a.key: a.backlog() for a in self.alerters if isinstance(a, _QueuedAlerter) and a.pending
        }

    def restore(self, backlogs: Mapping[str, list[Any]]) -> None:
        """Queue again what earlier passes could not deliver; a receiver no longer
        configured gets nothing (its backlog is dropped with the next ``backlog``)."""
        for alerter in self.alerters:
            if isinstance(alerter, _QueuedAlerter) and alerter.key in backlogs:
                alerter.restore(backlogs[alerter.key])

    def flush(self) -> bool:
        """Retry every queued delivery; True when none is left anywhere."""
        done = True
        for alerter in self.alerters:
            flush = getattr(alerter, "flush", None)
            if callable(flush):
                done = bool(flush()) and done
        return done
