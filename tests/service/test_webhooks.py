"""Webhook authentication (service/webhooks.py): signatures, tokens, replays."""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

from reconciler.adapters.state import StateStore
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
    assert gate.first_sighting("github", headers, BODY)
    assert not gate.first_sighting("github", headers, BODY)
    assert not gate.first_sighting("github", {**headers, "x-github-delivery": "d-2"}, BODY)
    assert gate.first_sighting("token", {}, b"") and gate.first_sighting("token", {}, b"")


def test_a_gitlab_delivery_replayed_under_a_new_uuid_is_refused() -> None:
    gate = WebhookGate(RunSettings(gitlab_token="gl"))
    push = {"x-gitlab-token": "gl", "x-gitlab-event": "Push Hook", "x-gitlab-event-uuid": "u-1"}
    assert gate.first_sighting("gitlab", push, BODY)
    assert not gate.first_sighting("gitlab", {**push, "x-gitlab-event-uuid": "u-2"}, BODY)
    assert not gate.first_sighting("gitlab", push, BODY + b" ")  # the same UUID, a new body
    # Another body, or the same body as another event, is another delivery.
    assert gate.first_sighting("gitlab", {**push, "x-gitlab-event-uuid": "u-3"}, BODY + b" ")
    tag = {**push, "x-gitlab-event": "Tag Push Hook", "x-gitlab-event-uuid": "u-4"}
    assert gate.first_sighting("gitlab", tag, BODY)


def test_deliveries_seen_are_recalled_by_the_next_process_within_the_window(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state.db"
    StateStore(state).close()  # made by the first pass
    run = RunSettings(github_secret="gh", replay_window=60, replay_memory=4)
    now = [1000.0]
    before = WebhookGate(run, state)
    before.deliveries.clock = lambda: now[0]
    old = {"x-hub-signature-256": "sha256=old", "x-github-delivery": "d-old"}
    assert before.first_sighting("github", old, b"old")
    now[0] = 1030
    new = {"x-hub-signature-256": "sha256=new", "x-github-delivery": "d-new"}
    assert before.first_sighting("github", new, b"new")
    before.close()

    def restarted(at: float) -> WebhookGate:
        gate = WebhookGate(run, state)
        gate.deliveries.clock = lambda: at
        gate.recall()
        return gate

    after = restarted(1050)
    assert not after.first_sighting("github", new, b"new")
    assert not after.first_sighting("github", {**old, "x-github-delivery": "d-3"}, b"old")
    assert restarted(1070).first_sighting("github", old, b"old")  # 70 s on: forgotten
    # At most replay_memory keys are kept in the store, the newest.
    gate = restarted(1080)
    for n in range(10):
        assert gate.first_sighting("github", {"x-hub-signature-256": f"sha256={n}"}, b"")
    gate.close()
    kept = StateStore(state).seen_deliveries(0, 100)
    assert [key for key, _ in kept] == [f"github-signature:sha256={n}" for n in range(6, 10)]


def test_no_state_file_is_made_for_a_delivery(tmp_path: Path) -> None:
    # The first pass warns that the state file is missing; a webhook before it must not
    # create one and hide that warning.
    gate = WebhookGate(RunSettings(gitlab_token="gl"), tmp_path / "state.db")
    gate.recall()
    assert gate.first_sighting("gitlab", {}, BODY)
    assert not gate.first_sighting("gitlab", {}, BODY)
    assert not (tmp_path / "state.db").exists()
