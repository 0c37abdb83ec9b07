"""The Triton adapter's streamed exchange (``adapters/triton_stream.py``) against a real
tritonserver whose process dies in the middle of a stream (issue 42, bad input): the
stream is cut, a failure of that exchange (StreamCut, naming the server and the responses
that came), never an error that escapes as something else and ends the pass."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import tritonclient.grpc as triton_grpc

from reconciler.adapters.triton import TritonServerClient
from reconciler.model.errors import StreamCut
from reconciler.model.spec import Tensor
from testkit.local_triton import LocalTriton
from testkit.manifests import GENERATOR, generator_config, write_generator_repository

pytestmark = pytest.mark.triton

# 100 tokens 50 ms apart: a 5 s stream, still going when the server dies.
LONG = generator_config([1], {"tokens": "100", "token_ms": "50"})


def test_a_server_that_dies_mid_stream_cuts_the_stream(tmp_path: Path) -> None:
    models = write_generator_repository(tmp_path / "models")
    server = LocalTriton(models, log_file=tmp_path / "triton.log").start()
    try:
        with triton_grpc.InferenceServerClient(server.grpc_address) as client:
            client.load_model(GENERATOR, config=json.dumps(LONG))
        outcome: list[BaseException | object] = []

        def stream() -> None:
            with TritonServerClient("edge-a", server.grpc_address) as adapter:
                try:
                    prompt = Tensor("PROMPT", "INT32", (3,), (1, 2, 3))
                    outcome.append(adapter.stream(GENERATOR, 1, (prompt,), (), timeout=30))
                except BaseException as exc:  # what escapes is what the test looks at
                    outcome.append(exc)

        streaming = threading.Thread(target=stream)
        streaming.start()
        time.sleep(1.0)  # a few of its 100 tokens, 50 ms apart, have come
        server.kill()
        streaming.join(timeout=30)
        assert outcome, "the stream did not end within 30 s of the server's death"
        (ended,) = outcome
        assert isinstance(ended, StreamCut), f"{type(ended).__name__}: {ended}"
        assert "server edge-a" in str(ended) and "closed after" in str(ended), str(ended)
    finally:
        server.stop()
