"""The service asks its secret files before each use: the Git token of the next pass, the
GitLab token and the reconcile token of the next webhook follow their files (the GitHub
secret and the operator tokens are tested through a running service in
tests/integration/test_secret_rotation.py)."""

from __future__ import annotations

from pathlib import Path

from reconciler.adapters.secret_files import SecretFiles
from reconciler.model.settings import GitSettings, RunSettings, Settings
from reconciler.model.source import GitCredentials, Source
from reconciler.service.daemon import Daemon


def test_the_git_token_and_webhook_tokens_follow_their_files(tmp_path: Path) -> None:
    paths = {name: tmp_path / name for name in ("git_token", "gitlab_token", "reconcile_token")}
    for name, path in paths.items():
        path.write_text(f"{name}-before-rotation")
    settings = Settings(
        cache_dir=tmp_path / "cache",
        state_path=tmp_path / "state.db",
        git=GitSettings(credentials=GitCredentials(token="git_token-before-rotation")),
    )
    run = RunSettings(gitlab_token="gitlab_token-before-rotation")
    service = Daemon(Source("unused"), settings, run, secrets=SecretFiles(paths))
    gate = service.webhooks
    before = {"x-gitlab-token": "gitlab_token-before-rotation"}
    assert gate.verify("/webhook/gitlab", before, b"{}") == "gitlab"

    for name, path in paths.items():
        path.write_text(f"{name}-after-rotation-longer")
    assert service.settings_now().git.credentials.token == "git_token-after-rotation-longer"
    assert service.settings_now().git.fetch_timeout == settings.git.fetch_timeout  # the rest
    assert gate.verify("/webhook/gitlab", before, b"{}") is None
    after = {"x-gitlab-token": "gitlab_token-after-rotation-longer"}
    assert gate.verify("/webhook/gitlab", after, b"{}") == "gitlab"
    bearer = {"authorization": "Bearer reconcile_token-after-rotation-longer"}
    assert gate.verify("/reconcile", bearer, b"") == "token"
    assert service.run_now().interval == run.interval  # only the secrets change
