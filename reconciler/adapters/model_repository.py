"""Read a Triton model repository folder: a model's config.pbtxt and its version folders.

Used when a TritonServer declares ``spec.modelRepository``: the base config for loads comes
from here when the model is not loaded, and desired versions the folder does not hold are
plan errors instead of failed loads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reconciler.core.triton_config import parse_pbtxt


def read_model(repository: str, model: str) -> tuple[dict[str, Any] | None, frozenset[int] | None]:
    """(config as JSON or None, version numbers present or None when the folder is missing)."""
    folder = Path(repository) / model
    if "/" in model or model in (".", "..") or not folder.is_dir():
        return None, None
    versions = frozenset(
        int(child.name) for child in folder.iterdir() if child.is_dir() and child.name.isdigit()
    )
    config_file = folder / "config.pbtxt"
    if not config_file.is_file():
        return None, versions
    try:
        return parse_pbtxt(config_file.read_text()), versions
    except ValueError:
        # A broken config.pbtxt is Triton's to report on load; the plan falls back to
        # the loaded config or spec.config.
        return None, versions
