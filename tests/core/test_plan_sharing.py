"""What a plan does once per distinct config rather than once per pair (issue 46): the
servers of a pool share one loaded config object per model (the Triton adapter converts each
distinct answer once; the config memory recalls one object per digest), so the drift check
runs once per (spec.config, loaded config) pair of objects, and a model that serves as
declared is planned without merging its target config. The answers are those of one check
per pair: an equal config in another object is checked again, a drifted one is found."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from reconciler.core import triton_config
from reconciler.core.plan import changes
from reconciler.core.plan.planner import plan
from reconciler.model.history import History
from reconciler.model.serving import ServerState
from tests.core.fakes import FakeTriton, deploy, desired_state, observe

SERVERS = ("s1", "s2", "s3", "s4")
CONFIG = {"max_batch_size": 4}


def pool(shared: dict[str, Any] | None) -> dict[str, ServerState]:
    """Each server serving m version 1, the loaded config one object on all when ``shared``."""
    serving = {}
    for name in SERVERS:
        fake = FakeTriton(name, {"m": range(1, 3)})
        fake.serve("m", [1])
        state = observe(fake)
        if shared is not None:
            model = replace(state.model("m"), loaded_config=shared)
            state = replace(state, models={**state.models, "m": model})
        serving[name] = state
    return serving


def counted(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[object]:
    calls: list[object] = []
    original = getattr(module, name)

    def counting(*args: Any, **options: Any) -> Any:
        calls.append(args)
        return original(*args, **options)

    monkeypatch.setattr(module, name, counting)
    return calls


def test_a_pool_sharing_one_loaded_config_is_checked_for_drift_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    desired = desired_state(deploy("m", [1], servers=SERVERS, config=CONFIG), servers=SERVERS)
    shared = pool(None)["s1"].model("m").loaded_config
    assert shared is not None
    checks = counted(monkeypatch, triton_config, "config_drift")

    p = plan(desired, pool(dict(shared)), History(), "rev-1")

    assert not p.has_changes and sorted(p.in_sync) == [(s, "m") for s in SERVERS], p.changes
    assert len(checks) == 1, f"{len(checks)} drift checks of one shared config"


def test_configs_in_other_objects_are_each_checked_and_drift_is_found(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    desired = desired_state(deploy("m", [1], servers=SERVERS, config=CONFIG), servers=SERVERS)
    serving = pool(None)  # a config object per server, as a fake reports them
    drifted = serving["s3"].model("m").loaded_config
    assert drifted is not None
    model = replace(serving["s3"].model("m"), loaded_config={**drifted, "max_batch_size": 8})
    serving["s3"] = replace(serving["s3"], models={**serving["s3"].models, "m": model})
    checks = counted(monkeypatch, triton_config, "config_drift")

    p = plan(desired, serving, History(), "rev-1")

    assert len(checks) == len(SERVERS), f"{len(checks)} drift checks of {len(SERVERS)} configs"
    assert [(c.server, c.model) for c in p.changes] == [("s3", "m")], p.problems
    assert "max_batch_size" in p.changes[0].steps[0].reason


def test_a_model_serving_as_declared_is_planned_without_merging_its_config(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    desired = desired_state(deploy("m", [1], servers=SERVERS, config=CONFIG), servers=SERVERS)
    # The plan merges in both modules: the lazy target config in triton_config's own
    # ``merged_when_asked``, the rest in changes.
    merges = counted(monkeypatch, changes, "merge")
    merges_when_asked = counted(monkeypatch, triton_config, "merge")

    in_sync = plan(desired, pool(None), History(), "rev-1")
    assert not in_sync.has_changes, in_sync.changes
    assert len(merges) == len(merges_when_asked) == 0, (
        f"{len(merges)} + {len(merges_when_asked)} merges for {len(SERVERS)} pairs in sync"
    )

    bumped = desired_state(deploy("m", [1, 2], servers=SERVERS, config=CONFIG), servers=SERVERS)
    changed = plan(bumped, pool(None), History(), "rev-2")
    assert len(changed.changes) == len(SERVERS), changed.problems
    assert len(merges_when_asked) >= len(SERVERS), (
        f"{len(merges_when_asked)} merges for {len(SERVERS)} changes"
    )
    load = changed.changes[0].steps[0]
    assert load.config is not None and load.config["max_batch_size"] == 4, load.config
