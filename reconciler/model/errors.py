"""The reconciler's error tree: the loop decides what to do from these types only.

    ReconcileError                     base of everything the reconciler raises on purpose
    ├── ValidationError                manifests are wrong; permanent until the input changes
    │                                  (carries every Problem found: file, line, message)
    ├── SourceUnavailable              the Git remote or ref cannot be read (transient)
    ├── ServerUnavailable              a Triton server does not answer (transient)
    ├── RouterUnavailable              a router does not answer or refuses a change (transient)
    │   └── RouterRestarted            it restarted under a traffic phase's analysis (put
    │                                  back, not held)
    ├── DiscoveryFailed                a server's DNS name does not resolve; nothing applied
    ├── TrustedKeysError               --trusted-keys gives no keyring (configuration)
    ├── StateFileRefused               the state file cannot be used as it is; left as it is
    │   ├── ForeignState               made for another repository or manifest folder
    │   │                              (configuration: names both, the fix)
    │   ├── NewerStateFile             written by a newer triton-gitops (its schema version
    │   │                              is above this one's)
    │   └── MigrationFailed            a migration to this version's schema failed (rolled
    │                                  back: the file stays at its version)
    ├── ArtifactError                  a version folder cannot be hashed
    ├── RepositoryUnavailable          a model repository in object storage cannot be read
    │                                  (transient: its server is not observed this pass)
    ├── UndoRefused                    ``undo`` has no earlier spec to go back to, or may not
    │                                  push one (names the deployment, file:line, revision)
    ├── UnsafeRevision                 a revision refused as a whole (e.g. it would empty a
    │   │                              server that serves models); nothing is applied
    │   ├── HistoryRewritten           the branch was force-pushed, or the last applied
    │   │                              revision is not in the mirror (until --accept-rewrite)
    │   ├── UnverifiedRevision         commits not signed by a trusted key
    │   ├── NotApproved                too few approval trailers
    │   └── StalePlan                  a saved plan no longer matches the branch or servers
    └── StepFailed                     one step of a model's change failed; the model goes back
        ├── LoadFailed                 Triton refused or failed the load (its own message)
        ├── VerifyFailed               a version did not become READY or a smoke case failed
        │   ├── ProbeTimedOut          a probe got no answer within its own deadline
        │   └── StreamCut              a stream ended without its final flag
        ├── AnalysisFailed             the new versions' metrics failed the analysis
        │   ├── MetricsUnavailable     inconclusive: the metrics could not be read (not held)
        │   └── Interrupted            shutdown came during the analysis (put back, not held)
        ├── ShutdownBetweenStages      shutdown came between a rollout's stages or traffic
        │                              phases (put back, not held)
        ├── UnloadFailed               dropping old versions failed (new ones serve already)
        └── DrainTimeout               a model did not go idle: not swapped, old ones serve

Library exceptions (GitPython, tritonclient, ruamel.yaml) are re-raised as these at the
adapter boundary, ``raise ServerUnavailable(...) from exc``.

What a failed step means is carried by its error's class, as kopf's PermanentError and
TemporaryError do: ``failure`` is the ``FailureKind`` the executor records where it catches
the error. By default a step's error counts against the versions (the spec is held);
ServerUnavailable, MetricsUnavailable and UnloadFailed are transient (the next pass tries
again), Interrupted and ShutdownBetweenStages are a shutdown, DrainTimeout swapped nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from reconciler.model.analysis import Evaluation, RolloutVerdict
from reconciler.model.problems import Problem
from reconciler.model.results import FailureKind
from reconciler.model.source import CommitVerdict


class ReconcileError(Exception):
    """Base of the reconciler's own errors."""

    # What a step that failed with this error says (see the module docstring).
    failure: ClassVar[FailureKind] = FailureKind.AGAINST_VERSIONS


class ValidationError(ReconcileError):
    def __init__(self, problems: list[Problem], revision: str | None = None) -> None:
        self.problems = sorted(problems, key=lambda p: (p.file, p.line, p.message))
        self.revision = revision  # the commit the manifests were read from, if any
        super().__init__("\n".join(str(p) for p in self.problems))


class SourceUnavailable(ReconcileError):
    """The manifest source (Git URL, path or ref) cannot be read."""


