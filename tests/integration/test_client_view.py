"""A new version judged by what its clients see, on a real tritonserver (issue 13).

Clients keep calling the unversioned model while the reconciler rolls out a version that
fails in one of the ways a real model does: an error *response* on every request (Triton 2.51
counts those successes: only the probes see them), an exception on 40% of requests (Triton
counts those failures), a wrong answer, a slow answer. Each is caught and reverted, with the
manifest as a user writes it (no smoke case unless the mode needs an expected answer). A good
version passes with the probes in its report, a model that rejects the probes' synthesized
request is not blocked, and a client that stops at its first failure (like perf_analyzer) is
still counted: the counting starts at READY.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testkit.cli_run import Reconciler, cli
from testkit.loadgen import WITNESS_PAUSE, LoadGenerator
from testkit.local_triton import LocalTriton
from testkit.manifests import ManifestRepo, git, server_doc
from tests.integration.flows import ready_versions

SMOKE_X2 = """\
    smoke:
      - name: ones
        inputs: {INPUT0: {datatype: FP32, shape: [1, 4], data: [1, 1, 1, 1]}}
        expect: {OUTPUT0: {data: [2, 2, 2, 2]}}
"""


def deployment(
    versions: list[int], *, analysis: str = "", checks: str = "", smoke: str = ""
) -> str:
    """The issue's manifest: successRate 0.99, interval 1s, duration 5s."""
    return (
        "apiVersion: triton-gitops/v1alpha1\n"
        "kind: ModelDeployment\n"
        "metadata: {name: echo}\n"
        "spec:\n"
        "  servers: {names: [edge-a]}\n"
        f"  versions: [{', '.join(map(str, versions))}]\n"
        "  verify:\n" + smoke + "    analysis:\n"
        "      interval: 1s\n"
        "      duration: 5s\n" + analysis + "      checks:\n"
        "        - name: success-rate\n"
        "          successRate: {min: 0.99}\n" + checks
    )


@pytest.fixture
def setup(
    manifests: ManifestRepo, triton: LocalTriton, model_repository: Path, tmp_path: Path
) -> Reconciler:
    manifests.write(
        "servers.yaml",
        server_doc("edge-a", triton.grpc_address, model_repository, metrics=triton.metrics_url),
    )
    return Reconciler(manifests.url, tmp_path / "reconciler")


def first(setup: Reconciler, manifests: ManifestRepo, triton: LocalTriton, doc: str) -> None:
    manifests.write("echo.yaml", doc)
    manifests.commit("deploy echo")
    with LoadGenerator(triton.grpc_address, "echo", threads=2, pause=WITNESS_PAUSE):
        result = setup.apply()
    assert result.code == 0, result.out


def roll(
    setup: Reconciler, manifests: ManifestRepo, triton: LocalTriton, doc: str, *extra: str
) -> tuple[int, dict[str, object], LoadGenerator, str]:
    manifests.write("echo.yaml", doc)
    revision = manifests.commit("roll echo")
    with LoadGenerator(triton.grpc_address, "echo", threads=3, pause=WITNESS_PAUSE) as load:
        load.wait_for_samples(200)
        result = setup.apply("--output", "json", *extra)
    change = json.loads(result.out)["result"]["changes"][0]
    return result.code, change, load, revision


def failed_checks(change: dict[str, object]) -> list[str]:
    analysis = change["analysis"]
    assert isinstance(analysis, dict)
    last = analysis["evaluations"][-1]
    return [f"{c['check']}: {c['detail']}" for c in last["checks"] if c["verdict"] == "fail"]


def test_error_responses_triton_counts_as_successes_are_caught_and_reverted_in_git(
    setup: Reconciler, manifests: ManifestRepo, triton: LocalTriton
) -> None:
    """The issue's first scenario, as written: version 10 answers every request with an
    error response; no smoke case; --revert-mode commit."""
    first(setup, manifests, triton, deployment([1]))
    code, change, load, bad = roll(
        setup, manifests, triton, deployment([10]), "--revert-mode", "commit"
    )

    assert code == 1
    assert ready_versions(triton, "echo") == {1}
    assert change["outcome"] == "reverted"
    (why,) = failed_checks(change)
    assert why.startswith("success-rate: early abort: 3 probes in a row failed")
    assert "version 10 answers request" in why
    # The clients saw the errors; Triton's own counters called them successes.
    assert any("answers request" in (s.error or "") for s in load.failures)
    head = git(manifests.bare, "log", "-1", "--format=%B", "main")
    assert f"Reverted-revision: {bad}" in head
    assert "early abort" in head


