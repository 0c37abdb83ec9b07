"""Step hooks: the webhooks called around steps and stages (drain, preStep/postStep), and a
backend's replaceLibrary command and webhook. ``HttpStepHooks`` is the real ``StepHooks``
(``ports.py``); ``wiring`` (today ``loop.reconcile``) gives it to ``engine.apply.apply``.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from reconciler.credentials import basic_auth, redact
from reconciler.model.errors import StepFailed
from reconciler.model.plan import Step


def _post_json(url: str, payload: Mapping[str, Any], timeout: float = 10.0) -> None:
    """POST ``payload``; any answer but 2xx, or none, raises StepFailed."""
    plain_url, headers = basic_auth(url)
    request = urllib.request.Request(
        plain_url,
        json.dumps(payload).encode(),
        {"Content-Type": "application/json", **headers},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status = int(response.status)
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (urllib.error.URLError, OSError) as exc:
        raise StepFailed(f"{redact(url)} did not answer: {exc}") from exc
    if not 200 <= status < 300:
        raise StepFailed(f"{redact(url)} answered {status}")


class HttpStepHooks:
    """Webhooks over HTTP(S) (basic auth from the URL, redacted in errors) and the
    replaceLibrary command as a subprocess."""

    def call_webhook(self, url: str, payload: Mapping[str, Any]) -> None:
        _post_json(url, payload)

    def replace_library(self, step: Step) -> None:
        _replace_library(step)


def _replace_library(step: Step) -> None:
    backend = step.backend
    assert backend is not None
    if backend.command:
        env = {
            **os.environ,
            "TRITON_GITOPS_SERVER": step.server,
            "TRITON_GITOPS_MODEL": step.model,
            "TRITON_GITOPS_BACKEND": backend.name,
            "TRITON_GITOPS_REVISION": backend.revision,
        }
        try:
            done = subprocess.run(
                list(backend.command), env=env, capture_output=True, text=True, timeout=600
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise StepFailed(f"replaceLibrary command failed: {exc}") from exc
        if done.returncode != 0:
            raise StepFailed(
                f"replaceLibrary command exited {done.returncode}: "
                f"{(done.stderr or done.stdout).strip()[-500:]}"
            )
    if backend.webhook:
        _post_json(
            backend.webhook,
            {"event": "replace-library", "server": step.server, "model": step.model,
             "backend": backend.name, "revision": backend.revision},
            timeout=600,
        )  # fmt: skip
