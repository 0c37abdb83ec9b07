"""The release artifacts as users get them (``./dev release``): the sdist and the wheel built
by PyPA's build from this tree, checked by testkit/release.py."""

from __future__ import annotations

from pathlib import Path

from testkit.release import build, problems


def test_the_sdist_and_the_wheel_hold_what_a_user_needs(tmp_path: Path) -> None:
    sdist, wheel = build(tmp_path)
    assert problems(sdist, wheel) == []
    assert wheel.name == "triton_gitops-0.1.0-py3-none-any.whl"
