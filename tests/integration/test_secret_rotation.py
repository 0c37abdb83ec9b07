"""Secrets that rotate, with the service as a subprocess: its webhook secret and operator
tokens come from a folder laid out as the kubelet mounts a Secret, and the Secret is updated
(the ``..data`` symlink swapped) while it runs. A delivery signed with the new secret is
accepted and one signed with the old refused, the new operator token answers and the old
does not, without a restart; an update that empties the files keeps the values in use.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

from testkit.service_process import Service
from tests.adapters.test_secret_files import SecretVolume
from tests.integration.test_daemon import service_process
from tests.integration.test_one_reconciler import FAST, mute_server, repo

__all__ = ["mute_server", "repo"]  # fixtures, used by name

OLD_SECRET, NEW_SECRET = "webhook-secret-before-rotation", "webhook-secret-after-rotation"
OLD_TOKEN, NEW_TOKEN = "oncall-token-before-" + "1" * 12, "oncall-token-after-" + "2" * 12


def last_pass(service: Service, token: str) -> int:
    """The status of GET /v1/passes/last with an operator token."""
    request = urllib.request.Request(
        service.url + "/v1/passes/last", headers={"Authorization": f"Bearer {token}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_a_rotated_webhook_secret_and_operator_token_take_effect_without_a_restart(
    repo: str, tmp_path: Path
) -> None:
    volume = SecretVolume(tmp_path / "secrets")
    volume.write({"github-secret": OLD_SECRET, "operator-tokens": f"oncall: {OLD_TOKEN}\n"})
    files = (
        "--github-secret-file", str(volume.path("github-secret")),
        "--operator-tokens-file", str(volume.path("operator-tokens")),
    )  # fmt: skip
    service = service_process(repo, tmp_path / "service", files + FAST).start()
    try:
        pid = service.pid
        assert service.github_push("1" * 40, secret=OLD_SECRET) == 202
        assert last_pass(service, OLD_TOKEN) == 200

        volume.write({"github-secret": NEW_SECRET, "operator-tokens": f"oncall: {NEW_TOKEN}\n"})
        assert service.github_push("2" * 40, secret=NEW_SECRET) == 202
        assert service.github_push("3" * 40, secret=OLD_SECRET) == 401
        assert last_pass(service, NEW_TOKEN) == 200
        assert last_pass(service, OLD_TOKEN) == 401

        # An update that leaves the files empty: the values in use stay, and the log says
        # so once per file, naming it.
        volume.write({"github-secret": "", "operator-tokens": ""})
        assert service.github_push("4" * 40, secret=NEW_SECRET) == 202
        assert last_pass(service, NEW_TOKEN) == 200
        kept = [e for e in service.events() if "stays in use" in str(e.get("message"))]
        assert sorted(e["file"] for e in kept) == sorted(
            str(volume.path(key)) for key in ("github-secret", "operator-tokens")
        )
        assert service.pid == pid and service.process is not None
        assert service.process.poll() is None  # the same process throughout
    finally:
        service.stop()
    log = service.log.read_text()
    for value in (OLD_SECRET, NEW_SECRET, OLD_TOKEN, NEW_TOKEN):
        assert value not in log
