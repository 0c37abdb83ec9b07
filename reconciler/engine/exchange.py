"""Sending one exchange to a model version (``model.plan.Exchange``): a unary call, a gRPC
stream for a model that streams, or a whole sequence of its own for a sequence model, through
the server's ``ModelControl``. The probes, the smoke cases, the synthesized check and the
replay all send through ``ask``, so no layer above knows which shape the model answers in:
each judges the ``core.exchange.Reply`` it gets back.
"""

from __future__ import annotations

from collections.abc import Callable

from reconciler.core.exchange import MAX_RESPONSES, SEQUENCE_REQUESTS, Reply
from reconciler.model.plan import Exchange
from reconciler.model.spec import Tensor
from reconciler.ports import ModelControl


def ask(
    control: ModelControl,
    model: str,
    version: int,
    inputs: tuple[Tensor, ...],
    outputs: tuple[str, ...],
    *,
    exchange: Exchange,
    timeout: float | None = None,
    max_responses: int = MAX_RESPONSES,
    clock: Callable[[], float] | None = None,
) -> Reply:
    """What ``version`` answers to ``inputs``: raises as ``ModelControl.infer``, ``stream``
    and ``sequence`` do (VerifyFailed, ProbeTimedOut). A unary call is timed by ``clock``
    when one is given; a stream's responses and a sequence's answers are timed as they
    arrive."""
    if exchange is Exchange.STREAM:
        return control.stream(model, version, inputs, outputs, timeout, max_responses)
    if exchange is Exchange.SEQUENCE:
        return control.sequence(model, version, inputs, outputs, SEQUENCE_REQUESTS, timeout)
    started = clock() if clock is not None else 0.0
    answer = control.infer(model, version, inputs, outputs, timeout)
    return Reply.unary(answer, clock() - started if clock is not None else 0.0)
