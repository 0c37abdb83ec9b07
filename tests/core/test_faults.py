"""Fault points: registered names are reached in the code where documented, and nothing else."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from reconciler import faults

SOURCE = Path(faults.__file__).parent
CALL = re.compile(r"""fault_point\(\s*["']([^"']+)["']\s*\)""")
# Where each point must be: the module, and the function it sits in.
WHERE = {
    "apply.load.requested": ("engine/steps.py", "_load"),
    "apply.load.accepted": ("engine/steps.py", "_load"),
    "apply.verify": ("engine/steps.py", "_verify"),
    "apply.analysis": ("engine/analyze.py", "analyze_step"),
    "apply.unload": ("engine/steps.py", "_unload"),
    "apply.library.replaced": ("engine/steps.py", "_replace_library"),
    "apply.revert": ("engine/change.py", "apply_change"),
    "loop.record": ("loop/phases.py", "record"),
    "state.write": ("adapters/state.py", "record_pass"),
    "state.migrate": ("adapters/state_schema.py", "migrate"),
    "git.push.before": ("adapters/git.py", "push_revert"),
    "git.push.after": ("adapters/git.py", "push_revert"),
    "loop.alerts": ("loop/phases.py", "alert"),
}


def calls() -> list[tuple[str, str, str]]:
    """(point, module, enclosing function) for every fault_point call in the package."""
    found = []
    for path in sorted(SOURCE.rglob("*.py")):
        if path.name == "faults.py":
            continue
        function = ""
        for line in path.read_text().splitlines():
            definition = re.match(r"\s*def (\w+)", line)
            if definition and not line.startswith(" " * 8):  # module and method level only
                function = definition.group(1)
            for name in CALL.findall(line):
                found.append((name, path.relative_to(SOURCE).as_posix(), function))
    return found


def test_every_point_is_registered_and_used_once_where_expected() -> None:
    used = calls()
    assert sorted(name for name, _, _ in used) == sorted(faults.POINTS)  # once each, no others
    assert {name: (module, function) for name, module, function in used} == WHERE
    assert set(WHERE) == set(faults.POINTS)


def test_every_point_is_documented_in_one_line() -> None:
    text = Path(faults.__file__).read_text()
    for name in faults.POINTS:
        assert re.search(rf'^    "{re.escape(name)}",  # \S.+$', text, re.MULTILINE), name


def test_unset_binds_the_no_op() -> None:
    # The test process runs without TRITON_GITOPS_FAULT: the point is the no-op function.
    assert faults.fault_point is faults._noop
    faults.fault_point("apply.verify")  # and it returns


@pytest.mark.parametrize(("setting", "hits_survived"), [("loop.record", 0), ("loop.record:3", 2)])
def test_armed_point_kills_with_sigkill_on_the_nth_hit(setting: str, hits_survived: int) -> None:
    script = (
        "from reconciler.faults import fault_point\n"
        "fault_point('loop.alerts')\n"  # another point: no effect
        "for i in range(5):\n"
        "    fault_point('loop.record')\n"
        "    print(i, flush=True)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        env={"TRITON_GITOPS_FAULT": setting, "PATH": ""},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == -9, done.stderr
    assert done.stdout.split() == [str(i) for i in range(hits_survived)]


def test_an_unknown_point_is_refused() -> None:
    with pytest.raises(ValueError, match="no such fault point"):
        faults.parse("apply.lod")
    assert faults.parse("apply.verify:2") == ("apply.verify", 2)
