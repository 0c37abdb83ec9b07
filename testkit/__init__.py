"""Test, benchmark and demo helpers that users do not need: not shipped in the wheel
(pyproject's wheel target packages ``reconciler`` only). The test suite, ``bench/`` and
``examples/demo.py`` import them from the checkout:

- ``local_triton``: a real tritonserver from the nvidia-pytriton wheel (``LocalTriton``);
- ``manifests``: the test models (``models/``), their repository, a bare Git remote
  (``ManifestRepo``) and the manifest documents as text;
- ``cli_run``: the CLI run in-process, its output captured;
- ``loadgen``: client threads sending requests and recording every outcome;
- ``service_process``: ``python -m reconciler run`` in its own process (``Service``);
- ``services``: real Prometheus and Alertmanager processes;
- ``object_store``: a real S3-protocol store (moto's server) for model repositories in a
  bucket (``LocalObjectStore``).
"""
