"""``gate``: the pre-merge quality gate, each changed ModelDeployment load-tested old beside
new on an isolated tritonserver of its own (``loop.gate``), its reports written and printed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from reconciler.cli.options import default_cache, git_credentials, two_refs
from reconciler.cli.shell import (
    EXIT_ERROR,
    EXIT_GATE_FAILED,
    EXIT_GATE_INCONCLUSIVE,
    EXIT_OK,
    Command,
    Commands,
    failed,
    print_as,
    problems_at,
)
from reconciler.model.errors import ReconcileError, ValidationError
from reconciler.model.gate import GateReport, GateVerdict, ModelGate
from reconciler.model.repository import parse_repository

if TYPE_CHECKING:
    from reconciler.loop.gate import GateTarget


def _declare_gate(commands: Commands) -> None:
    from reconciler.adapters.aiperf import AIPERF_VARIABLE

    gate = commands.add_parser(
        "gate",
        help="pre-merge quality gate: new versions load-tested beside the old in an isolated "
        "tritonserver; exit 0 pass, 3 failed, 4 inconclusive, 1 error",
        description="For every ModelDeployment whose versions or config change between --base "
        "and --head: start a tritonserver of its own on loopback over --model-repository, bring "
        "the base spec up as apply would, load the head's new versions beside the old with the "
        "config the reconciler would send (the apply-time interface rules refuse a config that "
        "changes what clients see), run the verify step (smoke cases, shadow replay, a "
        "synthesized request), load-test old and new interleaved with the same requests at "
        "spec.verify.gate's concurrency levels, and judge latency, throughput, errors and "
        "memory against its bounds. Exit 0 every deployment passed (or none changed), 3 one "
        "failed the gate, 4 none failed but one was inconclusive (its rounds too noisy to "
        "judge), 1 error (one could not be judged).",
    )
    two_refs(gate)
    gate.add_argument(
        "--model-repository",
        required=True,
        metavar="PATH|URL",
        help="a Triton model repository holding the old and the new version folders: a "
        "folder, or a bucket in Triton's spelling (s3://, s3://http://HOST:PORT/..., gs://, "
        "as://), which the isolated tritonserver reads directly with the credentials in the "
        "environment",
    )
    gate.add_argument(
        "--base-model-repository",
        metavar="PATH|URL",
        help="the model repository as it is at --base, for the config.pbtxt the old versions "
        "run with; default: read from --repo at --base when --model-repository is in its "
        "checkout",
    )
    gate.add_argument(
        "--output", choices=("text", "json", "markdown", "github"), default="text",
        help="github: GitHub Actions annotations on the manifest lines that failed",
    )  # fmt: skip
    gate.add_argument(
        "--report-dir",
        type=Path,
        metavar="DIR",
        help="also write gate.md, gate.json and one latency chart (SVG) per version there",
    )
    gate.add_argument(
        "--load-generator",
        choices=("auto", "built-in", "perf_analyzer", "aiperf"),
        default="auto",
        help="auto: a streaming (decoupled) model by AIPerf when --aiperf or "
        f"${AIPERF_VARIABLE} names it, else as the others; the others by perf_analyzer when "
        "it is found (--perf-analyzer or on PATH), else the built-in gRPC generator. "
        "built-in, perf_analyzer: that one for every model (AIPerf not used). aiperf: "
        "streaming models by AIPerf (also looked for on PATH), the others as auto",
    )
    gate.add_argument(
        "--perf-analyzer", metavar="PATH", help="perf_analyzer binary (default: on PATH)"
    )
    gate.add_argument(
        "--aiperf",
        metavar="PATH",
        help="AIPerf 0.13 binary: streaming models only, "
        "driven over the isolated tritonserver's HTTP generate_stream; when given it measures "
        "them, whatever else is found (see --load-generator)",
    )
    gate.add_argument(
        "--tritonserver",
        type=Path,
        metavar="PATH",
        help="tritonserver binary (backends in ../backends, as in Triton's image); default: "
        "the nvidia-pytriton wheel's (pip install 'triton-gitops[local]')",
    )
    gate.add_argument(
        "--deployment", action="append", metavar="NAME", help="only these (repeatable)"
    )
    gate.add_argument("--cache-dir", type=Path, default=default_cache())


def _load_generator(args: argparse.Namespace) -> str | None:
    """The perf_analyzer binary to use, or None for the built-in generator."""
    from reconciler.adapters.perf_analyzer import find_perf_analyzer

    if args.load_generator == "built-in":
        return None
    found = find_perf_analyzer(args.perf_analyzer)
    if found is None and (args.load_generator == "perf_analyzer" or args.perf_analyzer):
        raise ReconcileError(
            f"perf_analyzer {args.perf_analyzer or '(on PATH)'} not found; "
            "--load-generator built-in uses the gate's own"
        )
    return found


def _stream_generator(args: argparse.Namespace) -> str | None:
    """The AIPerf binary that measures streaming models, or None (the other generator
    measures them too). Used only when asked for: --aiperf (or $TRITON_GITOPS_AIPERF, as
    any option), or --load-generator aiperf, which also looks for it on PATH."""
    from reconciler.adapters.aiperf import AIPERF_VARIABLE, find_aiperf

    if args.load_generator in ("built-in", "perf_analyzer"):
        return None
    if not args.aiperf and args.load_generator != "aiperf":
        return None
    found = find_aiperf(args.aiperf)
    if found is None:
        raise ReconcileError(
            f"aiperf {args.aiperf or '(on PATH)'} not found; without --aiperf (and "
            f"${AIPERF_VARIABLE}) streaming models are measured as the others"
        )
    return found


def _gate(args: argparse.Namespace) -> int:
    from reconciler import wiring  # late: see cli/__init__.py
    from reconciler.loop.gate import gated
    from reconciler.loop.review import desired_at
    from reconciler.views.gate import gate_annotations, gate_json, gate_markdown, gate_text

    try:
        location = parse_repository(args.model_repository)
    except ValueError as exc:
        return failed(f"--model-repository {exc}")
    if not location.remote and not Path(args.model_repository).is_dir():
        return failed(f"model repository {args.model_repository} is not a folder")
    try:
        perf_analyzer = _load_generator(args)
        aiperf = _stream_generator(args)
        manifests = wiring.review_manifests(args.repo, args.cache_dir, git_credentials(args))
        base_sha, base = desired_at(manifests, args.base, args.path)
        # Read before the head: a CI checkout read in place keeps the last commit read only.
        configs = wiring.base_configs(
            manifests,
            args.repo,
            base_sha,
            args.model_repository,
            sorted({d.model for d in base.deployments.values()}),
            args.base_model_repository,
        )
        head_sha, head = desired_at(manifests, args.head, args.path)
    except ValidationError as exc:
        return problems_at(exc)
    targets = [
        replace(t, base_config=configs.get(t.base.model) if t.base is not None else None)
        for t in gated(base, head)
        if not args.deployment or t.head.name in args.deployment or t.head.model in args.deployment
    ]
    for target in targets:
        if target.base is not None and target.base_config is None:
            print(
                f"gate: {target.head.name}: warning: the base ref's config.pbtxt is not known "
                "(--model-repository is not in --repo's checkout; --base-model-repository "
                "gives it): the old versions run with the model repository's, so a change of "
                "its inputs or outputs goes unseen",
                file=sys.stderr,
            )
    workdir = Path(tempfile.mkdtemp(prefix="triton-gitops-gate-"))
    received: list[int] = []
    with _signals_interrupt(received):
        try:
            gates, errors = _gate_each(args, targets, workdir, perf_analyzer, aiperf)
        except KeyboardInterrupt:
            shutil.rmtree(workdir, ignore_errors=True)
            number = received[0] if received else signal.SIGINT
            print(
                f"gate: interrupted by {signal.Signals(number).name}: its tritonserver ended, "
                f"{workdir} removed",
                file=sys.stderr,
            )
            return 128 + number
    report = GateReport(base_sha, head_sha, tuple(gates))
    charts: list[str] = []
    if args.report_dir is not None:
        charts = write_gate_reports(report, args.report_dir)
    print_as(
        args.output,
        {
            "json": lambda: json.dumps(gate_json(report), indent=2, allow_nan=False),
            # both end in a newline of their own
            "markdown": lambda: gate_markdown(report, charts).removesuffix("\n"),
            "github": lambda: gate_annotations(report) or None,
            "text": lambda: gate_text(report).removesuffix("\n"),
        },
    )
    if errors:
        return EXIT_ERROR  # the servers' logs stay in the work folder the errors name
    shutil.rmtree(workdir, ignore_errors=True)
    return {
        GateVerdict.FAIL: EXIT_GATE_FAILED,
        GateVerdict.INCONCLUSIVE: EXIT_GATE_INCONCLUSIVE,
    }.get(report.verdict, EXIT_OK)


@contextmanager
def _signals_interrupt(received: list[int]) -> Iterator[None]:
    """SIGTERM (a cancelled CI job, a supervisor) ends the gate as Ctrl-C does: its server
    killed by its pid with its process group (its stubs), its shared memory and its temp
    folder removed. A signal's default action would leave them all behind. A SIGINT the
    gate was started ignoring (a background job) stays ignored. ``received``: the signals
    that came; the handlers are put back at the end of the block."""

    def interrupted(signum: int, frame: object) -> None:
        received.append(signum)
        for taken in handlers:  # a second signal must not cut the cleanup short
            signal.signal(taken, signal.SIG_IGN)
        raise KeyboardInterrupt

    handlers = {
        taken: signal.getsignal(taken)
        for taken in (signal.SIGTERM, signal.SIGINT)
        if signal.getsignal(taken) is not signal.SIG_IGN
    }
    for taken in handlers:
        signal.signal(taken, interrupted)
    try:
        yield
    finally:
        for taken, handler in handlers.items():
            signal.signal(taken, handler)


def _gate_each(
    args: argparse.Namespace,
    targets: list[GateTarget],
    workdir: Path,
    perf_analyzer: str | None,
    aiperf: str | None,
) -> tuple[list[ModelGate], int]:
    """Each target judged on a tritonserver of its own (its log under ``workdir``): the
    verdicts, and how many could not be judged."""
    from reconciler import wiring  # late: see cli/__init__.py
    from reconciler.adapters.local_triton import LocalTritonError
    from reconciler.loop.gate import run_gate

    gates: list[ModelGate] = []
    errors = 0
    for target in targets:
        print(f"gate: {target.head.name}: starting an isolated tritonserver", file=sys.stderr)
        try:
            with wiring.isolated_server(
                args.model_repository,
                workdir / target.head.name,
                tritonserver=args.tritonserver,
                perf_analyzer=perf_analyzer,
                aiperf=aiperf,
            ) as server:
                judged = run_gate(target, server)
        except (ReconcileError, LocalTritonError) as exc:
            errors += 1
            print(f"error: gate: {exc} (server log: {workdir / target.head.name})", file=sys.stderr)
            continue
        for one in judged:
            print(f"gate: {one.deployment}: {one.verdict} ({one.seconds:.1f} s)", file=sys.stderr)
        gates += judged
    return gates, errors


def write_gate_reports(report: GateReport, folder: Path) -> list[str]:
    """gate.md, gate.json and the charts (their file names) in ``folder``."""
    from reconciler.adapters.chart import ChartUnavailable, latency_chart
    from reconciler.views.gate import gate_json, gate_markdown

    folder.mkdir(parents=True, exist_ok=True)
    charts = []
    for one in report.models:
        if one.new_figures and any(f.quantiles for f in one.new_figures):
            name = f"{one.deployment}-v{one.new_version}-latency.svg"
            try:
                (folder / name).write_text(latency_chart(one))
            except ChartUnavailable as exc:
                print(f"gate: no chart: {exc}", file=sys.stderr)
                break
            charts.append(name)
    (folder / "gate.json").write_text(
        json.dumps(gate_json(report), indent=2, allow_nan=False) + "\n"
    )
    (folder / "gate.md").write_text(gate_markdown(report, charts))
    return charts


COMMANDS = {"gate": Command(_declare_gate, _gate)}
