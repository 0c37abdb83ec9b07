"""The serving truth the reconciler publishes for load balancers (core/serving_truth.py):
a restarted, empty server does not serve; one loading a new version beside the old serves
throughout; a model drained or healed is out; every reason is named."""

from __future__ import annotations

from reconciler.core.serving_truth import ANY_VERSION, serving_truth, wanted_from
from reconciler.model.plan import ModelChange, Plan, PlanProblem
from reconciler.model.reports import PassReport

# The last pass left echo 2 and ranker [1, 3] serving on edge-a.
LEFT = PassReport(
    "abc123",
    Plan("abc123", in_sync=(("edge-a", "echo"), ("edge-a", "ranker"))),
    servers={"edge-a": "127.0.0.1:8001"},
    expected={"edge-a": {"echo": (2,), "ranker": (1, 3)}},
)


def test_a_server_serving_what_the_pass_left_serves() -> None:
    ready = {"edge-a": {"echo": frozenset({2}), "ranker": frozenset({1, 3})}}
    (truth,) = serving_truth(wanted_from(LEFT), ready).values()
    assert truth.serving and truth.reasons == ()


def test_a_server_whose_connection_dropped_since_its_reading_does_not_serve() -> None:
    # Its reading still shows what the pass left, as read before the restart.
    ready = {"edge-a": {"echo": frozenset({2}), "ranker": frozenset({1, 3})}}
    stale = {"edge-a": "its connection dropped"}
    truth = serving_truth(wanted_from(LEFT), ready, stale=stale)["edge-a"]
    assert (truth.serving, truth.reasons) == (False, ("its connection dropped",)), truth


def test_a_restarted_empty_server_does_not_serve_until_restored() -> None:
    # Triton's /v2/health/ready answers 200 here: nothing is loaded yet.
    empty = serving_truth(wanted_from(LEFT), {"edge-a": {}})["edge-a"]
    assert not empty.serving
    assert empty.reasons == (
        "model echo: version(s) 2 not READY",
        "model ranker: version(s) 1, 3 not READY",
    )
    # Half restored: a client pinned to ranker 1 would fail.
    half = {"edge-a": {"echo": frozenset({2}), "ranker": frozenset({3})}}
    assert serving_truth(wanted_from(LEFT), half)["edge-a"].reasons == (
        "model ranker: version(s) 1 not READY",
    )


def test_a_version_loading_beside_the_serving_one_keeps_the_server_serving() -> None:
    # The manifest moved echo 1 -> 2: while 2 loads beside 1 (Triton's /v2/health/ready
    # answers 400 throughout), the last pass's intent, 1, still serves.
    before = PassReport(
        "abc", Plan("abc", in_sync=(("edge-a", "echo"),)),
        servers={"edge-a": "x"}, expected={"edge-a": {"echo": (1,)}},
    )  # fmt: skip
    moving = {"edge-a": {"echo": frozenset({1})}}
    assert serving_truth(wanted_from(before), moving)["edge-a"].serving
    # A change that did not converge (a transient failure, put back): its old versions
    # serve, and so does the server; nothing READY at all does not.
    change = ModelChange("edge-a", "echo", "echo", serving=(1,), desired=(2,), steps=())
    failed = PassReport("def", Plan("def", changes=(change,)), servers={"edge-a": "x"})
    assert wanted_from(failed) == {"edge-a": {"echo": ((2,), (1,))}}
    assert serving_truth(wanted_from(failed), moving)["edge-a"].serving
    assert serving_truth(wanted_from(failed), {"edge-a": {}})["edge-a"].reasons == (
        "model echo: version(s) 2 not READY",
    )
    # A first deployment that failed (nothing served when planned): not serving.
    first = ModelChange("edge-a", "echo", "echo", serving=(), desired=(2,), steps=())
    report = PassReport("d", Plan("d", changes=(first,)), servers={"edge-a": "x"})
    assert not serving_truth(wanted_from(report), {"edge-a": {}})["edge-a"].serving


def test_a_model_the_pass_left_alone_serves_with_any_version() -> None:
    problem = PlanProblem("edge-a", "echo", "digest mismatch", kind="artifact-mismatch")
    report = PassReport(
        "p", Plan("p", problems=(problem,), suspended=(("edge-a", "ranker"),)),
        servers={"edge-a": "x"},
    )  # fmt: skip
    assert wanted_from(report) == {"edge-a": {"echo": (ANY_VERSION,), "ranker": (ANY_VERSION,)}}
    some = {"edge-a": {"echo": frozenset({7}), "ranker": frozenset({1})}}
    assert serving_truth(wanted_from(report), some)["edge-a"].serving
    none = serving_truth(wanted_from(report), {"edge-a": {"echo": frozenset({7})}})["edge-a"]
    assert none.reasons == ("model ranker: no version READY",)


def test_a_model_out_of_service_takes_the_server_out_and_says_why() -> None:
    ready = {"edge-a": {"echo": frozenset({2}), "ranker": frozenset({1, 3})}}
    truth = serving_truth(
        wanted_from(LEFT), ready, {("edge-a", "ranker"): "drained for a sequence model's swap"}
    )["edge-a"]
    assert not truth.serving
    assert truth.reasons == ("model ranker: drained for a sequence model's swap",)


def test_an_unreachable_or_unobserved_server_does_not_serve() -> None:
    wanted = wanted_from(LEFT)
    assert serving_truth(wanted, {"edge-a": "connection refused"})["edge-a"].reasons == (
        "unreachable: connection refused",
    )
    assert serving_truth(wanted, {})["edge-a"].reasons == ("not observed yet",)
    # A server with nothing placed on it serves: nothing is asked of it.
    idle = PassReport("i", Plan("i"), servers={"edge-b": "x"})
    assert serving_truth(wanted_from(idle), {"edge-b": {}})["edge-b"].serving
