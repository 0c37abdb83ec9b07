"""Triton model configs in their JSON form: parsing config.pbtxt, merging, version policy.

Triton's load API replaces config.pbtxt with the JSON it is given, so every load carries a
whole config: the base (the loaded config, else the repository's config.pbtxt) with the
manifest's ``spec.config`` merged over it and the version policy set. Pure functions, no I/O.

The ModelConfig protobuf message (google.protobuf and tritonclient's ``model_config_pb2``) is
imported lazily, inside ``canonical`` and ``parse_pbtxt`` only (``_model_config_pb2``): the
planner and the views import this module, and importing the pure core must not load gRPC and
protobuf (this is the one function-level exception the import contract allows).
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from reconciler.model.plan import Exchange

# Fields Triton fills in or names itself when it loads a model; they say nothing about what
# the user asked for, so comparisons ignore them.
_SERVER_FILLED = {"version_policy"}


def canonical(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` in the form Triton reports it: through the ModelConfig message and back.

    Defaults drop out, int64 fields become strings, enums stay names; raises ValueError for a
    field or value the ModelConfig message does not have.
    """
    from google.protobuf import json_format

    try:
        message = json_format.ParseDict(dict(config), _model_config_pb2().ModelConfig())
    except json_format.ParseError as exc:
        raise ValueError(str(exc).splitlines()[0]) from exc
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


@functools.lru_cache(maxsize=4096)
def _canonical_of(text: str) -> dict[str, Any]:
    # Every server a ModelDeployment is placed on compares the same spec.config: canonicalise
    # it once. Callers only read the result.
    return canonical(json.loads(text))


def parse_pbtxt(text: str) -> dict[str, Any]:
    """config.pbtxt (protobuf text format) as Triton's JSON form; raises ValueError."""
    from google.protobuf import json_format, text_format

    try:
        message = text_format.Parse(text, _model_config_pb2().ModelConfig())
    except text_format.ParseError as exc:
        raise ValueError(str(exc)) from exc
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


_MODEL_CONFIG = "tritonclient.grpc.model_config_pb2"


@functools.cache
def _model_config_pb2() -> Any:
    """tritonclient's generated ``model_config_pb2`` module. Where ``tritonclient.grpc`` is
    not imported yet, the module's own file is loaded alone, registered under its name (the
    package imports it from there later): the package's ``__init__`` imports gRPC, numpy
    and ml_dtypes, 0.2 s that ``validate`` (issue 46: a pull request's check) would pay for
    a message that needs only protobuf."""
    import importlib
    import importlib.util
    import sys
    from pathlib import Path

    if "tritonclient.grpc" in sys.modules or _MODEL_CONFIG in sys.modules:
        return importlib.import_module(_MODEL_CONFIG)
    package = importlib.util.find_spec("tritonclient")
    if package is None or not package.submodule_search_locations:
        return importlib.import_module(_MODEL_CONFIG)
    path = Path(next(iter(package.submodule_search_locations)), "grpc", "model_config_pb2.py")
    spec = importlib.util.spec_from_file_location(_MODEL_CONFIG, path)
    if spec is None or spec.loader is None:
        return importlib.import_module(_MODEL_CONFIG)
    module = importlib.util.module_from_spec(spec)
    sys.modules[_MODEL_CONFIG] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[_MODEL_CONFIG]
        raise
    return module


def merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """``override`` over ``base``: objects merge key by key; lists and scalars replace. The
    result shares nothing with either."""
    merged: dict[str, Any] = {key: _copied(value) for key, value in base.items()}
    for key, value in override.items():
        if isinstance(value, dict | Mapping) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = _copied(value)
    return merged


def merged_when_asked(
    base: Mapping[str, Any], config: Mapping[str, Any]
) -> Callable[[], Mapping[str, Any]]:
    """``merge(base, config)``, made on the first call and kept for the next. A closure, not
    ``functools.cache``: it is made for every pair a plan sees (100,000 in a fleet), and
    ``cache`` costs ten times as much to make (2.7 against 0.27 us here)."""
    merged: list[Mapping[str, Any]] = []

    def declared() -> Mapping[str, Any]:
        if not merged:
            merged.append(merge(base, config))
        return merged[0]

    return declared


