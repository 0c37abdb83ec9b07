"""bench.gpu_memory on a machine without a GPU (this one): it says so and exits 2, never a
pass; on a GPU machine it compares Triton's per-device figures with nvidia-smi's."""

from __future__ import annotations

import json

import pytest

from bench import gpu_memory

pytestmark = pytest.mark.triton


def test_without_a_gpu_it_says_so_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    if gpu_memory.nvidia_smi() is not None:
        pytest.skip("a GPU is here: bench.gpu_memory measures it for real")
    assert gpu_memory.main([]) == 2
    out, err = capsys.readouterr()
    assert json.loads(out) == {"gpu": False, "nvidia_smi": False, "triton_devices": []}
    assert "no GPU here" in err
