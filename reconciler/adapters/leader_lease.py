"""The reconciler lock as a ``coordination.k8s.io/v1`` Lease, for more than one replica: the
official Kubernetes client's leader election (``kubernetes.leaderelection``) takes and renews
it. ``wiring.reconciler_lock`` makes it beside the file lock when ``--leader-lease
NAMESPACE/NAME`` is given.

Only the election's own steps are used (``try_acquire_or_renew``, ``renew_loop``), not its
blocking ``run``: ``acquire`` must give up after a timeout (a one-shot ``apply`` refuses), and
the service keeps serving its health checks and on-call verbs while it waits. Released, the
Lease is written with no holder, so a waiting replica takes it at its next try instead of
after the lease duration (as client-go's ReleaseOnCancel does).

No API server runs on the test machines: tests/adapters/test_leader_lease.py checks the
requests this sends against recorded Lease shapes (docs/guarantees.md says what was not run).
"""

from __future__ import annotations

import datetime
import logging
import re
import threading
import time

from kubernetes import client as kube
from kubernetes import config as kube_config
from kubernetes.leaderelection.electionconfig import Config
from kubernetes.leaderelection.leaderelection import LeaderElection
from kubernetes.leaderelection.leaderelectionrecord import LeaderElectionRecord
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

from reconciler.model.errors import ReconcileError
from reconciler.ports import LockHolder

# The holder identity written into the Lease: who, for a refusal to name.
_IDENTITY = re.compile(
    r"(?P<host>\S+) pid (?P<pid>\d+) \((?P<command>[^)]*)\) since (?P<since>\S+)"
)


def lease_api(kubeconfig: str | None = None) -> kube.ApiClient:
    """A client from ``kubeconfig`` ($KUBECONFIG), else from the pod's service account."""
    try:
        if kubeconfig is not None:
            made: kube.ApiClient = kube_config.new_client_from_config(config_file=kubeconfig)
            return made
        configuration = kube.Configuration()
        kube_config.load_incluster_config(client_configuration=configuration)
        return kube.ApiClient(configuration)
    except (kube_config.ConfigException, OSError, ValueError) as exc:
        source = kubeconfig or "the in-cluster service account"
        raise ReconcileError(f"leader Lease: no Kubernetes API from {source}: {exc}") from exc


class LeaderLease:
    """A ``ReconcilerLock`` on the Lease ``namespace/name``, renewed every ``retry_period``
    seconds by a thread while held; lost (``held`` False) when it could not be renewed
    within ``renew_deadline``. The defaults are client-go's (15, 10, 2 seconds)."""

    def __init__(
        self,
        namespace: str,
        name: str,
        me: LockHolder,
        api_client: kube.ApiClient,
        *,
        lease_duration: int = 15,
        renew_deadline: int = 10,
        retry_period: int = 2,
    ) -> None:
        # The election logs every renewal (every retry_period) at INFO: the service's log
        # says what matters (waiting, taken, lost) itself.
        logging.getLogger("leaderelection").setLevel(logging.WARNING)
        self.where = f"Lease {namespace}/{name}"
        self.identity = f"{me.host} pid {me.pid} ({me.command}) since {me.since}"
        self._lock = LeaseLock(name, namespace, self.identity)
        self._lock.api_instance = kube.CoordinationV1Api(api_client)
        self._retry = retry_period
        self._election = LeaderElection(
            Config(
                self._lock, lease_duration, renew_deadline, retry_period,
                onstarted_leading=lambda: None, onstopped_leading=None,
            )
        )  # fmt: skip
        self._stop = threading.Event()
        self._lost = threading.Event()
        self._renewer: threading.Thread | None = None

    def acquire(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not self._election.try_acquire_or_renew():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(self._retry, left))
        self._stop.clear()
        self._lost.clear()
        self._renewer = threading.Thread(target=self._renew, name="leader-lease", daemon=True)
        self._renewer.start()
        return True

    def _renew(self) -> None:
        if self._stop.wait(self._retry):
            return
        # Returns when stopped, or when a renewal did not succeed within the deadline.
        self._election.renew_loop(self._stop)
        if not self._stop.is_set():
            self._lost.set()

    def held(self) -> bool:
        return self._renewer is not None and not self._lost.is_set()

    def release(self) -> None:
        renewer, self._renewer = self._renewer, None
        if renewer is None:
            return
        self._stop.set()
        renewer.join()
        # Read again first: the write needs the Lease's latest resourceVersion, and a Lease
        # that someone else holds now is not ours to clear.
        found, record = self._lock.get(self._lock.name, self._lock.namespace)
        if self._lost.is_set() or not found or record.holder_identity != self.identity:
            return
        now = str(datetime.datetime.now())
        self._lock.update(
            self._lock.name, self._lock.namespace, LeaderElectionRecord("", "1", now, now)
        )

    def holder(self) -> LockHolder | None:
        found, record = self._lock.get(self._lock.name, self._lock.namespace)
        if not found or record.holder_identity is None:
            return None
        if record.renew_time is not None and record.lease_duration is not None:
            renewed = datetime.datetime.fromisoformat(record.renew_time)
            expires = renewed + datetime.timedelta(seconds=int(record.lease_duration))
            if expires < datetime.datetime.now():
                return None  # expired: the next candidate takes it
        parsed = _IDENTITY.fullmatch(record.holder_identity)
        if parsed is None:  # written by something else
            return LockHolder(0, record.holder_identity, "unknown", "unknown")
        return LockHolder(int(parsed["pid"]), parsed["command"], parsed["since"], parsed["host"])
