"""``triton-gitops undo`` end to end (issue 15): a commit on a real bare remote over file://
that puts a ModelDeployment back to an earlier spec, its comments and the file's other
documents kept byte for byte, applied by the next pass on a real tritonserver; the dry run
pushing nothing; the refusals; and the verb through the service, refused without a token."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from reconciler.adapters.state import StateStore
from reconciler.model.settings import RunSettings, Settings
from reconciler.model.source import Source
from reconciler.service.daemon import Daemon
from testkit.cli_run import Reconciler, cli
from testkit.local_triton import LocalTriton, free_port
from testkit.manifests import ManifestRepo, git, server_doc
from tests.integration.flows import ready_versions
from tests.integration.test_webhook_hostile import http_side

# A file of two ModelDeployments, commented; echo's smoke case expects what ``factor`` gives
# (the test model multiplies by its version: version 3 fails a smoke case of factor 2).
MODELS = """\
# Models of the edge fleet. Owner: ml-platform.
apiVersion: triton-gitops/v1alpha1
kind: ModelDeployment
metadata:
  name: echo  # the echo model
spec:
  servers:
    names: [edge-a]
  # Bumped by the release train; see the runbook before changing.
  versions: [{version}]  # the version clients get
  verify:
    smoke:
      - name: doubles
        inputs:
          INPUT0: {{datatype: FP32, shape: [1, 4], data: [1, 2, 3, 4]}}
        expect:
          OUTPUT0: {{data: [{expected}], tolerance: 0.0001}}
---
# other: untouched by every test here
apiVersion: triton-gitops/v1alpha1
kind: ModelDeployment
metadata:
  name: other
spec:
  servers: {{names: [edge-a]}}
  versions: [1]   # odd spacing, kept
"""


def models(version: int, factor: int, note: str = "") -> str:
    text = MODELS.format(version=version, expected=", ".join(str(x * factor) for x in (1, 2, 3, 4)))
    return text.replace(
        "  name: echo  # the echo model\n", f"  name: echo  # the echo model\n{note}"
    )


def remote_head(manifests: ManifestRepo) -> str:
    return git(manifests.bare, "rev-parse", "main")


def remote_file(manifests: ManifestRepo, path: str) -> str:
    return git(manifests.bare, "show", f"main:{path}") + "\n"


@pytest.mark.triton
def test_undo_commits_an_earlier_spec_that_the_next_pass_applies(
    manifests: ManifestRepo, triton: LocalTriton, model_repository: Path, tmp_path: Path
) -> None:
    reconciler = Reconciler(manifests.url, tmp_path / "r")
    state = str(tmp_path / "r" / "state.db")
    undo = ("undo", *reconciler.options)
    manifests.write("servers.yaml", server_doc("edge-a", triton.grpc_address, model_repository))
    before_echo = manifests.commit("servers only")
    manifests.write("models.yaml", models(1, 1))
    rev1 = manifests.commit("echo 1")
    assert reconciler.apply().code == 0
    manifests.write("models.yaml", models(2, 2))
    rev2 = manifests.commit("echo 2")
    assert reconciler.apply().code == 0
    # Version 3 fails its smoke case: held at version 2. A comment added with it stays.
    note = "  # version 3: the new tokenizer (ML-7)\n"
    manifests.write("models.yaml", models(3, 2, note))
    manifests.commit("echo 3")
    assert reconciler.apply().code == 1
    assert "echo" in StateStore(Path(state)).history().holds

    # The dry run: a patch on stdout, nothing pushed, nothing recorded.
    head = remote_head(manifests)
    dry = cli(*undo, "echo", "--dry-run")
    assert dry.code == 0, dry.err
    assert dry.out.startswith("--- a/models.yaml\n+++ b/models.yaml\n")
    assert "-  versions: [3]  # the version clients get\n+  versions: [2]  # the version" in dry.out
    assert f"back to its spec at {rev2[:12]}: dry run, nothing pushed" in dry.err
    assert remote_head(manifests) == head

    # By default: back to the last converged spec (version 2, factor 2), by a commit on main.
    done = cli(*undo, "echo", "--as", "alice", "--reason", "incident 7")
    assert done.code == 0, done.err
    assert remote_head(manifests) != head
    assert git(manifests.bare, "rev-parse", "main~1") == head  # on top of the branch
    assert remote_file(manifests, "models.yaml") == models(2, 2, note)  # byte for byte
    message = git(manifests.bare, "log", "-1", "--format=%B", "main")
    assert message.startswith(f"Undo echo: back to its spec at {rev2[:12]}")
    assert f"Undo-revision: {rev2}" in message and "Undo-requested-by: alice" in message
    assert "Reason: incident 7" in message

    # The next pass applies it; the new fingerprint lifts the hold on version 3 by itself.
    assert reconciler.apply().code == 0
    assert StateStore(Path(state)).history().holds == {}
    assert ", 0 held," in reconciler.plan().out

    # Again: the last converged spec that differs from version 2 is version 1's; applied.
    again = cli(*undo, "echo", "--as", "bob")
    assert again.code == 0 and f"back to its spec at {rev1[:12]}" in again.out, again.err
    assert remote_file(manifests, "models.yaml") == models(1, 1, note)
    applied = reconciler.apply()
    assert applied.code == 0, applied.out
    assert ready_versions(triton, "echo") == {1}

    history = cli("history", "--state", state, "--output", "json").json()["operator_actions"]
    assert [(a["verb"], a["target"], a["by"]) for a in history] == [
        ("undo", "echo", "bob"),
        ("undo", "echo", "alice"),
    ]
    assert all(a["at"].endswith("Z") for a in history)
    assert history[1]["detail"].startswith(f"back to {rev2} by ")

    # The refusals: exit 1, naming the deployment, its file:line and the revision.
    git(manifests.work, "checkout", "--quiet", "-b", "elsewhere", rev1)
    git(manifests.work, "commit", "--quiet", "--allow-empty", "-m", "not on main")
    git(manifests.work, "push", "--quiet", "origin", "elsewhere")
    elsewhere = git(manifests.work, "rev-parse", "HEAD")
    now = remote_head(manifests)
    for args, expected in (
        (("nothing",), "no ModelDeployment named 'nothing' on branch main"),
        (("echo", "--to-revision", before_echo), f"did not exist at revision {before_echo[:12]}"),
        (("echo", "--to-revision", elsewhere), f"revision {elsewhere[:12]} is not on the tracked"),
        (("echo", "--to-revision", now[:10]), "is already the one it had at"),
        (("other",), "no earlier converged revision whose spec differs"),
        (("echo", "--to-revision", "f" * 40), f"no revision {'f' * 40!r}"),
    ):
        refused = cli(*undo, *args)
        assert refused.code == 1, (args, refused.out)
        assert expected in refused.err, (args, refused.err)
        if args[0] == "echo":
            assert "echo (models.yaml:2)" in refused.err
    assert remote_head(manifests) == now


@pytest.fixture
def operator_daemon(manifests: ManifestRepo, tmp_path: Path) -> Iterator[Daemon]:
    """The service's HTTP side in this process, with one operator token (no passes run)."""
    daemon = Daemon(
        Source(manifests.url),
        Settings(cache_dir=tmp_path / "svc-cache", state_path=tmp_path / "svc-state.db"),
        RunSettings(listen=f"127.0.0.1:{free_port()}", operator_tokens={"oncall-alice": "a" * 32}),
    )
    with http_side(daemon):
        yield daemon


