"""Whether a server serves what it should: the truth the reconciler publishes for load
balancers (issue 30), per server and discovered instance. Pure: no I/O, no clock.

Triton's own readiness says something else. On 2.51 ``/v2/health/ready`` answers 400 for
the whole time a new version loads beside a serving one (the old version serves all along),
and 200 on a freshly restarted, empty server: a Kubernetes readiness probe on it takes a pod
out of its Service during every long load, and sends clients to a pod that has loaded
nothing yet. The reconciler knows what each server must serve, so it says:

A server serves when it is reachable and every model placed on it has READY every version
of one of the sets the last pass accepts for it (``wanted_from``): what the pass left
serving as intended (the declared versions, or the old ones of a held rollout), else its
declared versions or those that served when it planned (a rollout under way, or one that
failed and was put back, leaves the old ones serving), and no model on it is out of
service for a reason only the reconciler knows (a sequence model drained for its swap, a
version whose probes fail and that is being healed). A restarted server has nothing READY:
it does not serve until the pass has loaded what it served; nor does a server whose
connection dropped since its last reading (a restart ends the old process, and with it
every connection to it), until a reading begun after the drop says what it serves.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from reconciler.model.reports import PassReport

# An accepted set that any READY version satisfies: a model the pass left alone (a problem
# in its spec, suspended), whose versions the pass did not decide.
ANY_VERSION: tuple[int, ...] = ()

Wanted = Mapping[str, Mapping[str, tuple[tuple[int, ...], ...]]]


@dataclass(frozen=True)
class ServingTruth:
    """One server's truth: ``serving``, and every reason it does not (empty when it does)."""

    server: str
    serving: bool
    reasons: tuple[str, ...] = ()

    @property
    def message(self) -> str:
        return "; ".join(self.reasons) if self.reasons else "serves every version declared"


def wanted_from(report: PassReport) -> dict[str, dict[str, tuple[tuple[int, ...], ...]]]:
    """Per server and placed model, the version sets that make it serve, from ``report``
    (the last pass): the set it left serving as intended first; for a change that did not
    converge, its declared versions and those that served when it planned; any READY version
    for a model the pass left alone. Every server of the pass appears."""
    wanted: dict[str, dict[str, list[tuple[int, ...]]]] = {s: {} for s in report.servers}
    for server, models in report.expected.items():
        for model, versions in models.items():
            wanted.setdefault(server, {})[model] = [versions]
    for change in report.plan.changes:
        if change.deployment is None:
            continue  # being removed: not placed here any more
        accepted = wanted.setdefault(change.server, {}).setdefault(change.model, [])
        accepted += [v for v in (change.desired, change.serving) if v and v not in accepted]
    left_alone = [(p.server, p.model) for p in report.plan.problems if p.model is not None]
    for server, model in (*left_alone, *report.plan.suspended):
        wanted.setdefault(server, {}).setdefault(model, [ANY_VERSION])
    return {s: {m: tuple(sets) for m, sets in models.items()} for s, models in wanted.items()}


def serving_truth(
    wanted: Wanted,
    ready: Mapping[str, Mapping[str, frozenset[int]] | str],
    out_of_service: Mapping[tuple[str, str], str] = {},
    stale: Mapping[str, str] = {},
) -> dict[str, ServingTruth]:
    """Each server's truth, by server name (a discovered instance by its instance name).
    ``wanted``: per server and model, the version sets that make it serve (``wanted_from``);
    ``ready``: per server, the versions READY per model as its index says now, or why it
    could not be read; ``out_of_service``: per (server, model), why the reconciler took it
    out (a drain, a heal); ``stale``: per server, why its reading in ``ready`` no longer
    holds (its connection dropped after that reading began)."""
    truths: dict[str, ServingTruth] = {}
    for server, models in sorted(wanted.items()):
        reading = ready.get(server)
        if server in stale:
            truths[server] = ServingTruth(server, False, (stale[server],))
            continue
        if reading is None:
            truths[server] = ServingTruth(server, False, ("not observed yet",))
            continue
        if isinstance(reading, str):
            truths[server] = ServingTruth(server, False, (f"unreachable: {reading}",))
            continue
        reasons: list[str] = []
        for model, accepted in sorted(models.items()):
            why = out_of_service.get((server, model))
            if why is not None:
                reasons.append(f"model {model}: {why}")
                continue
            up = reading.get(model, frozenset())
            if any(set(versions) <= up if versions else up for versions in accepted):
                continue
            first = accepted[0] if accepted else ANY_VERSION
            missing = sorted(set(first) - up)
            reasons.append(
                f"model {model}: version(s) {', '.join(map(str, missing))} not READY"
                if missing
                else f"model {model}: no version READY"
            )
        truths[server] = ServingTruth(server, not reasons, tuple(reasons))
    return truths
