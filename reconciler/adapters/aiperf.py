"""AIPerf (PyPI ``aiperf``, NVIDIA's benchmark client for LLM serving) as the gate's
``LoadTester`` for a streaming (decoupled) model: one version at one concurrency level, the
gate's requests sent as they are, the figures read from AIPerf's per-request export.

AIPerf 0.13 has no gRPC transport (its ``kserve_v2_infer`` endpoint and ``grpc://`` URLs were
proposed upstream and not released: ``--endpoint-type kserve_v2_infer`` is refused, and so
is a ``grpc://`` URL), so it drives Triton's HTTP ``generate_stream`` extension: one
request, one server-sent-events stream, one event per response, no event for a flags-only
final response. Its ``raw`` endpoint sends each request as written in an ``inputs-json``
file: the gate's request as the generate extension's JSON (each input by name, its values
nested as its shape is, the version in the URL). Triton infers each input's shape from the
JSON.

The figures are computed here from ``--export-level raw`` (every request's send time and
the time of each of its events, on one clock), not read from AIPerf's summary, because:
- an error that comes inside a stream (the stream's status is fixed by its first event, so
  a generation that fails midway arrives as ``{"error": ...}`` in a 200 stream) is counted
  by AIPerf as a successful request; here it is a failure, as the built-in generator
  counts it;
- a run in which every request failed exits 1 with no summary, only the records;
- they are then the built-in generator's own figures (``triton_load.figures``): the time to
  the first response, the median time between responses, the responses per second.
Events that arrive in one read share a timestamp, so back-to-back responses can read 0 ms
apart.

AIPerf needs a tokenizer even to replay raw payloads, and its ``builtin`` one downloads its
encoding from the internet on first use. A word-level tokenizer written into the work
folder (every word an unknown token, so one token per word) is loaded from that path with
no network; the response field gives each response that is not an error one word, so
AIPerf's own token counts, in the files it leaves, are responses. Each run costs about 6 s
of AIPerf's start-up and shut-down on a 2-core machine, beside the measurement.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from reconciler.adapters.local_triton import end_process_group
from reconciler.core.smoke import as_array
from reconciler.model.errors import StepFailed
from reconciler.model.gate import LoadFigures
from reconciler.model.plan import Exchange
from reconciler.model.spec import Tensor

AIPERF_VARIABLE = "TRITON_GITOPS_AIPERF"
WARMUP_PER_WORKER = 5  # as the built-in generator: each concurrent stream warms up first

# One token per whitespace-separated word, whatever the word: a WordLevel model whose only
# entry is its unknown token. tokenizer_config.json names the class transformers builds.
_TOKENIZER = {
    "version": "1.0",
    "truncation": None,
    "padding": None,
    "added_tokens": [
        {
            "id": 0,
            "content": "[UNK]",
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
    ],
    "normalizer": None,
    "pre_tokenizer": {"type": "WhitespaceSplit"},
    "post_processor": None,
    "decoder": None,
    "model": {"type": "WordLevel", "vocab": {"[UNK]": 0}, "unk_token": "[UNK]"},
}
_TOKENIZER_CONFIG = {
    "tokenizer_class": "PreTrainedTokenizerFast",
    "unk_token": "[UNK]",
    "model_max_length": 1_000_000,
}
# A JMESPath query on each event: one word for an event that is not an error, nothing for an
# error (AIPerf then finds no text in it either).
_RESPONSE_FIELD = '[@][?!error] | [0] && `" x"`'


def find_aiperf(given: str | None = None) -> str | None:
    """``given`` (a path or a name on PATH), else $TRITON_GITOPS_AIPERF, else ``aiperf`` on
    PATH; None if absent."""
    return shutil.which(given or os.environ.get(AIPERF_VARIABLE) or "aiperf")


def write_tokenizer(folder: Path) -> Path:
    """The word-level tokenizer AIPerf is given, in ``folder`` (made if absent)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(json.dumps(_TOKENIZER))
    (folder / "tokenizer_config.json").write_text(json.dumps(_TOKENIZER_CONFIG))
    return folder


