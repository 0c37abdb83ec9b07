"""Planning: ``plan(desired, serving, history, revision) -> Plan``, pure."""

from __future__ import annotations

from reconciler.core.plan.planner import plan
from reconciler.core.plan.settle import emptied_servers, settle_key

__all__ = ["emptied_servers", "plan", "settle_key"]
