"""Staged rollouts: one stage of servers at a time, each stage analysed against the servers
the plan names as its baseline, step webhooks between stages. A ``RolloutKind``, chosen by
``engine/apply.py``.

Everything this module runs is planned: the stages, each stage's baseline servers
(``RolloutPlan.baselines``), and the finish of a server found restarted after its stage
passed (``ModelChange.restarted_finish``). It only observes which of them applies.
"""

from __future__ import annotations

from reconciler.engine.context import ChangeContext
from reconciler.engine.stages import Rollout, finish, take_back, through_stages
from reconciler.model.results import ChangeResult, StepResult


def run_staged(rollout: Rollout) -> list[ChangeResult]:
    """Run one ModelDeployment's change stage by stage (preview, then each step): a stage's
    servers swap (at most max_parallel at once), verify and analyse; any failure, or a step
    webhook that says no, puts back every server touched so far. Old versions go only after
    the last stage passed."""
    done: dict[str, list[StepResult]] = {}
    contexts: dict[str, ChangeContext] = {}
    failure = through_stages(rollout, contexts, done)
    if failure is not None:
        return take_back(rollout, failure, done)
    return [
        finish(rollout, server, done[server], contexts[server])
        for server in sorted(rollout.changes)
    ]
