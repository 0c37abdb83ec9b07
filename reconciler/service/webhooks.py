"""What a webhook must pass before it triggers a pass: its route, a slot to read its body in,
its signature or token, and a first sighting of its delivery (replays are refused).

The request handler (service/http.py) asks ``WebhookGate``; ``Daemon`` (service/daemon.py)
keeps one, made from its ``RunSettings``, and has it recall the deliveries seen before a
restart from the state store at start.
"""

from __future__ import annotations

import hashlib
import hmac
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from reconciler.model.settings import RunSettings
from reconciler.ports import DeliveryRecord
from reconciler.service.operator import caller
from reconciler.service.telemetry import log_event
from reconciler.wiring import open_state_store

# Webhook endpoints and the source each is counted and verified as.
WEBHOOK_ROUTES = {"/webhook/github": "github", "/webhook/gitlab": "gitlab", "/reconcile": "token"}


class DeliveryMemory:
    """Webhook deliveries seen in the last ``window`` seconds, at most ``capacity`` of them.

    A delivery is known by keys (its delivery id, its signature); one whose key was seen
    within the window is a replay. Time is the wall clock (the keys outlive the process, in
    the state store), injected so that expiry is tested without sleeping.
    """

    def __init__(
        self, window: float, capacity: int, clock: Callable[[], float] = time.time
    ) -> None:
        self.window = window
        self.capacity = capacity
        self.clock = clock
        self._seen: OrderedDict[str, float] = OrderedDict()  # oldest first
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._seen)

    def recall(self, seen: Iterable[tuple[str, float]]) -> None:
        """Take in keys seen earlier (oldest first) with their time, before any new one."""
        with self._lock:
            for key, at in seen:
                self._seen[key] = at
            self._forget(self.clock())

    def _forget(self, now: float) -> None:
        while self._seen and next(iter(self._seen.values())) <= now - self.window:
            self._seen.popitem(last=False)
        while len(self._seen) > self.capacity:
            self._seen.popitem(last=False)

    def first_sighting(
        self, keys: Iterable[str], remember: Callable[[list[str], float], None] | None = None
    ) -> bool:
        """Remember ``keys`` (and pass them to ``remember`` with their time, under the same
        lock, so that a store sees them in order); False (and nothing remembered) when one
        was seen in the window."""
        keys = list(keys)
        now = self.clock()
        with self._lock:
            self._forget(now)
            if any(key in self._seen for key in keys):
                return False
            for key in keys:
                self._seen[key] = now
            self._forget(now)
            if remember is not None and keys:
                remember(keys, now)
            return True


def delivery_keys(source: str, headers: Mapping[str, str], body: bytes) -> list[str]:
    """What identifies one verified delivery, for replay detection.

    GitHub signs the body but not its X-GitHub-Delivery header, so a replayer could change
    the id: the signature (one per body, and every push body differs) is a key too. GitLab's
    token is not bound to the body, and its X-Gitlab-Event-UUID is as easy to change, so a
    digest of the event name and the body is a key: the same delivery under a new UUID is
    caught. What is not caught: whoever holds the GitLab token (it travels in every delivery)
    can send a new body, which no replay memory can tell from a real delivery; only the
    token's secrecy (TLS, rotation) stops that. Two real GitLab events with byte-identical
    bodies within the window count as one (the pass the first asks for reads Git anyway).
    POST /reconcile means "reconcile now" and is safe to repeat: it has no keys.
    """
    if source == "github":
        keys = [f"github-signature:{headers.get('x-hub-signature-256', '')}"]
        if headers.get("x-github-delivery"):
            keys.append(f"github-delivery:{headers['x-github-delivery']}")
        return keys
    if source == "gitlab":
        event = headers.get("x-gitlab-event", "").encode()
        digest = hashlib.sha256(event + b"\n" + body).hexdigest()
        keys = [f"gitlab-body:{digest}"]
        if headers.get("x-gitlab-event-uuid"):
            keys.append(f"gitlab-event:{headers['x-gitlab-event-uuid']}")
        return keys
    return []


class WebhookGate:
    """The secrets a webhook is checked against, the deliveries already seen, and the slots
    for reading bodies (bounded so that slow senders cannot take every thread)."""

    def __init__(
        self,
        run: RunSettings,
        state_path: Path | None = None,
        now: Callable[[], RunSettings] | None = None,
    ) -> None:
        self.run_settings = run
        # The secrets as their files say now (``Daemon.run_now``: a rotated Secret).
        self._now = now or (lambda: run)
        self.deliveries = DeliveryMemory(run.replay_window, run.replay_memory)
        self.reads = threading.BoundedSemaphore(run.max_webhook_reads)
        self.state_path = state_path  # where deliveries outlive the process (None: nowhere)
        self._store: DeliveryRecord | None = None

    def _open_store(self) -> DeliveryRecord | None:
        # Only a store a pass has made: creating one here would hide the first pass's
        # warning that the state file is missing.
        if self._store is None and self.state_path is not None and self.state_path.exists():
            self._store = open_state_store(self.state_path)
        return self._store

    def recall(self) -> None:
        """Take in the deliveries seen within the window before a restart."""
        store = self._open_store()
        if store is not None:
            window, memory = self.run_settings.replay_window, self.run_settings.replay_memory
            seen = store.seen_deliveries(self.deliveries.clock() - window, memory)
            self.deliveries.recall(seen)
            log_event("webhook deliveries recalled", keys=len(seen))

    def _remember(self, keys: list[str], at: float) -> None:
        store = self._open_store()
        if store is not None:
            run = self.run_settings
            store.remember_deliveries(keys, at, at - run.replay_window, run.replay_memory)

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None

    def verify(self, path: str, headers: Mapping[str, str], body: bytes) -> str | None:
        """The source of a verified webhook ('github', 'gitlab', 'token'), else None.

        ``headers`` are keyed in lower case (HTTP header names are case-insensitive).
        """
        run = self._now()
        if path == "/webhook/github" and run.github_secret:
            signature = headers.get("x-hub-signature-256", "")
            digest = hmac.new(run.github_secret.encode(), body, hashlib.sha256).hexdigest()
            return "github" if hmac.compare_digest(signature, f"sha256={digest}") else None
        if path == "/webhook/gitlab" and run.gitlab_token:
            given = headers.get("x-gitlab-token", "")
            return "gitlab" if hmac.compare_digest(given, run.gitlab_token) else None
        if path == "/reconcile" and run.reconcile_token:
            given = headers.get("authorization", "")
            return "token" if hmac.compare_digest(given, f"Bearer {run.reconcile_token}") else None
        return None

    def operator(self, headers: Mapping[str, str]) -> str | None:
        """The name of the operator token a request carries, else None."""
        return caller(self._now().operator_tokens, headers)

    def first_sighting(self, verified: str, headers: Mapping[str, str], body: bytes) -> bool:
        """Remember a verified delivery, in the state store too; False when it is a replay."""
        keys = delivery_keys(verified, headers, body)
        return self.deliveries.first_sighting(keys, self._remember)