@pytest.mark.parametrize(
    ("version", "doc", "caught_by"),
    [
        # An exception on 40% of requests: Triton counts these, and so do the probes.
        (4, deployment([4]), "success-rate: early abort"),
        # A wrong answer: the smoke case's expectation (verify, then the probes).
        (3, deployment([3], smoke=SMOKE_X2), "smoke ones on version 3"),
        # 25 ms late: the latency check against the old version.
        (
            5,
            deployment(
                [5], checks="        - name: latency\n          latency: {maxIncrease: 3.0}\n"
            ),
            "latency",
        ),
    ],
)
def test_each_failure_mode_is_caught_and_reverted(
    setup: Reconciler,
    manifests: ManifestRepo,
    triton: LocalTriton,
    version: int,
    doc: str,
    caught_by: str,
) -> None:
    smoke = SMOKE_X2.replace("[2, 2, 2, 2]", "[1, 1, 1, 1]") if version == 3 else ""
    first(setup, manifests, triton, deployment([1], smoke=smoke))
    if version == 3:
        # The expectation is the model's right answer (x2, as version 2 gives): deploy 2.
        code, change, _, _ = roll(setup, manifests, triton, deployment([2], smoke=SMOKE_X2))
        assert code == 0, change
    code, change, _, _ = roll(setup, manifests, triton, doc)

    assert code == 1
    assert change["outcome"] == "reverted"
    assert ready_versions(triton, "echo") == ({2} if version == 3 else {1})
    error = str(change["error"])
    reasons = failed_checks(change) if change.get("analysis") else []
    assert caught_by in error or any(r.startswith(caught_by) for r in reasons), (error, reasons)


def test_a_good_version_passes_with_its_probes_in_the_report(
    setup: Reconciler, manifests: ManifestRepo, triton: LocalTriton
) -> None:
    first(setup, manifests, triton, deployment([1]))
    code, change, load, _ = roll(setup, manifests, triton, deployment([2]))

    assert code == 0, change
    assert load.failures == []
    assert ready_versions(triton, "echo") == {2}
    analysis = change["analysis"]
    assert isinstance(analysis, dict) and analysis["verdict"] == "passed"
    evaluations = analysis["evaluations"]
    assert len(evaluations) == 5
    for evaluation in evaluations:
        probes = evaluation["probes"]
        assert probes["sent"] > 0 and probes["failed"] == 0
        (rate,) = [c for c in evaluation["checks"] if c["check"] == "success-rate"]
        assert "triton: 0 of " in rate["detail"] and "probes: 0 of " in rate["detail"]
    # Bounded: at most 20 rounds a second by default, over 5 s.
    assert sum(e["probes"]["sent"] + e["probes"]["old_sent"] for e in evaluations) <= 5 * 20 + 5


def test_a_model_that_rejects_the_synthesized_request_is_not_blocked(
    setup: Reconciler, manifests: ManifestRepo, triton: LocalTriton
) -> None:
    """Versions 12 and 13 answer an all-zero input with an error: the old one too, so the
    synthesized request is left out, and the good version 13 rolls out."""
    first(setup, manifests, triton, deployment([12]))
    code, change, load, _ = roll(setup, manifests, triton, deployment([13]))

    assert code == 0, change
    assert load.failures == []  # the clients send ones
    assert ready_versions(triton, "echo") == {13}
    analysis = change["analysis"]
    assert isinstance(analysis, dict)
    probes = analysis["evaluations"][-1]["probes"]
    assert probes["sent"] == 0 and probes["skipped"] == 1
    assert "version 12 fails the 1 synthesized or recorded request(s) too" in probes["note"]


def test_a_client_that_stops_at_its_first_failure_is_counted_from_ready(
    setup: Reconciler, manifests: ManifestRepo, triton: LocalTriton
) -> None:
    """The issue's second scenario without the probes: clients that stop at their first
    failed request (as perf_analyzer does) fail only in the first moments of version 4. They
    count because the counting starts at READY, not at the analysis's first reading."""
    no_probes = "      probes: {enabled: false}\n      noTraffic: pass\n      minEvidence: 0\n"
    first(setup, manifests, triton, deployment([1], analysis=no_probes))
    manifests.write("echo.yaml", deployment([4], analysis=no_probes))
    manifests.commit("echo 4")
    load = LoadGenerator(
        triton.grpc_address, "echo", threads=3, stop_at_first_failure=True, pause=WITNESS_PAUSE
    )
    with load:
        load.wait_for_samples(200)
        result = setup.apply("--output", "json")
    change = json.loads(result.out)["result"]["changes"][0]

    assert load.failures, "the clients never met version 4"
    assert result.code == 1, result.out
    assert change["outcome"] == "reverted"
    assert ready_versions(triton, "echo") == {1}
    assert any(r.startswith("success-rate: ") for r in failed_checks(change))


def test_probe_settings_are_validated(tmp_path: Path) -> None:
    (tmp_path / "servers.yaml").write_text(server_doc("edge-a", "127.0.0.1:8001", tmp_path))
    (tmp_path / "echo.yaml").write_text(
        deployment([1], analysis="      probes: {rate: 0, concurency: 2}\n")
    )
    result = cli("validate", str(tmp_path))
    assert result.code == 1
    assert "echo.yaml" in result.err and "probes" in result.err


def test_without_an_analysis_verify_catches_error_responses(
    setup: Reconciler, manifests: ManifestRepo, triton: LocalTriton
) -> None:
    """No smoke case and no analysis: verify still sends one synthesized request, which
    version 1 answers and version 10 fails."""
    plain = (
        "apiVersion: triton-gitops/v1alpha1\nkind: ModelDeployment\nmetadata: {name: echo}\n"
        "spec:\n  servers: {names: [edge-a]}\n  versions: [VERSION]\n"
    )
    first(setup, manifests, triton, plain.replace("VERSION", "1"))
    code, change, _, _ = roll(setup, manifests, triton, plain.replace("VERSION", "10"))

    assert code == 1
    assert change["outcome"] == "reverted"
    assert ready_versions(triton, "echo") == {1}
    assert "fails on version 10 3 times in a row" in str(change["error"])
    assert "version 10 answers request" in str(change["error"])
