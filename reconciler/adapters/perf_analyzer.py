"""Triton's own load generator, perf_analyzer, as the gate's ``LoadTester``: one version of a
model at one concurrency level, with the gate's requests as its ``--input-data``, figures
read from its CSV export (``-f``).

A measurement is a fixed one: three windows of at least ``count`` requests each
(``--measurement-mode count_windows``), their figures merged, whatever they say. perf_analyzer
would otherwise go on measuring until three windows in a row agree within 10%, and on a busy
machine give up ("Failed to obtain stable measurement", exit 2, no figures), which says
nothing about the version; the gate judges the spread over its own interleaved rounds. (Its
``--request-count`` mode is no fixed measurement to use either: it divides by whole seconds,
so 60 requests read as 60/s however fast they were answered.) perf_analyzer stops a worker at
its first failed request: those are the failures it reports (it does not measure a rate; the
built-in generator does). Any other non-zero exit is an error of the measurement
(``StepFailed``), never failed requests. Its binary must be the release of the server it
drives (2.51 here: see docs/gate.md for how to install one beside the project).
"""

from __future__ import annotations

import csv
import hashlib
import json
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from reconciler.core.smoke import as_array
from reconciler.model.errors import StepFailed
from reconciler.model.gate import LoadFigures
from reconciler.model.plan import Exchange
from reconciler.model.spec import Tensor


def find_perf_analyzer(given: str | None = None) -> str | None:
    """``given`` (a path or a name on PATH), else ``perf_analyzer`` on PATH; None if absent."""
    return shutil.which(given or "perf_analyzer")


def _content(tensor: Tensor, batched: bool) -> dict[str, Any]:
    array = as_array(tensor)
    if batched and array.ndim > 0:
        # perf_analyzer adds the batch dimension itself (batch size 1): the request's first row.
        array = array[0]
    # As numbers of the tensor's own type (perf_analyzer refuses 1 for an FP32 input: 1.0).
    values = array.reshape(-1).tolist()
    if tensor.datatype == "BYTES":
        values = [v.decode() if isinstance(v, bytes) else v for v in values]
    return {"content": values, "shape": list(array.shape)}


def input_data(requests: Sequence[tuple[Tensor, ...]], batched: bool) -> dict[str, Any]:
    """The ``--input-data`` JSON of ``requests``: one entry per request, sent in turn."""
    return {
        "data": [
            {tensor.name: _content(tensor, batched) for tensor in request} for request in requests
        ]
    }


# A worker that met a failed request (perf_analyzer 2.51: "Thread [0] had error: Failed to
# process the request(s) for model ..."; older releases: "Failed to retrieve results from
# inference request"): one line per failed request, since each worker stops at its first.
_FAILED_REQUEST = re.compile(
    r"^(Thread \[\d+\] had error: .*|.*Failed to retrieve results from inference request.*)$",
    re.MULTILINE,
)
_WINDOWS = 3  # perf_analyzer's stability rule compares the last three windows
_ANY_SPREAD = "10000"  # percent
_REQUEST_COUNT = re.compile(r"^\s*Request count: (\d+)\s*$", re.MULTILINE)


def _number(row: dict[str, str], key: str) -> float:
    try:
        return float(row[key])
    except (KeyError, ValueError):
        return float("nan")


