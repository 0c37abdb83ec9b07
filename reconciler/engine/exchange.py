"""Sending one exchange to a model version: a unary call, or a gRPC stream for a model that
streams (the plan's ``Step.streaming``, from its config), through the server's
``ModelControl``. The probes, the smoke cases and the synthesized check all send through
``ask``, so no layer above knows which shape the model answers in: each judges the
``core.exchange.Reply`` it gets back.
"""

from __future__ import annotations

from collections.abc import Callable

from reconciler.core.exchange import MAX_RESPONSES, Reply
from reconciler.model.spec import Tensor
from reconciler.ports import ModelControl


def ask(
    control: ModelControl,
    model: str,
    version: int,
    inputs: tuple[Tensor, ...],
    outputs: tuple[str, ...],
    *,
    streaming: bool,
    timeout: float | None = None,
    max_responses: int = MAX_RESPONSES,
    clock: Callable[[], float] | None = None,
) -> Reply:
    """What ``version`` answers to ``inputs``: raises as ``ModelControl.infer`` and
    ``stream`` do (VerifyFailed, ProbeTimedOut). A unary call is timed by ``clock`` when one
    is given; a stream's responses are timed as they arrive."""
    if streaming:
        return control.stream(model, version, inputs, outputs, timeout, max_responses)
    started = clock() if clock is not None else 0.0
    answer = control.infer(model, version, inputs, outputs, timeout)
    return Reply.unary(answer, clock() - started if clock is not None else 0.0)