def test_undo_through_the_service_needs_a_token_and_asks_for_a_pass(
    manifests: ManifestRepo, operator_daemon: Daemon, tmp_path: Path
) -> None:
    manifests.write("models.yaml", models(1, 1))
    rev1 = manifests.commit("echo 1")
    manifests.write("models.yaml", models(2, 2))
    head = manifests.commit("echo 2")
    assert operator_daemon.http is not None
    url = f"http://127.0.0.1:{operator_daemon.http.server_address[1]}"
    asked: list[str] = []
    operator_daemon.trigger = asked.append
    token = tmp_path / "token"
    token.write_text("a" * 32 + "\n")
    wrong = tmp_path / "wrong"
    wrong.write_text("b" * 32 + "\n")
    undo = ("undo", "echo", "--to-revision", rev1, "--service", url)

    for headers in ({}, {"Authorization": "Bearer " + "b" * 32}):
        request = urllib.request.Request(
            f"{url}/v1/deployments/echo/undo", b"{}", headers, method="POST"
        )
        with pytest.raises(urllib.error.HTTPError) as answer:
            urllib.request.urlopen(request, timeout=10)
        assert answer.value.code == 401
    refused = cli(*undo, "--token-file", str(wrong))
    assert refused.code == 1 and "answered 401" in refused.err
    dry = cli(*undo, "--token-file", str(token), "--dry-run")
    assert dry.code == 0, dry.err
    assert "+  versions: [1]  # the version clients get" in dry.out
    assert remote_head(manifests) == head and asked == []

    done = cli(*undo, "--token-file", str(token), "--reason", "pager 12")
    assert done.code == 0, done.err
    assert done.out.endswith("(requested)\n") and "by token:oncall-alice" in done.out
    assert remote_file(manifests, "models.yaml") == models(1, 1)
    assert "Undo-requested-by: token:oncall-alice" in git(
        manifests.bare, "log", "-1", "--format=%B", "main"
    )
    assert asked == ["undo by token:oncall-alice"]
    store = StateStore(tmp_path / "svc-state.db")
    try:
        (action,) = store.operator_actions("echo")
    finally:
        store.close()
    assert (action.verb, action.by) == ("undo", "token:oncall-alice")
    assert action.detail.endswith(": pager 12")
