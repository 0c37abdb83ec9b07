"""The suite's one rerun: a test is run again once when a tritonserver it started aborted in
Triton's own Python backend, and never for any other failure (tests/conftest.py)."""

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
