"""A connection to Triton dropped, and the reconciler's next call: how often the call made
at once fails, and how many asks a quarter second apart it takes to answer again
(``engine.change.answers_again``: a verify whose call lost the server puts the old versions
back when the server answers again within ``ANSWER_AGAIN_WITHIN``).

A real tritonserver behind ``testkit.tcp_proxy`` (loopback); the reconciler's own client
(``adapters.triton.TritonServerClient``, its channel options) reads the index, the proxy
cuts every connection, and the client asks again at once, then every 0.25 s for 2 s.

    python -m bench.connection_drop [--drops 60]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import tritonclient.grpc as triton_grpc

from reconciler.adapters.triton import TritonServerClient
from reconciler.engine.change import ANSWER_AGAIN_WITHIN, ASK_AGAIN_EVERY
from reconciler.model.errors import ReconcileError


def asks_after_a_drop(client: TritonServerClient, within: float) -> tuple[int | None, float]:
    """(the ask that answered, 1 the first; None: none within ``within``), seconds taken."""
    began, asks = time.monotonic(), 0
    while True:
        asks += 1
        try:
            client.model_state("echo")
            return asks, time.monotonic() - began
        except ReconcileError:
            if time.monotonic() - began >= within:
                return None, time.monotonic() - began
            time.sleep(ASK_AGAIN_EVERY)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.connection_drop", description=__doc__)
    parser.add_argument("--drops", type=int, default=60)
    args = parser.parse_args(argv)
    from testkit.local_triton import LocalTriton
    from testkit.manifests import write_model_repository
    from testkit.tcp_proxy import TcpProxy

    with tempfile.TemporaryDirectory(prefix="bench-connection-drop-") as scratch:
        repository = write_model_repository(Path(scratch) / "models")
        server = LocalTriton(repository, log_file=Path(scratch) / "triton.log").start()
        try:
            with triton_grpc.InferenceServerClient(server.grpc_address) as direct:
                direct.load_model("echo")
            results = []
            with TcpProxy(server.grpc_address) as proxy:
                client = TritonServerClient("edge-a", proxy.address, call_timeout=5)
                for _ in range(args.drops):
                    client.model_state("echo")  # a live connection to cut
                    proxy.cut()
                    results.append(asks_after_a_drop(client, ANSWER_AGAIN_WITHIN))
                    time.sleep(0.2)
        finally:
            server.stop()
    answered = Counter(asks for asks, _ in results)
    slowest = max(seconds for _, seconds in results)
    print(f"{args.drops} drops; the ask that answered: "
          + ", ".join(f"{'none' if k is None else k}: {v}" for k, v in sorted(
              answered.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)))
          + f"; slowest {slowest * 1e3:.0f} ms", flush=True)  # fmt: skip
    return 0 if None not in answered else 1


if __name__ == "__main__":
    sys.exit(main())
