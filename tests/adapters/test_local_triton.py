"""LocalTriton: extra variables reach the server, and only the server; start() returns once
the server and its metrics endpoint both answer."""

from __future__ import annotations

import os
import sys
import urllib.request
from pathlib import Path

from testkit.local_triton import LocalTriton


def test_extra_env_reaches_the_server_process_only(model_repository: Path, tmp_path: Path) -> None:
    name = "TRITON_GITOPS_TEST_MARKER"
    server = LocalTriton(
        model_repository, log_file=tmp_path / "triton.log", extra_env={name: "soak"}
    ).start()
    try:
        assert server.process is not None
        environ = Path(f"/proc/{server.process.pid}/environ").read_bytes().split(b"\0")
        assert f"{name}=soak".encode() in environ
        assert name not in os.environ
    finally:
        server.stop()


# A stand-in for tritonserver that answers /v2/health/ready at once and opens its metrics
# port only after a while, as a real one on a busy host does (Triton starts the metrics
# endpoint after HTTP): start() must not return before both answer.
_SLOW_METRICS = r"""#!{python}
import sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

args = dict(a.removeprefix("--").split("=", 1) for a in sys.argv[1:] if "=" in a)

class Answer(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"nv_inference_count 0\n")
    def log_message(self, *_):
        pass

def serve(port):
    ThreadingHTTPServer((args["http-address"], int(port)), Answer).serve_forever()

threading.Thread(target=serve, args=(args["http-port"],), daemon=True).start()
time.sleep(1.5)
serve(args["metrics-port"])
"""


def test_start_returns_once_the_metrics_endpoint_answers_too(tmp_path: Path) -> None:
    binary = tmp_path / "server" / "bin" / "tritonserver"
    binary.parent.mkdir(parents=True)
    binary.write_text(_SLOW_METRICS.replace("{python}", sys.executable))
    binary.chmod(0o755)
    server = LocalTriton(tmp_path, binary=binary, log_file=tmp_path / "server.log").start()
    try:
        with urllib.request.urlopen(server.metrics_url, timeout=2) as response:
            assert response.status == 200, server.log_tail()
    finally:
        server.stop()
