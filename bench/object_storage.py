"""Model repositories in object storage (issue 29): what a reconcile pass asks of the store.

One repository of ``--models`` (100) Python models x 3 versions (``o000``..``o099``: the test
model ``echo``'s files, versions 1-3), twice: in an S3 bucket (moto's server on loopback,
``testkit.object_store``, read by Triton and the reconciler in Triton's own spelling,
``s3://http://127.0.0.1:PORT/BUCKET/models``) and in a local folder. Each arm runs one real
tritonserver over its copy, with every model loaded at version 1 (by hand, in parallel, as
the reconciler would load it), and the manifests declare every model at version 1 with its
folder's digest pinned (``versions: [{version: 1, digest: ...}]``, as ``triton-gitops digest``
prints it), so that every pass reads each model's listing, its base config and its digest.

Passes, in this process, as the service runs them (``bench.harness.passes.run_pass`` with one
``PassMemory`` kept across passes, one reader of the repository URL for the process):

1. ``first``: the reconciler's first pass over what is already served (it reads every
   ``config.pbtxt`` and hashes every pinned version once);
2. ``no-op``: ``--passes`` passes with nothing changed (each checked: no change, no problem,
   every model in sync);
3. ``new version``: version 4 of ``o000`` written to the repository, then the manifest
   pinning it committed; one pass loads it (beside 1, verified, 1 unloaded).

Per pass: wall time, and for the bucket the reconciler's own reads as its reader counts them
(``ObjectRepository.reads``: listings, objects read, bytes read) and every request the store
answered in the pass (moto's access log: Triton's reads for its repository index and its
loads, and the reconciler's, which the log does not tell apart), with the listings and the
object reads among them. Goal: a no-op pass reads no
object (listings only), and an unchanged version's digest is never computed again.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.harness.cli import markdown_main
from bench.harness.errors import BenchError
from bench.harness.passes import pass_settings, run_pass
from bench.harness.provenance import machine, provenance
from bench.harness.report import render
from bench.harness.triton import Index
from reconciler.adapters.artifacts import tree_digest
from reconciler.adapters.model_repository import opened
from reconciler.core.records import rfc3339
from reconciler.core.triton_config import parse_pbtxt
from reconciler.loop.memory import PassMemory
from reconciler.model.reports import PassReport
from reconciler.model.source import Source
from testkit.local_triton import LocalTriton
from testkit.manifests import MODELS, ManifestRepo, server_doc
from testkit.object_store import LocalObjectStore, StoreRequest

VERSIONS = (1, 2, 3)
NEW_VERSION = 4
LOAD_THREADS = 8  # hand loads at once; Triton's own load threads bound the rest


def model_names(count: int) -> list[str]:
    return [f"o{i:03d}" for i in range(count)]


def write_repository(root: Path, models: list[str]) -> Path:
    """``models`` with echo's config (renamed) and model.py in versions 1-3."""
    config = (MODELS / "echo" / "config.pbtxt").read_text()
    for name in models:
        (root / name).mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(config.replace('"echo"', f'"{name}"'))
        for version in VERSIONS:
            add_version(root, name, version)
    return root


def add_version(root: Path, model: str, version: int) -> None:
    (root / model / str(version)).mkdir()
    shutil.copy(MODELS / "echo" / "model.py", root / model / str(version) / "model.py")
    # Objects have no execute bit: the folder's digest is then the bucket's.
    (root / model / str(version) / "model.py").chmod(0o644)


def deployment(model: str, version: int, digest: str) -> str:
    return (
        "apiVersion: triton-gitops.dev/v1alpha1\n"
        "kind: ModelDeployment\n"
        f"metadata:\n  name: {model}\n"
        "spec:\n"
        "  servers:\n    names: [edge-a]\n"
        f'  versions: [{{version: {version}, digest: "{digest}"}}]\n'
    )


