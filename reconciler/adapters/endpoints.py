"""Whether an HTTP service answers its readiness endpoint (``triton-gitops check``):
Prometheus and Alertmanager both serve ``/-/ready`` (200 when ready)."""

from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request

from reconciler.credentials import basic_auth, redact


def not_ready(url: str, path: str = "/-/ready", timeout: float = 5.0) -> str | None:
    """Why ``url`` + ``path`` does not answer 200, or None when it does."""
    target = url.rstrip("/") + path
    plain, headers = basic_auth(target)
    try:
        with urllib.request.urlopen(
            urllib.request.Request(plain, headers=headers), timeout=timeout
        ) as response:
            if response.status == 200:
                return None
            return f"{redact(target)} answered {response.status}"
    except urllib.error.HTTPError as exc:
        return f"{redact(target)} answered {exc.code} {exc.reason}"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        return f"{redact(target)} did not answer: {reason}"
