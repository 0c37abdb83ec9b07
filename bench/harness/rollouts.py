"""What the rollout scenarios share (``bench.rollback_latency``, ``bench.blast_radius``): a
manifest remote that one server document and one deployment document are committed to and
that ``reconcile`` runs against in this process, the Python backend stubs a server runs, and
an error message with its numbers masked.
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

from bench.harness.calls import CallLog
from bench.harness.errors import BenchError
from bench.harness.passes import pass_settings, run_pass
from reconciler.model.errors import ReconcileError
from reconciler.model.reports import PassReport
from reconciler.model.source import Source
from testkit.local_triton import LocalTriton
from testkit.manifests import ManifestRepo, server_doc


class ManifestRemote:
    """A bare Git remote holding ``servers.yaml`` (one server, ``server``, scraped directly
    for its metrics) and one deployment document; ``apply`` runs one reconcile pass in this
    process against it, with its own Git cache and state store under ``root``."""

    def __init__(
        self, root: Path, triton: LocalTriton, repository: Path, server: str, document: str
    ) -> None:
        self.repo = ManifestRepo(root / "git")
        self.source = Source(self.repo.url)
        self.settings = pass_settings(
            root / "reconciler" / "cache", root / "reconciler" / "state.db"
        )
        self.document = document
        self.repo.write(
            "servers.yaml",
            server_doc(server, triton.grpc_address, repository, metrics=triton.metrics_url),
        )

    def commit(self, text: str, message: str) -> str:
        """Write the deployment document, commit and push it; the new revision."""
        self.repo.write(self.document, text)
        return self.repo.commit(message)

    def apply(self, calls: CallLog | None = None) -> PassReport:
        """One pass; its Triton and metrics calls logged in ``calls`` if given."""
        try:
            return run_pass(self.source, self.settings, calls=calls)
        except ReconcileError as exc:
            raise BenchError(f"reconcile raised {type(exc).__name__}: {exc}") from exc


def backend_stubs(server_pid: int, model: str) -> dict[int, int]:
    """The server's Python backend stub processes of ``model``, counted by version."""
    counts: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid != server_pid:
                continue
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            # The stub's first argument is the model file: <repository>/<model>/<version>/model.py
            *_, name, version, script = argv[1].split("/")
            if name != model or script != "model.py":
                continue
            counts[int(version)] = counts.get(int(version), 0) + 1
    return dict(sorted(counts.items()))


def masked(error: str) -> str:
    """An error's first line, numbers masked (the test model numbers its failures)."""
    return re.sub(r"\d+", "N", error.strip().splitlines()[0] if error.strip() else "")


def smoke_case_lines(factor: int) -> list[str]:
    """A deployment's ``verify.smoke`` lines (indented for ``spec.verify``): the echo model's
    input [1, 2, 3, 4], expected times ``factor``."""
    expected = ", ".join(f"{x * factor}" for x in (1, 2, 3, 4))
    return [
        "    smoke:",
        f"      - name: times-{factor}",
        "        inputs:",
        "          INPUT0: {datatype: FP32, shape: [1, 4], data: [1, 2, 3, 4]}",
        "        expect:",
        f"          OUTPUT0: {{data: [{expected}], tolerance: 0.0001}}",
    ]
