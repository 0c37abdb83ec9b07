"""Does Envoy mirror an HTTP ``generate_stream`` request (server-sent events), body and all
(issue 43, point 1)? One real tritonserver serving the streaming test model ``gen``
(version 1, 5 tokens 5 ms apart), one real Envoy routing Triton's HTTP API to it with a
request mirror policy (runtime share ``mirror.triton.comparator_http``) to a mirror-only
HTTP/1.1 cluster: a counting server in this process (testkit/counting_http.py) that records
each copy's method, path, headers and body.

Each request carries its own prompt ``[n]`` (n unique), so a copy is matched to its request
by its body, and the client checks its own stream's tokens ((n + i) % 1000). Phases, one
after another, each ``--requests`` requests from ``--threads`` client threads:

- ``length``: share 100%, the body with Content-Length, the mirror answering in SSE;
- ``chunked``: share 100%, the body chunked (two chunks 10 ms apart), SSE answer;
- ``share25``: share 25%, Content-Length: the copies' share;
- ``plain``: share 100%, the mirror answering a plain 200 (a quarter of the requests);
- ``slow``: share 100%, the mirror answering 0.5 s late (a quarter): the clients' time;
- ``off``: share 0 (a quarter): no copy;
- ``down``: share 100%, the mirror server stopped (a quarter): the clients' streams.

Then, with a second Envoy (the first stopped), ``subset``: the HTTP route mirrors to a
cluster built as a pool's is (testkit.envoy._cluster: a gRPC and an HTTP endpoint told apart
by the subset load balancer, here two more counting servers): which endpoint the copies reach.

    python -m bench.sse_mirror [--requests 200] [--threads 2] [--output FILE.json]

The tritonserver, the first Envoy and its counting server are the SSE mirror bed
(testkit/sse_mirror.py), the one tests/integration/test_sse_mirror.py runs on. Every process
started here (one tritonserver, one Envoy at a time) is stopped on leaving its ``with``, by
its pid.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from itertools import count
from pathlib import Path
from typing import Any

from testkit.counting_http import Answer, CountingServer, Received
from testkit.envoy import LocalEnvoy, _cluster
from testkit.loadgen import SseRequest, sse_request
from testkit.local_triton import LocalTriton
from testkit.manifests import GENERATOR
from testkit.sse_mirror import MIRROR, expected_tokens, set_mirror_share, sse_mirror_bed


def send(address: str, prompts: list[int], threads: int, chunked: bool) -> list[SseRequest]:
    sent: list[SseRequest] = []
    lock = threading.Lock()
    queue = iter(prompts)

    def run() -> None:
        while True:
            with lock:
                prompt = next(queue, None)
            if prompt is None:
                return
            one = sse_request(address, GENERATOR, prompt, chunked)
            with lock:
                sent.append(one)

    workers = [threading.Thread(target=run) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
    return sent


def settle(servers: list[CountingServer], quiet: float = 0.5, limit: float = 10.0) -> None:
    """Wait until no copy has arrived for ``quiet`` seconds (copies are sent beside the
    requests, not before their answers)."""
    deadline = time.monotonic() + limit
    seen = -1
    while time.monotonic() < deadline:
        now = sum(len(s.received) for s in servers)
        if now == seen:
            return
        seen = now
        time.sleep(quiet)


def cluster_stats(envoy: LocalEnvoy, *clusters: str) -> dict[str, int]:
    """Every counter of ``clusters`` that is not 0 (upstream_rq_*, upstream_cx_*...)."""
    wanted = r"^cluster\.(" + "|".join(clusters) + r")\.(upstream_rq|upstream_cx|retry_or)"
    path = f"/stats?{urllib.parse.urlencode({'filter': wanted})}"
    with urllib.request.urlopen(f"{envoy.admin_url}{path}", timeout=5) as answer:
        lines = answer.read().decode().splitlines()
    pairs = (line.split(": ", 1) for line in lines if ": " in line)
    return {k: int(v) for k, v in pairs if v.strip().isdigit() and int(v)}


def judge(name: str, share: int, sent: list[SseRequest], copies: list[Received]) -> dict[str, Any]:
    """What one phase measured: copies per request, whole bodies, whole client streams."""
    by_prompt = {s.prompt: s for s in sent}
    matched, whole, foreign, duplicates = 0, 0, 0, 0
    seen: set[int] = set()
    for copy in copies:
        try:
            prompt = int(json.loads(copy.body)["PROMPT"][0])
        except (ValueError, KeyError, IndexError, TypeError):
            foreign += 1
            continue
        if prompt not in by_prompt:
            foreign += 1
            continue
        duplicates += prompt in seen
        seen.add(prompt)
        matched += 1
        whole += copy.body == by_prompt[prompt].body
    expected = [expected_tokens(s.prompt) for s in sent]
    streams_whole = sum(
        s.error is None and s.tokens == e for s, e in zip(sent, expected, strict=True)
    )
    seconds = sorted(s.seconds for s in sent)
    return {
        "phase": name,
        "share": share / 10_000,
        "sent": len(sent),
        "mirrored": len(copies),
        "matched": matched,
        "bodies_whole": whole,
        "foreign": foreign,
        "duplicates": duplicates,
        "client_streams_whole": streams_whole,
        "client_errors": [s.error for s in sent if s.error][:3],
        "client_p50_ms": round(statistics.median(seconds) * 1000, 1) if seconds else None,
        "client_max_ms": round(seconds[-1] * 1000, 1) if seconds else None,
        "copy_methods": sorted({c.method for c in copies}),
        "copy_paths": sorted({c.path for c in copies}),
        "copy_hosts": sorted({c.headers.get("host", "") for c in copies}),
        "copies_chunked": sum(c.chunked for c in copies),
        "copies_with_content_length": sum("content-length" in c.headers for c in copies),
        "copy_content_types": sorted({c.headers.get("content-type", "") for c in copies}),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    n, quarter = args.requests, max(args.requests // 4, 1)
    prompts = count(1)
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="sse-mirror-") as temp:
        root = Path(temp)
        with sse_mirror_bed(root) as bed:
            envoy, mirror = bed.envoy, bed.mirror
            phases: tuple[tuple[str, int, int, bool, Answer, float], ...] = (
                ("length", 10_000, n, False, "sse", 0.0),
                ("chunked", 10_000, n, True, "sse", 0.0),
                ("share25", 2_500, n, False, "sse", 0.0),
                ("plain", 10_000, quarter, False, "plain", 0.0),
                ("slow", 10_000, quarter, False, "sse", 0.5),
                ("off", 0, quarter, False, "sse", 0.0),
            )
            for name, share, many, chunked, answer, delay in phases:
                bed.share(share)
                mirror.answer, mirror.delay = answer, delay
                sent = send(envoy.http_address, [next(prompts) for _ in range(many)],
                            args.threads, chunked)  # fmt: skip
                settle([mirror], quiet=0.5 + delay)
                results.append(judge(name, share, sent, mirror.taken()))
                print(json.dumps(results[-1]), flush=True)
            # The mirror target gone (its port closed): the clients' streams, the copies' fate.
            mirror.stop()
            bed.share(10_000)
            sent = send(envoy.http_address, [next(prompts) for _ in range(quarter)],
                        args.threads, False)  # fmt: skip
            settle([mirror])
            results.append(judge("down", 10_000, sent, mirror.taken()))
            print(json.dumps(results[-1]), flush=True)
            stats = cluster_stats(envoy, MIRROR, "stable")
            print(json.dumps({"envoy_stats": stats}), flush=True)
            results.append({"envoy_stats": stats})
            envoy.stop()
            # A pool-shaped cluster (subset load balancer) as the HTTP route's mirror target,
            # behind a second Envoy in front of the same tritonserver.
            with (
                CountingServer() as grpc_side,
                CountingServer() as http_side,
                subset_envoy(root, bed.triton, grpc_side.address, http_side.address) as second,
            ):
                set_mirror_share(second, "mirror.triton.pool", 10_000)
                sent = send(second.http_address, [next(prompts) for _ in range(quarter)],
                            args.threads, False)  # fmt: skip
                settle([grpc_side, http_side])
                subset = {
                    "phase": "subset",
                    "sent": len(sent),
                    "client_streams_whole": sum(s.error is None for s in sent),
                    "copies_at_grpc_endpoint": len(grpc_side.taken()),
                    "copies_at_http_endpoint": len(http_side.taken()),
                    "stats": cluster_stats(second, "pool"),
                }
                print(json.dumps(subset), flush=True)
                results.append(subset)
    if args.output:
        args.output.write_text(json.dumps(results, indent=2) + "\n")
    return 0


class _SubsetEnvoy(LocalEnvoy):
    """The HTTP route mirroring to ``pool``, a cluster shaped as a pool's (subset LB)."""

    pool_grpc: str = ""
    pool_http: str = ""

    def config(self) -> dict[str, Any]:
        config = super().config()
        resources = config["static_resources"]
        resources["clusters"].append(_cluster("pool", [self.pool_grpc], [self.pool_http]))
        for listener in resources["listeners"]:
            if listener["name"] != "http":
                continue
            manager = listener["filter_chains"][0]["filters"][0]["typed_config"]
            for host in manager["route_config"]["virtual_hosts"]:
                for route in host["routes"]:
                    route["route"]["request_mirror_policies"] = [
                        {
                            "cluster": "pool",
                            "runtime_fraction": {
                                "default_value": {"numerator": 0, "denominator": "TEN_THOUSAND"},
                                "runtime_key": "mirror.triton.pool",
                            },
                        }
                    ]
        return config


def subset_envoy(root: Path, triton: LocalTriton, grpc: str, http: str) -> LocalEnvoy:
    envoy = LocalEnvoy.of(
        root / "envoy-subset",
        {"stable": [triton.grpc_address]},
        {"stable": 10_000},
        http={"stable": [triton.http_address]},
    )
    subset = _SubsetEnvoy(envoy.binary, envoy.workdir, pools=envoy.pools, weights=envoy.weights,
                          http_pools=envoy.http_pools)  # fmt: skip
    subset.pool_grpc, subset.pool_http = grpc, http
    return subset


if __name__ == "__main__":
    raise SystemExit(main())