def load_by_hand(triton: LocalTriton, repository: Path, models: list[str]) -> float:
    """Every model at version 1, with its config.pbtxt, ``LOAD_THREADS`` at once; seconds."""
    started = time.monotonic()

    def load(model: str) -> None:
        index = Index(triton.grpc_address)
        try:
            config = parse_pbtxt((repository / model / "config.pbtxt").read_text())
            index.load(model, config, [1])
        finally:
            index.close()

    with ThreadPoolExecutor(LOAD_THREADS) as pool:
        list(pool.map(load, models))
    index = Index(triton.grpc_address)
    try:
        missing = set(models) - index.ready_models()
    finally:
        index.close()
    if missing:
        raise BenchError(f"{len(missing)} model(s) not READY after the hand loads")
    return time.monotonic() - started


class Arm:
    """One repository (a folder or a bucket URL), its tritonserver, manifests and passes."""

    def __init__(
        self,
        name: str,
        workdir: Path,
        repository: str,
        local_copy: Path,
        models: list[str],
        store: LocalObjectStore | None = None,
        write: Any = None,
    ) -> None:
        self.name, self.workdir, self.repository = name, workdir, repository
        self.local_copy, self.models, self.store, self.write = local_copy, models, store, write
        self.manifests = ManifestRepo(workdir / "git")
        self.settings = pass_settings(workdir / "cache", workdir / "state.db")
        self.memory = PassMemory()
        self.passes: list[dict[str, Any]] = []

    def deploy(self, triton: LocalTriton) -> None:
        # Pinned from the local copy, as a model pipeline would pin what it uploads: the
        # reconciler's reader hashes each version itself, in the first pass.
        digests = {m: tree_digest(self.local_copy / m / "1") for m in self.models}
        self.manifests.write(
            "servers.yaml",
            server_doc("edge-a", triton.grpc_address, self.repository, metrics=None),
        )
        for model, digest in digests.items():
            assert digest is not None, model
            self.manifests.write(f"{model}.yaml", deployment(model, 1, digest))
        self.manifests.commit("every model at version 1")

    def measured_pass(self, kind: str, expect_changes: int) -> dict[str, Any]:
        reader = opened(self.repository)
        before = asdict(reader.reads) if reader is not None else None
        requests_before = self.store.request_count if self.store is not None else 0
        started = time.monotonic()
        report = run_pass(Source(self.manifests.url), self.settings, memory=self.memory)
        seconds = time.monotonic() - started
        self._check(kind, report, expect_changes)
        row: dict[str, Any] = {"kind": kind, "seconds": seconds}
        reader = opened(self.repository)
        if reader is not None and before is not None:
            after = asdict(reader.reads)
            row["reconciler"] = {k: after[k] - before[k] for k in after}
        if self.store is not None:
            answered = self.store.requests()[requests_before:]
            row["store"] = split_requests(answered)
        self.passes.append(row)
        return row

    def _check(self, kind: str, report: PassReport, expect_changes: int) -> None:
        plan = report.plan
        if plan.problems or not report.ok:
            raise BenchError(f"{self.name} {kind} pass: {[str(p) for p in plan.problems][:3]}")
        if len(plan.changes) != expect_changes:
            raise BenchError(
                f"{self.name} {kind} pass: {len(plan.changes)} change(s), {expect_changes} expected"
            )


def split_requests(answered: list[StoreRequest]) -> dict[str, int]:
    """The store's requests in a pass, Triton's and the reconciler's together (moto's log
    does not say who asked): all of them, the listings, and the objects read (GET of a key)."""
    listings = sum(1 for r in answered if r.method == "GET" and "list-type=2" in r.path)
    gets = sum(1 for r in answered if r.method == "GET" and "?" not in r.path)
    return {"total": len(answered), "listings": listings, "object_gets": gets}


