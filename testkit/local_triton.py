"""The local tritonserver the demo, the tests and the benchmarks start: the product's own
launcher (``reconciler/adapters/local_triton.py``, which the ``gate`` command uses too),
re-exported under the name the test code has always imported."""

from reconciler.adapters.local_triton import (
    LocalTriton,
    LocalTritonError,
    end_process_group,
    free_port,
)

__all__ = ["LocalTriton", "LocalTritonError", "end_process_group", "free_port"]
