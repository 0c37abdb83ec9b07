"""The local demo: a real Triton, a real Git remote, and a reconciler that swaps versions.

Run by ``./dev demo``. It copies ``examples/repo`` into a fresh bare Git remote, starts a
tritonserver (from the nvidia-pytriton wheel) over a copy of ``examples/model-repository``,
then: applies version 1; commits a bump to version 2 and applies it while a client keeps
sending requests (analysis passes, version 1 is unloaded); commits version 3, which fails to
load (version 2 keeps serving, the ModelDeployment is held); commits version 4, which loads
but fails requests: the analysis catches it, version 2 serves again within milliseconds, and
a revert commit lands in Git. Everything it starts is stopped at the end; with ``--stay``
the Triton and the Git repository stay up once it is done, for you to try ``status``, ``plan``
and ``history`` on them with the options it prints, until Ctrl-C.
"""

from __future__ import annotations

import argparse
import compileall
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as triton_grpc
from ruamel.yaml import YAML

from reconciler.cli import main as triton_gitops
from testkit.local_triton import LocalTriton
from testkit.manifests import git

EXAMPLES = Path(__file__).resolve().parent


def banner(text: str) -> None:
    print(f"\n\033[1m== {text}\033[0m", flush=True)


def run(*args: str) -> int:
    print(f"$ triton-gitops {' '.join(args)}", flush=True)
    code = triton_gitops(list(args))
    print(f"(exit {code})", flush=True)
    return code


def edit_yaml(path: Path, change: dict[str, object], section: str = "spec") -> None:
    """Round-trip edit: comments and layout stay as the user wrote them."""
    yaml = YAML()
    yaml.preserve_quotes = True
    document = yaml.load(path)
    for key, value in change.items():
        document[section][key] = value
    with path.open("w") as stream:
        yaml.dump(document, stream)


def bump(path: Path, version: int) -> None:
    """Serve ``version`` instead, with the smoke expectation that version answers."""
    yaml = YAML()
    document = yaml.load(path)
    document["spec"]["versions"][:] = [version]
    expect = document["spec"]["verify"]["smoke"][0]["expect"]["OUTPUT0"]["data"]
    expect[:] = [version * x for x in (1, 2, 3, 4)]
    with path.open("w") as stream:
        yaml.dump(document, stream)


def serving(server: LocalTriton) -> str:
    with triton_grpc.InferenceServerClient(server.grpc_address) as client:
        item = triton_grpc.InferInput("INPUT0", [1, 4], "FP32")
        item.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
        answer = client.infer("echo", [item]).as_numpy("OUTPUT0")[0][0]
        index = client.get_model_repository_index(as_json=True).get("models", [])
    ready = sorted(int(m["version"]) for m in index if m.get("state") == "READY")
    return f"loaded versions {ready}; an unversioned request is answered by version {answer:g}"


class Client:
    """A client sending unversioned requests in a loop, counting answers per version."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.answers: dict[str, int] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        ones = np.ones((1, 4), dtype=np.float32)
        with triton_grpc.InferenceServerClient(self.address) as client:
            while not self.stop.is_set():
                item = triton_grpc.InferInput("INPUT0", [1, 4], "FP32")
                item.set_data_from_numpy(ones)
                try:
                    key = f"v{client.infer('echo', [item]).as_numpy('OUTPUT0')[0][0]:g}"
                except Exception as exc:
                    key = f"failed: {exc}"
                self.answers[key] = self.answers.get(key, 0) + 1

    def __enter__(self) -> Client:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def try_it(workdir: Path, options: list[str], work: Path) -> list[str]:
    """What to type to explore what the demo left running: the commands on the PATH, then
    ``status``, ``plan`` and ``history`` with the demo's own options, then the clone to edit."""
    activate = Path(sys.executable).parent / "activate"
    state = str(workdir / "state.db")
    return [
        f"source {activate}    # puts triton-gitops on the PATH",
        f"triton-gitops status {' '.join(options)}",
        f"triton-gitops plan {' '.join(options)}",
        f"triton-gitops history --state {state}",
        f"cd {work}    # the manifests' clone, the revert pulled in: edit, git commit, "
        "git push origin HEAD:main,",
        f"triton-gitops apply {' '.join(options)}    # ...then apply it",
    ]


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def stay(lines: list[str]) -> None:
    """Wait, the demo's Triton and Git repository up, until Ctrl-C (or SIGTERM)."""
    banner("the demo's Triton and Git repository stay up: try them (Ctrl-C ends it)")
    for line in lines:
        print(f"$ {line}", flush=True)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        print("\nstopping the demo's Triton", flush=True)


