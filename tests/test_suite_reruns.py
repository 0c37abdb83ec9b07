"""The suite's one rerun: a test is run again once when a tritonserver it started, or one its
module shares, aborted in Triton's own Python backend, and never for any other failure; a
shared tritonserver that ended is started again before the next test (tests/conftest.py)."""

from __future__ import annotations

import pytest

pytest_plugins = ("pytester",)

_INNER_CONFTEST = """
from tests.conftest import pytest_collection_modifyitems, pytest_runtest_setup
"""

_INNER_TESTS = """
from pathlib import Path

from testkit.local_triton import LocalTriton, _started

ATTEMPTS = {"aborted": 0, "plain": 0}


def _server_with_log(tmp_path: Path, text: str) -> None:
    log = tmp_path / "triton.log"
    log.write_text(text)
    _started.append(LocalTriton(tmp_path, log_file=log))


def test_whose_server_aborted_once(tmp_path: Path) -> None:
    ATTEMPTS["aborted"] += 1
    first = ATTEMPTS["aborted"] == 1
    _server_with_log(
        tmp_path,
        "terminate called after throwing an instance of "
        "'boost::interprocess::lock_exception'\\n" if first else "I1203 ready\\n",
    )
    assert not first, "the attempt whose server aborted"


def test_failing_with_a_healthy_server(tmp_path: Path) -> None:
    ATTEMPTS["plain"] += 1
    _server_with_log(tmp_path, "I1203 ready\\n")
    assert ATTEMPTS["plain"] == 2, "a failure of the test's own"
"""


def test_only_a_triton_abort_gets_a_second_attempt(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(_INNER_CONFTEST)
    pytester.makepyfile(test_inner=_INNER_TESTS)

    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-raR")

    outcomes = result.parseoutcomes()
    assert (outcomes.get("passed"), outcomes.get("failed"), outcomes.get("rerun")) == (1, 1, 1), (
        result.stdout.str()
    )
    result.stdout.fnmatch_lines(
        [
            "*triton.log: terminate called after throwing*lock_exception*",
            "RERUN test_inner.py::test_whose_server_aborted_once",
            "PASSED test_inner.py::test_whose_server_aborted_once",
            "FAILED test_inner.py::test_failing_with_a_healthy_server*",
        ]
    )


_INNER_SHARED = """
import os
import signal
import urllib.request

import pytest

from testkit.local_triton import LocalTriton, shared_between_tests

ATTEMPTS = {"aborted": 0}
ABORT = "terminate called after throwing an instance of 'boost::interprocess::lock_exception'"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    started = LocalTriton(root, log_file=root.parent / "shared-triton.log").start()
    try:
        with shared_between_tests(started):
            yield started
    finally:
        started.stop()


def _ends(server, line=None):
    if line is not None:  # what Triton's abort writes before the server goes
        with open(server.log_file, "a") as log:
            log.write(line + "\\n")
    os.killpg(server.process.pid, signal.SIGKILL)
    server.process.wait()


def _answers(server):
    url = f"http://{server.http_address}/v2/health/ready"
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.status == 200


def test_during_which_the_shared_server_aborts(server):
    ATTEMPTS["aborted"] += 1
    if ATTEMPTS["aborted"] == 1:
        _ends(server, ABORT)
        raise AssertionError("the attempt whose shared server aborted")
    assert _answers(server)


def test_after_the_abort(server):
    assert _answers(server)


def test_during_which_the_shared_server_ends_otherwise(server):
    _ends(server)
    raise AssertionError("a failure that is no abort of Triton's")


def test_after_the_other_end(server):
    assert _answers(server)
"""


@pytest.mark.triton
def test_a_shared_server_that_aborted_is_rerun_and_started_again_for_the_next_test(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(_INNER_CONFTEST)
    pytester.makepyfile(test_inner=_INNER_SHARED)

    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-raR", "-v")

    outcomes = result.parseoutcomes()
    assert (outcomes.get("passed"), outcomes.get("failed"), outcomes.get("rerun")) == (3, 1, 1), (
        result.stdout.str()
    )
    result.stdout.fnmatch_lines(
        [
            "*shared-triton.log: terminate called after throwing*lock_exception*",
            "*started again on its own ports before "
            "test_inner.py::test_during_which_the_shared_server_aborts*",
            "*started again on its own ports before test_inner.py::test_after_the_other_end*",
            "*shared-triton.log: exited with -9*",
        ],
        consecutive=False,
    )
    result.stdout.fnmatch_lines(
        [
            "test_inner.py::test_during_which_the_shared_server_aborts RERUN*",
            "test_inner.py::test_during_which_the_shared_server_aborts PASSED*",
            "test_inner.py::test_after_the_abort PASSED*",
            "test_inner.py::test_during_which_the_shared_server_ends_otherwise FAILED*",
            "test_inner.py::test_after_the_other_end PASSED*",
        ]
    )
