"""Webhook authentication (service/webhooks.py): signatures, tokens, replays."""

from __future__ import annotations

import hashlib
import hmac

from reconciler.model.settings import RunSettings
from reconciler.service.webhooks import WebhookGate

BODY = b'{"ref": "refs/heads/main"}'


def signed(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def test_each_route_is_checked_against_its_own_secret() -> None:
    gate = WebhookGate(RunSettings(github_secret="gh", gitlab_token="gl", reconcile_token="tok"))
    github = {"x-hub-signature-256": signed("gh", BODY)}
    assert gate.verify("/webhook/github", github, BODY) == "github"
    assert gate.verify("/webhook/github", github, BODY + b" ") is None
    assert gate.verify("/webhook/gitlab", github, BODY) is None
    assert gate.verify("/webhook/gitlab", {"x-gitlab-token": "gl"}, BODY) == "gitlab"
    assert gate.verify("/reconcile", {"authorization": "Bearer tok"}, b"") == "token"
    assert gate.verify("/reconcile", {"authorization": "Bearer gl"}, b"") is None


def test_a_route_without_a_secret_accepts_nothing() -> None:
    gate = WebhookGate(RunSettings())
    assert gate.verify("/webhook/github", {"x-hub-signature-256": signed("", BODY)}, BODY) is None
    assert gate.verify("/reconcile", {"authorization": "Bearer "}, b"") is None


def test_a_delivery_is_accepted_once_and_reconcile_any_number_of_times() -> None:
    gate = WebhookGate(RunSettings(github_secret="gh"))
    headers = {"x-hub-signature-256": signed("gh", BODY), "x-github-delivery": "d-1"}
    assert gate.first_sighting("github", headers)
    assert not gate.first_sighting("github", headers)
    assert not gate.first_sighting("github", {**headers, "x-github-delivery": "d-2"})
    assert gate.first_sighting("token", {}) and gate.first_sighting("token", {})
