"""Secret files read again when they change: a Kubernetes Secret volume's ``..data`` symlink
swapped, a file rewritten in place; an empty, missing or malformed new file keeps the old
value and says so once; an unchanged file is not read again."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from reconciler.adapters.secret_files import SecretFileError, SecretFiles
from reconciler.credentials import redact
from reconciler.service.operator import parse_tokens


class SecretVolume:
    """A folder laid out as the kubelet mounts a Secret: each key a symlink to
    ``..data/<key>``, ``..data`` a symlink to a timestamped folder, swapped atomically on
    an update."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.updates = 0
        root.mkdir(parents=True)

    def write(self, values: dict[str, str]) -> None:
        self.updates += 1
        folder = self.root / f"..2026_12_01_22_00_{self.updates:02d}.000000001"
        folder.mkdir()
        for key, value in values.items():
            (folder / key).write_text(value)
            if not (self.root / key).is_symlink():
                (self.root / key).symlink_to(Path("..data") / key)
        staged = self.root / "..data_tmp"
        staged.symlink_to(folder.name)
        os.replace(staged, self.root / "..data")

    def path(self, key: str) -> Path:
        return self.root / key


OLD = {"github-secret": "old-secret-1234", "tokens": "alice: " + "a" * 20 + "\n"}


def files(volume: SecretVolume) -> SecretFiles:
    return SecretFiles(
        {"github_secret": volume.path("github-secret"), "operator_tokens": volume.path("tokens")},
        {"operator_tokens": parse_tokens},
    )


def test_a_swapped_secret_volume_is_read_again(tmp_path: Path) -> None:
    volume = SecretVolume(tmp_path / "secrets")
    volume.write(OLD)
    secrets = files(volume)
    assert secrets.current() == {
        "github_secret": "old-secret-1234",
        "operator_tokens": {"alice": "a" * 20},
    }
    volume.write({"github-secret": "new-secret-5678\n", "tokens": "alice: " + "b" * 20 + "\n"})
    assert secrets.current() == {
        "github_secret": "new-secret-5678",
        "operator_tokens": {"alice": "b" * 20},
    }
    assert redact("x new-secret-5678 " + "b" * 20) == "x *** ***"  # concealed from the logs


def test_a_file_rewritten_in_place_is_read_again_and_an_unchanged_one_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "reconcile-token"
    path.write_text("first-token-value")
    secrets = SecretFiles({"reconcile_token": path})
    reads: list[Path] = []
    read_text = Path.read_text

    def counted(self: Path, *args: object, **kwargs: object) -> str:
        reads.append(self)
        return read_text(self)

    monkeypatch.setattr(Path, "read_text", counted)
    for _ in range(3):
        assert secrets.current() == {"reconcile_token": "first-token-value"}
    assert reads == []  # a stat each time, no read
    path.write_text("second-token-value-longer")
    assert secrets.current() == {"reconcile_token": "second-token-value-longer"}
    assert reads == [path]


@pytest.mark.parametrize(
    ("new", "why"),
    [
        ({"github-secret": "", "tokens": "  \n"}, "is empty"),
        ({"github-secret": "\n", "tokens": "alice short\n"}, "cannot be read or parsed"),
    ],
)
def test_an_empty_or_bad_new_file_keeps_the_old_value_and_says_so_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, new: dict[str, str], why: str
) -> None:
    volume = SecretVolume(tmp_path / "secrets")
    volume.write(OLD)
    secrets = files(volume)
    before = secrets.current()
    volume.write(new)
    with caplog.at_level(logging.WARNING, logger="triton_gitops.secrets"):
        for _ in range(3):
            assert secrets.current() == before
    messages = [r.getMessage() for r in caplog.records]
    assert any(why in m for m in messages), messages
    assert len(messages) == 2  # one per file, not one per use
    assert all("the value read before stays in use" in m for m in messages)
    fields = [getattr(r, "fields", {}).get("file") for r in caplog.records]
    assert sorted(fields) == sorted(str(volume.path(k)) for k in ("github-secret", "tokens"))
    volume.write({"github-secret": "fixed-secret-9999", "tokens": OLD["tokens"]})
    assert secrets.current()["github_secret"] == "fixed-secret-9999"


def test_a_missing_file_keeps_the_old_value_and_a_file_missing_at_start_refuses(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "gitlab-token"
    path.write_text("gitlab-token-value")
    secrets = SecretFiles({"gitlab_token": path})
    path.unlink()
    with caplog.at_level(logging.WARNING, logger="triton_gitops.secrets"):
        assert secrets.current() == {"gitlab_token": "gitlab-token-value"}
        assert secrets.current() == {"gitlab_token": "gitlab-token-value"}
    assert [r.getMessage() for r in caplog.records] == [
        "secret file cannot be read (No such file or directory); the value read before stays in use"
    ]
    path.write_text("gitlab-token-back")
    assert secrets.current() == {"gitlab_token": "gitlab-token-back"}

    with pytest.raises(SecretFileError, match="No such file or directory"):
        SecretFiles({"gitlab_token": tmp_path / "absent"})
    bad = tmp_path / "tokens"
    bad.write_text("alice: short\n")
    with pytest.raises(SecretFileError, match=f"^{bad}:1: expected 'name: token'"):
        SecretFiles({"operator_tokens": bad}, {"operator_tokens": parse_tokens})
