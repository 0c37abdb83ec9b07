"""What the benchmark scenarios share, once: the Triton index they watch, provenance,
statistics, report tables, their error, and the timing probe on the pass's hooks.

Scenarios (``bench/*.py``) import this package and ``testkit`` only: never each other, never
``tests``.
"""
