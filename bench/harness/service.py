"""The reconciler service as the service benchmarks (``bench.daemon``, ``bench.soak``) run it:
``testkit.service_process.Service`` with the benchmarks' options.

Only the first pass comes from the timer (``--interval 3600``): every other pass is one the
benchmark asked for (a webhook, ``POST /reconcile``) or the watch started. A service that does
not stop on SIGTERM is killed and its exit code recorded, not raised: the numbers already
taken stand.
"""

from __future__ import annotations

from pathlib import Path

from testkit.service_process import Service, ServiceOptions

SECRET = "bench-webhook-secret"
TOKEN = "bench-reconcile-token"


def measured_service(repo: str, workdir: Path, watch_interval: float) -> Service:
    """The service over ``repo`` (not started), its files in ``workdir``."""
    options = ServiceOptions(
        secret=SECRET,
        token=TOKEN,
        secret_file="github-secret",
        interval=3600,
        watch_interval=watch_interval,
        start_timeout=60,
        stop_timeout=90,
        hung_stop_raises=False,
        http_timeout=10,
    )
    return Service(repo, workdir, options)
