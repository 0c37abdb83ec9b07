"""Smoke-case arithmetic: manifest tensors to arrays, and answers against expectations."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.core.exchange import Reply
from reconciler.core.smoke import as_array, mismatches, reply_mismatches
from reconciler.model.spec import Expectation, SmokeCase, StreamExpectation, Tensor

NO_INPUTS: tuple[Tensor, ...] = ()


def case(*expect: Expectation) -> SmokeCase:
    return SmokeCase("case", NO_INPUTS, expect)


def fp32(*values: float, shape: tuple[int, ...] | None = None) -> np.ndarray:
    array = np.array(values, dtype=np.float32)
    return array.reshape(shape) if shape is not None else array


def test_exact_answer_passes() -> None:
    expect = Expectation("OUT", (1.0, 2.0, 3.0, 4.0), (2, 2))
    assert mismatches(case(expect), {"OUT": fp32(1, 2, 3, 4, shape=(2, 2))}) == []


@pytest.mark.parametrize(
    ("answer", "tolerance", "ok"),
    [
        (1.5, 0.5, True),  # at the bound passes
        (0.5, 0.5, True),
        (1.5, 0.25, False),
        (1.0 + 1e-3, 0.0, False),  # no tolerance: exact only
        (1.0, 0.0, True),
    ],
)
def test_tolerance_is_an_absolute_bound(answer: float, tolerance: float, ok: bool) -> None:
    expect = Expectation("OUT", (1.0, 7.0), tolerance=tolerance)
    problems = mismatches(case(expect), {"OUT": np.array([answer, 7.0], dtype=np.float64)})
    assert (problems == []) is ok
    if not ok:
        (problem,) = problems
        assert problem.startswith("output OUT[0] is ")
        assert f"(tolerance {tolerance})" in problem


def test_the_worst_element_is_named() -> None:
    expect = Expectation("OUT", (1.0, 2.0, 3.0), tolerance=0.1)
    (problem,) = mismatches(case(expect), {"OUT": fp32(1.2, 2.0, 9.0)})
    assert problem.startswith("output OUT[2] is 9.0, expected 3.0")


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (math.nan, 1.0),
        (1.0, math.nan),
        (math.nan, math.nan),
    ],
)
@pytest.mark.parametrize("tolerance", [0.0, 1e300])
def test_nan_never_passes(answer: float, expected: float, tolerance: float) -> None:
    expect = Expectation("OUT", (expected,), tolerance=tolerance)
    assert mismatches(case(expect), {"OUT": np.array([answer], dtype=np.float32)}) != []


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=8),
    st.data(),
    st.floats(0, 1e6),
)
def test_a_nan_anywhere_fails_whatever_the_tolerance(
    values: list[float], data: st.DataObject, tolerance: float
) -> None:
    where = data.draw(st.integers(0, len(values) - 1))
    answer = np.array(values, dtype=np.float64)
    answer[where] = np.nan
    expect = Expectation("OUT", tuple(values), tolerance=tolerance)
    assert len(mismatches(case(expect), {"OUT": answer})) == 1


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=8),
    st.floats(0.001, 10),
    st.data(),
)
def test_within_tolerance_passes_and_beyond_fails(
    values: list[float], tolerance: float, data: st.DataObject
) -> None:
    expect = Expectation("OUT", tuple(values), tolerance=tolerance)
    inside = [v + data.draw(st.floats(-tolerance / 2, tolerance / 2)) for v in values]
    assert mismatches(case(expect), {"OUT": np.array(inside, dtype=np.float64)}) == []
    where = data.draw(st.integers(0, len(values) - 1))
    outside = list(values)
    outside[where] += tolerance * 2 * data.draw(st.sampled_from([-1, 1]))
    (problem,) = mismatches(case(expect), {"OUT": np.array(outside, dtype=np.float64)})
    assert problem.startswith(f"output OUT[{where}] ")


def test_declared_shape_must_match() -> None:
    expect = Expectation("OUT", (1.0, 2.0, 3.0, 4.0), (2, 2))
    (problem,) = mismatches(case(expect), {"OUT": fp32(1, 2, 3, 4)})
    assert problem == "output OUT has shape [4], expected [2, 2]"


def test_without_a_shape_values_are_compared_flat() -> None:
    expect = Expectation("OUT", (1.0, 2.0, 3.0, 4.0))
    assert mismatches(case(expect), {"OUT": fp32(1, 2, 3, 4, shape=(1, 2, 2))}) == []
    (problem,) = mismatches(case(expect), {"OUT": fp32(1, 2, 3)})
    assert problem == "output OUT has 3 values, expected 4"


def test_missing_output_and_every_problem_listed() -> None:
    problems = mismatches(
        case(Expectation("A", (1.0,)), Expectation("B", (2.0,)), Expectation("C", (3.0,))),
        {"A": fp32(1.0), "C": fp32(4.0)},
    )
    assert problems[0] == "output B missing"
    assert problems[1].startswith("output C[0] is 4.0, expected 3.0")
    assert len(problems) == 2


def test_bytes_compare_as_text_and_ignore_tolerance() -> None:
    expect = Expectation("TEXT", ("hello", "wörld"), (2,), tolerance=100.0)
    answer = np.array([b"hello", "wörld".encode()], dtype=np.object_)
    assert mismatches(case(expect), {"TEXT": answer}) == []
    wrong = np.array([b"hello", b"world"], dtype=np.object_)
    (problem,) = mismatches(case(expect), {"TEXT": wrong})
    assert problem == "output TEXT is ['hello', 'world'], expected ['hello', 'wörld']"


def test_as_array_types_and_shapes() -> None:
    floats = as_array(Tensor("X", "FP32", (2, 2), (1, 2, 3, 4)))
    assert floats.dtype == np.float32 and floats.shape == (2, 2)
    assert floats.tolist() == [[1.0, 2.0], [3.0, 4.0]]
    text = as_array(Tensor("T", "BYTES", (1, 2), ("a", b"b")))
    assert text.dtype == np.object_ and text.tolist() == [[b"a", b"b"]]
    assert as_array(Tensor("B", "BOOL", (3,), (True, False, True))).dtype == np.bool_
    assert as_array(Tensor("I", "INT64", (0,), ())).shape == (0,)
    with pytest.raises(ValueError):
        as_array(Tensor("X", "FP32", (3,), (1, 2)))


def test_a_nan_answer_is_the_element_named() -> None:
    (problem,) = mismatches(case(Expectation("OUT", (1.0, 2.0))), {"OUT": fp32(1.0, math.nan)})
    assert problem.startswith("output OUT[1] is nan")


def test_text_expected_from_a_numeric_output_is_a_mismatch_not_a_crash() -> None:
    problems = mismatches(case(Expectation("OUT", ("abc",))), {"OUT": fp32(1.0)})
    assert len(problems) == 1 and "OUT" in problems[0]


def test_a_stream_is_judged_by_its_count_and_each_response_in_order() -> None:
    """Issue 42: a smoke case's ``stream`` on a streaming model's reply."""
    tokens = tuple({"TOKEN": np.array([t], dtype=np.int32)} for t in (6, 7, 8))
    reply = Reply(tokens, (0.01, 0.02, 0.03), streamed=True)
    first_two = ((Expectation("TOKEN", (6,)),), (Expectation("TOKEN", (7,)),))
    case = SmokeCase(
        "counts",
        (),
        (Expectation("TOKEN", (6, 7, 8)),),
        StreamExpectation(3, 3, first_two),
    )
    assert reply_mismatches(case, reply) == []
    fewer = StreamExpectation(4, 5, ((Expectation("TOKEN", (9,)),),))
    assert reply_mismatches(SmokeCase("c", (), (), fewer), reply) == [
        "3 response(s) in the stream, expected 4 to 5",
        "response 0: output TOKEN[0] is 6, expected 9 (tolerance 0.0)",
    ]
    beyond = StreamExpectation(0, None, ((),) * 4)
    assert reply_mismatches(SmokeCase("c", (), (), beyond), reply) == [
        "response 3 missing (the stream sent 3)"
    ]


def test_a_stream_whose_first_response_is_late_fails_the_case_that_bounds_it() -> None:
    """Issue 42: with the analysis's probes off, a smoke case's ``firstResponse`` is what
    holds a streaming version's first response (version 5 of the bench: 300 ms late)."""
    late = Reply(({"TOKEN": np.array([6], dtype=np.int32)},), (0.31,), streamed=True)
    bounded = SmokeCase("fast", (), (), StreamExpectation(first_response=0.1))
    assert reply_mismatches(bounded, late) == [
        "first response after 310 ms, expected within 100 ms"
    ]
    on_time = Reply(late.responses, (0.04,), streamed=True)
    assert reply_mismatches(bounded, on_time) == []
    unbounded = SmokeCase("any", (), (), StreamExpectation())
    assert reply_mismatches(unbounded, late) == []
