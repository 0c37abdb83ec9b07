"""Secrets never leave the process: Git tokens, SSH keys, webhook secrets, bearer tokens and
credentials in URLs are planted with unique values, a full flow runs (validate, plan, apply, a
failed load alerting a real Alertmanager, status, history, the service with good and bad
webhooks, passes failing on unreachable remotes), and every output is searched for them:
stdout and stderr, JSON log lines, the SQLite state (and its -wal), the saved plan, the
alerts Alertmanager holds, and every file in the Git caches.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import socket
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from reconciler.adapters.git import GitWriter
from reconciler.adapters.logs import JsonLogFormatter
from reconciler.model.errors import SourceUnavailable
from reconciler.model.settings import GitSettings, RunSettings, Settings
from reconciler.model.source import GitCredentials, RevertEdit, Source
from reconciler.service.daemon import Daemon
from testkit.cli_run import CliRun, Reconciler, cli
from testkit.local_triton import LocalTriton
from testkit.manifests import ManifestRepo, deployment_doc, server_doc
from testkit.service_process import wait_until
from testkit.services import Alertmanager
from tests.integration.flows import ready_versions
from tests.integration.test_daemon import service_process


@dataclass
class Planted:
    """Unique secret values, and every form in which one could travel (basic auth)."""

    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:12])

    def __post_init__(self) -> None:
        t = self.tag
        self.git_token = f"gittoken-{t}"
        self.ssh_key = f"sshkey-{t}"
        self.github_secret = f"ghsecret-{t}"
        self.gitlab_token = f"gltoken-{t}"
        self.bearer = f"bearer-{t}"
        self.url_password = f"urlpass-{t}"
        self.alertmanager_password = f"ampass-{t}"

    def forms(self) -> dict[str, bytes]:
        plain = {
            "git token": self.git_token,
            "ssh key": self.ssh_key,
            "github secret": self.github_secret,
            "gitlab token": self.gitlab_token,
            "bearer token": self.bearer,
            "URL password": self.url_password,
            "Alertmanager password": self.alertmanager_password,
        }
        basic = {
            "git token as basic auth": f"x-access-token:{self.git_token}",
            "URL password as basic auth": f"deploy:{self.url_password}",
            "Alertmanager password as basic auth": f"am:{self.alertmanager_password}",
        }
        forms = {name: value.encode() for name, value in plain.items()}
        forms.update({name: base64.b64encode(v.encode()) for name, v in basic.items()})
        return forms


class Outputs:
    """Everything the reconciler said or wrote, by where it came from."""

    def __init__(self) -> None:
        self.items: list[tuple[str, bytes]] = []

    def add(self, where: str, data: str | bytes) -> None:
        self.items.append((where, data.encode() if isinstance(data, str) else data))

    def add_files(self, root: Path) -> None:
        for path in sorted(root.rglob("*")):
            if path.is_file():
                self.add(str(path.relative_to(root)), path.read_bytes())

    def leaks(self, forms: dict[str, bytes]) -> list[str]:
        return [
            f"{name} in {where}"
            for where, data in self.items
            for name, value in forms.items()
            if value in data
        ]


def closed_port() -> int:
    """A loopback port nothing listens on (taken and released at once)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def planted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Planted:
    secrets = Planted()
    monkeypatch.setenv("TRITON_GITOPS_GIT_TOKEN", secrets.git_token)  # the CLI and the service
    monkeypatch.setenv("TRITON_GITOPS_RECONCILE_TOKEN", secrets.bearer)
    files = tmp_path / "secrets"
    files.mkdir()
    key = files / "id_ed25519"
    key.write_text(
        f"-----BEGIN OPENSSH PRIVATE KEY-----\n{secrets.ssh_key}\n"
        "-----END OPENSSH PRIVATE KEY-----\n"
    )
    key.chmod(0o600)
    (files / "github").write_text(secrets.github_secret)
    (files / "gitlab").write_text(secrets.gitlab_token)
    (files / "bearer").write_text(secrets.bearer)
    return secrets


