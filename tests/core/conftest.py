"""Fixtures of the pass tests with plain fakes (``test_loop.py``, ``test_refusals.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.model.settings import Settings
from tests.core.pass_fakes import FakeClient, World


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(cache_dir=tmp_path / "cache", state_path=tmp_path / "state.db")


@pytest.fixture
def world() -> World:
    """One server s1 whose repository holds echo 1 and 2, serving nothing yet."""
    found = World()
    found.servers["s1"] = FakeClient("s1", {"echo": [1, 2]})
    return found
