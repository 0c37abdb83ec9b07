"""One exchange with a sequence model's version (``sequence_batching``): the same request sent
as a whole sequence of its own, START to END, under a correlation ID no client uses. Used by
the Triton adapter's ``sequence`` (``adapters/triton.py``), which makes each call and maps
its errors; a call that fails ends the exchange (Triton frees the sequence's slot once it
idles past ``max_sequence_idle_microseconds``).
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from reconciler.core.exchange import Reply

Answer = dict[str, npt.NDArray[np.generic]]


def correlation_id(config: Mapping[str, Any]) -> int | str:
    """A fresh correlation ID of the type the model with ``config`` takes: a string where
    its CORRID control input is TYPE_STRING, else a number far above the small ones clients
    count from."""
    controls = config.get("sequence_batching", {}).get("control_input", [])
    strings = any(
        c.get("kind") == "CONTROL_SEQUENCE_CORRID" and c.get("data_type") == "TYPE_STRING"
        for control in controls
        for c in control.get("control", [])
    )
    if strings:
        return f"triton-gitops-probe-{uuid.uuid4().hex}"
    return (1 << 62) + random.getrandbits(61)


# Triton's max_sequence_idle_microseconds when a config sets none.
DEFAULT_IDLE_SECONDS = 1.0


def start_deadline(config: Mapping[str, Any], timeout: float | None) -> float | None:
    """The deadline of a sequence's START: ``timeout`` plus the model's idle window. A new
    sequence waits in the sequence batcher's backlog until a slot frees (Direct: each
    instance holds max_batch_size sequences), as its clients' sequences wait; a slot held
    by a silent sequence frees once it idles past max_sequence_idle_microseconds. Measured
    (bench.sequence_rollouts --walk, 50 client sequences on 8 slots a server): a probe's
    START unanswered within 1 s, twice, failed a good version's analysis."""
    if timeout is None:
        return None
    batching = config.get("sequence_batching", {})
    idle = batching.get("max_sequence_idle_microseconds") if isinstance(batching, Mapping) else None
    return timeout + (int(idle) / 1e6 if idle else DEFAULT_IDLE_SECONDS)


def whole_sequence(
    call: Callable[[int, str], Answer], requests: int, clock: Callable[[], float]
) -> Reply:
    """``requests`` calls one after another (``call(index, what)``, where ``what`` names the
    request for an error: "request 2 of 3 of a sequence"), each timed from the first sent."""
    started = clock()
    answers: list[Answer] = []
    seconds: list[float] = []
    for index in range(requests):
        answers.append(call(index, f"request {index + 1} of {requests} of a sequence"))
        seconds.append(clock() - started)
    return Reply(tuple(answers), tuple(seconds))