def _strings(value: Any) -> Any:
    """BYTES values (nested lists of bytes) as strings, the nesting kept."""
    if isinstance(value, list):
        return [_strings(v) for v in value]
    return value.decode() if isinstance(value, bytes) else value


def _value(tensor: Tensor, batched: bool) -> Any:
    """One input's JSON value: its values nested as its shape is."""
    array = as_array(tensor)
    if batched and array.ndim > 0:
        # The generate extension has no batch of its own: the request's first row, as
        # perf_analyzer is given it.
        array = array[0]
    if tensor.datatype != "BYTES":
        return array.tolist()
    try:
        return _strings(array.tolist())
    except UnicodeDecodeError:
        raise StepFailed(
            f"input {tensor.name} holds bytes that are not text: Triton's generate extension "
            "(which aiperf drives) takes strings only"
        ) from None


def payload(request: tuple[Tensor, ...], batched: bool = False) -> dict[str, Any]:
    """One request as the JSON body of Triton's generate extension."""
    return {tensor.name: _value(tensor, batched) for tensor in request}


def inputs_file(requests: Sequence[tuple[Tensor, ...]], batched: bool = False) -> dict[str, Any]:
    """AIPerf's ``inputs-json`` dataset of ``requests``: one single-request session each,
    replayed in turn (``--dataset-sampling-strategy sequential``)."""
    return {
        "data": [
            {"session_id": f"request-{index}", "payloads": [payload(request, batched)]}
            for index, request in enumerate(requests)
        ]
    }


def _event_error(response: dict[str, Any]) -> str | None:
    """The error an event carries (Triton's ``{"error": ...}``), if any."""
    for packet in response.get("packets") or ():
        if packet.get("name") != "data":
            continue
        try:
            event = json.loads(packet.get("value") or "")
        except ValueError:
            continue
        if isinstance(event, dict) and "error" in event:
            return str(event["error"])
    return None


def _record_error(record: dict[str, Any]) -> str | None:
    """Why one request failed (None: it did not): an HTTP error or a transport error, a
    request AIPerf cancelled (its timeout), or an error inside the stream."""
    error = record.get("error")
    if error:
        if not isinstance(error, dict):
            return str(error)
        message = str(error.get("message") or error.get("type") or error).strip()
        # A stream whose first event is an error is refused whole (its status is fixed by
        # that event: 400), the event as the body: its error said as the others are.
        if message.startswith("data:"):
            said = _event_error({"packets": [{"name": "data", "value": message[5:]}]})
            return said if said is not None else message
        return message
    if (record.get("metadata") or {}).get("was_cancelled"):
        return "cancelled by aiperf (its request timeout)"
    for response in record.get("responses") or ():
        why = _event_error(response)
        if why is not None:
            return why
    return None


def measured(concurrency: int, records: Iterable[dict[str, Any]]) -> LoadFigures:
    """The figures of the profiling phase's records (AIPerf's raw export, warm-up left out):
    per request, the seconds from its send to each of its events, or why it failed; the
    time they took is from the first send to the last event."""
    exchanges: list[tuple[float, ...]] = []
    errors: list[str] = []
    first: int | None = None
    last: int | None = None
    for record in records:
        if (record.get("metadata") or {}).get("benchmark_phase") != "profiling":
            continue
        start = int(record["start_perf_ns"])
        times = [int(r["perf_ns"]) for r in record.get("responses") or ()]
        first = start if first is None else min(first, start)
        end = max([start, *times])
        last = end if last is None else max(last, end)
        why = _record_error(record)
        if why is None:
            exchanges.append(tuple((t - start) / 1e9 for t in times))
        else:
            errors.append(why)
    elapsed = (last - first) / 1e9 if first is not None and last is not None else 0.0
    # Late: triton_load brings tritonclient's gRPC, which `gate --help` and every other
    # command would import with this module (issue 46).
    from reconciler.adapters.triton_load import figures

    return figures(concurrency, exchanges, errors, elapsed, streamed=True)


def raw_records(folder: Path) -> list[dict[str, Any]]:
    """AIPerf's raw records: its merged export, or where it left them unmerged (a run in
    which every request failed stops before merging them)."""
    merged = folder / "profile_export_raw.jsonl"
    files = [merged] if merged.is_file() else sorted((folder / "raw_records").glob("*.jsonl"))
    records = []
    for path in files:
        for line in path.read_text().splitlines():
            if line.strip():
                records.append(json.loads(line))
    return records


