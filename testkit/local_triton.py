"""The local tritonserver the demo, the tests and the benchmarks start: the product's own
launcher (``reconciler/adapters/local_triton.py``, which the ``gate`` command uses too),
under the name the test code has always imported, ending its servers at once (SIGKILL, their
shared memory removed): a test needs no graceful shutdown, which costs 1 to 3 s a server.
"""

from dataclasses import dataclass

from reconciler.adapters.local_triton import LocalTriton as _LocalTriton
from reconciler.adapters.local_triton import (
    LocalTritonError,
    end_process_group,
    free_port,
)


@dataclass
class LocalTriton(_LocalTriton):
    fast_stop: bool = True


__all__ = ["LocalTriton", "LocalTritonError", "end_process_group", "free_port"]