class PerfAnalyzer:
    """perf_analyzer over gRPC against one server (``ports.LoadTester``)."""

    name = "perf_analyzer"

    def __init__(
        self, binary: str, address: str, workdir: Path | None = None, timeout: float = 900.0
    ) -> None:
        self.binary = binary
        self.address = address
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="triton-gitops-perf-"))
        self.timeout = timeout

    def _data_file(self, requests: Sequence[tuple[Tensor, ...]], batched: bool) -> Path:
        text = json.dumps(input_data(requests, batched), sort_keys=True)
        path = self.workdir / f"input-{hashlib.sha256(text.encode()).hexdigest()[:16]}.json"
        if not path.exists():
            path.write_text(text)
        return path

    def measure(
        self,
        model: str,
        version: int,
        requests: Sequence[tuple[Tensor, ...]],
        outputs: tuple[str, ...],
        concurrency: int,
        count: int,
        batched: bool = False,
        *,
        exchange: Exchange = Exchange.UNARY,
    ) -> LoadFigures:
        # A sequence model's sequences perf_analyzer makes itself, from the model's config
        # (its --sequence-length, 20 by default, with a correlation ID of each one's own).
        streaming = exchange is Exchange.STREAM
        data = self._data_file(requests, batched)
        report = self.workdir / f"{model}-{version}-c{concurrency}.csv"
        report.unlink(missing_ok=True)
        command = [
            self.binary,
            "-i", "grpc",
            "-u", self.address,
            "-m", model,
            "-x", str(version),
            "--concurrency-range", f"{concurrency}:{concurrency}",
            "--measurement-mode", "count_windows",
            "--measurement-request-count", str(count),
            # Any three windows are "stable" (max/min within 100x): a fixed measurement.
            "--stability-percentage", _ANY_SPREAD,
            "--max-trials", str(_WINDOWS),
            "--input-data", str(data),
            "-f", str(report),
        ]  # fmt: skip
        export = self.workdir / f"{model}-{version}-c{concurrency}.requests.json"
        if streaming:
            # gRPC streams. perf_analyzer 2.51 says it times a decoupled model's first
            # response, but its summary and CSV read the whole stream (measured: 47 ms p50
            # where its own per-request timestamps put the first response at 24 ms): the
            # time to the first response is read from those timestamps instead.
            command += ["--streaming", "--profile-export-file", str(export)]
            export.unlink(missing_ok=True)
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=self.timeout, check=False
            )
        except subprocess.TimeoutExpired:
            raise StepFailed(
                f"perf_analyzer on {model} version {version} did not finish within "
                f"{self.timeout:g}s"
            ) from None
        except OSError as exc:
            raise StepFailed(f"perf_analyzer {self.binary} could not run: {exc}") from None
        rows = list(csv.DictReader(report.open())) if report.exists() else []
        said = f"{done.stdout}\n{done.stderr}"
        if done.returncode == 0 and rows:
            found = _figures(concurrency, rows[-1], said, count)
            return first_responses(found, rows[-1], export) if streaming else found
        failed = [m.group(0).strip() for m in _FAILED_REQUEST.finditer(said)]
        if failed:
            return failed_requests(concurrency, failed, done.returncode)
        lines = [line.strip() for line in said.splitlines() if line.strip()]
        why = next((line for line in lines if "ail" in line or "rror" in line), None)
        raise StepFailed(
            f"perf_analyzer could not measure {model} version {version} at concurrency "
            f"{concurrency} (exit {done.returncode}): "
            + (why or (lines[-1] if lines else "no output"))
        )


def _figures(concurrency: int, row: dict[str, str], said: str, count: int) -> LoadFigures:
    """A finished measurement: every request answered (it stops at the first failure), in
    the three windows merged."""
    quantiles = tuple((float(p), _number(row, f"p{p} latency") / 1000.0) for p in (50, 90, 95, 99))
    sent = _REQUEST_COUNT.search(said)
    return LoadFigures(
        concurrency=concurrency,
        requests=int(sent.group(1)) if sent else count,
        errors=0,
        throughput=_number(row, "Inferences/Second"),
        p50_ms=quantiles[0][1],
        p95_ms=quantiles[2][1],
        p99_ms=quantiles[3][1],
        quantiles=quantiles,
    )


def failed_requests(concurrency: int, failed: Sequence[str], code: int) -> LoadFigures:
    """A measurement perf_analyzer stopped at failed requests: those it reported, and only
    those (how many succeeded before them it does not say, so they are all the requests the
    figures account for: the rate reads 100%, a failure under any bound but 1)."""
    return LoadFigures(
        concurrency=concurrency,
        requests=len(failed),
        errors=len(failed),
        throughput=0.0,
        p50_ms=float("nan"),
        p95_ms=float("nan"),
        p99_ms=float("nan"),
        note=f"perf_analyzer exited {code} at {len(failed)} failed request(s), first: {failed[0]}",
    )


def first_responses(found: LoadFigures, row: dict[str, str], export: Path) -> LoadFigures:
    """A streamed measurement: its latency the time to each stream's first response, from
    the per-request timestamps of ``--profile-export-file`` (every window), and the responses
    per second from the CSV. The time between responses is not read (None): the timestamps
    count an empty final-flag response like a token, and nothing in the export tells them
    apart, so the built-in generator measures it."""
    try:
        requests = [
            request
            for experiment in json.loads(export.read_text())["experiments"]
            for request in experiment["requests"]
        ]
        first = [
            (r["response_timestamps"][0] - r["timestamp"]) / 1e6
            for r in requests
            if r.get("response_timestamps")
        ]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise StepFailed(f"perf_analyzer's request timestamps {export}: {exc}") from None
    if not first:
        raise StepFailed(f"perf_analyzer's request timestamps ({export}) hold no response")
    levels = (50, 90, 95, 99)
    values = [float(v) for v in np.percentile(np.array(first), levels)]
    return replace(
        found,
        p50_ms=values[0],
        p95_ms=values[2],
        p99_ms=values[3],
        quantiles=tuple((float(p), v) for p, v in zip(levels, values, strict=True)),
        streamed=True,
        responses_per_second=_number(row, "Response Throughput"),
    )