class AIPerf:
    """AIPerf over Triton's HTTP ``generate_stream`` against one server
    (``ports.LoadTester``), for streaming models only."""

    name = "aiperf"

    def __init__(
        self,
        binary: str,
        http_address: str,
        workdir: Path | None = None,
        timeout: float = 900.0,
        request_timeout: float = 30.0,
        workers: int = 1,
    ) -> None:
        self.binary = binary
        self.http_address = http_address
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="triton-gitops-aiperf-"))
        self.timeout = timeout
        self.request_timeout = request_timeout
        # One worker process drives every concurrent stream (asyncio): enough for the
        # gate's levels, and AIPerf's default (one per core) would load the machine that
        # runs the server.
        self.workers = workers

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
        if exchange is not Exchange.STREAM:
            raise StepFailed(
                f"aiperf drives streaming models only (Triton's generate_stream); {model} is "
                "not decoupled: the built-in generator or perf_analyzer measures it"
            )
        tokenizer = write_tokenizer(self.workdir / "tokenizer")
        data = self.workdir / f"{model}-{version}-inputs.json"
        data.write_text(json.dumps(inputs_file(requests, batched), sort_keys=True))
        run = self.workdir / f"{model}-{version}-c{concurrency}"
        shutil.rmtree(run, ignore_errors=True)
        url = (
            f"http://{self.http_address}/v2/models/{quote(model, safe='')}"
            f"/versions/{version}/generate_stream"
        )
        command = [
            self.binary, "profile",
            "--model", model,
            "--tokenizer", str(tokenizer),
            "--endpoint-type", "raw",
            "--url", url,
            "--streaming",
            "--input-file", str(data),
            "--custom-dataset-type", "inputs-json",
            "--dataset-sampling-strategy", "sequential",
            "--extra-inputs", json.dumps({"response_field": _RESPONSE_FIELD}),
            "--concurrency", str(concurrency),
            "--request-count", str(count),
            "--warmup-request-count", str(WARMUP_PER_WORKER * concurrency),
            "--request-timeout-seconds", f"{self.request_timeout:g}",
            "--random-seed", "0",
            "--export-level", "raw",
            "--artifact-dir", str(run),
            "--workers-max", str(self.workers),
            "--ui", "none",
            "--no-server-metrics",
            "--no-gpu-telemetry",
        ]  # fmt: skip
        # Not HF_HUB_OFFLINE: AIPerf 0.13 then looks a tokenizer path up in the Hugging Face
        # cache and refuses it; a local path is loaded without the network either way.
        # A session of its own: AIPerf runs its services as processes of their own, which
        # are ended with it, by its process group, when the gate is interrupted or gives up.
        try:
            process = subprocess.Popen(
                command,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as exc:
            raise StepFailed(f"aiperf {self.binary} could not run: {exc}") from None
        try:
            out, err = process.communicate(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            end_process_group(process, 10.0)
            raise StepFailed(
                f"aiperf on {model} version {version} did not finish within {self.timeout:g}s"
            ) from None
        except BaseException:
            end_process_group(process, 10.0)
            raise
        returncode = process.returncode
        said = f"{out.decode(errors='replace')}\n{err.decode(errors='replace')}"
        try:
            records = raw_records(run)
        except (OSError, ValueError) as exc:
            raise StepFailed(f"aiperf's records in {run}: {exc}") from None
        found = measured(concurrency, records)
        # Exit 1 with every request failed is a measurement (all failures); any other
        # failed run, or one with nothing measured, is an error of the measurement.
        if found.requests and (returncode == 0 or found.errors == found.requests):
            return found
        lines = [line.strip(" │╭╮╰╯─") for line in said.splitlines()]
        lines = [line for line in lines if line]
        why = next((line for line in lines if "rror" in line or "ail" in line), None)
        raise StepFailed(
            f"aiperf could not measure {model} version {version} at concurrency "
            f"{concurrency} (exit {returncode}): " + (why or (lines[-1] if lines else "no output"))
        )