class ServerUnavailable(ReconcileError):
    """A Triton server did not answer."""

    failure = FailureKind.SERVER_LOST

    def __init__(self, server: str, message: str, repository: str | None = None) -> None:
        self.server = server
        # Without the server's name: what a record that names the server already shows
        # (ServerState.error, a plan problem), so the name is said once.
        self.reason = message
        # The model repository in object storage that could not be read either (its URL,
        # credentials hidden): the likely cause, which a fix names instead of Triton.
        self.repository = repository
        super().__init__(f"server {server}: {message}")


class RouterUnavailable(ReconcileError):
    """A router (Envoy's admin API, the Kubernetes API) did not answer or refused a change:
    nothing is known against the versions."""

    failure = FailureKind.SERVER_LOST


class RouterRestarted(RouterUnavailable):
    """The router that took a traffic phase's route is not the one answering any more (it
    restarted, or another writer set the route): the analysis did not watch the share the
    phase set, so nothing is known against the versions."""


class UnsafeRevision(ReconcileError):
    """A revision that would do something no single commit should do, refused as a whole."""


class StepFailed(ReconcileError):
    """A step of one model's change on one server failed."""


class LoadFailed(StepFailed):
    pass


class VerifyFailed(StepFailed):
    pass


class ProbeTimedOut(VerifyFailed):
    """A request with a deadline of its own (an analysis's probe) got no answer in time."""


class StreamCut(VerifyFailed):
    """A stream ended without Triton's final flag, not by an error the version sent: more
    responses than its cap, or the server closing it midway."""


class AnalysisFailed(StepFailed):
    """The analysis failed the rollout; carries every evaluation made, for the record, and
    how the analysis ended (failed; aborted or interrupted for the subclasses)."""

    def __init__(
        self,
        message: str,
        evaluations: tuple[Evaluation, ...],
        verdict: RolloutVerdict = RolloutVerdict.FAILED,
    ) -> None:
        super().__init__(message)
        self.evaluations = evaluations
        self.verdict = verdict


class MetricsUnavailable(AnalysisFailed):
    """The analysis ended inconclusive because its metrics could not be read: the old
    versions go back, the spec is not held (nothing is known against the new ones)."""

    failure = FailureKind.METRICS_UNAVAILABLE


class Interrupted(AnalysisFailed):
    """Shutdown began during an analysis; the old versions go back, the spec is not held."""

    failure = FailureKind.INTERRUPTED

    def __init__(self, message: str, evaluations: tuple[Evaluation, ...]) -> None:
        super().__init__(message, evaluations, RolloutVerdict.INTERRUPTED)


class ShutdownBetweenStages(StepFailed):
    """Shutdown began between the stages of a staged rollout (or the phases of a traffic
    rollout): every server it touched goes back, the spec is not held, the next pass rolls
    out again. Nothing failed; no alert."""

    failure = FailureKind.INTERRUPTED


class Aborted(AnalysisFailed):
    """An operator's ``abort`` stopped the rollout: the old versions go back and the spec is
    held, as after a failed analysis (the operator judged the new versions)."""

    def __init__(self, message: str, evaluations: tuple[Evaluation, ...] = ()) -> None:
        super().__init__(message, evaluations, RolloutVerdict.ABORTED)


class UnloadFailed(StepFailed):
    """An unload did not go through (refused, or the versions did not go in time)."""

    failure = FailureKind.UNLOAD_FAILED


class DrainTimeout(StepFailed):
    """A model did not go idle on a server in time; nothing was swapped there."""

    failure = FailureKind.NOT_SWAPPED


class DiscoveryFailed(ReconcileError):
    """A name could not be resolved."""


class TrustedKeysError(ReconcileError):
    """The trusted-keys folder cannot be turned into a keyring (missing, empty, not keys)."""


class UnverifiedRevision(UnsafeRevision):
    """A revision refused because commits it brings are not signed by a trusted key."""

    def __init__(self, verdicts: Sequence[CommitVerdict]) -> None:
        self.verdicts = tuple(verdicts)
        failed = [v for v in self.verdicts if not v.ok]
        super().__init__(
            f"refusing revision: {len(failed)} commit(s) not signed by a trusted key: "
            + "; ".join(str(v) for v in failed)
        )


