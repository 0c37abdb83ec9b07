"""What the analysis's probes send and when a probe failed. Pure: no I/O.

The reconciler is a client of the versions it rolls out: during an analysis it sends its own
requests, pinned to each new version, so that an error a client sees counts even where
Triton's counters miss it (a Python model's error response is counted a success by Triton
2.51, server#7713). Requests come from the deployment's smoke cases (with their
expectations), else from its shadow request file, else they are synthesized from the
model's inputs: zeros of each input's datatype, every variable dimension (-1) set to 1, and
a batch of 1 for a batching model.

A synthesized or recorded request has no expected answer, so it is judged against the old
version: one the old version fails too is left out (a model that rejects zeros must not
block every rollout). A smoke case is judged by its expectations.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import median

import numpy as np

from reconciler.core.exchange import MAX_RESPONSES, Reply, answer_of
from reconciler.core.smoke import reply_mismatches
from reconciler.model.analysis import ProbeOutcome
from reconciler.model.serving import ModelInterface
from reconciler.model.spec import ShadowSpec, SmokeCase, Tensor


@dataclass(frozen=True)
class ProbeRequest:
    """One request the probes send: its inputs, the outputs asked for, and what makes its
    answer wrong (a smoke case's expectations; none for a synthesized or recorded one)."""

    name: str
    inputs: tuple[Tensor, ...]
    outputs: tuple[str, ...]
    case: SmokeCase | None = None  # the expectations, for a smoke case
    # Judged against the old version: left out when the old version fails it too.
    relative: bool = False

    def limits(self, timeout: float | None) -> tuple[float | None, int]:
        """The deadline and the cap on responses of an exchange of this request."""
        return limits(self.case, timeout)


def limits(case: SmokeCase | None, timeout: float | None) -> tuple[float | None, int]:
    """The deadline and the cap on responses of an exchange: those of a smoke case's
    ``stream``, else its own ``timeout`` or ``timeout``, and MAX_RESPONSES."""
    stream = case.stream if case is not None else None
    if stream is None:
        own = case.timeout if case is not None else None
        return (own if own is not None else timeout), MAX_RESPONSES
    return stream.deadline, stream.cap


def _zero(datatype: str) -> object:
    if datatype == "BYTES":
        return ""
    if datatype == "BOOL":
        return False
    return 0


def synthesized(interface: ModelInterface) -> ProbeRequest | None:
    """A request made of zeros, from the model's inputs; None when an input's datatype
    cannot be made up (none known)."""
    inputs = []
    for tensor in interface.inputs:
        if not tensor.datatype or tensor.datatype == "INVALID":
            return None
        shape = tuple(1 if d < 0 else d for d in tensor.shape)
        count = int(np.prod(shape)) if shape else 1
        inputs.append(
            Tensor(tensor.name, tensor.datatype, shape, (_zero(tensor.datatype),) * count)
        )
    outputs = tuple(t.name for t in interface.outputs)
    return ProbeRequest("synthesized", tuple(inputs), outputs, relative=True)


def declared(
    smoke: Sequence[SmokeCase], shadow: ShadowSpec | None, outputs: tuple[str, ...]
) -> tuple[ProbeRequest, ...]:
    """The probe requests a deployment declares: its smoke cases, else its recorded
    requests (``outputs``: the model's outputs, all asked for)."""
    if smoke:
        return tuple(
            ProbeRequest(
                f"smoke {case.name}",
                case.inputs,
                tuple(e.name for e in case.expect) or outputs,
                case=case,
            )
            for case in smoke
        )
    if shadow is not None and shadow.requests:
        return tuple(
            ProbeRequest(f"recorded request {i + 1}", inputs, outputs, relative=True)
            for i, inputs in enumerate(shadow.requests)
        )
    return ()


def unanswered(request: ProbeRequest, reply: Reply) -> str | None:
    """Why a probe of an old version failed: no response, or an output asked for missing.
    A smoke case's expectations are the new versions' (the change may be meant to answer
    otherwise), so an old version answering differently has not failed: counted failed, it
    read "old version ..., 4 of 4 failed" in a good rollout's report, and an old version
    under its clients' load gave no baseline (``Prober.old_under_load`` leaves failed ones
    out)."""
    if not reply.responses:
        return f"{request.name}: the stream ended with no response"
    answer = answer_of(reply)
    missing = [name for name in request.outputs if name not in answer]
    if missing:
        return f"{request.name}: output {', '.join(missing)} missing in the response"
    return None


def wrong(request: ProbeRequest, reply: Reply) -> str | None:
    """Why a probe of a new version failed: unanswered, or outside its smoke case's
    expectations (a stream judged reassembled: ``core.exchange.answer_of``)."""
    why = unanswered(request, reply)
    if why is None and request.case is not None:
        problems = reply_mismatches(request.case, reply)
        if problems:
            return f"{request.name}: {'; '.join(problems)}"
    return why


# How a probe's answer is judged: ``wrong`` for the new versions, ``unanswered`` for the old.
Judge = Callable[[ProbeRequest, Reply], str | None]


def outcome(
    request: ProbeRequest, reply: Reply, version: int, elapsed: float, judge: Judge = wrong
) -> ProbeOutcome:
    """An answered probe as the analysis counts it: failed as ``judge`` says; its latency the
    exchange's (a stream's time to its first response; ``elapsed``, the whole exchange, for
    one that brought none), and for a stream the median time between its responses."""
    why = judge(request, reply)
    first = reply.first_seconds
    return ProbeOutcome(
        f"{why} (version {version})" if why else None,
        elapsed if first is None else first,
        streamed=reply.streamed,
        # A sequence's answers are apart by the calls between them, not by a generation.
        gap=median(reply.gaps) if reply.streamed and reply.gaps else None,
    )


# The odds at which ``failures_in_sight`` says which failure rate the probes would have shown.
SIGHT = 0.95


def failures_in_sight(sent: int, failed: int) -> str | None:
    """What a streaming model's analysis that passed could see: the share of failing streams
    its ``sent`` probe streams would have shown at least once with SIGHT odds (the share p
    with (1 - p)^sent = 1 - SIGHT). Triton 2.51's counters count a stream that fails midway
    a success, so only the probes see such a version: 8 probe streams see one failing 1 in 3,
    not one failing 1 in 20 (bench.streaming: version 8 passed 2 of 4 in place). None with no
    probe stream, or when one failed (the checks said what it meant)."""
    if sent <= 0 or failed:
        return None
    share = 1.0 - (1.0 - SIGHT) ** (1.0 / sent)
    return (
        f"{sent} probe stream(s), none failed: a version failing 1 stream in {1.0 / share:.0f}"
        f" or more would have failed one with {SIGHT:.0%} odds (Triton's counters do not count "
        "an error inside a stream; a longer duration or a higher probes.maxShare sees rarer ones)"
    )
