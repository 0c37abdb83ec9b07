"""The on-call verbs' front door (service/operator.py): routes matched exactly, named tokens
read strictly, the caller found by its token, bodies read strictly."""

from __future__ import annotations

import pytest

from reconciler.service.operator import (
    OperatorTokensError,
    caller,
    parse_tokens,
    reason_of,
    route,
    undo_of,
)

TOKENS = {"alice": "a" * 32, "pager-bot": "b" * 40}


def test_routes_are_matched_exactly() -> None:
    assert route("/v1/suspend") == ("suspend", None)
    assert route("/v1/resume") == ("resume", None)
    assert route("/v1/deployments/echo/suspend") == ("suspend", "echo")
    assert route("/v1/deployments/fraud-model.v2/retry") == ("retry", "fraud-model.v2")
    assert route("/v1/reconcile") == ("reconcile", None)
    assert route("/v1/deployments/echo/undo") == ("undo", "echo")
    assert route("/v1/deployments/echo/abort") == ("abort", "echo")
    assert route("/v1/deployments/echo/promote") == ("promote", "echo")
    assert route("/v1/deployments/echo/promote-full") == ("promote-full", "echo")
    for path in (
        "/v1/retry",  # retry needs a deployment
        "/v1/undo",  # so does undo
        "/v1/deployments/echo/reconcile",  # a pass is for everything
        "/v1/suspend/",
        "/v1/suspend?x=1",
        "/v1/deployments/Echo/suspend",  # not a Kubernetes name
        "/v1/deployments/../suspend",
        "/v1/abort",  # an order is for one rollout
        "/v1/promote",
        "/v1/deployments/echo/promote-fully",
        "/v1/deployments/echo/rollback",  # not a verb
        "/v1/deployments/" + "a" * 254 + "/suspend",
        "/V1/suspend",
    ):
        assert route(path) is None, path


def test_the_caller_is_the_name_of_the_token_it_carries() -> None:
    assert caller(TOKENS, {"authorization": "Bearer " + "b" * 40}) == "pager-bot"
    assert caller(TOKENS, {"authorization": "Bearer " + "a" * 32}) == "alice"
    for headers in ({}, {"authorization": "a" * 32}, {"authorization": "Bearer " + "a" * 31}):
        assert caller(TOKENS, headers) is None
    assert caller({}, {"authorization": "Bearer " + "a" * 32}) is None  # verbs off


def test_a_token_file_is_read_strictly_naming_the_line() -> None:
    text = "# on call\nalice: " + "a" * 32 + "\n\npager-bot:" + "b" * 40 + "\n"
    assert parse_tokens(text, "tokens") == TOKENS
    for bad, line in (
        ("alice " + "a" * 32, 1),  # no colon
        ("alice: short", 1),  # under 16 characters
        ("alice: " + "a" * 32 + "\nalice: " + "c" * 32, 2),  # a name twice
        ("alice: " + "a" * 32 + "\nbob: " + "a" * 32, 2),  # a token twice
        ("al ice: " + "a" * 32, 1),
    ):
        with pytest.raises(OperatorTokensError, match=f"^tokens:{line}: "):
            parse_tokens(bad, "tokens")


def test_a_body_is_empty_or_a_json_object_with_a_text_reason() -> None:
    assert reason_of(b"") == ""
    assert reason_of(b"{}") == ""
    assert reason_of(b'{"reason": "incident 42"}') == "incident 42"
    assert len(reason_of(b'{"reason": "' + b"x" * 1000 + b'"}')) == 500
    for bad in (b"[1]", b'{"reason": 5}', b"not json"):
        with pytest.raises(ValueError):
            reason_of(bad)


def test_an_undo_body_names_a_revision_by_its_sha_and_may_ask_for_a_dry_run() -> None:
    assert undo_of(b"") == (None, False)
    assert undo_of(b'{"reason": "pager 12"}') == (None, False)
    assert undo_of(b'{"toRevision": "0a1b2c3d", "dryRun": true}') == ("0a1b2c3d", True)
    for bad in (
        b'{"toRevision": "main"}',  # a ref, not a commit: the branch moves
        b'{"toRevision": "abc"}',  # too short to name one commit
        b'{"toRevision": "' + b"a" * 41 + b'"}',
        b'{"toRevision": 12345}',
        b'{"dryRun": "yes"}',
    ):
        with pytest.raises(ValueError):
            undo_of(bad)
