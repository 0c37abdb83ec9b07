"""One exchange with a model version: what came back for one request, a single response or,
for a model that streams (decoupled), a stream of them ended by Triton's final flag, or for a
sequence model (sequence_batching) the answers to one whole sequence of its own.

Probes, smoke cases and the synthesized check in verify are exchanges of either shape
(``engine/exchange.py`` sends them through ``ModelControl``); they judge what came back through
one view of it: ``answer_of``, the answer a unary call gives, and for a stream the stream
reassembled (each output's values from every response, in order). Its latency is the time
to the first response: a stream's whole duration measures how long the generation was, not
the version. A sequence exchange sends the request SEQUENCE_REQUESTS times under one fresh
correlation ID (START on the first, END on the last), each answered before the next goes:
it is judged by the START's answer (what a client's first request gets, the state fresh) and
its latency is that answer's; a later request that fails fails the exchange. Pure: values
and arithmetic, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Answer = Mapping[str, npt.NDArray[np.generic]]

# A stream that sends more responses than this without its final flag is cut and failed: a
# generator that never ends must not hold a probe, or verify, for ever.
MAX_RESPONSES = 4096

# A sequence exchange's requests: START, one within, END. Few, because a probe's sequence
# holds one of the model's sequence slots (Direct: max_batch_size per instance) until its
# END, a slot the clients' sequences wait for when all are taken.
SEQUENCE_REQUESTS = 3


@dataclass(frozen=True)
class Reply:
    """What one request brought back: the responses in order (one for a unary call; the
    final flag's empty response is not one) and the seconds from sending it to each."""

    responses: tuple[Answer, ...]
    seconds: tuple[float, ...]
    streamed: bool = False

    @classmethod
    def unary(cls, answer: Answer, seconds: float = 0.0) -> Reply:
        return cls((answer,), (seconds,))

    @property
    def first_seconds(self) -> float | None:
        """The time to the first response: the latency of the exchange."""
        return self.seconds[0] if self.seconds else None

    @property
    def gaps(self) -> tuple[float, ...]:
        """The seconds between one response and the next."""
        return tuple(b - a for a, b in zip(self.seconds, self.seconds[1:], strict=False))


def answer_of(reply: Reply) -> dict[str, npt.NDArray[np.generic]]:
    """The answer an exchange is judged by: a unary call's one answer; a stream reassembled,
    each output's values from every response that carries it, in order, joined along the
    first axis (a generator's tokens, one per response, become the generated sequence)."""
    if not reply.streamed:
        return dict(reply.responses[0]) if reply.responses else {}
    parts: dict[str, list[npt.NDArray[np.generic]]] = {}
    for response in reply.responses:
        for name, values in response.items():
            parts.setdefault(name, []).append(np.atleast_1d(values))
    joined = {}
    for name, pieces in parts.items():
        try:
            joined[name] = np.concatenate(pieces)
        except ValueError:  # responses of other shapes: their values in order, flat
            joined[name] = np.concatenate([piece.reshape(-1) for piece in pieces])
    return joined
