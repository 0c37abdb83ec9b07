"""HTTP ``generate_stream`` requests (server-sent events) mirrored by a real Envoy (issue 43,
point 1): one real tritonserver serving the streaming test model ``gen``, one Envoy routing
Triton's HTTP API to it with a request mirror policy (runtime share
``mirror.triton.comparator_http``) to a mirror-only HTTP/1.1 cluster, a counting server in
this process (testkit/counting_http.py) that records every copy whole: the SSE mirror bed
(testkit/sse_mirror.py), which ``python -m bench.sse_mirror`` measures on too.

Envoy 1.40 streams a copy beside the request (``envoy.reloadable_features.streaming_shadow``,
on by default since 1.33): headers at once, the body as it comes, whether the client sends
it with Content-Length or chunked; the copy's answer is dropped, and the client's stream is
the serving model's alone. Each request carries its own prompt ``[n]``, so each copy is
matched to its request by its body; the client checks its own tokens ((n + i) % 1000).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import count

import pytest

from testkit.counting_http import CountingServer, Received
from testkit.loadgen import SseRequest, sse_request
from testkit.manifests import GENERATOR
from testkit.sse_mirror import SseMirrorBed, expected_tokens, sse_mirror_bed
from tests.services import envoy_or_skip

pytestmark = pytest.mark.triton


@dataclass
class Setup:
    bed: SseMirrorBed
    prompts: Iterator[int]

    @property
    def mirror(self) -> CountingServer:
        return self.bed.mirror

    def share(self, share: int) -> None:
        """The mirror share out of 10,000, as the reconciler's adapter writes it."""
        self.bed.share(share)

    def send(self, many: int, chunked: bool = False) -> list[SseRequest]:
        prompts = [next(self.prompts) for _ in range(many)]
        with ThreadPoolExecutor(2) as pool:
            return list(
                pool.map(
                    lambda p: sse_request(self.bed.envoy.http_address, GENERATOR, p, chunked),
                    prompts,
                )
            )

    def copies(self, expected: int, timeout: float = 5.0) -> list[Received]:
        """The copies received: ``expected`` of them, or what came within ``timeout`` and
        a quiet half second after (a copy is sent beside its request, not before its
        answer)."""
        deadline = time.monotonic() + timeout
        while len(self.mirror.received) < expected and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.5)  # none more than expected
        return self.mirror.taken()


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    envoy_or_skip()
    with sse_mirror_bed(tmp_path_factory.mktemp("sse-mirror")) as bed:
        yield Setup(bed, count(1))


def _streams_whole(sent: list[SseRequest]) -> None:
    cut = [s for s in sent if s.error is not None or s.tokens != expected_tokens(s.prompt)]
    assert cut == [], f"{len(cut)} of {len(sent)} client streams cut or wrong: {cut[:2]}"


def _matched(sent: list[SseRequest], copies: list[Received]) -> dict[int, Received]:
    """Each copy by the prompt of the request it copies; every copy is one request's, once."""
    by_prompt = {s.prompt: s for s in sent}
    matched: dict[int, Received] = {}
    for copy in copies:
        prompt = int(json.loads(copy.body)["PROMPT"][0])
        assert prompt in by_prompt and prompt not in matched, f"a stray copy: {copy}"
        matched[prompt] = copy
    return matched


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_every_sse_request_is_mirrored_whole_and_no_client_stream_is_touched(
    setup: Setup, chunked: bool
) -> None:
    """At 100%: one copy per request, its method, path and body the request's (sent with
    Content-Length as the client sent it, else chunked), its Host marked ``-shadow``; the
    mirror's own event stream is dropped, and every client stream is whole."""
    setup.share(10_000)
    sent = setup.send(60, chunked)
    copies = setup.copies(len(sent))
    _streams_whole(sent)
    matched = _matched(sent, copies)
    assert len(matched) == len(sent), f"{len(matched)} of {len(sent)} requests mirrored"
    for request in sent:
        copy = matched[request.prompt]
        assert (copy.method, copy.path) == ("POST", f"/v2/models/{GENERATOR}/generate_stream")
        assert copy.body == request.body, f"a body not whole: {copy.body!r}"
        assert copy.chunked is chunked
        assert ("content-length" in copy.headers) is not chunked
        assert copy.headers["host"].split(":")[0].endswith("-shadow")


def test_the_mirror_share_is_a_share_of_sse_requests(setup: Setup) -> None:
    """A runtime share of 20% mirrors about a fifth of the requests (within 3 standard
    errors), every copy whole; a share of 0 mirrors none."""
    setup.share(2_000)
    sent = setup.send(200)
    copies = setup.copies(40)
    _streams_whole(sent)
    matched = _matched(sent, copies)
    assert all(c.body == s.body for s in sent if (c := matched.get(s.prompt)) is not None)
    share, p = len(matched) / len(sent), 0.2
    allowed = 3 * math.sqrt(p * (1 - p) / len(sent))
    assert abs(share - p) <= allowed, f"{len(matched)} of {len(sent)} mirrored at 20%"
    setup.share(0)
    sent = setup.send(20)
    _streams_whole(sent)
    assert setup.copies(0, timeout=0.0) == []


def test_the_mirror_is_not_waited_for(setup: Setup) -> None:
    """A mirror that answers 0.5 s late leaves every client stream whole and on time."""
    setup.share(10_000)
    setup.mirror.delay = 0.5
    try:
        sent = setup.send(20)
        copies = setup.copies(len(sent))
    finally:
        setup.mirror.delay = 0.0
    _streams_whole(sent)
    assert len(_matched(sent, copies)) == len(sent)
    slowest = max(s.seconds for s in sent)
    assert slowest < 0.4, f"a client stream took {slowest:.2f}s behind a mirror 0.5 s late"
