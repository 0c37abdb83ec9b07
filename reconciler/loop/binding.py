"""Which repository a state store is the record of: bound by the first pass that records,
checked by every pass before it reads the record (``loop.phases.approve`` and ``record``).

A state file holds what the reconciler placed on the servers, its holds and its history for
one repository's manifests at one folder. Read for another, the last applied revision is not
in that repository and its managed models are not that desired state's: the pass would fail
on a commit git does not know, or unload what it never placed. So it is refused, naming both
and the fix. A store from before the binding is bound by its next pass that records.
"""

from __future__ import annotations

from reconciler.model.errors import ForeignState
from reconciler.ports import StateStore


def _repository_key(location: str) -> str:
    # One repository, spelled with or without the trailing ".git" or "/" that Git hosts and
    # git itself accept alike.
    return location.rstrip("/").removesuffix(".git").rstrip("/")


def _folder(path: str) -> str:
    return path.strip("/")


def check_bound(state: StateStore, location: str, path: str, state_file: str) -> None:
    """Refuse (ForeignState) a store bound to another repository or manifest folder."""
    recorded = state.bound_source()
    if recorded is None:
        return
    repo, folder = recorded
    if (_repository_key(repo), _folder(folder)) != (_repository_key(location), _folder(path)):
        raise ForeignState(state_file, (repo, folder), (location, _folder(path)))


def bind(state: StateStore, location: str, path: str) -> None:
    """Make ``state`` the record of ``location`` at ``path`` if it is not bound yet."""
    if state.bound_source() is None:  # a read: most passes find it bound
        state.bind_source(location, _folder(path))
