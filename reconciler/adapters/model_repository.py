"""Read a TritonServer's model repository (``spec.modelRepository``): a model's config.pbtxt,
its version folders and their digests, from a local folder or from object storage
(``object_repository.py``), one interface for both.

Used when a TritonServer declares ``spec.modelRepository``: the base config for loads comes
from here when the model is not loaded, desired versions the repository does not hold are
plan errors instead of failed loads, and pinned digests are checked before any load.
A repository in object storage is opened once per process (``opened``), so what was parsed
and hashed is kept between passes.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from pathlib import Path

from reconciler.adapters.artifacts import tree_digest
from reconciler.adapters.artifacts import version_digests as folder_digests
from reconciler.adapters.object_repository import ObjectRepository, open_store
from reconciler.core.triton_config import parse_pbtxt
from reconciler.model.errors import ArtifactError, RepositoryUnavailable
from reconciler.model.repository import RepositoryModel, parse_repository

_OPENED: dict[str, ObjectRepository] = {}
_OPENING = threading.Lock()


def opened(repository: str) -> ObjectRepository | None:
    """The process's reader of ``repository`` when it is in object storage, else None.
    Raises RepositoryUnavailable when its store's file system is not installed."""
    location = parse_repository(repository)  # validated with the manifests
    if not location.remote:
        return None
    with _OPENING:
        if repository not in _OPENED:
            _OPENED[repository] = open_store(location)
        return _OPENED[repository]


def store_trouble(repository: str) -> RepositoryUnavailable | None:
    """Why ``repository``'s store cannot be read now (one listing of its root), or None: it
    answers, or the repository is a local folder (the reconciler's view of a folder says
    nothing of the server's), or the reconciler has no client for the store."""
    try:
        store = opened(repository)
    except (RepositoryUnavailable, ValueError):
        return None
    return None if store is None else store.unreadable()


def read_model(repository: str, model: str) -> RepositoryModel:
    """The model's config.pbtxt (or why it does not parse) and version numbers in the
    repository. Raises RepositoryUnavailable for a store that cannot be read."""
    store = opened(repository)
    if store is not None:
        return store.read_model(model)
    folder = Path(repository) / model
    if "/" in model or model in (".", "..") or not folder.is_dir():
        return RepositoryModel(None, None)
    versions = frozenset(
        int(child.name) for child in folder.iterdir() if child.is_dir() and child.name.isdigit()
    )
    config_file = folder / "config.pbtxt"
    if not config_file.is_file():
        return RepositoryModel(None, versions)
    try:
        return RepositoryModel(parse_pbtxt(config_file.read_text()), versions)
    except ValueError as exc:
        # The plan refuses to load new versions of it (core/plan/changes.py), naming the file.
        return RepositoryModel(None, versions, f"{config_file} does not parse: {exc}")


def version_digests(repository: str, model: str, versions: Iterable[int]) -> dict[int, str | None]:
    """The digest of each of ``model``'s version folders (``artifacts.py``'s contract); None
    for a version the repository does not hold. Raises ArtifactError for a local folder that
    cannot be hashed, RepositoryUnavailable for a store that cannot be read."""
    store = opened(repository)
    if store is not None:
        return store.version_digests(model, versions)
    return folder_digests(repository, model, versions)


def folder_digest(folder: str) -> str:
    """The digest of one version folder: a local path, or a URL in the repository's
    spelling ending in ``/MODEL/VERSION`` (``s3://bucket/models/echo/3``), hashed from the
    objects in the store. Raises ArtifactError, RepositoryUnavailable."""
    location = parse_repository(folder)
    if not location.remote:
        return tree_digest(Path(folder))
    root, model, version = location.text.rstrip("/").rsplit("/", 2)
    store = opened(root) if len(location.prefix.split("/")) >= 2 else None
    if store is None or not version.isdigit():
        raise ArtifactError(f"cannot hash {folder}: it does not end in /MODEL/VERSION")
    found = store.version_digests(model, [int(version)])[int(version)]
    if found is None:
        raise ArtifactError(f"cannot hash {folder}: no object under it")
    return found
