"""The one error of the benchmarks: the run did not go as the measurement needs, so its
numbers are void. Every scenario's ``main`` reports it as ``benchmark failed: ...``, exit 1.
"""

from __future__ import annotations

from testkit.service_process import ServiceProcessError


class BenchError(RuntimeError):
    """Something did not end where it should have; the measurement is void."""


# What voids a measurement: ours, and the service wrapper's (it did not answer in time).
VOID: tuple[type[Exception], ...] = (BenchError, ServiceProcessError)
