"""What the benchmark scenarios share, once. Scenarios (``bench/*.py``) import this package
and ``testkit`` only: never each other, never ``tests``.

- ``triton``: the benchmark's own view of a server (``Index``: states, ready, settle, hand
  loads) and ``wait_for``;
- ``passes``: the one place a scenario runs a reconcile pass in its process and builds its
  settings;
- ``probe``: where a pass spends its time, through the pass's hooks and ports;
- ``service``: the reconciler service as the service benchmarks start it;
- ``gates``: one pre-merge gate run on an isolated tritonserver, as a JSON record;
- ``provenance``: machine, versions, code measured, how busy the machine was;
- ``procfs``: processes as /proc sees them (children, RSS, CPU time);
- ``stats``: percentiles, summaries, slopes, a paired bootstrap;
- ``report``: Markdown and fixed-width tables;
- ``cli``: what every ``main`` does around its run;
- ``burner``: a CPU burner, one busy loop per core, around a measured step;
- ``verdicts``: what an ``apply --output json`` report says about a rollout;
- ``streams``: what a streaming rollout's client streams and report say;
- ``errors``: ``BenchError``, the run is void.
"""
