"""Manifests: files to a validated ``DesiredState``, every problem as
FILE:LINE: message; and text edits that put a ModelDeployment back (revert commits).
"""

from __future__ import annotations

from reconciler.core.spec.desired import load_desired_state
from reconciler.core.spec.schema import API_VERSION

__all__ = ["API_VERSION", "load_desired_state"]
