"""triton-gitops: a GitOps reconciler for NVIDIA Triton Inference Server.

Git holds declarative manifests (which Triton servers exist, which model versions each must
serve); one reconcile pass reads them at a commit, observes each server, computes a pure Plan
and applies it step by step: load new versions beside the old, verify, then unload the old.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

# The version is written once, in pyproject.toml; the installed package's metadata carries it.
try:
    __version__ = version("triton-gitops")
except PackageNotFoundError:  # run from a checkout that was never installed
    __version__ = "unknown"
