"""Triton's own load generator, perf_analyzer, as the gate's ``LoadTester``: one version of a
model at one concurrency level, with the gate's requests as its ``--input-data``, figures
read from its CSV export (``-f``).

perf_analyzer measures in windows until three in a row agree (its stability rule), each of at
least ``count`` requests here (``--measurement-mode count_windows``), so it sends more than the
built-in generator for the same setting and reports its last stable window. It stops at the
first failed request with a non-zero exit: that measurement is reported as all failed, with
its message. Its binary must be the release of the server it drives (2.51 here: see
docs/gate.md for how to install one beside the project).
"""

from __future__ import annotations

import csv
import hashlib
import json
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from reconciler.core.smoke import as_array
from reconciler.model.errors import StepFailed
from reconciler.model.gate import LoadFigures
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
    ) -> LoadFigures:
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
            "--input-data", str(data),
            "-f", str(report),
        ]  # fmt: skip
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
        if done.returncode != 0 or not rows:
            said = (done.stderr.strip() or done.stdout.strip()).splitlines()
            why = next((line for line in said if "ail" in line or "rror" in line), None)
            return LoadFigures(
                concurrency=concurrency,
                requests=count,
                errors=count,
                throughput=0.0,
                p50_ms=float("nan"),
                p95_ms=float("nan"),
                p99_ms=float("nan"),
                note=f"perf_analyzer exited {done.returncode}: "
                + (why or (said[-1] if said else "no output")),
            )
        row = rows[-1]
        quantiles = tuple(
            (float(p), _number(row, f"p{p} latency") / 1000.0) for p in (50, 90, 95, 99)
        )
        return LoadFigures(
            concurrency=concurrency,
            requests=count,
            errors=0,  # it stops at the first failure, so a finished run had none
            throughput=_number(row, "Inferences/Second"),
            p50_ms=quantiles[0][1],
            p95_ms=quantiles[2][1],
            p99_ms=quantiles[3][1],
            quantiles=quantiles,
        )
