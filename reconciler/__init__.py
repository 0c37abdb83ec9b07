"""triton-gitops: a GitOps reconciler for NVIDIA Triton Inference Server.

Git holds declarative manifests (which Triton servers exist, which model versions each must
serve); one reconcile pass reads them at a commit, observes each server, computes a pure Plan
and applies it step by step: load new versions beside the old, verify, then unload the old.
"""

from __future__ import annotations

__version__ = "0.1.0"
