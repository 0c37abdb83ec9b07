"""``bench.false_verdicts``'s pure pieces, without Triton: its manifests (parsed by the
reconciler's own loader), the margins read from an apply's JSON report, the rule that caught
a rollout, the client counts, the summary and the Markdown section."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from bench.false_verdicts import (
    ARMS,
    BLAST_GOAL,
    bounds,
    burner_plan,
    caught_by,
    check_margins,
    client_figures,
    deployment_doc,
    evidence,
    good_counts,
    margin,
    markdown,
    phase,
    router_doc,
    summarize,
    verdict_text,
    write_section,
)
from reconciler.core.spec.desired import load_desired_state
from testkit.loadgen import Sample
from testkit.manifests import server_doc


def check(name: str, value: float | None, threshold: str, detail: str = "") -> dict[str, Any]:
    verdict = "pass" if value is None or (margin(value, threshold) or 0) >= 0 else "fail"
    return {
        "check": name,
        "verdict": verdict,
        "value": value,
        "threshold": threshold,
        "detail": detail,
    }


def report(*changes: dict[str, Any], problems: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    return {"problems": list(problems), "result": {"changes": list(changes)}}


def change(server: str, outcome: str, evaluations: list[dict[str, Any]], **extra: Any) -> dict:
    return {
        "server": server,
        "model": "echo",
        "outcome": outcome,
        "error": extra.get("error"),
        "steps": extra.get("steps", []),
        "revert": [],
        "analysis": {"verdict": "passed", "evaluations": evaluations} if evaluations else None,
    }


def evaluation(index: int, *checks: dict[str, Any], probes: int = 0, **extra: Any) -> dict:
    return {
        "index": index,
        "verdict": "pass",
        "checks": list(checks),
        "probes": {"sent": probes, "failed": 0},
        "counted": True,
        "aborted": extra.get("aborted", False),
    }


GOOD = report(
    change(
        "edge-a",
        "converged",
        [
            evaluation(
                0,
                check("success-rate", 1.0, ">= 0.99", "triton: 0 of 120 requests failed; "
                      "probes: 0 of 20 failed"),
                check("latency", 0.1, "increase <= 0.5", "mean 900us vs 820us before"),
                probes=20,
            ),
            evaluation(
                1,
                check("success-rate", 0.995, ">= 0.99", "triton: 1 of 200 requests failed; "
                      "probes: 0 of 20 failed"),
                check(
                    "latency",
                    0.3,
                    "increase <= 0.5",
                    "mean 2100us vs 820us before (+156%), not confirmed by the probes: new "
                    "and old probed at the same time differ by +30% (a busy machine, not the "
                    "version)",
                ),
                probes=20,
            ),
        ],
    )
)  # fmt: skip


def test_bounds_and_margins_are_positive_on_the_passing_side() -> None:
    assert bounds(">= 0.99") == [("min", 0.99)]
    assert bounds("increase <= 0.5") == [("max", 0.5)]
    assert bounds(">= 1 and <= 2") == [("min", 1.0), ("max", 2.0)]
    assert bounds("growth <= 5.36871e+08 bytes") == [("max", 5.36871e08)]
    assert bounds("promql") == []
    assert margin(0.995, ">= 0.99") == pytest.approx(0.005)
    assert margin(0.98, ">= 0.99") == pytest.approx(-0.01)
    assert margin(0.3, "increase <= 0.5") == pytest.approx(0.2)
    assert margin(-0.2, "increase <= 0.5") == pytest.approx(0.7)
    assert margin(1.5, ">= 1 and <= 2") == pytest.approx(0.5)
    assert margin(None, ">= 0.99") is None
    assert margin(3.0, "any value") is None


def test_the_closest_margin_of_each_check_over_the_evaluations() -> None:
    closest = check_margins(GOOD)
    rate, latency = closest["success-rate"], closest["latency"]
    assert rate["margin"] == pytest.approx(0.005) and rate["value"] == 0.995
    assert rate["evaluation"] == 1 and rate["server"] == "edge-a"
    assert latency["margin"] == pytest.approx(0.2) and latency["threshold"] == "increase <= 0.5"
    # The probes overruled one increase measured against the mean before the swap: +156%.
    assert latency["overruled"] == 1 and latency["raw_max"] == pytest.approx(1.56)
    assert rate["overruled"] == 0


def test_evidence_is_the_most_any_source_saw_the_least_over_the_changes() -> None:
    assert evidence(GOOD) == {"evidence": 320, "min": 10, "margin": 310}
    routed = report(
        change(
            "edge-c",
            "converged",
            [
                evaluation(0, check("success-rate", 1.0, ">= 0.99", "triton: 0 of 3 requests "
                           "failed; probes: 0 of 4 failed; router: 0 of 7 client requests "
                           "failed"), probes=4),
            ],
        ),
        change("edge-a", "converged", []),  # no analysis of its own
    )  # fmt: skip
    assert evidence(routed) == {"evidence": 7, "min": 10, "margin": -3}
    assert evidence(report(change("edge-a", "converged", []))) is None


def test_verdicts_and_what_caught_a_rollout() -> None:
    assert caught_by(GOOD) == "not caught"
    assert verdict_text(GOOD) == ""
    aborted = report(
        change(
            "edge-a",
            "reverted",
            [
                evaluation(
                    0,
                    check("success-rate", 0.0, ">= 0.99", "early abort: 3 probes in a row "
                          "failed, last: version 90 raises"),
                    aborted=True,
                )
            ],
            error="server edge-a: analysis of echo version(s) 90 failed after 1 evaluation(s)",
            steps=[{"action": "load", "ok": True}, {"action": "analyze", "ok": False}],
        )
    )  # fmt: skip
    assert caught_by(aborted) == "early abort: probes in a row"
    assert verdict_text(aborted).startswith("edge-a: reverted: server edge-a: analysis of echo")
    smoke = report(
        change(
            "edge-a",
            "reverted",
            [],
            error="smoke case times-2 failed",
            steps=[{"action": "verify", "ok": False, "error": "smoke case times-2: OUTPUT0"}],
        )
    )
    assert caught_by(smoke) == "verify: smoke case"
    latency = report(
        change(
            "edge-a",
            "reverted",
            [evaluation(0, check("latency", 2.1, "increase <= 0.5", "mean 3ms vs 1ms before"))],
            steps=[{"action": "analyze", "ok": False}],
        )
    )
    assert caught_by(latency) == "evaluation 1: latency"
    refused = report(
        problems=({"server": "edge-a", "model": "echo", "message": "version 2 changes the "
                   "model's interface ...; refused before anything is loaded"},),
    )  # fmt: skip
    assert caught_by(refused) == "refused before any load (interface change)"
    assert verdict_text(refused).startswith("problem: version 2 changes the model's interface")


def test_a_traffic_rollout_names_the_failing_server_and_the_phase_it_failed_under() -> None:
    error = "server edge-c: analysis of echo version(s) 2 failed: latency=1.07 (increase <= 0.5)"
    stopped = {
        "server": "edge-a",
        "model": "echo",
        "outcome": "skipped",
        "error": f"rollout of echo stopped (edge-c): {error}",
        "steps": [],
        "analysis": None,
    }
    failing = change(
        "edge-c",
        "reverted",
        [evaluation(0, check("latency", 1.07, "increase <= 0.5", "mean 1431us vs 690us"))],
        error=error,
        steps=[
            {"action": "load", "ok": True},
            {"action": "route", "ok": True, "reason": "router edge: canary at no traffic"},
            {"action": "analyze", "ok": False},
        ],
    )
    routed = report(stopped, failing)
    assert caught_by(routed) == "evaluation 1: latency"
    assert phase(routed) == "router edge: canary at no traffic"
    assert verdict_text(routed) == f"edge-c: reverted: {error} | skipped: edge-a"
    assert phase(GOOD) is None


def test_client_counts_in_a_window() -> None:
    samples = [
        Sample(0.5, 0.001, 1),
        Sample(1.0, 0.001, None, "version 90 raises on every request (17)"),
        Sample(1.1, 0.001, 3),
        Sample(1.2, 0.004, 5),
        Sample(3.0, 0.001, None, "late"),
    ]
    errors = client_figures(samples, 1.0, 2.0, "error", 90)
    assert errors["requests"] == 3 and errors["failed"] == 1 and errors["affected"] == 0
    assert errors["messages"] == ["version N raises on every request (N)"]
    assert client_figures(samples, 1.0, 2.0, "wrong", 3)["failed"] == 2  # an error, a x3
    slow = client_figures(samples, 1.0, 2.0, "slow", 5)
    assert slow["failed"] == 1 and slow["affected"] == 1


def test_rollouts_are_spread_by_weight_half_of_them_burning() -> None:
    counts = good_counts(52, ARMS)
    assert sum(counts.values()) >= 50 and all(n % 2 == 0 and n >= 2 for n in counts.values())
    assert counts["single"] > counts["staged"]
    assert good_counts(2, ARMS) == {a.name: 2 for a in ARMS}
    flags = burner_plan(10, random.Random(1))
    assert sorted(flags) == [False] * 5 + [True] * 5
    assert burner_plan(3, random.Random(1)).count(True) == 1
    assert flags == burner_plan(10, random.Random(1))  # the seed decides


@pytest.mark.parametrize("arm", ARMS, ids=[a.name for a in ARMS])
def test_the_manifests_parse_and_ask_for_what_each_arm_says(arm: Any) -> None:
    files = {
        "servers.yaml": "---\n".join(
            server_doc(name, f"localhost:{8001 + i}", Path("/models"))
            for i, name in enumerate(("edge-a", "edge-b", "edge-c"))
        ).encode(),
        f"{arm.model}.yaml": deployment_doc(arm, [2], True, slow_ms=1.5, smoke_factor=2).encode(),
    }
    if arm.pools:
        files["router.yaml"] = router_doc("http://127.0.0.1:9901", arm.pools).encode()
    deployment = load_desired_state(files).deployments[arm.model]
    assert deployment.versions == (2,)
    analysis = deployment.analysis
    assert analysis is not None and analysis.interval == 1.0 and analysis.min_evidence == 10
    assert [c.kind for c in analysis.checks] == ["successRate", "latency"]
    assert analysis.failure_limit == 0 and analysis.probes.enabled
    assert (deployment.rollout.traffic is not None) == (arm.traffic is not None)
    assert len(deployment.smoke) == 1
    if arm.traffic is None:  # a traffic rollout needs its analysis: always deployed with it
        plain = load_desired_state(
            files | {f"{arm.model}.yaml": deployment_doc(arm, [1], True, analysis=False).encode()}
        ).deployments[arm.model]
        assert plain.analysis is None


def good_record(arm: str, index: int, burner: bool, false: bool) -> dict[str, Any]:
    return {
        "arm": arm,
        "index": index,
        "burner": burner,
        "old": 1,
        "new": 2,
        "false_revert": false,
        "verdict": "edge-a: reverted: latency=0.7 (increase <= 0.5): fail" if false else None,
        "phase": "router edge: canary 10%" if false else None,
        "apply_seconds": 6.0 + index,
        "client": {"failed": 0},
        "checks": check_margins(GOOD),
        "evidence": evidence(GOOD),
        "burner_use": {"cores": 1.8} if burner else None,
    }


def test_the_summary_and_the_section() -> None:
    good = [
        good_record("single", 0, False, False),
        good_record("single", 1, True, True),
        good_record("canary", 0, True, False),
    ]
    bad = [
        {
            "mode": "raises",
            "index": 0,
            "burner": b,
            "caught": True,
            "caught_by": "early abort: probes in a row",
            "client": {"failed": f, "affected": 0},
        }
        for b, f in ((False, 12), (True, BLAST_GOAL + 1))
    ]
    summary = summarize(good, bad)
    assert summary["good_rollouts"] == 3 and summary["false_reverts"] == 1
    on = summary["arms"]["single"]["on"]
    assert on["false_reverts"] == 1 and on["verdicts"][0]["rollout"] == "1->2"
    assert on["closest"]["success-rate"]["margin"] == pytest.approx(0.005)
    assert on["closest"]["evidence"]["value"] == 320 and on["burner_cores_min"] == 1.8
    assert summary["modes"]["raises"]["off"]["within_goal"] is True
    assert summary["modes"]["raises"]["on"]["within_goal"] is False
    assert summary["bad_caught"] == 2
    result = {
        "command": "python -m bench.false_verdicts --quick",
        "machine": {
            "nproc": 2,
            "cpu_model": "test CPU",
            "ram_gib": 8,
            "python": "3.11",
            "triton_server": "2.51.0",
            "nvidia_pytriton": "0.7.0",
            "tritonclient": "2.73.0",
            "load_average_at_start": [1.0, 1.0, 1.0],
            "load_average_at_end": [2.0, 2.0, 2.0],
            "other_tritonservers_at_start": 0,
            "wall_minutes": 3.5,
        },
        "code": {"commit": "abcdef0123", "uncommitted_reconciler_files": []},
        "settings": {
            "interval_s": 1.0,
            "duration_s": 3.0,
            "min_evidence": 10,
            "min_success": 0.99,
            "latency_max_increase": 0.5,
            "seed": 26,
        },
        "calibration": {"burner off": {"slow_ms": 2.4}},
        "summary": summary,
    }
    text = markdown(result)
    assert "**Good rollouts: 3, false reverts: 1.**" in text
    assert "| `single` | on | 1 | **1** | 0.9950 (>= 0.99; margin 0.0050) |" in text
    assert (
        '- `single` burner on, rollout 1 (1->2), under "router edge: canary 10%": edge-a: '
        "reverted: latency=0.7" in text
    )
    assert "**Bad versions: 2 of 2 caught**" in text and "**missed**" in text
    assert "`slow_ms`: burner off 2.4" in text
    assert "gate" in text  # says the gate's runs are not part of it
    assert "| `canary` | on | 1 | 0 |" in text


def test_the_section_is_written(tmp_path: Path) -> None:
    summary = summarize([good_record("single", 0, False, False)], [])
    result = {
        "command": "python -m bench.false_verdicts",
        "machine": {
            "nproc": 2,
            "cpu_model": "c",
            "ram_gib": 1,
            "python": "3.11",
            "triton_server": "2.51.0",
            "nvidia_pytriton": "0.7.0",
            "tritonclient": "2.73.0",
            "load_average_at_start": [0.0] * 3,
            "load_average_at_end": [0.0] * 3,
            "other_tritonservers_at_start": 0,
            "wall_minutes": 1.0,
        },
        "code": {"commit": "abcdef0", "uncommitted_reconciler_files": ["reconciler/x.py"]},
        "settings": {
            "interval_s": 1.0,
            "duration_s": 4.0,
            "min_evidence": 10,
            "min_success": 0.99,
            "latency_max_increase": 0.5,
            "seed": 1,
        },
        "summary": summary,
    }
    path = tmp_path / "out" / "false_verdicts.md"
    write_section(result, path)
    assert path.read_text() == markdown(result)
    assert "plus uncommitted reconciler/x.py" in path.read_text()
