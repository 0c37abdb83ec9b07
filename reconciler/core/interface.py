"""What clients of a model see in its config: inputs and outputs (names, datatypes, dims) and
whether requests carry a batch dimension.

Two readings of it. ``config_interface`` is the planner's (``core/plan/changes.py``): the
interface Triton's model metadata reports for a model loaded with a whole config, so the config
about to be sent can be compared with the one the serving versions run before anything is
loaded (Triton applies a config to the whole model: the serving versions would answer with the
new one at once). It reads as ``ModelInterface``, the form the executor's after-load check
compares, so both name a difference alike. ``interface_changes`` is the reviewers' diff
(``core/review_diff.py``), which also reads partial ``spec.config``s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reconciler.model.serving import ModelInterface, TensorSignature

INTERFACE_KEYS = ("input", "output")
# Everything of a config that the interface depends on: the tensors, and max_batch_size,
# which decides whether every tensor has a batch dimension.
INTERFACE_FIELDS = (*INTERFACE_KEYS, "max_batch_size")


def _dims(tensor: Mapping[str, Any]) -> str:
    return "[" + ", ".join(str(d) for d in tensor.get("dims", [])) + "]"


def _tensor(tensor: Mapping[str, Any]) -> str:
    datatype = str(tensor.get("data_type", "TYPE_INVALID")).removeprefix("TYPE_")
    return f"{tensor.get('name', '?')} {datatype} {_dims(tensor)}"


def _tensors(config: Mapping[str, Any], key: str) -> dict[str, Mapping[str, Any]]:
    entries = config.get(key) or []
    # Anything but a list of objects is a validation problem, reported there.
    return {str(t.get("name", "?")): t for t in entries if isinstance(t, Mapping)}


def _signature(tensor: Mapping[str, Any], batched: bool) -> TensorSignature:
    # As Triton's model metadata gives it: the datatype without TYPE_ (TYPE_STRING is
    # BYTES there), a leading -1 for the batch dimension, int64 dims as numbers (the
    # reported config renders them as strings).
    datatype = str(tensor.get("data_type", "TYPE_INVALID")).removeprefix("TYPE_")
    shape = tuple(int(d) for d in tensor.get("dims", []))
    return TensorSignature(
        str(tensor.get("name", "?")),
        "BYTES" if datatype == "STRING" else datatype,
        ((-1,) if batched else ()) + shape,
    )


def config_interface(config: Mapping[str, Any]) -> ModelInterface | None:
    """The inputs and outputs Triton's model metadata reports for a model loaded with the whole
    ``config`` (a missing list means none, a missing ``max_batch_size`` 0, as in the config
    Triton reports); None when a dim or max_batch_size is not a number (validation reports
    that, and the after-load check still reads the real interface)."""
    try:
        batched = int(config.get("max_batch_size", 0) or 0) > 0
        return ModelInterface(
            tuple(_signature(t, batched) for t in _tensors(config, "input").values()),
            tuple(_signature(t, batched) for t in _tensors(config, "output").values()),
        )
    except (TypeError, ValueError):
        return None


def interface_part(config: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of ``config`` the interface depends on (``INTERFACE_FIELDS``), those it has."""
    return {key: config[key] for key in INTERFACE_FIELDS if key in config}


def interface_changes(
    old: Mapping[str, Any], new: Mapping[str, Any], *, whole: bool
) -> tuple[str, ...]:
    """How the inputs and outputs clients see differ between two configs.

    ``whole``: both are complete configs (as loaded), so a missing list means none and a missing
    ``max_batch_size`` means 0. Otherwise they are ``spec.config``s, where a missing key means
    "from the base config", which a diff cannot see.
    """
    found: list[str] = []
    for key in INTERFACE_KEYS:
        if not whole and (key in old) != (key in new):
            if key in new:
                listed = ", ".join(_tensor(t) for t in _tensors(new, key).values()) or "none"
                found.append(
                    f"{key} now declared in spec.config ({listed}); before, it came from the "
                    "base config, which this diff does not see"
                )
            else:
                listed = ", ".join(_tensor(t) for t in _tensors(old, key).values()) or "none"
                found.append(
                    f"{key} no longer declared in spec.config (was {listed}): where the model "
                    "is loaded it keeps these; a first load takes config.pbtxt's"
                )
            continue
        before, after = _tensors(old, key), _tensors(new, key)
        for name in sorted(set(before) | set(after)):
            if name not in after:
                found.append(f"{key} {_tensor(before[name])} removed")
            elif name not in before:
                found.append(f"{key} {_tensor(after[name])} added")
            else:
                was, now = _tensor(before[name]), _tensor(after[name])
                if was != now:
                    found.append(f"{key} {was} -> {now.removeprefix(name + ' ')}")
    if whole or ("max_batch_size" in old and "max_batch_size" in new):
        was_batched = int(old.get("max_batch_size", 0) or 0) > 0
        now_batched = int(new.get("max_batch_size", 0) or 0) > 0
        if was_batched != now_batched:
            found.append(
                "max_batch_size "
                + (
                    "becomes 0: inputs and outputs lose their batch dimension"
                    if was_batched
                    else "becomes non-zero: every input and output gains a batch dimension"
                )
            )
    return tuple(found)
