"""Smoke-case arithmetic: manifest tensors to numpy arrays, and outputs against expectations.

Pure: the Triton adapter sends the arrays and hands back what the server answered.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from reconciler.core.exchange import Reply, answer_of
from reconciler.model.spec import Expectation, SmokeCase, Tensor

_NUMPY_TYPES: dict[str, type] = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
    "BYTES": np.object_,
}


def as_array(tensor: Tensor) -> npt.NDArray[np.generic]:
    if tensor.datatype == "BYTES":
        values = [v.encode() if isinstance(v, str) else v for v in tensor.data]
        return np.array(values, dtype=np.object_).reshape(tensor.shape)
    return np.array(tensor.data, dtype=_NUMPY_TYPES[tensor.datatype]).reshape(tensor.shape)


def mismatches(case: SmokeCase, outputs: Mapping[str, npt.NDArray[np.generic]]) -> list[str]:
    """What in ``outputs`` differs from the case's expectations (empty when all agree)."""
    return unmet(case.expect, outputs)


def reply_mismatches(case: SmokeCase, reply: Reply) -> list[str]:
    """What in ``reply`` differs from the case: its expectations on the answer (a stream
    reassembled), and for a case that declares ``stream`` the number of responses, each
    response's outputs, in order, and the time to the first response."""
    problems = mismatches(case, answer_of(reply))
    stream = case.stream
    if stream is None:
        return problems
    count, low, high = len(reply.responses), stream.min_responses, stream.max_responses
    if (low is not None and count < low) or (high is not None and count > high):
        wanted = (
            f"{low}"
            if low == high
            else f"at most {high}"
            if low is None
            else f"at least {low}"
            if high is None
            else f"{low} to {high}"
        )
        problems.append(f"{count} response(s) in the stream, expected {wanted}")
    first = reply.first_seconds
    if stream.first_response is not None and first is not None and first > stream.first_response:
        problems.append(
            f"first response after {first * 1000:.0f} ms, expected within "
            f"{stream.first_response * 1000:.0f} ms"
        )
    for index, expected in enumerate(stream.each):
        if index >= count:
            problems.append(f"response {index} missing (the stream sent {count})")
            break
        problems += [f"response {index}: {p}" for p in unmet(expected, reply.responses[index])]
    return problems


def unmet(
    expectations: tuple[Expectation, ...], outputs: Mapping[str, npt.NDArray[np.generic]]
) -> list[str]:
    """What in ``outputs`` differs from ``expectations`` (empty when all agree)."""
    problems = []
    for expected in expectations:
        actual = outputs.get(expected.name)
        if actual is None:
            problems.append(f"output {expected.name} missing")
            continue
        if expected.shape is not None and tuple(actual.shape) != expected.shape:
            problems.append(
                f"output {expected.name} has shape {list(actual.shape)}, "
                f"expected {list(expected.shape)}"
            )
            continue
        flat = actual.reshape(-1)
        if flat.size != len(expected.data):
            problems.append(
                f"output {expected.name} has {flat.size} values, expected {len(expected.data)}"
            )
            continue
        if actual.dtype == np.object_:
            got = [v.decode() if isinstance(v, bytes) else v for v in flat.tolist()]
            if got != list(expected.data):
                problems.append(f"output {expected.name} is {got}, expected {list(expected.data)}")
            continue
        try:
            want = np.array(expected.data, dtype=np.float64)
        except (TypeError, ValueError):
            problems.append(
                f"output {expected.name} is numeric ({actual.dtype}), expected "
                f"{list(expected.data)}"
            )
            continue
        diff = np.abs(flat.astype(np.float64) - want)
        if not np.all(diff <= expected.tolerance):  # NaN never passes
            nan = np.flatnonzero(np.isnan(diff))
            worst = int(nan[0]) if nan.size else int(np.argmax(diff))
            problems.append(
                f"output {expected.name}[{worst}] is {flat[worst]!r}, expected "
                f"{expected.data[worst]!r} (tolerance {expected.tolerance})"
            )
    return problems
