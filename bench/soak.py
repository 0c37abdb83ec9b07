"""Soak: many consecutive swaps by the running service, under client load, memory watched.

For the reliability issue ("Soak"). Per arm: two real tritonservers (``LocalTriton``, from the
nvidia-pytriton wheel, EXPLICIT mode) over one model repository, a bare Git remote
(``ManifestRepo``, file://) declaring echo on both, and ``python -m reconciler run`` as a
service (``bench.harness.service``: long ``--interval``, so only our ``POST /reconcile`` starts
passes). Client threads (``testkit.loadgen``) send unversioned requests to echo on every server
all along. Then ``--swaps`` consecutive swaps, each a commit and a ``POST /reconcile``, awaited
on the service's ``triton_gitops_passes_total``:

- a good swap alternates echo between versions 1 and 2, so each is a real load and unload;
- every ``--bad-every``-th swap goes to version 4, which fails 40% of its requests: the
  service's post-swap analysis (success rate, scraped from each server's metrics, a short
  window) must revert it. The next commit changes the spec, which releases the hold.

After each pass: both servers must settle on the expected version (new for good, old for bad),
the state store must record the rollouts (``converged`` / ``reverted``) and, for a bad swap,
a hold on its revision. Client outcomes are attributed by the time each request was sent: to
the swap whose window (trigger to settled) holds it, or to the gap between swaps. Failures
raised by version 4 itself ("version 4 failed request N") are its own and expected; any other
failure in a good swap's window is one the swap caused.

Memory, sampled after every swap from /proc: the service's VmRSS; each tritonserver's VmRSS
and that of its children (the Python backend's ``triton_python_backend_stub`` processes, one
per loaded model version). Least-squares slopes in KB per 100 swaps (all swaps, after the
warm-up, second half) and first/last/max.

Arms: Triton with glibc malloc (default), with ``LD_PRELOAD`` of tcmalloc, with ``LD_PRELOAD``
of jemalloc (Debian's libgoogle-perftools4 and libjemalloc2). An arm whose library is not
installed is skipped and reported "not installed". The preload is set in the tritonservers'
environment only (``LocalTriton.extra_env``); the backend stubs inherit it.

    python -m bench.soak [--swaps 200] [--bad-every 5] [--arms glibc,tcmalloc,jemalloc]

Every process started here (tritonservers and their stubs, the service) is stopped in
``finally``, by its process id.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sqlite3
import statistics
import sys
import sysconfig
import tempfile
import time
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from bench.harness.cli import markdown_main, write_json
from bench.harness.errors import BenchError
from bench.harness.procfs import children, rss_kb
from bench.harness.provenance import machine, other_tritonservers, provenance
from bench.harness.report import render
from bench.harness.service import measured_service
from bench.harness.stats import slope_per_100
from bench.harness.triton import Index, wait_for
from testkit.loadgen import LoadGenerator, Sample
from testkit.local_triton import LocalTriton
from testkit.manifests import ManifestRepo, deployment_doc, server_doc, write_model_repository
from testkit.service_process import Service

MODEL = "echo"
SERVERS = ("edge-a", "edge-b")
GOOD = (1, 2)
BAD = 4
OWN_FAILURE = "version 4 failed request"  # what version 4 raises; its own, expected failures
RESULTS = Path(__file__).parent / "results"
# (arm, file names in the order tried); glibc's malloc needs no preload.
ALLOCATORS: dict[str, tuple[str, ...]] = {
    "glibc": (),
    "tcmalloc": ("libtcmalloc.so.4", "libtcmalloc_minimal.so.4"),
    "jemalloc": ("libjemalloc.so.2", "libjemalloc.so.1"),
}


def library_dirs() -> list[Path]:
    multiarch = sysconfig.get_config_var("MULTIARCH") or "x86_64-linux-gnu"
    return [Path(p) for p in (f"/usr/lib/{multiarch}", "/usr/lib", "/usr/lib64", "/usr/local/lib")]


def find_allocator(arm: str) -> Path | None:
    """The shared library to preload for ``arm``; None when it is not installed."""
    for name in ALLOCATORS[arm]:
        for folder in library_dirs():
            if (folder / name).exists():
                return folder / name
    return None


def soak_doc(version: int, interval: str, duration: str) -> str:
    """echo on both servers, analysed after every swap on its success rate alone.

    ``noTraffic: pass``: going down (2 -> 1) the new version gets no unversioned traffic
    while the old, higher one is loaded beside it, so its window has no requests at all;
    version 4 is always the highest, so it gets all the traffic and cannot slip through.
    Latency and memory checks are left out: on this shared machine they would judge noise."""
    analysis = (
        "  verify:\n"
        "    analysis:\n"
        f"      interval: {interval}\n"
        f"      duration: {duration}\n"
        "      noTraffic: pass\n"
        "      checks:\n"
        "        - name: success-rate\n"
        "          successRate: {min: 0.95}\n"
    )
    return deployment_doc(MODEL, [version], list(SERVERS), extra=analysis)


# -- memory, as /proc sees it ------------------------------------------------------------------


def preloaded(pid: int, library: Path) -> bool:
    """Whether ``library`` is mapped into ``pid`` (the preload took)."""
    with contextlib.suppress(OSError):
        return library.name in Path(f"/proc/{pid}/maps").read_text()
    return False


def series_summary(swaps: Sequence[int], kb: Sequence[int], warmup: int) -> dict[str, Any]:
    """First/last/max in MB and least-squares slopes in KB per 100 swaps."""
    xs = [float(s) for s in swaps]
    ys = [float(v) for v in kb]
    warm = [i for i, s in enumerate(swaps) if s >= warmup]
    half = len(xs) // 2
    return {
        "first_mb": ys[0] / 1024,
        "last_mb": ys[-1] / 1024,
        "max_mb": max(ys) / 1024,
        "growth_mb": (ys[-1] - ys[0]) / 1024,
        "slope_kb_per_100_swaps": {
            "all": slope_per_100(xs, ys),
            f"from_swap_{warmup}": slope_per_100([xs[i] for i in warm], [ys[i] for i in warm]),
            "second_half": slope_per_100(xs[half:], ys[half:]),
        },
    }


# -- client outcomes, attributed to swaps --------------------------------------------------------


@dataclass
class Window:
    """What clients saw while one swap ran (from its trigger until both servers settled)."""

    requests: int = 0
    own_v4_failures: int = 0  # raised by version 4 itself: expected
    other_failures: int = 0
    versions: dict[int, int] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)

    def add(self, sample: Sample) -> None:
        self.requests += 1
        if sample.error is None:
            assert sample.version is not None
            self.versions[sample.version] = self.versions.get(sample.version, 0) + 1
        elif OWN_FAILURE in sample.error:
            self.own_v4_failures += 1
        else:
            self.other_failures += 1
            if len(self.examples) < 3:
                self.examples.append(sample.error[:300])


class Attribution:
    """Client samples, read as they come, counted per swap window or between swaps."""

    def __init__(self, loads: Sequence[LoadGenerator]) -> None:
        self.loads = loads
        self.read = [0] * len(loads)
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.windows: list[Window] = []
        self.between = Window()

    def open(self, started: float) -> None:
        self.starts.append(started)
        self.ends.append(float("inf"))
        self.windows.append(Window())

    def close(self, ended: float) -> None:
        self.ends[-1] = ended

    def collect(self) -> None:
        """Count every sample that has come in since the last call."""
        for i, load in enumerate(self.loads):
            new = load.samples[self.read[i] :]  # appended under the generator's lock only
            self.read[i] += len(new)
            for sample in new:
                at = bisect_right(self.starts, sample.started) - 1
                if at >= 0 and sample.started <= self.ends[at]:
                    self.windows[at].add(sample)
                else:
                    self.between.add(sample)


# -- one arm -----------------------------------------------------------------------------------


def state_record(state: Path, revision: str) -> dict[str, Any]:
    """The rollouts the service recorded for ``revision`` and the holds now in its store."""
    db = sqlite3.connect(f"file:{state}?mode=ro", uri=True, timeout=30)
    try:
        outcomes = {
            server: outcome
            for server, outcome in db.execute(
                "SELECT server, outcome FROM rollouts WHERE revision = ? AND model = ?",
                (revision, MODEL),
            )
        }
        holds = {name: rev for name, rev in db.execute("SELECT deployment, revision FROM holds")}
    finally:
        db.close()
    return {"outcomes": outcomes, "holds": holds}


def settled_on(indexes: Sequence[Index], version: int, timeout: float) -> str | None:
    """None when every server serves ``version`` alone within ``timeout``, with nothing
    LOADING or UNLOADING except version 4; else what the servers hold.

    Version 4 is let off: Triton 2.51 never finishes unloading a Python-backend version whose
    ``execute`` raised (it stays UNLOADING, its stub process alive; see "Rollback latency"
    in BENCHMARKS.md). The leftover stubs are counted in the memory samples instead."""

    def settled(index: Index) -> bool:
        return index.is_settled(MODEL, version, stuck_unloading=(BAD,)) is not None

    try:
        for index in indexes:
            wait_for(partial(settled, index), timeout, f"{MODEL} settles on {version}", 0.02)
    except BenchError:
        return "; ".join(str(index.states(MODEL)) for index in indexes)
    return None


def memory_sample(
    swap: int, service: Service, servers: Sequence[LocalTriton], started: float
) -> dict[str, Any]:
    triton, stubs, stub_counts = [], [], []
    for server in servers:
        assert server.process is not None
        pid = server.process.pid
        kids = children(pid)
        triton.append(rss_kb(pid))
        stubs.append(sum(rss_kb(k) for k in kids))
        stub_counts.append(len(kids))
    return {
        "swap": swap,
        "seconds": round(time.monotonic() - started, 2),
        "service_kb": rss_kb(service.pid),
        "triton_kb": triton,
        "stubs_kb": stubs,
        "stub_processes": stub_counts,
    }


def one_swap(
    service: Service,
    indexes: Sequence[Index],
    attribution: Attribution,
    number: int,
    current: int,
    target: int,
    bad: bool,
    sha: str,
) -> dict[str, Any]:
    """Swap ``number`` (committed at ``sha``): trigger the pass, wait until it is counted and
    the servers settle, and read what the service recorded of it."""
    before = service.pass_count()
    attribution.collect()
    t0 = time.monotonic()
    attribution.open(t0)
    status = service.reconcile_now()
    if status != 202:
        raise BenchError(f"POST /reconcile answered {status}")
    service.wait_passes(before, 300, f"swap {number}'s pass is counted")
    t1 = time.monotonic()
    expected = current if bad else target
    problem = settled_on(indexes, expected, 120)
    attribution.close(time.monotonic())
    record = state_record(service.workdir / "state.db", sha)
    outcomes = set(record["outcomes"].values())
    held = record["holds"].get(MODEL) == sha
    want = "reverted" if bad else "converged"
    return {
        "swap": number,
        "from": current,
        "to": target,
        "bad": bad,
        "revision": sha,
        "pass_s": round(t1 - t0, 3),
        "settled": problem is None,
        "unsettled": problem,
        "outcomes": record["outcomes"],
        "held": held,
        "holds": record["holds"],
        "as_expected": problem is None
        and outcomes == {want}
        and len(record["outcomes"]) == len(SERVERS)
        and held == bad,
    }


def run_arm(arm: str, library: Path | None, args: argparse.Namespace) -> dict[str, Any]:
    extra_env = {"LD_PRELOAD": str(library)} if library else {}
    print(f"arm {arm}: LD_PRELOAD={library or '(none)'}", file=sys.stderr)
    # The work folder (server and service logs) is removed only when the arm succeeds with
    # every swap as expected: a run whose swap 94 went otherwise kept no log to say why.
    root = Path(tempfile.mkdtemp(prefix=f"bench-soak-{arm}-"))
    repository = write_model_repository(root / "models")
    servers = [
        LocalTriton(repository, log_file=root / f"{name}.log", extra_env=extra_env)
        for name in SERVERS
    ]
    service: Service | None = None
    loads: list[LoadGenerator] = []
    indexes: list[Index] = []
    try:
        for server in servers:
            server.start()
        indexes = [Index(s.grpc_address, own_subchannel=True) for s in servers]
        server_version = indexes[0].server_version()
        mapped = [
            preloaded(s.process.pid, library) if library and s.process else None for s in servers
        ]
        if library and not all(mapped):
            raise BenchError(f"{library} is not mapped into every tritonserver")
        manifests = ManifestRepo(root / "git")
        manifests.write(
            "servers.yaml",
            "---\n".join(
                server_doc(name, s.grpc_address, repository, metrics=s.metrics_url)
                for name, s in zip(SERVERS, servers, strict=True)
            ),
        )
        doc = partial(soak_doc, interval=args.interval, duration=args.duration)
        manifests.write("echo.yaml", doc(GOOD[0]))
        manifests.commit(f"echo {GOOD[0]}")
        service = measured_service(manifests.url, root / "service", args.watch_interval).start()
        service.wait_passes(0, 300, "the first pass (deploys echo 1)")
        if problem := settled_on(indexes, GOOD[0], 120):
            raise BenchError(f"echo {GOOD[0]} not deployed on both servers: {problem}")

        loads = [
            LoadGenerator(s.grpc_address, MODEL, threads=args.threads).start() for s in servers
        ]
        for load in loads:
            load.wait_for_samples(50, timeout=60)
        attribution = Attribution(loads)
        started = time.monotonic()
        memory = [memory_sample(0, service, servers, started)]
        swaps: list[dict[str, Any]] = []
        current = GOOD[0]
        for number in range(1, args.swaps + 1):
            bad = args.bad_every > 0 and number % args.bad_every == 0
            target = BAD if bad else (GOOD[1] if current == GOOD[0] else GOOD[0])
            manifests.write("echo.yaml", doc(target))
            sha = manifests.commit(f"echo {target}")
            swaps.append(one_swap(service, indexes, attribution, number, current, target, bad, sha))
            memory.append(memory_sample(number, service, servers, started))
            if not bad:
                current = target
            last = swaps[-1]
            print(
                f"  [{arm}] swap {number:>3} {last['from']}->{target}"
                f"{' (bad)' if bad else '      '} pass {last['pass_s']:6.2f} s  "
                f"{'ok' if last['as_expected'] else 'NOT AS EXPECTED'}  service "
                f"{memory[-1]['service_kb'] / 1024:.1f} MB  triton "
                + " / ".join(f"{kb / 1024:.0f}" for kb in memory[-1]["triton_kb"])
                + " MB",
                file=sys.stderr,
            )
        time.sleep(1.0)  # the last requests come in
        attribution.collect()
        seconds = time.monotonic() - started
    except Exception as exc:
        exits = {
            name: s.process.poll() if s.process else None
            for name, s in zip(SERVERS, servers, strict=True)
        }
        tails = "\n".join(f"{s.log_file}:\n{s.log_tail(15)}" for s in servers)
        raise BenchError(
            f"arm {arm}: {type(exc).__name__}: {exc}\ntritonserver exit codes (None: "
            f"running): {exits}; logs kept in {root}\ntritonserver log tails:\n{tails}"
        ) from exc
    finally:
        for load in loads:
            load.stop()
        for index in indexes:
            index.close()
        if service is not None:
            service.stop()
        for server in servers:
            server.stop()
    if all(swap["as_expected"] for swap in swaps):
        shutil.rmtree(root, ignore_errors=True)
    else:
        print(f"  [{arm}] a swap went otherwise: logs kept in {root}", file=sys.stderr)
    for swap, window in zip(swaps, attribution.windows, strict=True):
        swap["client"] = {
            "requests": window.requests,
            "own_v4_failures": window.own_v4_failures,
            "other_failures": window.other_failures,
            "versions": {str(k): v for k, v in sorted(window.versions.items())},
            "failure_examples": window.examples,
        }
    return arm_summary(
        arm, library, mapped, server_version, swaps, memory, attribution, seconds, args
    )


def arm_summary(
    arm: str,
    library: Path | None,
    mapped: list[bool | None],
    server_version: str,
    swaps: list[dict[str, Any]],
    memory: list[dict[str, Any]],
    attribution: Attribution,
    seconds: float,
    args: argparse.Namespace,
) -> dict[str, Any]:
    good = [s for s in swaps if not s["bad"]]
    bad = [s for s in swaps if s["bad"]]
    xs = [m["swap"] for m in memory]
    warmup = min(args.warmup, max(0, len(swaps) // 2))
    per_server = {
        name: {
            "tritonserver": series_summary(xs, [m["triton_kb"][i] for m in memory], warmup),
            "backend_stubs": series_summary(xs, [m["stubs_kb"][i] for m in memory], warmup),
            "tritonserver_plus_stubs": series_summary(
                xs, [m["triton_kb"][i] + m["stubs_kb"][i] for m in memory], warmup
            ),
            "stub_processes_first_last": [
                memory[0]["stub_processes"][i],
                memory[-1]["stub_processes"][i],
            ],
        }
        for i, name in enumerate(SERVERS)
    }
    return {
        "arm": arm,
        "ld_preload": str(library) if library else None,
        "preload_mapped_in_tritonservers": mapped,
        "triton_server": server_version,
        "seconds": round(seconds, 1),
        "swaps": len(swaps),
        "good_swaps": len(good),
        "bad_swaps": len(bad),
        "good_as_expected": sum(s["as_expected"] for s in good),
        "bad_reverted_and_held": sum(s["as_expected"] for s in bad),
        "not_as_expected": [
            {k: s[k] for k in ("swap", "from", "to", "bad", "unsettled", "outcomes", "held")}
            for s in swaps
            if not s["as_expected"]
        ],
        "client": {
            "requests": sum(w.requests for w in attribution.windows) + attribution.between.requests,
            "failures_in_good_swaps": sum(s["client"]["other_failures"] for s in good),
            "good_swaps_with_failures": [s["swap"] for s in good if s["client"]["other_failures"]],
            "v4_own_failures_in_bad_swaps": sum(s["client"]["own_v4_failures"] for s in bad),
            "other_failures_in_bad_swaps": sum(s["client"]["other_failures"] for s in bad),
            "own_v4_failures_in_good_swaps": sum(s["client"]["own_v4_failures"] for s in good),
            "between_swaps": {
                "requests": attribution.between.requests,
                "failures": attribution.between.other_failures
                + attribution.between.own_v4_failures,
                "examples": attribution.between.examples,
            },
            "failure_examples": [e for s in swaps for e in s["client"]["failure_examples"]][:5],
        },
        "pass_s": {
            "good_median": statistics.median(s["pass_s"] for s in good) if good else None,
            "bad_median": statistics.median(s["pass_s"] for s in bad) if bad else None,
            "max": max(s["pass_s"] for s in swaps) if swaps else None,
        },
        "memory": {
            "warmup_swaps": warmup,
            "service": series_summary(xs, [m["service_kb"] for m in memory], warmup),
            "servers": per_server,
        },
        "samples": memory,
        "swap_records": swaps,
    }


# -- the run and the report ----------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, Any]:
    before = {"load_average": os.getloadavg(), "other_tritonservers": other_tritonservers()}
    code = provenance()
    arms: dict[str, Any] = {}
    server_version = "unknown"
    started = time.monotonic()
    for arm in args.arms:
        library = find_allocator(arm)
        if ALLOCATORS[arm] and library is None:
            arms[arm] = {"arm": arm, "skipped": "not installed", "looked_for": ALLOCATORS[arm]}
            print(f"arm {arm}: not installed (looked for {', '.join(ALLOCATORS[arm])})")
            continue
        arms[arm] = run_arm(arm, library, args)
        server_version = arms[arm]["triton_server"]
        # Written after every arm, so a run cut short keeps the arms it finished.
        write_json(args.output, result(args, arms, before, code, server_version, started))
    return result(args, arms, before, code, server_version, started)


def result(
    args: argparse.Namespace,
    arms: dict[str, Any],
    before: dict[str, Any],
    code: dict[str, Any],
    server_version: str,
    started: float,
) -> dict[str, Any]:
    return {
        "benchmark": "soak",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": "python -m bench.soak " + " ".join(sys.argv[1:]),
        "settings": {
            "swaps": args.swaps,
            "bad_every": args.bad_every,
            "arms": args.arms,
            "client_threads_per_server": args.threads,
            "analysis_interval": args.interval,
            "analysis_duration": args.duration,
            "watch_interval": args.watch_interval,
            "warmup_swaps": args.warmup,
        },
        "machine": machine(server_version)
        | {
            "before_run": before,
            "at_end": {
                "load_average": os.getloadavg(),
                "other_tritonservers": other_tritonservers(),
            },
        },
        "code": {"at_start": code, "at_end": provenance()},
        "run_seconds": round(time.monotonic() - started, 1),
        "arms": arms,
    }


def markdown(result: dict[str, Any]) -> str:
    return render("soak", result, json_dumps=json.dumps)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak",
        description="Consecutive good and bad swaps by the service on two real tritonservers "
        "under client load: failures per swap, reverts, and memory slopes per malloc.",
    )
    parser.add_argument("--swaps", type=int, default=200, help="swaps per arm (default 200)")
    parser.add_argument(
        "--bad-every", type=int, default=5, help="every k-th swap is version 4 (default 5; 0: none)"
    )
    parser.add_argument(
        "--arms",
        default="glibc,tcmalloc,jemalloc",
        help="comma-separated, of glibc, tcmalloc, jemalloc (default all three)",
    )
    parser.add_argument("--threads", type=int, default=2, help="client threads per server (2)")
    parser.add_argument("--interval", default="500ms", help="analysis interval (default 500ms)")
    parser.add_argument("--duration", default="1s", help="analysis duration (default 1s)")
    parser.add_argument(
        "--watch-interval", type=float, default=2.0, help="the service's (default 2)"
    )
    parser.add_argument(
        "--warmup", type=int, default=20, help="swaps left out of the second slope (default 20)"
    )
    parser.add_argument("--output", type=Path, default=RESULTS / "soak.json", help="JSON result")
    parser.add_argument(
        "--report", type=Path, metavar="JSON", help="print the section from a saved result"
    )
    args = parser.parse_args(argv)
    args.arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in args.arms if a not in ALLOCATORS]
    if unknown or not args.arms:
        parser.error(f"--arms: unknown {unknown}; choose from {', '.join(ALLOCATORS)}")
    if args.swaps < 1 or args.bad_every < 0 or args.threads < 1:
        parser.error("--swaps and --threads must be >= 1, --bad-every >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    return markdown_main(parse_args(argv), run, markdown)


if __name__ == "__main__":
    sys.exit(main())
