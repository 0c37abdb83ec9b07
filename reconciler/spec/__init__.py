"""Manifests: the user-facing ``triton-gitops/v1alpha1`` kinds, as typed read-only values.

``load_desired_state`` turns manifest files into a ``DesiredState`` or raises a
``ValidationError`` listing every problem as FILE:LINE: message.
"""

from reconciler.spec.load import API_VERSION, load_desired_state, manifest_files_in
from reconciler.spec.model import (
    DesiredState,
    Expectation,
    ModelDeployment,
    Placement,
    SmokeCase,
    Tensor,
    TritonServer,
)

__all__ = [
    "API_VERSION",
    "DesiredState",
    "Expectation",
    "ModelDeployment",
    "Placement",
    "SmokeCase",
    "Tensor",
    "TritonServer",
    "load_desired_state",
    "manifest_files_in",
]