def run_arm(arm: Arm, triton: LocalTriton, args: argparse.Namespace) -> dict[str, Any]:
    hand = load_by_hand(triton, arm.local_copy, arm.models)
    arm.deploy(triton)
    arm.measured_pass("first", expect_changes=0)
    for _ in range(args.passes):
        arm.measured_pass("no-op", expect_changes=0)
    model = arm.models[0]
    arm.write(model, NEW_VERSION)
    digest = tree_digest(arm.local_copy / model / str(NEW_VERSION))
    arm.manifests.write(f"{model}.yaml", deployment(model, NEW_VERSION, digest))
    arm.manifests.commit(f"{model} {NEW_VERSION}")
    arm.measured_pass("new version", expect_changes=1)
    arm.measured_pass("no-op after", expect_changes=0)
    index = Index(triton.grpc_address)
    try:
        if index.ready(model) != {NEW_VERSION}:
            raise BenchError(f"{arm.name}: {model} serves {index.ready(model)} after the pass")
        server_version = index.server_version()
    finally:
        index.close()
    return {
        "arm": arm.name,
        "server_version": server_version,
        "hand_load_seconds": hand,
        "passes": arm.passes,
    }


def bucket_arm(root: Path, models: list[str], args: argparse.Namespace) -> dict[str, Any]:
    folder = write_repository(root / "bucket-source", models)
    with LocalObjectStore(log_file=root / "moto.log") as store:
        saved = {k: os.environ.get(k) for k in store.environment()}
        os.environ.update(store.environment())  # the reconciler reads the bucket in-process
        try:
            bucket = f"models-{uuid.uuid4().hex[:8]}"
            store.create_bucket(bucket)
            store.upload_folder(folder, bucket, "models")
            url = store.triton_url(bucket, "models")

            def write(model: str, version: int) -> None:
                add_version(folder, model, version)
                key = f"models/{model}/{version}/model.py"
                store.put(bucket, key, (folder / model / str(version) / "model.py").read_bytes())

            arm = Arm("bucket", root / "bucket", url, folder, models, store, write)
            with LocalTriton(
                url, log_file=root / "triton-bucket.log", extra_env=store.environment()
            ) as triton:
                return run_arm(arm, triton, args)
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


def folder_arm(root: Path, models: list[str], args: argparse.Namespace) -> dict[str, Any]:
    folder = write_repository(root / "folder", models)

    def write(model: str, version: int) -> None:
        add_version(folder, model, version)

    arm = Arm("folder", root / "folder-arm", str(folder), folder, models, None, write)
    with LocalTriton(folder, log_file=root / "triton-folder.log") as triton:
        return run_arm(arm, triton, args)


def summarize(arm: dict[str, Any]) -> dict[str, Any]:
    noop = [p for p in arm["passes"] if p["kind"] == "no-op"]
    summary: dict[str, Any] = {
        "noop_median_s": statistics.median(p["seconds"] for p in noop),
        "noop_max_s": max(p["seconds"] for p in noop),
    }
    if "reconciler" in noop[0]:
        summary["noop_objects_read_max"] = max(p["reconciler"]["objects_read"] for p in noop)
        summary["noop_bytes_read_max"] = max(p["reconciler"]["bytes_read"] for p in noop)
        summary["noop_listings_median"] = statistics.median(
            p["reconciler"]["listings"] for p in noop
        )
        summary["noop_store_requests_median"] = statistics.median(p["store"]["total"] for p in noop)
    return summary


def run(args: argparse.Namespace) -> dict[str, Any]:
    models = model_names(args.models)
    root = Path(tempfile.mkdtemp(prefix="bench-object-storage-"))
    try:
        arms = [bucket_arm(root, models, args), folder_arm(root, models, args)]
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    for arm in arms:
        arm["summary"] = summarize(arm)
    return {
        "machine": machine(arms[0]["server_version"]),
        "code": provenance(),
        "at": rfc3339(time.time()),
        "settings": {"models": args.models, "versions": len(VERSIONS), "passes": args.passes},
        "arms": arms,
    }


def markdown(result: dict[str, Any]) -> str:
    return render("object_storage", result)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=100, help="models (default 100)")
    parser.add_argument("--passes", type=int, default=5, help="no-op passes (default 5)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    parser.add_argument("--output", type=Path, default=Path("bench/results/object_storage.json"))
    parser.add_argument("--report", type=Path, help="print the section from a saved result")
    return markdown_main(parser.parse_args(argv), run, markdown)


if __name__ == "__main__":
    sys.exit(main())