class HistoryRewritten(UnsafeRevision):
    """The tracked branch no longer descends from the last applied commit (a force-push).

    ``missing_from``: the repository, when the last applied commit is not even in the
    mirror: a force-push the mirror never saw the old history of (a fresh cache), or a
    state file that belongs to another repository. Either way the message names the
    option that accepts this head, with the sha to give it."""

    def __init__(self, old: str, new: str, *, missing_from: str | None = None) -> None:
        self.old, self.new = old, new
        self.missing = missing_from is not None
        accept = f"accept this head with --accept-rewrite {new[:12]}"
        if missing_from is None:
            why = f"it does not descend from the last applied revision {old} (a force-push)"
            fix = f"If the rewrite is intended, {accept}"
        else:
            why = (
                f"the last applied revision {old} is not in {missing_from} (a force-push whose "
                "old history this cache never held, or a state file of another repository)"
            )
            fix = (
                f"If the rewrite is intended, {accept}; if the state file is another "
                "repository's, give this repository's --state"
            )
        super().__init__(
            f"refusing revision {new}: {why}; the last applied revision keeps serving. {fix}"
        )


class StateFileRefused(ReconcileError):
    """The state file cannot be used as it is (configuration or release, not damage): it is
    neither read nor written nor moved aside, and nothing is applied."""


class ForeignState(StateFileRefused):
    """The state file records another repository or manifest folder than the one given:
    its managed models, holds and history are another desired state's."""

    def __init__(self, state_file: str, recorded: tuple[str, str], given: tuple[str, str]) -> None:
        self.state_file, self.recorded, self.given = state_file, recorded, given

        def named(repo: str, path: str) -> str:
            return f"{repo} ({f'folder {path!r}' if path else 'the whole repository'})"

        super().__init__(
            f"state file {state_file} was made for {named(*recorded)}, not for "
            f"{named(*given)}: its record (the models it placed, holds, history) is another "
            f"repository's. Give the --state that {given[0]} was reconciled with, or a new "
            "state file (--state PATH, a file that does not exist yet) to start its record "
            "afresh. (The same repository under a new URL or folder: delete the one row of "
            "the state file's table bound_source, and the next pass binds it anew.)"
        )


class NewerStateFile(StateFileRefused):
    """The state file's schema version is above the newest this triton-gitops knows: a
    newer release wrote it. Nothing is read from it or written to it."""

    def __init__(self, state_file: str, found: int, known: int) -> None:
        self.state_file, self.found, self.known = state_file, found, known
        super().__init__(
            f"state file {state_file} has schema version {found}, written by a newer "
            f"triton-gitops (this one knows versions up to {known}): it is left as it is, "
            "nothing read or changed. Run the release that wrote it or a later one; going "
            "back to an older release needs a state file of its own (a new --state PATH)"
        )


class MigrationFailed(StateFileRefused):
    """A migration of the state file to this release's schema failed; it was rolled back,
    so the file is at the version it had."""

    def __init__(self, state_file: str, at: int, to: int, summary: str, error: Exception) -> None:
        self.state_file, self.at, self.to = state_file, at, to
        super().__init__(
            f"state file {state_file}: migrating it from schema version {at} to {to} "
            f"({summary}) failed: {type(error).__name__}: {error}. It was rolled back: the "
            f"file is at version {at}, nothing changed. Report it with a copy of the file"
        )


class ArtifactError(ReconcileError):
    """A version folder cannot be hashed: missing, unreadable, or holding a special file."""


class RepositoryUnavailable(ReconcileError):
    """A model repository in object storage cannot be read: the store does not answer or
    times out, the bucket is missing, the credentials are refused. Like a server that does
    not answer, a reason to wait: the server is left unobserved (nothing is loaded or
    unloaded on it) and no spec is held."""

    def __init__(self, url: str, reason: str) -> None:
        self.url = url
        self.reason = reason
        super().__init__(f"model repository {url}: {reason}")


class UndoRefused(ReconcileError):
    """``undo`` cannot go back: an unknown deployment or revision, no earlier converged
    spec, the spec already equal, or a commit the reconciler would refuse to apply."""


class StalePlan(UnsafeRevision):
    """A saved plan no longer matches the tracked branch or the servers."""


class NotApproved(UnsafeRevision):
    """The commit lacks the approvals its trailers must record."""
