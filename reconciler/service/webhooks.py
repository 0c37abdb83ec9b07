"""What a webhook must pass before it triggers a pass: its route, a slot to read its body in,
its signature or token, and a first sighting of its delivery (replays are refused).

The request handler (service/http.py) asks ``WebhookGate``; ``Daemon`` (service/daemon.py)
keeps one, made from its ``RunSettings``.
"""

from __future__ import annotations

import hashlib
import hmac
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping

from reconciler.model.settings import RunSettings
from reconciler.service.operator import caller

# Webhook endpoints and the source each is counted and verified as.
WEBHOOK_ROUTES = {"/webhook/github": "github", "/webhook/gitlab": "gitlab", "/reconcile": "token"}


class DeliveryMemory:
    """Webhook deliveries seen in the last ``window`` seconds, at most ``capacity`` of them.

    A delivery is known by keys (its delivery id, its signature); one whose key was seen
    within the window is a replay. Time is injected so that expiry is tested without sleeping.
    """

    def __init__(
        self, window: float, capacity: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.window = window
        self.capacity = capacity
        self.clock = clock
        self._seen: OrderedDict[str, float] = OrderedDict()  # oldest first
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._seen)

    def first_sighting(self, keys: Iterable[str]) -> bool:
        """Remember ``keys``; False (and nothing remembered) when one was seen in the window."""
        keys = list(keys)
        now = self.clock()
        with self._lock:
            while self._seen and next(iter(self._seen.values())) <= now - self.window:
                self._seen.popitem(last=False)
            if any(key in self._seen for key in keys):
                return False
            for key in keys:
                self._seen[key] = now
            while len(self._seen) > self.capacity:
                self._seen.popitem(last=False)
            return True


def delivery_keys(source: str, headers: Mapping[str, str]) -> list[str]:
    """What identifies one verified delivery, for replay detection.

    GitHub signs the body but not its X-GitHub-Delivery header, so a replayer could change
    the id: the signature (one per body, and every push body differs) is a key too. GitLab's
    token is not bound to the body, so its event UUID is all there is. POST /reconcile means
    "reconcile now" and is safe to repeat: it has no keys.
    """
    if source == "github":
        keys = [f"github-signature:{headers.get('x-hub-signature-256', '')}"]
        if headers.get("x-github-delivery"):
            keys.append(f"github-delivery:{headers['x-github-delivery']}")
        return keys
    if source == "gitlab" and headers.get("x-gitlab-event-uuid"):
        return [f"gitlab-event:{headers['x-gitlab-event-uuid']}"]
    return []


class WebhookGate:
    """The secrets a webhook is checked against, the deliveries already seen, and the slots
    for reading bodies (bounded so that slow senders cannot take every thread)."""

    def __init__(self, run: RunSettings, now: Callable[[], RunSettings] | None = None) -> None:
        self.run_settings = run
        # The secrets as their files say now (``Daemon.run_now``: a rotated Secret).
        self._now = now or (lambda: run)
        self.deliveries = DeliveryMemory(run.replay_window, run.replay_memory)
        self.reads = threading.BoundedSemaphore(run.max_webhook_reads)

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

    def first_sighting(self, verified: str, headers: Mapping[str, str]) -> bool:
        """Remember a verified delivery; False when it is a replay."""
        return self.deliveries.first_sighting(delivery_keys(verified, headers))
