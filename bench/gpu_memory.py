"""GPU memory per device (issue 30): what the reconciler reads of a real GPU server, against
NVIDIA's own tools, on a machine with GPUs (the device tool lends one to some sessions).

    python -m bench.gpu_memory [--output PATH]

Starts one tritonserver (the nvidia-pytriton wheel's; GPU metrics are on by default when a
GPU is visible), reads its metrics endpoint as the reconciler does (``TritonScrape``), and
compares each device's memory in use and in all with ``nvidia-smi --query-gpu=uuid,
memory.used,memory.total``, then loads the test model ``echo`` and reads its statistics'
``memory_usage`` (the Python backend reports none: said, not failed). Prints one JSON
object: per device the two sources and their ratio, the fullest device and its free memory
(what the headroom check uses), and the statistics. Exit 0 when every device Triton reports
matches nvidia-smi within 5% (the two sample at different moments), 1 when not, 2 when the
machine has no GPU (nvidia-smi missing, or no ``nv_gpu_*`` series: this machine, CPU only).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from reconciler.adapters.metrics import TritonScrape
from reconciler.adapters.triton import TritonServerClient
from reconciler.core.triton_config import parse_pbtxt, with_versions
from testkit.local_triton import LocalTriton
from testkit.manifests import write_model_repository

MATCH = 0.05  # the most the two sources may differ per device (relative)


def nvidia_smi() -> dict[str, tuple[float, float]] | None:
    """Per device uuid: memory used and total (bytes), as nvidia-smi says; None without it."""
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return None
    query = "--query-gpu=uuid,memory.used,memory.total"
    out = subprocess.run(
        [binary, query, "--format=csv,noheader,nounits"], capture_output=True, text=True
    )
    if out.returncode != 0:
        return None
    found = {}
    for line in out.stdout.splitlines():
        uuid, used, total = (part.strip() for part in line.split(","))
        found[uuid] = (float(used) * 2**20, float(total) * 2**20)  # MiB
    return found


def measure(root: Path) -> tuple[int, dict[str, Any]]:
    repository = write_model_repository(root)
    server = LocalTriton(repository).start()
    try:
        time.sleep(3)  # Triton samples its GPU figures every couple of seconds
        figures = TritonScrape(server.metrics_url).figures("echo", ())
        smi = nvidia_smi()
        if smi is None or not figures.gpu_used:
            return 2, {"gpu": False, "nvidia_smi": smi is not None,
                       "triton_devices": sorted(figures.gpu_used)}  # fmt: skip
        devices, worst = {}, 0.0
        for uuid, used in sorted(figures.gpu_used.items()):
            smi_used, smi_total = smi.get(uuid, (float("nan"), float("nan")))
            total = figures.gpu_total.get(uuid, float("nan"))
            off = max(abs(used - smi_used) / max(smi_used, 1.0), abs(total - smi_total) / smi_total)
            worst = max(worst, off if off == off else 1.0)  # NaN: a device nvidia-smi lacks
            devices[uuid] = {"triton": [used, total], "nvidia_smi": [smi_used, smi_total],
                             "relative_difference": off}  # fmt: skip
        with TritonServerClient("gpu", server.grpc_address) as client:
            base = parse_pbtxt((repository / "echo" / "config.pbtxt").read_text())
            client.load("echo", with_versions(base, "echo", [1]))
            usage = client.memory_usage("echo")
        result = {
            "gpu": True,
            "devices": devices,
            "fullest_device": figures.fullest_device(),
            "statistics_memory_usage": {
                v: [list(u.__dict__.values()) for u in us] for v, us in usage.items()
            },
            "worst_relative_difference": worst,
        }
        return (0 if worst <= MATCH else 1), result
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_memory", description=__doc__)
    parser.add_argument("--output", type=Path, help="also write the JSON result here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-gpu-memory-") as folder:
        code, result = measure(Path(folder))
    text = json.dumps(result, indent=2, default=str)
    print(text)
    if args.output is not None:
        args.output.write_text(text + "\n")
    if code == 2:
        print("no GPU here: nothing to compare (run it on a GPU machine)", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
