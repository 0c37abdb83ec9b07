"""``bench.streaming``'s pure pieces, without Triton: its manifests (parsed by the reconciler's
own loader), the client streams counted failed, cut, mixed and affected, the unload's wait
read from an apply's JSON report, and the summary's goals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.harness.streams import probes_sent, stream_figures, unload_wait
from bench.streaming import BADS, BLUE_GREEN, CANARY, GOALS, POOLS, deployment_doc, summarize
from reconciler.core.spec.desired import load_desired_state
from testkit.loadgen import Stream
from testkit.manifests import router_doc, server_doc


def _files(doc: str, servers: tuple[str, ...], arm: str | None = None) -> dict[str, bytes]:
    files = {
        "servers.yaml": "---\n".join(
            server_doc(name, f"localhost:{8001 + i}", Path("/models"))
            for i, name in enumerate(servers)
        ).encode(),
        "gen.yaml": doc.encode(),
    }
    if arm is not None:
        pools = {pool: [name] for pool, name in zip(POOLS[arm], servers, strict=True)}
        files["router.yaml"] = router_doc("http://127.0.0.1:9901", pools).encode()
    return files


@pytest.mark.parametrize("arm", [None, "canary", "blue-green"], ids=["in-place", "canary", "bg"])
@pytest.mark.parametrize("probes", [True, False], ids=["probes", "no-probes"])
def test_the_manifests_parse_and_ask_for_what_the_bench_says(arm: str | None, probes: bool) -> None:
    servers = ("a", "c") if arm else ("a",)
    traffic = {None: None, "canary": CANARY, "blue-green": BLUE_GREEN}[arm]
    doc = deployment_doc(2, servers, flip=True, probes=probes, traffic=traffic)
    deployment = load_desired_state(_files(doc, servers, arm)).deployments["gen"]
    assert deployment.versions == (2,)
    analysis = deployment.analysis
    assert analysis is not None and analysis.interval == 1.0 and analysis.failure_limit == 0
    assert analysis.probes.enabled is probes
    kinds = [c.kind for c in analysis.checks]
    assert kinds == (["successRate", "latency", "latency"] if probes else ["successRate"])
    assert (deployment.rollout.traffic is not None) == (traffic is not None)


def test_the_swap_manifest_has_no_analysis() -> None:
    doc = deployment_doc(1, ("a",), analysis=False, swap=True)
    assert "count: 20" in doc and "'5'" in doc and "'100'" in doc
    assert load_desired_state(_files(doc, ("a",))).deployments["gen"].analysis is None


def _stream(versions: str, tokens: int, error: str | None = None) -> Stream:
    return Stream(0.0, tuple(versions), tuple(range(tokens)), error)


def test_client_streams_are_counted_failed_cut_mixed_and_affected() -> None:
    streams = [
        _stream("1" * 20, 20),
        _stream("5" * 20, 20),  # whole, on the late version
        _stream("4" * 2, 2, "version 4 failed at token 2"),
        _stream("", 0, "version 3 fails every request"),
        _stream("7" * 20, 20, "no final flag within 30s"),
        _stream("1" * 10, 10),  # short: cut
        _stream("1" * 10 + "2" * 10, 20),  # mixed
    ]
    plain = stream_figures(streams, 20)
    assert (plain["streams"], plain["failed"], plain["cut"], plain["mixed"]) == (7, 2, 2, 1)
    assert "version N failed at token N" in plain["messages"]
    late = stream_figures(streams, 20, BADS[5])
    assert (late["on_bad"], late["affected"]) == (1, 5)  # the 4 failures and cuts, and 1 late
    failing = stream_figures(streams, 20, BADS[3])
    assert (failing["on_bad"], failing["affected"]) == (1, 4)


def test_the_unload_wait_and_the_probes_come_from_the_report() -> None:
    report: dict[str, Any] = {"result": {"changes": [{
        "server": "a",
        "steps": [{"action": "load", "ok": True},
                  {"action": "unload", "ok": True, "seconds": 4.3, "stream_wait_seconds": 4.21,
                   "error": None}],
        "analysis": {"evaluations": [
            {"probes": {"sent": 3}}, {"probes": None}, {"probes": {"sent": 4}}]},
    }]}}  # fmt: skip
    assert unload_wait(report) == [
        {"server": "a", "ok": True, "seconds": 4.3, "stream_wait_seconds": 4.21, "error": None}
    ]
    assert probes_sent(report) == 7
    assert unload_wait({"problems": []}) == [] and probes_sent({}) == 0


def _client(**counts: int) -> dict[str, Any]:
    return {"streams": 50, "failed": 0, "cut": 0, "mixed": 0, "on_bad": 0, "affected": 0} | counts


def test_the_summary_says_which_goals_were_missed() -> None:
    good = [
        {"arm": "canary", "index": i, "burner": i % 2 == 1, "old": 1, "new": 2,
         "false_revert": i == 3, "verdict": "a: reverted: slow" if i == 3 else None,
         "apply_seconds": 20.0 + i, "client": _client(),
         "burner_use": {"cores": 0.5} if i % 2 else None}
        for i in range(4)
    ]  # fmt: skip
    bad = [
        {"arm": "in-place", "version": 4, "caught": True, "caught_by": "verify",
         "client": _client(affected=3, on_bad=3)},
        {"arm": "envoy-probes-on", "version": 8, "caught": True, "caught_by": "evaluation 2",
         "client": _client(affected=1, on_bad=9)},
    ]  # fmt: skip
    swaps = [{"exit": 0, "client": _client(), "unload": [{"stream_wait_seconds": 2.5}]}]
    summary = summarize({"good": good, "bad": bad, "no_client": [], "swaps": swaps})
    assert summary["false_reverts"] == 1 and summary["good_rollouts"] == 4
    assert summary["arms"]["canary, burner on"]["verdicts"] == [
        "rollout 3 (1->2): a: reverted: slow"
    ]
    assert summary["arms"]["canary, burner on"]["burner_cores_min"] == 0.5
    assert summary["modes"]["in-place 4"]["met"] is True
    assert summary["modes"]["envoy-probes-on 8"]["met"] is False  # 1 affected, goal 0
    goals = list(summary["goals"].values())
    assert goals == [False, False, None, True]
    assert GOALS["envoy-probes-on"] == 0
