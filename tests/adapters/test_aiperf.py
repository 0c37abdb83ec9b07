"""AIPerf as the gate's load generator (``adapters/aiperf.py``), without AIPerf or a server:
the gate's requests as Triton's generate JSON, and the figures made from AIPerf's raw
records as it writes them (the shapes below are AIPerf 0.13's)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from reconciler.adapters.aiperf import (
    AIPERF_VARIABLE,
    AIPerf,
    inputs_file,
    measured,
    payload,
    raw_records,
)
from reconciler.cli import parse_arguments
from reconciler.cli.gate import _stream_generator
from reconciler.model.errors import ReconcileError, StepFailed
from reconciler.model.spec import Tensor

MS = 1_000_000  # nanoseconds


def _record(
    phase: str, start: int, events: list[tuple[int, dict[str, Any]]], **more: Any
) -> dict[str, Any]:
    return {
        "metadata": {"benchmark_phase": phase, "was_cancelled": more.pop("cancelled", False)},
        "start_perf_ns": start,
        "status": more.pop("status", 200),
        "responses": [
            {"perf_ns": at, "packets": [{"name": "data", "value": json.dumps(event)}]}
            for at, event in events
        ],
        **more,
    }


def test_a_request_is_the_generate_extensions_json_each_input_as_its_shape_is() -> None:
    request = (
        Tensor("text_input", "BYTES", (1,), (b"hello",)),
        Tensor("stream", "BOOL", (1,), (True,)),
        Tensor("PROMPT", "INT32", (3,), (1, 2, 3)),
        Tensor("GRID", "FP32", (2, 2), (1, 2, 3, 4)),
    )
    assert payload(request) == {
        "text_input": ["hello"],
        "stream": [True],
        "PROMPT": [1, 2, 3],
        "GRID": [[1.0, 2.0], [3.0, 4.0]],
    }
    assert payload((Tensor("GRID", "FP32", (1, 2), (1, 2)),), batched=True) == {"GRID": [1.0, 2.0]}
    sessions = inputs_file([request[2:3], (Tensor("PROMPT", "INT32", (1,), (7,)),)])["data"]
    assert [s["payloads"] for s in sessions] == [[{"PROMPT": [1, 2, 3]}], [{"PROMPT": [7]}]]
    with pytest.raises(StepFailed, match="not text"):
        payload((Tensor("RAW", "BYTES", (1,), (b"\xff",)),))


def test_figures_are_the_profiling_streams_an_error_inside_a_stream_a_failure() -> None:
    token = {"TOKEN": 6}
    records = [
        _record("warmup", 0, [(500 * MS, token)]),  # left out, however slow
        _record("profiling", 1000 * MS, [(1010 * MS, token), (1015 * MS, token)]),
        _record("profiling", 1000 * MS, [(1020 * MS, token), (1025 * MS, token)]),
        # A generation that fails midway: a 200 stream whose last event is an error. AIPerf
        # itself counts it a success.
        _record("profiling", 1030 * MS, [(1040 * MS, token), (1050 * MS, {"error": "at 2"})]),
        # Refused at its first event: 400, the event as the body.
        _record(
            "profiling",
            1050 * MS,
            [],
            status=400,
            error={"code": 400, "message": 'data: {"error":"fails every request"}\n\n'},
        ),
        _record("profiling", 1050 * MS, [], cancelled=True),
    ]
    found = measured(2, records)
    assert (found.requests, found.errors, found.streamed) == (5, 3, True)
    assert found.note == "3 failed, first: at 2"
    assert found.p50_ms == pytest.approx(15.0)  # 10 and 20 ms to the first response
    assert found.gap_ms == pytest.approx(5.0)
    # 2 streams and 4 responses completed in the 50 ms from the first send to the last event
    assert found.throughput == pytest.approx(40.0)
    assert found.responses_per_second == pytest.approx(80.0)
    assert measured(1, [records[4]]).note == "1 failed, first: fails every request"


def test_records_are_read_where_a_run_whose_requests_all_failed_leaves_them(
    tmp_path: Path,
) -> None:
    (tmp_path / "raw_records").mkdir()
    lines = [_record("profiling", 0, [], error={"message": "refused"})] * 2
    (tmp_path / "raw_records" / "raw_records_p1.jsonl").write_text(
        "\n".join(json.dumps(line) for line in lines) + "\n"
    )
    assert len(raw_records(tmp_path)) == 2
    (tmp_path / "profile_export_raw.jsonl").write_text(json.dumps(lines[0]) + "\n")
    assert len(raw_records(tmp_path)) == 1  # merged: the merged export alone


def test_a_model_that_does_not_stream_is_refused(tmp_path: Path) -> None:
    tester = AIPerf("aiperf", "127.0.0.1:1", tmp_path)
    with pytest.raises(StepFailed, match="streaming models only"):
        tester.measure("echo", 1, [(Tensor("INPUT0", "FP32", (1,), (1.0,)),)], (), 1, 10)


def _gate_args(*extra: str, environ: dict[str, str] | None = None) -> Any:
    return parse_arguments(
        ["gate", "--repo", "r", "--base", "a", "--head", "b", "--model-repository", "m", *extra],
        environ or {},
    )


def test_the_gate_uses_aiperf_for_streams_only_when_it_is_asked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--aiperf`` or $TRITON_GITOPS_AIPERF: AIPerf measures streaming models (under auto
    and ``--load-generator aiperf``); ``built-in`` and ``perf_analyzer`` keep it out; on
    PATH alone it is used only when ``--load-generator aiperf`` asks."""
    binary = tmp_path / "aiperf"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    monkeypatch.delenv(AIPERF_VARIABLE, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert _stream_generator(_gate_args()) is None  # on PATH, not asked for
    assert _stream_generator(_gate_args("--load-generator", "aiperf")) == str(binary)
    assert _stream_generator(_gate_args("--aiperf", str(binary))) == str(binary)
    for other in ("built-in", "perf_analyzer"):
        args = _gate_args("--aiperf", str(binary), "--load-generator", other)
        assert _stream_generator(args) is None
    monkeypatch.setenv("PATH", "/nonexistent")
    environ = {AIPERF_VARIABLE: str(binary)}
    assert _stream_generator(_gate_args(environ=environ)) == str(binary)
    missing = str(tmp_path / "missing")
    with pytest.raises(ReconcileError, match=f"aiperf {missing} not found"):
        _stream_generator(_gate_args(environ={AIPERF_VARIABLE: missing}))
    with pytest.raises(ReconcileError, match=r"aiperf \(on PATH\) not found"):
        _stream_generator(_gate_args("--load-generator", "aiperf"))
