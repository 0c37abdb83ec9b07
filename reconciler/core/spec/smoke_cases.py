"""Smoke cases as a ModelDeployment writes them (``spec.verify.smoke``): the requests, what
their answers must hold, and how long they may take, into ``SmokeCase`` values. What the
schema cannot say (data that does not fill its shape, a range upside down) is a problem."""

from __future__ import annotations

import math
from typing import Any

from reconciler.core.spec.durations import schema_seconds
from reconciler.core.spec.schema import (
    ANY,
    DEPLOYMENT,
    VERIFY,
    JsonPath,
    or_default,
)
from reconciler.core.spec.yaml import Document
from reconciler.model.problems import Problem
from reconciler.model.spec import Expectation, SmokeCase, StreamExpectation, Tensor


def flat(data: list[Any]) -> list[Any]:
    """A tensor's data as written (nested lists, or flat) in row-major order."""
    out: list[Any] = []
    for item in data:
        out.extend(flat(item) if isinstance(item, list) else [item])
    return out


def smoke_cases(
    doc: Document, verify: dict[str, Any], problems: list[Problem]
) -> tuple[SmokeCase, ...]:
    """spec.verify.smoke; data that does not fill its shape is a problem (the schema cannot
    relate the two)."""
    smoke: list[SmokeCase] = []
    for index, case in enumerate(verify.get("smoke", [])):
        path: JsonPath = (*VERIFY, "smoke", index)
        inputs = []
        for name, tensor in case["inputs"].items():
            data = flat(tensor["data"])
            if math.prod(tensor["shape"]) != len(data):
                problems.append(
                    doc.problem(
                        (*path, "inputs", name, "data"),
                        f"input {name}: shape {tensor['shape']} holds "
                        f"{math.prod(tensor['shape'])} values, data has {len(data)}",
                    )
                )
            inputs.append(Tensor(name, tensor["datatype"], tuple(tensor["shape"]), tuple(data)))
        expect = [
            _expectation(doc, (*path, "expect", name), name, expected, problems)
            for name, expected in case.get("expect", {}).items()
        ]
        stream = (
            _stream(doc, (*path, "stream"), case["stream"], problems) if "stream" in case else None
        )
        timeout = _case_timeout(doc, path, case, problems)
        smoke.append(
            SmokeCase(
                case.get("name", f"smoke[{index}]"), tuple(inputs), tuple(expect), stream, timeout
            )
        )
    return tuple(smoke)


def _case_timeout(
    doc: Document, path: JsonPath, case: dict[str, Any], problems: list[Problem]
) -> float | None:
    """A smoke case's ``timeout``: above 0, and not beside a ``stream``, whose deadline is
    the case's time."""
    if "timeout" not in case:
        return None
    timeout = schema_seconds(case["timeout"])
    if "stream" in case:
        problems.append(
            doc.problem(
                (*path, "timeout"),
                "a streaming case's time is its stream.deadline: set that, not timeout",
            )
        )
    elif timeout <= 0:
        problems.append(doc.problem((*path, "timeout"), f"{case['timeout']} is not above 0"))
    return timeout if timeout > 0 else None


def _stream(
    doc: Document, path: JsonPath, stream: dict[str, Any], problems: list[Problem]
) -> StreamExpectation:
    """A smoke case's ``stream``; a range whose min exceeds its max is a problem."""
    count = stream.get("responses", {})
    low, high = (count, count) if isinstance(count, int) else (count.get("min"), count.get("max"))
    if low is not None and high is not None and low > high:
        problems.append(doc.problem((*path, "responses"), f"min {low} is above max {high}"))
    each = tuple(
        tuple(
            _expectation(doc, (*path, "each", i, name), name, expected, problems, _EACH)
            for name, expected in response.items()
        )
        for i, response in enumerate(stream.get("each", []))
    )
    where = (*VERIFY, "smoke", ANY, "stream")
    deadline = schema_seconds(or_default(stream, DEPLOYMENT, *where, "deadline"))
    first = stream.get("firstResponse")
    first_response = None if first is None else schema_seconds(first)
    if first_response is not None and first_response > deadline:
        problems.append(
            doc.problem(
                (*path, "firstResponse"),
                f"{first} is past the stream's deadline ({deadline:g}s): the first response "
                "could never be late",
            )
        )
    cap = int(or_default(stream, DEPLOYMENT, *where, "maxResponses"))
    return StreamExpectation(low, high, each, deadline, cap, first_response)


# Where the schema keeps an expectation's defaults: a smoke case's ``expect``, and each
# response's of its ``stream``.
_EXPECT = (*VERIFY, "smoke", ANY, "expect", ANY)
_EACH = (*VERIFY, "smoke", ANY, "stream", "each", ANY, ANY)


def _expectation(
    doc: Document,
    path: JsonPath,
    name: str,
    expected: dict[str, Any],
    problems: list[Problem],
    defaults: tuple[str, ...] = _EXPECT,
) -> Expectation:
    data = flat(expected["data"])
    shape = expected.get("shape")
    if shape is not None and math.prod(shape) != len(data):
        problems.append(
            doc.problem(
                (*path, "data"),
                f"output {name}: shape {shape} holds {math.prod(shape)} values, "
                f"data has {len(data)}",
            )
        )
    return Expectation(
        name,
        tuple(data),
        tuple(shape) if shape is not None else None,
        float(or_default(expected, DEPLOYMENT, *defaults, "tolerance")),
    )
