"""Traffic through a router (issue 14): the failed client requests of a bad rollout with a 1%
first canary step, against the same bad version rolled out without a router in the same run,
and the blue-green switch and switch-back as clients see them.

Three real tritonservers (``a``, ``b``, ``c``) serve ``echo`` (OUTPUT0 = INPUT0 * version) at
version 1. Two real Envoys front them: ``routed`` with pools ``stable`` [a, b] and ``canary``
[c] (the reconciler's Router), and ``plain``, one cluster over all three (a load balancer the
reconciler does not know: the "no router" arm, today's rollout of every server at once).
``--threads`` client threads (4) send unversioned requests through the arm's Envoy the whole
time. Each rollout commits ``versions: [V]`` and runs one reconcile pass in this process.

Bad versions (``testkit/models/echo/model.py``): ``error-100`` (version 10: an error
response on every request; Triton counts those successes) and ``exception-40`` (version 4:
40% raise); ``exception-40-unprobed`` is version 4 with the probes off in both arms, so that
only client requests give the evidence. Both arms' analysis: ``interval: 1s``, ``duration:
5s``, ``successRate`` min 0.99, probes and early abort at their defaults. The routed arm's rollout:
``traffic: {strategy: canary, steps: [1%, 5%, 25%]}``. Arms alternate rollout by rollout.
Failed client requests are counted from the pass's start to its end.

Blue-green (``--blue-green N``): the routed Envoy's two pools as blue and green
(``strategy: blueGreen``, switch at once, ``keepOld: 3s``). Good rollouts alternate 1 and 2
(each switches the live pool); bad ones roll version 10 with probes off (only the clients
and the router can show it). Measured on this process's ``time.monotonic()`` clock, which
the pass's steps and the clients share: the switch, from the switch's route update being
sent to the first request answered by the new version; the switch-back, from the failed
analysis (the decision) to the first request sent after it and answered by the old version,
and to the switch-back route update's return.

    python -m bench.traffic [--rollouts N] [--blue-green N] [--threads 4] [--output PATH]

Every process started here (three tritonservers, two Envoys) is stopped in ``finally``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.harness.passes import pass_settings, run_pass
from bench.harness.provenance import host, provenance
from reconciler.model.plan import Action
from reconciler.model.reports import PassReport
from reconciler.model.source import Source
from testkit.envoy import LocalEnvoy
from testkit.loadgen import LoadGenerator, Sample
from testkit.local_triton import LocalTriton
from testkit.manifests import ManifestRepo, server_doc, write_model_repository

MODES = {"error-100": 10, "exception-40": 4, "exception-40-unprobed": 4}
# Modes judged without the probes (both arms): only the clients' requests show the failure,
# so the router arm's 1% share, not a probe, has to give the evidence.
UNPROBED = "      probes: {enabled: false}\n"
ANALYSIS = (
    "    analysis:\n      interval: 1s\n      duration: 5s\n{extra}"
    "      checks: [{{name: success-rate, successRate: {{min: 0.99}}}}]\n"
)


def deployment(version: int, traffic: str | None, flip: bool, extra: str = "") -> str:
    """The ModelDeployment; ``flip`` adds a harmless ``failureLimit: 0`` so that a spec held
    by an earlier failed rollout is a new spec."""
    text = (
        "apiVersion: triton-gitops.dev/v1alpha1\nkind: ModelDeployment\nmetadata: {name: echo}\n"
        f"spec:\n  servers: {{names: [a, b, c]}}\n  versions: [{version}]\n  verify:\n"
        + ANALYSIS.format(extra=extra + ("      failureLimit: 0\n" if flip else ""))
    )
    if traffic:
        text += f"  rollout:\n    traffic: {traffic}\n"
    return text


class Arm:
    """One manifest remote with its own state store, reconciled in this process."""

    def __init__(self, root: Path, servers: dict[str, LocalTriton], models: Path) -> None:
        self.repo = ManifestRepo(root / "git")
        self.source = Source(self.repo.url)
        self.settings = pass_settings(root / "cache", root / "state.db")
        for name, server in servers.items():
            self.repo.write(
                f"servers/{name}.yaml",
                server_doc(name, server.grpc_address, models, metrics=server.metrics_url),
            )
        self.flip = False

    def roll(self, text: str) -> PassReport:
        self.repo.write("echo.yaml", text)
        self.repo.commit("roll echo")
        return run_pass(self.source, self.settings)


def router_doc(envoy: LocalEnvoy) -> str:
    return (
        "apiVersion: triton-gitops.dev/v1alpha1\nkind: Router\nmetadata: {name: edge}\nspec:\n"
        f"  envoy: {{admin: '{envoy.admin_url}'}}\n  pools:\n"
        "    - {name: stable, servers: {names: [a, b]}}\n"
        "    - {name: canary, servers: {names: [c]}}\n"
    )


def failed_in(samples: Sequence[Sample], start: float, end: float) -> int:
    return sum(1 for s in samples if s.error is not None and start <= s.started <= end)


def canary_run(
    rollouts: int,
    threads: int,
    routed: Arm,
    plain: Arm,
    routed_envoy: LocalEnvoy,
    plain_envoy: LocalEnvoy,
) -> list[dict[str, Any]]:
    traffic = (
        "{router: edge, strategy: canary, stablePool: stable, canaryPool: canary, "
        "steps: [1%, 5%, 25%]}"
    )
    rows: list[dict[str, Any]] = []
    for mode, version in MODES.items():
        for index in range(rollouts):
            for arm, envoy, spec in ((routed, routed_envoy, traffic), (plain, plain_envoy, None)):
                arm.flip = not arm.flip
                with LoadGenerator(envoy.address, "echo", threads=threads) as load:
                    load.wait_for_samples(200)
                    start = time.monotonic()
                    extra = UNPROBED if mode.endswith("-unprobed") else ""
                    report = arm.roll(deployment(version, spec, arm.flip, extra))
                    end = time.monotonic()
                    samples = list(load.samples)
                reverted = report.result is not None and any(
                    c.outcome == "reverted" for c in report.result.changes
                )
                row = {
                    "mode": mode,
                    "arm": "router" if spec else "no-router",
                    "rollout": index,
                    "reverted": reverted,
                    "failed": failed_in(samples, start, end),
                    "requests": sum(1 for s in samples if start <= s.started <= end),
                    "seconds": round(end - start, 3),
                }
                if spec and report.result is not None:
                    row.update(_exposure(report, samples))
                rows.append(row)
                print(json.dumps(row), file=sys.stderr)
                arm.flip = not arm.flip
                back = arm.roll(deployment(1, spec, arm.flip))  # the spec is held: a new one
                assert back.result is None or back.result.ok or not back.result.changes
    return rows


def _exposure(report: PassReport, samples: Sequence[Sample]) -> dict[str, Any]:
    """Where a routed rollout's failed requests came from: the time from the first share
    being set to the switch back returning, split at the failed analysis; and when the
    failed requests were sent, relative to the first share."""
    assert report.result is not None
    change = next((c for c in report.result.changes if c.analysis is not None), None)
    if change is None or not change.revert:
        return {}
    shared = next(
        (s for s in change.steps if s.step.action is Action.ROUTE and "step 1 of" in s.step.reason),
        None,
    )
    analysis = change.analysis
    assert analysis is not None
    caught = str(analysis.evaluations[-1].results[0]) if analysis.evaluations else ""
    if shared is None:  # caught by the probes while the canary had no traffic
        return {"caught_at_no_traffic": True, "caught_by": caught}
    set_at, decided, back = shared.ended_at, analysis.ended_at, change.revert[0].ended_at
    failed = sorted(s.started - set_at for s in samples if s.error is not None)
    return {
        "share_to_decision_ms": round((decided - set_at) * 1e3, 2),
        "decision_to_switch_back_ms": round((back - decided) * 1e3, 2),
        "failed_sent_ms_after_share": [round(t * 1e3, 1) for t in failed],
        "caught_at_no_traffic": False,
        "caught_by": caught,
    }


def blue_green_run(rounds: int, threads: int, arm: Arm, envoy: LocalEnvoy) -> list[dict[str, Any]]:
    traffic = "{router: edge, strategy: blueGreen, pools: [stable, canary], keepOld: 3s}"
    no_probes = "      probes: {enabled: false}\n"
    rows: list[dict[str, Any]] = []
    serving = 1
    for index in range(rounds):
        for bad in (False, True):
            version = 10 if bad else 3 - serving
            arm.flip = not arm.flip
            with LoadGenerator(envoy.address, "echo", threads=threads) as load:
                load.wait_for_samples(200)
                report = arm.roll(deployment(version, traffic, arm.flip, no_probes if bad else ""))
                load.wait_for_samples(len(load.samples) + 200)
                samples = list(load.samples)
            assert report.result is not None
            row: dict[str, Any] = {"round": index, "bad": bad, "version": version}
            # The new pool's change: the one whose analysis ran under the switch.
            change = next(c for c in report.result.changes if c.analysis is not None)
            if not bad:
                switch = next(
                    s
                    for s in change.steps
                    if s.step.action is Action.ROUTE and "switch" in s.step.reason
                )
                sent = switch.ended_at - switch.seconds
                first = min(
                    (
                        s.started + s.seconds
                        for s in samples
                        if s.started >= sent and s.version == version
                    ),
                    default=None,
                )
                row["switch_ms"] = None if first is None else round((first - sent) * 1e3, 2)
                row["failed"] = sum(1 for s in samples if s.error is not None)
                serving = version
            else:
                analysis = change.analysis
                assert analysis is not None and not analysis.ok, change
                decision = analysis.ended_at
                back = change.revert[0]
                first = min(
                    (
                        s.started + s.seconds
                        for s in samples
                        if s.started >= decision and s.version == serving
                    ),
                    default=None,
                )
                row["switch_back_ms"] = (
                    None if first is None else round((first - decision) * 1e3, 2)
                )
                row["route_update_ms"] = round((back.ended_at - decision) * 1e3, 2)
                row["failed"] = sum(1 for s in samples if s.error is not None)
                row["caught_by"] = (
                    str(analysis.evaluations[-1].results[0]) if analysis.evaluations else ""
                )
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
    return rows


def summary(canary: list[dict[str, Any]], blue_green: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for mode in MODES:
        arms = {
            arm: [r["failed"] for r in canary if r["mode"] == mode and r["arm"] == arm]
            for arm in ("router", "no-router")
        }
        if not arms["router"]:
            continue
        total = {arm: sum(v) for arm, v in arms.items()}
        out[mode] = {
            "failed_per_rollout": {arm: v for arm, v in arms.items()},
            "mean": {arm: statistics.mean(v) for arm, v in arms.items()},
            "ratio_of_totals": total["router"] / total["no-router"] if total["no-router"] else None,
            "all_reverted": all(r["reverted"] for r in canary if r["mode"] == mode),
        }
    backs = [
        r["switch_back_ms"] for r in blue_green if r["bad"] and r.get("switch_back_ms") is not None
    ]
    switches = [
        r["switch_ms"] for r in blue_green if not r["bad"] and r.get("switch_ms") is not None
    ]
    if backs:
        out["switch_back_ms"] = {
            "median": statistics.median(backs),
            "max": max(backs),
            "all": backs,
        }
    if switches:
        out["switch_ms"] = {
            "median": statistics.median(switches),
            "max": max(switches),
            "all": switches,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=5, help="bad rollouts per mode and arm")
    parser.add_argument("--blue-green", type=int, default=5, help="good and bad switch rounds")
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--output", type=Path, default=Path("bench/results/traffic.json"))
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="bench-traffic-"))
    models = write_model_repository(root / "models")
    servers = {n: LocalTriton(models, log_file=root / f"triton-{n}.log") for n in "abc"}
    envoys: list[LocalEnvoy] = []
    try:
        for server in servers.values():
            server.start()
        address = {n: s.grpc_address for n, s in servers.items()}
        routed_envoy = LocalEnvoy.of(
            root / "envoy-routed",
            {"stable": [address["a"], address["b"]], "canary": [address["c"]]},
            {"stable": 10_000},
        ).start()
        envoys.append(routed_envoy)
        plain_envoy = LocalEnvoy.of(
            root / "envoy-plain", {"fleet": list(address.values())}, {"fleet": 10_000}
        ).start()
        envoys.append(plain_envoy)
        routed, plain = Arm(root / "routed", servers, models), Arm(root / "plain", servers, models)
        routed.repo.write("router.yaml", router_doc(routed_envoy))
        for arm, spec in (
            (
                routed,
                "{router: edge, strategy: canary, stablePool: stable, canaryPool: canary, "
                "steps: [1%]}",
            ),
            (plain, None),
        ):
            first = arm.roll(deployment(1, spec, arm.flip))
            assert first.result is not None and first.result.ok, first
        canary = canary_run(args.rollouts, args.threads, routed, plain, routed_envoy, plain_envoy)
        blue_green: list[dict[str, Any]] = []
        if args.blue_green:
            switched = Arm(root / "blue-green", servers, models)
            switched.repo.write("router.yaml", router_doc(routed_envoy))
            first = switched.roll(
                deployment(1, "{router: edge, strategy: blueGreen, pools: [stable, canary]}", False)
            )
            assert first.result is not None
            blue_green = blue_green_run(args.blue_green, args.threads, switched, routed_envoy)
        result = {
            "machine": host(),
            "provenance": provenance(),
            "arguments": vars(args) | {"output": str(args.output)},
            "canary": canary,
            "blue_green": blue_green,
            "summary": summary(canary, blue_green),
        }
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(result, indent=2, default=str))
        print(json.dumps(result["summary"], indent=2))
    finally:
        for envoy in envoys:
            envoy.stop()
        for server in servers.values():
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