def demo(workdir: Path, stay_up: bool = False) -> int:
    models = workdir / "model-repository"
    shutil.copytree(EXAMPLES / "model-repository", models)  # symlinks become files
    compileall.compile_dir(models, quiet=1)

    banner("starting a local Triton (EXPLICIT model control) on 127.0.0.1")
    triton = LocalTriton(models, log_file=workdir / "tritonserver.log").start()
    try:
        remote, work = workdir / "manifests.git", workdir / "manifests"
        git(workdir, "init", "--quiet", "--bare", "--initial-branch=main", str(remote))
        shutil.copytree(EXAMPLES / "repo", work)
        git(work, "init", "--quiet", "--initial-branch=main")
        git(work, "config", "user.name", "demo")
        git(work, "config", "user.email", "demo@triton-gitops.invalid")
        git(work, "remote", "add", "origin", remote.as_uri())
        edit_yaml(
            work / "servers" / "local.yaml",
            {
                "grpc": triton.grpc_address,
                "metrics": triton.metrics_url,
                "modelRepository": str(models),
            },
        )

        def commit(message: str) -> None:
            git(work, "add", "--all")
            git(work, "commit", "--quiet", "-m", message)
            git(work, "push", "--quiet", "origin", "HEAD:main")
            print(f"committed {git(work, 'rev-parse', '--short', 'HEAD')}: {message}")

        commit("Serve echo version 1 on the edge pool")
        print(f"Triton gRPC {triton.grpc_address}; manifests in {remote.as_uri()}")
        options = [
            "--repo", remote.as_uri(),
            "--state", str(workdir / "state.db"),
            "--cache-dir", str(workdir / "cache"),
        ]  # fmt: skip

        banner("validate the manifests")
        run("validate", str(work))
        banner("plan and apply the first deployment")
        run("plan", *options)
        if run("apply", *options) != 0:
            return 1
        print(serving(triton))

        banner("a pull request bumps echo to version 2; apply it while a client sends requests")
        bump(work / "models" / "echo.yaml", 2)
        commit("Bump echo to version 2")
        run("plan", *options)
        with Client(triton.grpc_address) as client:
            time.sleep(0.5)
            code = run("apply", *options)
            time.sleep(0.5)
        print(f"client answers during the swap: {client.answers}")
        print(serving(triton))
        if code != 0 or any(key.startswith("failed") for key in client.answers):
            return 1

        banner("version 3 is a bad release: Triton cannot load it, version 2 keeps serving")
        bump(work / "models" / "echo.yaml", 3)
        commit("Bump echo to version 3")
        code = run("apply", *options)
        print(serving(triton))
        if code != 1:
            return 1
        banner("the failed spec is held: the next pass does not try it again")
        run("plan", *options)

        banner("version 4 loads but fails requests: the analysis reverts it, and Git too")
        bump(work / "models" / "echo.yaml", 4)
        commit("Bump echo to version 4")
        with Client(triton.grpc_address) as client:
            time.sleep(0.5)
            code = run("apply", *options, "--revert-mode", "commit")
        print(f"client answers during the rollout: {client.answers}")
        print(serving(triton))
        if code != 1:
            return 1
        print("$ git log -1 (the tracked branch)")
        print(git(workdir, "--git-dir", str(remote), "log", "-1", "--format=%an: %B", "main"))
        run("history", "--state", str(workdir / "state.db"))
        print("\ndemo finished: every step behaved as intended")
        if stay_up:
            # The reconciler pushed its revert: the clone takes it, so that an edit made
            # there pushes without a rejected push first.
            git(work, "pull", "--quiet", "--ff-only", "origin", "main")
            stay(try_it(workdir, options, work))
        return 0
    finally:
        triton.stop()


def cli() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="keep the demo's work folder")
    parser.add_argument(
        "--stay",
        action="store_true",
        help="once done, keep its Triton and Git repository up and print the commands to try "
        "on them (status, plan, history), until Ctrl-C",
    )
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="triton-gitops-demo-"))
    try:
        return demo(workdir, stay_up=args.stay)
    finally:
        if args.keep:
            print(f"work folder kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(cli())
