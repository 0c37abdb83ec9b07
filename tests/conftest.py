"""Fixtures shared by the whole suite: real tritonserver processes, real Git remotes.

The helpers behind them (the test models, ``ManifestRepo``, ``LocalTriton``...) live in
``testkit/``, where the benchmarks and the demo use them too.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.local_triton import LocalTriton, forget_started, revive_shared, triton_aborts
from testkit.manifests import ManifestRepo, write_model_repository

pytest_plugins = ("tests.services", "tests.signing")


@pytest.fixture(scope="session")
def model_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model_repository(tmp_path_factory.mktemp("models"))


@pytest.fixture
def triton(model_repository: Path, tmp_path: Path) -> Iterator[LocalTriton]:
    server = LocalTriton(model_repository, log_file=tmp_path / "triton-a.log").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def triton_b(model_repository: Path, tmp_path: Path) -> Iterator[LocalTriton]:
    server = LocalTriton(model_repository, log_file=tmp_path / "triton-b.log").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def manifests(tmp_path: Path) -> ManifestRepo:
    return ManifestRepo(tmp_path / "git")


# The longest test files first (measured: each file's tests' time summed, in the three
# processes of ./dev test: 195 s for test_crash.py down to 32 s for test_dashboard_live.py),
# the image test last. ``./dev test`` runs files side by side with ``--dist loadfile``: each
# process takes the next file in collection order, and a long file started near the end
# would keep the whole run waiting for it. test_image.py waits for the image build running
# beside the tests, which takes most of the run.
LONGEST_FIRST = (
    "tests/integration/test_crash.py",
    "tests/integration/test_fleet.py",
    "tests/integration/test_streaming.py",
    "tests/integration/test_analysis.py",
    "tests/integration/test_streaming_traffic.py",
    "tests/integration/test_shadow.py",
    "tests/integration/test_traffic.py",
    "tests/integration/test_daemon.py",
    "tests/integration/test_serving_truth.py",
    "tests/integration/test_dependencies.py",
    "tests/test_release.py",
    "tests/integration/test_client_view.py",
    "tests/adapters/test_model_interfaces.py",
    "tests/integration/test_operator_verbs.py",
    "tests/adapters/test_envoy.py",
    "tests/integration/test_object_storage.py",
    "tests/integration/test_model_safety.py",
    "tests/core/test_hostile_manifests.py",
    "tests/integration/test_aiperf.py",
    "tests/integration/test_webhook_hostile.py",
    "tests/integration/test_reconcile.py",
    "tests/adapters/test_metrics_more.py",
    "tests/integration/test_dashboard_live.py",
    "tests/integration/test_sequence_rollout.py",  # one test of about 55 s
)
LAST = ("tests/integration/test_image.py",)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    # pytest-xdist (3.5 on) hands a --dist loadfile run's files out by their number of tests,
    # most first, unless told not to (--no-loadscope-reorder, 3.8 on): the order below was
    # lost, and files of a few long tests went out last (measured on 319bfc1: the 4 tests of
    # test_streaming_traffic.py, about 110 s, were the 91st file of 134).
    config.option.loadscopereorder = False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::", 1)[0]
        if path in LAST:
            return len(LONGEST_FIRST) + 1
        return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: a file's tests keep their order
    for item in items:
        # pytest-rerunfailures asks the condition after the attempt has failed.
        item.add_marker(pytest.mark.flaky(reruns=1, condition=_triton_aborted))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # A module's shared tritonserver that ended during an earlier test (Triton's abort) is
    # started again first: that test failed or was rerun, and this one starts as it would.
    revived = revive_shared()
    if revived:
        warnings.warn(
            "a tritonserver shared by the module had ended; started again on its own ports "
            f"before {item.nodeid}:\n" + "\n".join(revived),
            stacklevel=1,
        )
    forget_started()


def _triton_aborted() -> bool:
    """A failed attempt is run again only when a tritonserver it started aborted in Triton's
    own Python backend (testkit.local_triton.TRITON_ABORT); any other failure stands."""
    aborts = triton_aborts()
    if aborts:
        warnings.warn(
            "tritonserver aborted in Triton's Python backend (triton-inference-server/"
            "server#8882); the test is run once more:\n" + "\n".join(aborts),
            stacklevel=1,
        )
    return bool(aborts)
