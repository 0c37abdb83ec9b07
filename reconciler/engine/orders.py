"""The operator's orders as apply sees them: for a step, the order its rollout obeys now.
Read from the state store (``ports.OperatorOrders``), where a running service's HTTP API
and one-shot commands alike put them, at most every ``every`` seconds per ModelDeployment
so that the analysis can ask as often as it wakes; which order applies is
``core.orders.standing``'s decision.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

from reconciler.core.orders import standing
from reconciler.model.history import OperatorOrder
from reconciler.model.plan import Step
from reconciler.ports import OperatorOrders

ORDERS_EVERY = 0.25  # seconds: how late an abort or promote can be seen, at most


class OrderWatch:
    """The orders of one apply's rollouts (``deployments``: (server, model) -> its
    ModelDeployment), given since ``started`` (wall clock), or for a resumed rollout since
    its ``resumed`` time (``core.orders.resumed_since``) when that is earlier."""

    every = ORDERS_EVERY

    def __init__(
        self,
        source: OperatorOrders,
        deployments: Mapping[tuple[str, str], str],
        started: float,
        clock: Callable[[], float],
        resumed: Mapping[str, float] | None = None,
    ) -> None:
        self._source, self._deployments, self.started = source, deployments, started
        self._since = {name: min(at, started) for name, at in (resumed or {}).items()}
        self._clock = clock
        self._read: dict[str, tuple[float, list[OperatorOrder]]] = {}
        self._lock = threading.Lock()

    def __call__(self, step: Step, analysis_started: float | None) -> OperatorOrder | None:
        """The order ``step`` obeys now (``analysis_started``: wall clock, while it is an
        analysis), or None."""
        deployment = self._deployments.get((step.server, step.model))
        if deployment is None:
            return None
        since = self._since.get(deployment, self.started)
        now = self._clock()
        with self._lock:
            read = self._read.get(deployment)
            if read is None or now - read[0] >= self.every:
                read = (now, self._source.orders(deployment, since))
                self._read[deployment] = read
        return standing(read[1], since, analysis_started)
