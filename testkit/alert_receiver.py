"""A webhook receiver on a free loopback port that keeps every alert event posted to it
(the JSON of ``--alert-webhook``), for tests that check what the reconciler alerted."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class AlertReceiver:
    """``with AlertReceiver() as receiver``: ``receiver.hook`` are the CLI options that send
    alerts to it, ``receiver.events`` what it received, in order."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        events = self.events

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                events.append(json.loads(body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.hook = ("--alert-webhook", f"http://127.0.0.1:{self._server.server_address[1]}/events")

    def __enter__(self) -> AlertReceiver:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
