"""Fixtures shared by the whole suite: real tritonserver processes, real Git remotes.

The helpers behind them (the test models, ``ManifestRepo``, ``LocalTriton``...) live in
``testkit/``, where the benchmarks and the demo use them too.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.local_triton import LocalTriton
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
