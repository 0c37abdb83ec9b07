"""A real Google Cloud Storage protocol server on loopback, for model repositories in ``gs://``.

``LocalGcsStore`` runs PyPI's ``gcp-storage-emulator`` (in memory) on a free 127.0.0.1 port
in its own process group, and ends it by its pid. What a client needs to reach it and nothing
else (checked with tritonserver 2.51 and gcsfs, /work/shared/object-storage.md), given by
``environment()``:

- ``STORAGE_EMULATOR_HOST`` (gcsfs and Google's libraries) and
  ``CLOUD_STORAGE_EMULATOR_ENDPOINT`` (Triton's GCS client): the emulator's address;
- ``GCE_METADATA_ROOT`` / ``GCE_METADATA_HOST`` on a closed loopback port and
  ``NO_GCE_CHECK=true``: the credential lookups find no metadata server and go on without
  credentials, and never leave loopback;
- ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false``: without it gcsfs waits 60 s per bucket for a
  hierarchical-namespace check the emulator does not answer (gcsfs reads it when it is
  imported: a process must have it before its first ``import gcsfs``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testkit.local_triton import end_process_group, free_port
from testkit.object_store import ObjectStoreError


@dataclass
class LocalGcsStore:
    """gcp-storage-emulator in its own process group on a loopback port."""

    host: str = "127.0.0.1"
    port: int = 0
    log_file: Path | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def environment(self) -> dict[str, str]:
        closed = f"{self.host}:9"  # discard's port: nothing listens on loopback
        return {
            "STORAGE_EMULATOR_HOST": self.endpoint,
            "CLOUD_STORAGE_EMULATOR_ENDPOINT": self.endpoint,
            "GCE_METADATA_ROOT": closed,
            "GCE_METADATA_HOST": closed,
            "NO_GCE_CHECK": "true",
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
        }

    def start(self, ready_timeout: float = 30.0) -> LocalGcsStore:
        if self.process is not None:
            return self
        if not self.port:
            self.port = free_port(self.host)
        if self.log_file is None:
            self.log_file = Path(tempfile.mkstemp(prefix="gcs-emulator-", suffix=".log")[1])
        emulator = Path(sys.executable).parent / "gcp-storage-emulator"
        command = [str(emulator), "start", "--host", self.host, "--port", str(self.port)]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GCE_", "GOOGLE_"))}
        with open(self.log_file, "ab") as log:
            self.process = subprocess.Popen(
                [*command, "--in-memory"],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        deadline = time.monotonic() + ready_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                code, self.process = self.process.returncode, None
                raise ObjectStoreError(f"gcp-storage-emulator exited with {code}: {self.log_file}")
            try:
                with urllib.request.urlopen(f"{self.endpoint}/storage/v1/b", timeout=1):
                    return self
            except urllib.error.HTTPError:
                return self  # it answers
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.05)
        self.stop()
        raise ObjectStoreError(f"gcp-storage-emulator not ready after {ready_timeout}s")

    def stop(self, timeout: float = 10.0) -> None:
        """End the emulator and its process group by its pid (SIGTERM, then SIGKILL)."""
        process, self.process = self.process, None
        end_process_group(process, timeout)

    def __enter__(self) -> LocalGcsStore:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def _fs(self) -> Any:
        """gcsfs on the emulator. gcsfs reads ``STORAGE_EMULATOR_HOST`` at each request
        (without it, to storage.googleapis.com), so the caller's process must have
        ``environment()`` set: refused otherwise, so that nothing leaves loopback."""
        import gcsfs  # the test extras' (the gcs extra's) file system

        if os.environ.get("STORAGE_EMULATOR_HOST") != self.endpoint:
            raise ObjectStoreError(
                "set LocalGcsStore.environment() in this process first (monkeypatch.setenv)"
            )
        # No endpoint_url: given one, gcsfs takes it for a real service and first asks it
        # over gRPC and TLS about hierarchical namespaces (what the emulator cannot answer).
        return gcsfs.GCSFileSystem(token="anon", skip_instance_cache=True)

    def create_bucket(self, name: str) -> None:
        self._fs().mkdir(name)

    def upload_folder(self, local_folder: Path, bucket: str, prefix: str = "") -> list[str]:
        """Every file under ``local_folder`` as ``bucket/prefix/<relative path>``."""
        fs = self._fs()
        keys = []
        for path in sorted(p for p in local_folder.rglob("*") if p.is_file()):
            key = "/".join(x for x in (prefix, path.relative_to(local_folder).as_posix()) if x)
            fs.pipe(f"{bucket}/{key}", path.read_bytes())
            keys.append(key)
        return keys

    def put(self, bucket: str, key: str, data: bytes) -> None:
        self._fs().pipe(f"{bucket}/{key}", data)