def raw_request(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        conn.sendall(request)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    return answer


def test_no_planted_secret_appears_in_any_output(
    planted: Planted,
    manifests: ManifestRepo,
    triton: LocalTriton,
    model_repository: Path,
    alertmanager: Alertmanager,
    tmp_path: Path,
) -> None:
    files = tmp_path / "secrets"
    work = tmp_path / "reconciler"
    outputs = Outputs()
    alertmanager_url = alertmanager.url.replace("://", f"://am:{planted.alertmanager_password}@", 1)
    common = (
        "--git-ssh-key", str(files / "id_ed25519"),
        "--alertmanager-url", alertmanager_url,
    )  # fmt: skip
    reconciler = Reconciler(manifests.url, work)

    def record(what: str, run: CliRun) -> None:
        outputs.add(f"{what} stdout", run.out)
        outputs.add(f"{what} stderr", run.err)

    # validate, plan, apply: version 9 fails to load, which alerts Alertmanager.
    manifests.write("servers.yaml", server_doc("edge-a", triton.grpc_address, model_repository))
    manifests.write("echo.yaml", deployment_doc("echo", [9], ["edge-a"]))
    manifests.commit("echo 9, which cannot load")
    validated = cli("validate", str(manifests.work))
    assert validated.code == 0, validated.err
    record("validate", validated)
    saved = work / "plan.json"
    planned = reconciler.plan("--output", "json", "--out", str(saved), *common)
    assert planned.code == 2, planned.err
    record("plan", planned)
    outputs.add("saved plan", saved.read_bytes())
    applied = reconciler.apply("--output", "json", *common)
    assert applied.code == 1, applied.out  # the load failed
    record("apply", applied)
    wait_until(
        lambda: any(a["labels"].get("model") == "echo" for a in alertmanager.alerts()),
        30,
        "the failed load is alerted",
    )
    status = cli("status", *reconciler.options, "--output", "json", *common)
    assert status.code == 0, status.err
    record("status", status)
    for output in ("text", "json"):
        history = cli("history", "--state", str(work / "state.db"), "--output", output)
        assert history.code == 0 and "echo" in history.out
        record(f"history {output}", history)

    # The service: a good push, bad webhooks of every kind, then a pass serving echo 1.
    manifests.write("echo.yaml", deployment_doc("echo", [1], ["edge-a"]))
    manifests.commit("echo 1")
    service = service_process(
        manifests.url,
        tmp_path / "service",
        (
            *common,
            "--github-secret-file", str(files / "github"),
            "--gitlab-token-file", str(files / "gitlab"),
            "--reconcile-token-file", str(files / "bearer"),
        ),
    ).start()  # fmt: skip
    try:
        wait_until(lambda: ready_versions(triton, "echo") == {1}, 60, "the service's pass")
        body = b'{"ref": "refs/heads/main"}'
        good = hmac.new(planted.github_secret.encode(), body, hashlib.sha256).hexdigest()
        wrong = "sha256=" + hmac.new(b"wrong", body, hashlib.sha256).hexdigest()
        assert service.post("/webhook/github", body, {"X-Hub-Signature-256": wrong}) == 401
        assert service.post("/webhook/gitlab", body, {"X-Gitlab-Token": "wrong"}) == 401
        assert service.post("/reconcile", body, {"Authorization": "Bearer wrong"}) == 401
        # A client that puts a real secret where it does not belong.
        assert service.post("/reconcile", body, {"X-Gitlab-Token": planted.bearer}) == 401
        answer = raw_request(
            service.port, f"POST /reconcile {planted.bearer} HTTP/1.1\r\n\r\n".encode()
        )
        # http.server answers this itself (400); its own messages quote the request line.
        assert answer.startswith(b"HTTP/1.0 400") and planted.bearer.encode() not in answer
        assert service.post(f"/reconcile?token={planted.bearer}", body, {}) == 404
        signed = {"X-Hub-Signature-256": f"sha256={good}"}
        assert service.post("/webhook/github", body, signed) == 202
        bearer = {"Authorization": f"Bearer {planted.bearer}"}
        assert service.post("/reconcile", b"", bearer) == 202
        wait_until(lambda: service.passes() >= 2, 60, "a pass the webhooks asked for")
        outputs.add("service /metrics", service.get("/metrics")[1])
        outputs.add("service /readyz", service.get("/readyz")[1])
    finally:
        assert service.stop() == 0
    assert any(e.get("message") == "webhook refused" for e in service.events())

    # Passes that fail on unreachable remotes: HTTPS with a password in the URL, and SSH.
    https = f"https://deploy:{planted.url_password}@127.0.0.1:{closed_port()}/x.git"
    ssh = f"ssh://git@127.0.0.1:{closed_port()}/x.git"
    for name, url in (("https", https), ("ssh", ssh)):
        broken = Reconciler(url, work)
        failed = broken.apply(*common)
        assert failed.code == 1 and "cannot fetch" in failed.err, failed.err
        record(f"apply {name} remote", failed)
    down = service_process(https, tmp_path / "service-down", common).start()
    try:
        wait_until(
            lambda: any(e.get("result") == "source-unavailable" for e in down.events()),
            60,
            "the service reports the unreachable remote",
        )
    finally:
        assert down.stop() == 0

    # Everything written: logs, state stores (with -wal and -shm), Git caches, saved plan.
    outputs.add("alertmanager alerts", json.dumps(alertmanager.alerts()))
    assert (work / "state.db").exists() and (tmp_path / "service" / "state.db").exists()
    assert any((work / "cache").rglob("config"))
    outputs.add_files(tmp_path / "service")
    outputs.add_files(tmp_path / "service-down")
    outputs.add_files(work)
    # Not a vacuous search: the state stores, logs and Git caches were all collected.
    collected = [where for where, _ in outputs.items]
    for expected in ("state.db", "reconciler.log", "repos/", "alertmanager alerts"):
        assert any(expected in where for where in collected), expected
    assert outputs.leaks(planted.forms()) == []


def test_revert_checkout_keeps_url_credentials_off_disk(tmp_path: Path) -> None:
    password = f"writer-{uuid.uuid4().hex[:12]}"
    url = f"https://deploy:{password}@127.0.0.1:{closed_port()}/x.git"
    writer = GitWriter(url, tmp_path / "cache", "triton-gitops <t@localhost>")
    edit = RevertEdit("echo", "echo.yaml", "fingerprint", (1,), None)
    with pytest.raises(SourceUnavailable) as failure:
        writer.push_revert("main", (edit,), "revert")
    assert password not in str(failure.value)
    written = [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert any(p.name == "config" for p in written)
    assert [p for p in written if password.encode() in p.read_bytes()] == []


def test_the_search_finds_a_planted_secret(planted: Planted, tmp_path: Path) -> None:
    """The leak search itself can fail: a file holding a basic-auth form is found."""
    (tmp_path / "out").mkdir()
    leaked = base64.b64encode(f"x-access-token:{planted.git_token}".encode())
    (tmp_path / "out" / "state.db-wal").write_bytes(b"\x00" + leaked + b"\x00")
    outputs = Outputs()
    outputs.add_files(tmp_path / "out")
    assert outputs.leaks(planted.forms()) == ["git token as basic auth in state.db-wal"]


def test_the_service_hides_the_secrets_it_was_given_from_every_log_line(tmp_path: Path) -> None:
    """Defence in depth: a secret reaching a message by an unforeseen path is still hidden."""
    secret = f"hook-{uuid.uuid4().hex[:12]}"
    token = f"gittoken-{uuid.uuid4().hex[:12]}"
    Daemon(
        Source("file:///nowhere"),
        Settings(
            tmp_path / "cache",
            tmp_path / "state.db",
            git=GitSettings(credentials=GitCredentials(token)),
        ),
        RunSettings(github_secret=secret),
    )
    record = logging.LogRecord("t", logging.ERROR, __file__, 1, "got %s", (secret,), None)
    record.fields = {"error": f"git said {token}"}
    line = JsonLogFormatter().format(record)
    assert secret not in line and token not in line
    assert json.loads(line)["message"] == "got ***"
