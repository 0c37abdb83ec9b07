"""A sequence model rolled out through a real Envoy by the reconciler itself (issue 44, points
2, 3 and 5): the counter model (a running sum per sequence, times the version) on two real
tritonservers, pool ``stable`` = [a] and pool ``canary`` = [c], behind an Envoy that reads
its route by RDS from a file the reconciler keeps (``spec.sequenceAffinity``), and client
threads sending sequences of 2 to 40 requests continuously through it, each sending the
session headers of its START's answer back (``testkit.sequences.SequenceSessions``).

A version that breaks sequences midway (error responses, which Triton counts successes) is
caught by the probes' own sequences at no traffic, before any client meets it; a good one
goes through the canary's steps and the drain phase, each server's versions changing only
once its drain has seen the sequences in flight end; no client sequence breaks in either.
Version 1 again, aborted by the on-call at 50%, is switched back without waiting for the
sequences in flight on it: the report says what still reached it when they were cut.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as triton_grpc

from testkit.cli_run import Reconciler
from testkit.envoy import POOL_HEADER, LocalEnvoy
from testkit.local_triton import LocalTriton
from testkit.manifests import (
    SEQUENCE_MODEL,
    ManifestRepo,
    router_doc,
    sequence_deployment_doc,
    server_doc,
)
from testkit.on_call import AbortAt
from testkit.sequences import Sequence, SequenceLoad, broken_between, started_between
from tests.integration.flows import ready_versions
from tests.services import envoy_or_skip

pytestmark = pytest.mark.triton

HEADER = "x-sequence-id"  # the Router's spec.sequenceAffinity.header


@pytest.fixture
def envoy(triton: LocalTriton, triton_b: LocalTriton, tmp_path: Path) -> Iterator[LocalEnvoy]:
    envoy_or_skip()
    pools = {"stable": [triton.grpc_address], "canary": [triton_b.grpc_address]}
    with LocalEnvoy.of(tmp_path / "envoy", pools, {"stable": 10_000}, rds=True) as envoy:
        yield envoy


def _router(envoy: LocalEnvoy) -> str:
    pools = {"stable": ["a"], "canary": ["c"]}
    return router_doc(envoy.admin_url, pools, routes_file=envoy.routes_file, sequence_header=HEADER)


CANARY = (
    "{router: edge, strategy: canary, stablePool: stable, canaryPool: canary, steps: [10%, 50%]}"
)


def _counter(version: int, fail_later: str = "") -> str:
    return sequence_deployment_doc(version, CANARY, fail_later=fail_later)


def _broken(sequences: list[Sequence]) -> list[str]:
    return [f"{s.key} ({s.sent} of {s.length} sent): {s.broken}" for s in sequences if s.broken]


def _steps(report: dict[str, Any], server: str) -> list[dict[str, Any]]:
    (change,) = [c for c in report["result"]["changes"] if c["server"] == server]
    steps: list[dict[str, Any]] = change["steps"]
    return steps


def test_a_sequence_model_rolls_through_envoy_without_breaking_a_client_sequence(
    triton: LocalTriton,
    triton_b: LocalTriton,
    envoy: LocalEnvoy,
    manifests: ManifestRepo,
    model_repository: Path,
    tmp_path: Path,
) -> None:
    for name, server in (("a", triton), ("c", triton_b)):
        manifests.write(
            f"servers/{name}.yaml",
            server_doc(name, server.grpc_address, model_repository, metrics=server.metrics_url),
        )
    manifests.write("router.yaml", _router(envoy))
    manifests.write("counter.yaml", _counter(1))
    manifests.commit("counter 1 through the router, sequences kept on their server")
    reconciler = Reconciler(manifests.url, tmp_path / "reconciler")
    first = reconciler.apply()
    assert first.code == 0, first.explain()
    # The reconciler wrote the affinity into the route file Envoy reads.
    assert "stateful_session" in envoy.routes_file.read_text()

    load = SequenceLoad(envoy.address, threads=6, sessions=True, headers=(HEADER, POOL_HEADER))
    with load:
        time.sleep(1.0)
        # Version 2 that loses every sequence after its START: the probes' sequences fail
        # at their second request while the canary takes no client.
        manifests.write("counter.yaml", _counter(2, fail_later="2:1"))
        manifests.commit("counter 2, which loses its sequences")
        bad = reconciler.apply("--output", "json")
        bad_ended = time.monotonic()
        # Version 2 as it should be: through 10% and 50%, then every new sequence to the
        # canary while the stable pool drains, then the stable pool takes it too.
        manifests.write("counter.yaml", _counter(2))
        manifests.commit("counter 2")
        good = reconciler.apply("--output", "json")
        good_ended = time.monotonic()
        time.sleep(1.0)
        # Back to version 1 (good), aborted by the on-call at 50%: the switch back does not
        # wait for the sequences in flight on it (an abort judges the version), and says
        # what it cut.
        manifests.write("counter.yaml", _counter(1))
        manifests.commit("counter 1 again")
        with AbortAt(
            envoy.admin_url, tmp_path / "reconciler" / "state.db", SEQUENCE_MODEL
        ) as abort:
            aborted = reconciler.apply("--output", "json")
        time.sleep(1.0)
    sequences = load.snapshot()

    assert bad.code != 0, bad.explain()
    assert "request 2 of 3 of a sequence" in bad.out, bad.explain()
    assert good.code == 0, good.explain()
    kept = [s for s in sequences if s.started < good_ended]
    assert _broken(kept) == [], f"{len(_broken(kept))} of {len(kept)} broke"
    during_bad = list(started_between(sequences, 0.0, bad_ended))
    assert {s.scale for s in during_bad} == {1}, "a client met the version that failed"
    during_good = list(started_between(sequences, bad_ended, good_ended))
    assert {1, 2} <= {s.scale for s in during_good}, [s.scale for s in during_good][:20]
    assert len(sequences) >= 30, len(sequences)
    assert ready_versions(triton, SEQUENCE_MODEL) == {2}
    assert ready_versions(triton_b, SEQUENCE_MODEL) == {2}

    report = json.loads(good.out)
    # The route steps are told on the canary's server, which leads the rollout.
    routes = [s["reason"] for s in _steps(report, "c") if s["action"] == "route"]
    assert any("drain stable: every new sequence to canary" in r for r in routes), routes
    # The stable server changed only after its drain, which saw the sequences in flight end
    # (at least the config's 5 s of quiet: max_sequence_idle_microseconds).
    stable = [s["action"] for s in _steps(report, "a")]
    assert stable.index("drain") < stable.index("load"), stable
    drain = next(s for s in _steps(report, "a") if s["action"] == "drain")
    assert drain["ok"] and drain["seconds"] >= 5.0, drain
    # The canary's analyses were judged on the probes' sequences (and its clients), none
    # inconclusive for want of requests.
    analyses = [s for s in _steps(report, "c") if s["action"] == "analyze"]
    assert analyses and all(a["ok"] for a in analyses), analyses
    probes = [
        e["probes"] for a in analyses for e in a["analysis"]["evaluations"] if e.get("probes")
    ]
    assert probes and sum(p["sent"] for p in probes) > 0, probes
    with triton_grpc.InferenceServerClient(triton.grpc_address) as client:
        assert client.is_model_ready(SEQUENCE_MODEL, "2")

    # The abort: the switch back cut the sequences in flight on version 1 and counted what
    # still reached them; no client sequence broke before the abort was given.
    assert abort.given is not None and aborted.code != 0, (abort.answer, aborted.explain())
    early = [s for s in sequences if s.broken_at is not None and s.broken_at < abort.given]
    assert _broken(early) == [], _broken(early)
    (canary,) = [c for c in json.loads(aborted.out)["result"]["changes"] if c["server"] == "c"]
    # Version 2 left c before the canary took clients (1 beside 2 would take none): the
    # phases after it compared 1 with version 2 on a (TrafficPlan.old_probed_on), never with
    # the 2 just unloaded on c, which made this run's analysis inconclusive when Triton's
    # asynchronous unload had already gone through.
    actions = [s["action"] for s in canary["steps"]]
    assert "unload" in actions, actions
    after = [s for s in canary["steps"][actions.index("unload") :] if s["action"] == "analyze"]
    judged = [e["probes"] for a in after for e in a["analysis"]["evaluations"] if e.get("probes")]
    assert judged and all(p["old_failed"] == 0 for p in judged), after
    assert sum(p["sent"] for p in judged) > 0 and sum(p["old_sent"] for p in judged) > 0, after
    cut = [r["cut"] for r in canary["revert"] if r["action"] == "drain"]
    assert len(cut) == 1 and cut[0]["requests_per_second"] is not None, canary["revert"]
    broken = broken_between(sequences, abort.given, time.monotonic())
    assert cut[0]["requests_per_second"] > 0 or not broken, (cut, _broken(broken))
    assert "were cut:" in aborted.err, aborted.err[-3000:]
    assert ready_versions(triton, SEQUENCE_MODEL) == {2}
    assert ready_versions(triton_b, SEQUENCE_MODEL) == {2}
