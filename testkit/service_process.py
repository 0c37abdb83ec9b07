"""``python -m reconciler run`` in its own process, as an operator runs it, seen from outside.

The one wrapper of the reconciler service process, used by the service tests
(``tests/integration/test_daemon.py`` and the tests that build on it) and by the service
benchmarks (``bench.daemon``, ``bench.soak``). It starts the service in its own process group
on a free loopback port, with a GitHub webhook secret in a file and a bearer token for
``POST /reconcile`` in its environment, and ends it by its process id (SIGTERM, then SIGKILL).
It speaks to it over HTTP (webhooks, ``/reconcile``, ``/metrics``) and reads its JSON log.

The tests and the benchmarks start it differently (the tests with a short call timeout and a
5-minute interval, the benchmarks with an hour's interval and their own watch interval):
those choices are a ``ServiceOptions`` value, never a second copy of this class.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from testkit.local_triton import free_port


class ServiceProcessError(RuntimeError):
    """The service did not answer, or answered what a caller cannot go on with."""


def wait_until(
    condition: Callable[[], bool],
    timeout: float,
    what: str,
    poll: float = 0.05,
    explain: Callable[[], str] | None = None,
) -> float:
    """``time.monotonic()`` when ``condition`` first held (an exception counts as not yet);
    ``ServiceProcessError`` after ``timeout`` seconds, with what ``explain`` says of the
    state then (the reason a reader of the failure needs)."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(Exception):
            if condition():
                return time.monotonic()
        if time.monotonic() > deadline:
            detail = ""
            if explain is not None:
                try:
                    detail = "\n" + explain()
                except Exception as exc:  # the explanation must not hide the timeout
                    detail = f"\n(could not explain: {exc!r})"
            raise ServiceProcessError(f"not within {timeout:g} s: {what}{detail}")
        time.sleep(poll)


@dataclass(frozen=True)
class ServiceOptions:
    """How the service is started and spoken to."""

    secret: str  # the GitHub webhook secret, written to ``secret_file`` in the workdir
    token: str  # $TRITON_GITOPS_RECONCILE_TOKEN, the bearer token of POST /reconcile
    secret_file: str = "secret"
    interval: float = 300  # --interval: long, so that only the first pass comes from the timer
    watch_interval: float = 0.5
    call_timeout: float | None = None  # --call-timeout, when given
    extra: tuple[str, ...] = ()  # any other options, last on the command line
    start_timeout: float = 30.0  # until /healthz answers 200
    stop_timeout: float = 60.0  # after SIGTERM, before SIGKILL
    # A test must fail when the service does not stop on SIGTERM; a benchmark records the
    # exit code (-9) and goes on.
    hung_stop_raises: bool = True
    http_timeout: float = 5.0


@dataclass
class Service:
    """``python -m reconciler run`` in its own process group, ended by its pid."""

    repo: str
    workdir: Path
    options: ServiceOptions
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    scrapes: int = 0  # GET /metrics made through this wrapper

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.workdir / "reconciler.log"

    @property
    def pid(self) -> int:
        if self.process is None:
            raise ServiceProcessError("the service is not running")
        return self.process.pid

    def command(self) -> list[str]:
        o = self.options
        return [
            sys.executable, "-m", "reconciler", "run",
            "--repo", self.repo,
            "--state", str(self.workdir / "state.db"),
            "--cache-dir", str(self.workdir / "cache"),
            "--listen", f"127.0.0.1:{self.port}",
            "--interval", f"{o.interval:g}", "--jitter", "0",
            "--watch-interval", f"{o.watch_interval:g}",
            *(("--call-timeout", f"{o.call_timeout:g}") if o.call_timeout is not None else ()),
            "--github-secret-file", str(self.workdir / o.secret_file),
            *o.extra,
        ]  # fmt: skip

    def start(self) -> Service:
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / self.options.secret_file).write_text(self.options.secret)
        env = dict(os.environ, TRITON_GITOPS_RECONCILE_TOKEN=self.options.token)
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        wait_until(
            lambda: self.get("/healthz")[0] == 200,
            self.options.start_timeout,
            "the service answers",
        )
        return self

    def stop(self) -> int:
        """SIGTERM to the process group, SIGKILL after ``stop_timeout``; the exit code (0 if
        it was not running)."""
        process, self.process = self.process, None
        if process is None:
            return 0
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                return process.wait(self.options.stop_timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                if self.options.hung_stop_raises:
                    raise
        return process.returncode

    # -- HTTP ------------------------------------------------------------------------------

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(
                self.url + path, timeout=self.options.http_timeout
            ) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def post(self, path: str, body: bytes, headers: dict[str, str]) -> int:
        request = urllib.request.Request(self.url + path, body, headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.options.http_timeout) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)

    def github_push(self, sha: str | None = None, secret: str | None = None) -> int:
        """POST a GitHub push webhook for main (``after``: ``sha`` when given), signed with
        ``secret`` (the service's own by default)."""
        payload: dict[str, str] = {"ref": "refs/heads/main"}
        if sha is not None:
            payload["after"] = sha
        body = json.dumps(payload).encode()
        key = (self.options.secret if secret is None else secret).encode()
        signature = "sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest()
        headers = {
            "X-Hub-Signature-256": signature,
            "X-GitHub-Event": "push",
            "Content-Type": "application/json",
        }
        return self.post("/webhook/github", body, headers)

    def reconcile_now(self) -> int:
        return self.post("/reconcile", b"{}", {"Authorization": f"Bearer {self.options.token}"})

    # -- what it reports -------------------------------------------------------------------

    def metrics(self) -> dict[str, float]:
        """Every sample of /metrics, keyed ``name{label="value",...}``."""
        status, body = self.get("/metrics")
        self.scrapes += 1
        if status != 200:
            raise ServiceProcessError(f"/metrics answered {status}")
        values: dict[str, float] = {}
        for family in text_string_to_metric_families(body.decode()):
            for sample in family.samples:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
                values[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
        return values

    def passes_by_result(self, metrics: dict[str, float] | None = None) -> dict[str, float]:
        """Finished passes by result, from ``triton_gitops_passes_total``."""
        metrics = self.metrics() if metrics is None else metrics
        prefix = 'triton_gitops_passes_total{result="'
        return {k[len(prefix) : -2]: v for k, v in metrics.items() if k.startswith(prefix)}

    def pass_count(self) -> int:
        return int(sum(self.passes_by_result().values()))

    def wait_passes(self, more_than: int, timeout: float, what: str) -> int:
        """The pass counter once it is above ``more_than``."""
        count = 0

        def done() -> bool:
            nonlocal count
            count = self.pass_count()
            return count > more_than

        wait_until(done, timeout, what, poll=0.02)
        return count

    def events(self) -> list[dict[str, Any]]:
        """The JSON lines of its log (a line cut off while being written is left out)."""
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        events = []
        for line in lines:
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    events.append(json.loads(line))
        return events

    def passes(self) -> int:
        """Passes its log says finished."""
        return sum(e.get("message") == "pass finished" for e in self.events())
