"""The unload of a streaming model says how long it waited for the streams in flight on the
versions it dropped (issue 42, point 5): in apply's text, its progress lines and its JSON.
Triton does not say how many streams there were, so only the wait is shown. The wait itself
is measured on a real tritonserver (tests/integration/test_streaming.py)."""

from __future__ import annotations

from dataclasses import replace

from reconciler.model.plan import Action, ModelChange, Step
from reconciler.model.results import ApplyResult, ChangeResult, Cut, Outcome, StepResult
from reconciler.views.render import progress_line, result_json, result_text

UNLOAD = Step("s1", "gen", Action.UNLOAD, (2,), "drop old version(s) 1", dropped=(1,))


def applied(result: StepResult) -> ApplyResult:
    change = ModelChange("s1", "gen", "gen", (1,), (2,), (result.step,))
    return ApplyResult("r", (ChangeResult(change, Outcome.CONVERGED, (result,)),))


def test_an_unload_that_waited_for_streams_says_how_long() -> None:
    result = StepResult(UNLOAD, True, 4.3, stream_wait=4.21)

    line = progress_line(result)
    text = result_text(applied(result))
    (step,) = result_json(applied(result))["changes"][0]["steps"]

    said = "ok (4.30s; waited 4.21s for the streams in flight on 1 to end)"
    assert line == f"s1/gen: unload 2 {said}", f"the progress line hides the wait: {line}"
    assert said in text, f"apply's text hides the wait: {text}"
    assert step["stream_wait_seconds"] == 4.21, f"apply's JSON hides the wait: {step}"


def test_an_unload_that_did_not_wait_for_streams_says_nothing_of_them() -> None:
    result = StepResult(UNLOAD, True, 0.2)

    (step,) = result_json(applied(result))["changes"][0]["steps"]

    assert progress_line(result) == "s1/gen: unload 2 ok (0.20s)", progress_line(result)
    assert "stream_wait_seconds" not in step, f"a wait shown where there was none: {step}"


def test_a_switch_back_that_cut_sequences_says_what_still_reached_them() -> None:
    """Issue 44, point 2: a sequence model's switch back after its new versions failed does
    not wait for the sequences in flight on them; the report gives what it cut as the rate
    of requests that still reached them (Triton counts no open sequence), in the progress
    line, apply's text and the revert's JSON; unread, it says so."""
    drain = Step("s1", "counter", Action.DRAIN, (3,), "drain 3 first", unless_failed=True)
    change = ModelChange("s1", "counter", "counter", (2,), (3,), (drain,), revert=(drain,))
    cut = StepResult(drain, True, 1.01, reverting=True, cut=Cut(41.0, 1.0))
    failed = ChangeResult(change, Outcome.REVERTED, (), (cut,))
    report = ApplyResult("r", (failed,))

    said = "the sequences in flight on 3 were cut: 41.0 requests a second still reached them"
    assert said in progress_line(cut), progress_line(cut)
    assert said in result_text(report), result_text(report)
    (reverted,) = result_json(report)["changes"][0]["revert"]
    assert reverted["cut"] == {"requests_per_second": 41.0, "seconds": 1.0}, reverted
    unread = replace(cut, cut=Cut(None, 0.0))
    assert "were cut, not counted (no reading)" in progress_line(unread), progress_line(unread)