def _copied(value: Any) -> Any:
    """A copy of a config's JSON values (mappings, lists, text, numbers). copy.deepcopy was
    two thirds of planning a fleet's in-sync pairs, for its memo and dispatch (issue 46)."""
    kind = type(value)
    if kind is str or kind is int or kind is float or kind is bool or value is None:
        return value  # most of a config: checked first, and without the ABCs' cost
    if isinstance(value, dict | Mapping):
        return {key: _copied(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_copied(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_copied(item) for item in value)
    return value


def with_versions(config: Mapping[str, Any], model: str, versions: Iterable[int]) -> dict[str, Any]:
    """The whole config to load ``model`` with exactly ``versions``."""
    result = copy.deepcopy(dict(config))
    result["name"] = model
    result["version_policy"] = {"specific": {"versions": sorted(set(versions))}}
    return result


def _same(wanted: Any, actual: Any) -> bool:
    # Triton's JSON renders int64 fields (dims, sizes) as strings: compare by text.
    if type(wanted) is str and type(actual) is str:
        return wanted == actual  # the commonest pair, without the ABCs' checks below
    if isinstance(wanted, dict | Mapping):
        return isinstance(actual, Mapping) and all(
            _same(v, actual.get(k)) for k, v in wanted.items()
        )
    if isinstance(wanted, list):
        return (
            isinstance(actual, list)
            and len(wanted) == len(actual)
            and all(_same(w, a) for w, a in zip(wanted, actual, strict=True))
        )
    if isinstance(wanted, bool) or isinstance(actual, bool):
        return bool(wanted == actual)
    return bool(wanted == actual) or str(wanted) == str(actual)


def config_drift(wanted: Mapping[str, Any], loaded: Mapping[str, Any]) -> list[str]:
    """Top-level keys of ``wanted`` (the manifest's spec.config) that ``loaded`` does not match.

    Both sides are compared in Triton's reported form; what the server fills in itself (an
    instance group's name, say) is not drift. A key whose wanted value is the default counts
    as matching when the loaded config leaves it out too.
    """
    try:
        normal = _canonical_of(json.dumps(wanted, sort_keys=True))
    except ValueError:
        return sorted(k for k in wanted if k not in _SERVER_FILLED)  # validation reports it
    drift = []
    for key in wanted:
        if key in _SERVER_FILLED:
            continue
        if key in normal:
            if not _same(normal[key], loaded.get(key)):
                drift.append(key)
        elif key in loaded and canonical({key: loaded[key]}):
            drift.append(key)
    return sorted(drift)


class DriftMemo:
    """``config_drift`` for the (spec.config, loaded config) pairs of one plan, each pair of
    objects compared once: the servers of a pool share one loaded config object per model
    (the Triton adapter converts each distinct answer once, the config memory recalls one
    object per digest), so a fleet's 100,000 pairs are about 100 comparisons (issue 46). One
    per plan: it keeps the objects it has seen, so that their ids are not reused while it
    lives, and nothing changes a config while a plan is made."""

    def __init__(self) -> None:
        self._seen: dict[tuple[int, int], tuple[object, object, tuple[str, ...]]] = {}

    def __call__(self, wanted: Mapping[str, Any], loaded: Mapping[str, Any]) -> list[str]:
        key = (id(wanted), id(loaded))
        seen = self._seen.get(key)
        if seen is None:
            seen = (wanted, loaded, tuple(config_drift(wanted, loaded)))
            self._seen[key] = seen
        return list(seen[2])


def is_complete(config: Mapping[str, Any]) -> bool:
    return "backend" in config or "platform" in config


# A parameter of the reconciler's own in a loaded config: a reload in place of versions that
# stopped answering (a Python stub that died) sends the config with this value one higher.
# Triton reloads a model only when its config changed (the same config again returns at once
# and heals nothing), loading the new instances beside the old and swapping them in when
# READY. It is left out wherever a loaded config is compared or built on.
HEAL_MARKER = "triton-gitops-reload"


def heal_generation(config: Mapping[str, Any] | None) -> int:
    """How many reloads in place the loaded ``config`` has been through (0: none)."""
    value = ((config or {}).get("parameters") or {}).get(HEAL_MARKER, {})
    try:
        return int(value.get("string_value", 0)) if isinstance(value, Mapping) else 0
    except ValueError:
        return 0


def without_heal_marker(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """``config`` without the reload marker (itself when it has none)."""
    parameters = config.get("parameters")
    if not isinstance(parameters, Mapping) or HEAL_MARKER not in parameters:
        return config
    rest = {k: v for k, v in parameters.items() if k != HEAL_MARKER}
    stripped = {k: v for k, v in config.items() if k != "parameters"}
    return {**stripped, "parameters": rest} if rest else stripped


def with_heal_marker(config: Mapping[str, Any], generation: int) -> dict[str, Any]:
    """``config`` with the reload marker at ``generation``."""
    parameters = dict(config.get("parameters") or {})
    parameters[HEAL_MARKER] = {"string_value": str(generation)}
    return {**config, "parameters": parameters}


def streams(config: Mapping[str, Any] | None) -> bool:
    """Whether a model with ``config`` answers by streams (``model_transaction_policy {
    decoupled: true }``): it takes gRPC ModelStreamInfer only, a unary call is refused
    (UNIMPLEMENTED). The config is the live one where the model is loaded: the vLLM backend
    sets the policy in its auto-complete, TensorRT-LLM's LLM API model outside config.pbtxt."""
    policy = (config or {}).get("model_transaction_policy")
    return isinstance(policy, Mapping) and policy.get("decoupled") in (True, "true")


def in_sequences(config: Mapping[str, Any] | None) -> bool:
    """Whether a model with ``config`` keeps state per sequence (``sequence_batching``):
    Triton refuses a request to it that names no sequence (correlation ID)."""
    return "sequence_batching" in (config or {})


def exchange_of(config: Mapping[str, Any] | None) -> Exchange:
    """How a question is put to a model with ``config`` (``model.plan.Exchange.of``)."""
    return Exchange.of(streams(config), in_sequences(config))
