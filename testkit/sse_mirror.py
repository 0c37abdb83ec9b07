"""The SSE mirror bed: a real Envoy mirroring Triton's HTTP ``generate_stream`` requests
(server-sent events) to a counting server, for the question of issue 43, point 1: does
Envoy mirror such a request, body and all, and leave the client's stream alone?
``tests/integration/test_sse_mirror.py`` asserts it and ``python -m bench.sse_mirror``
measures it, both on this one bed.

``sse_mirror_bed`` starts one real tritonserver serving the streaming test model ``gen``
(version 1, ``TOKENS`` tokens 5 ms apart, two instances), a ``CountingServer``
(testkit/counting_http.py) that records each copy whole, and one ``LocalEnvoy`` routing
Triton's HTTP API to the server with a request mirror policy to ``MIRROR``, a mirror-only
HTTP/1.1 cluster of the counting server whose share is the runtime key ``RUNTIME_KEY``
(0 until ``SseMirrorBed.share`` sets it). Leaving the ``with`` stops the three, each by
its own ``stop``; a caller may stop the Envoy or the counting server sooner (a mirror
target gone), as stopping again does nothing.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import tritonclient.grpc as triton_grpc

from reconciler.adapters.envoy import mirror_value
from testkit.counting_http import CountingServer
from testkit.envoy import LocalEnvoy
from testkit.local_triton import LocalTriton
from testkit.manifests import GENERATOR, generator_config, write_generator_repository

TOKENS = 5
PARAMETERS = {"tokens": str(TOKENS), "token_ms": "5"}
MIRROR = "comparator_http"  # the mirror-only cluster of the counting server
RUNTIME_KEY = f"mirror.triton.{MIRROR}"


@dataclass(frozen=True)
class SseMirrorBed:
    triton: LocalTriton
    envoy: LocalEnvoy
    mirror: CountingServer

    def share(self, share: int) -> None:
        """The share of requests mirrored to ``MIRROR``, out of 10,000."""
        set_mirror_share(self.envoy, RUNTIME_KEY, share)


def expected_tokens(prompt: int) -> tuple[int, ...]:
    """The tokens a whole stream of ``gen`` answers the prompt ``[prompt]`` with
    (testkit/models/gen/model.py)."""
    return tuple((prompt + i) % 1000 for i in range(TOKENS))


def set_mirror_share(envoy: LocalEnvoy, key: str, share: int) -> None:
    """Set the runtime fraction ``key`` to ``share`` out of 10,000, as the reconciler's
    adapter writes it (``mirror_value``)."""
    query = urllib.parse.urlencode({key: mirror_value(share)}, quote_via=urllib.parse.quote)
    request = urllib.request.Request(f"{envoy.admin_url}/runtime_modify?{query}", method="POST")
    with urllib.request.urlopen(request, timeout=5) as answer:
        answer.read()


@contextmanager
def sse_mirror_bed(root: Path) -> Iterator[SseMirrorBed]:
    """The bed, its files (the model repository, the logs, Envoy's bootstrap) under
    ``root``; every process it starts is stopped on leaving, by its pid."""
    models = write_generator_repository(root / "models", parameters=PARAMETERS)
    triton = LocalTriton(models, log_file=root / "triton.log")
    mirror = CountingServer()
    envoy: LocalEnvoy | None = None
    try:
        triton.start()
        config = generator_config([1], PARAMETERS, instances=2)
        with triton_grpc.InferenceServerClient(triton.grpc_address) as client:
            client.load_model(GENERATOR, config=json.dumps(config))
        mirror.start()
        envoy = LocalEnvoy.of(
            root / "envoy",
            {"stable": [triton.grpc_address]},
            {"stable": 10_000},
            http={"stable": [triton.http_address]},
            http_mirrors={MIRROR: [mirror.address]},
        ).start()
        yield SseMirrorBed(triton, envoy, mirror)
    finally:
        if envoy is not None:
            envoy.stop()
        mirror.stop()
        triton.stop()
