"""The container image, built from the Dockerfile and run: what an operator's container does.

The image is built with podman (``./dev image``: a Debian bookworm base made by mmdebstrap,
since registry images cannot be pulled here; ``.ci/podman`` has the settings these machines
need). ``./dev test`` starts that build in the background at its start and names its folder in
``$TRITON_GITOPS_IMAGE_BUILD``; this test waits for it there (``rc``, ``image``,
``build.log``), or builds the image itself when run without ``./dev test``. It then starts
``triton-gitops run`` in a container (host network, the bare Git remote mounted read-only at its
own path) against a tritonserver started on the host, and checks what the Kubernetes example
relies on: /healthz, a pass that loads the model, tini as PID 1 with the reconciler as uid
10001 under it, the tools the reconciler runs (git, gpg, ps) and none it must not carry (a
compiler, pip), a model repository in an S3 bucket read from inside it, the OCI labels,
and a SIGTERM that ends it with exit 0 within its shutdown deadline. The container is
removed; the images stay (CI machines are fresh).

Without podman the test is skipped (outside CI) or fails (in CI, which installs it).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.cli_run import cli
from testkit.local_triton import LocalTriton, free_port
from testkit.manifests import ManifestRepo, deployment_doc, server_doc
from testkit.object_store import LocalObjectStore
from testkit.release import current as current_release
from testkit.service_process import wait_until
from tests.integration.flows import ready_versions
from tests.services import find_binary

pytestmark = [pytest.mark.image, pytest.mark.triton]

ROOT = Path(__file__).resolve().parents[2]
PODMAN = os.environ.get("PODMAN") or str(ROOT / ".ci" / "podman")
# The build in the background of ./dev test usually has ended before this test starts; on a
# cold machine it takes a few minutes (the base, then pip downloading the locked wheels).
BUILD_WAIT = 1200.0
BUILD_LOG_TAIL = 40  # lines of build.log in the failure message
UID = 10001  # the Dockerfile's USER, which deployment.yaml's runAsUser repeats
SHUTDOWN_DEADLINE = 20  # --shutdown-deadline given to the container
OCI_LABELS = ("title", "source", "version", "revision", "licenses", "description")


def podman(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PODMAN, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def build_failure(folder: Path, rc: str) -> str:
    log = folder / "build.log"
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    tail = "\n".join(lines[-BUILD_LOG_TAIL:]) or "(no build log)"
    return f"the image build failed (exit {rc}); the end of {log}:\n{tail}"


def wait_for_build(folder: Path) -> str:
    """The tag the build in ``folder`` made, once it has ended; fails the test if it failed."""
    missing = folder / "missing"
    if missing.exists():
        reason = missing.read_text().strip()
        if os.environ.get("CI"):
            pytest.fail(f"{reason}; CI must install it", pytrace=False)
        pytest.skip(reason)
    skipped = folder / "skipped"
    if skipped.exists():  # TRITON_GITOPS_SKIP_IMAGE, a developer's choice (.ci/run unsets it)
        reason = skipped.read_text().strip()
        if os.environ.get("CI"):
            pytest.fail(f"{reason}; CI always builds the image", pytrace=False)
        pytest.skip(reason)
    rc_file = folder / "rc"
    deadline = time.monotonic() + BUILD_WAIT
    while not rc_file.exists():
        if time.monotonic() > deadline:
            pytest.fail(build_failure(folder, f"none after {BUILD_WAIT:g} s"), pytrace=False)
        time.sleep(1)
    rc = rc_file.read_text().strip()
    if rc != "0":
        pytest.fail(build_failure(folder, rc), pytrace=False)
    return (folder / "image").read_text().strip()


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> str:
    started = os.environ.get("TRITON_GITOPS_IMAGE_BUILD")
    if started:
        return wait_for_build(Path(started))
    find_binary(("podman",), "podman runc uidmap")
    find_binary(("mmdebstrap",), "mmdebstrap")
    folder = tmp_path_factory.mktemp("image-build")
    subprocess.run([str(ROOT / "dev"), "image", str(folder)], timeout=BUILD_WAIT, check=False)
    return wait_for_build(folder)


@pytest.fixture
def container_name() -> Iterator[str]:
    name = f"triton-gitops-test-{os.getpid()}-{free_port()}"
    try:
        yield name
    finally:
        # The container and its anonymous volume (the image's VOLUME); the images stay.
        podman("rm", "--force", "--volumes", name)


def proc_status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {key: value.strip() for key, _, value in (line.partition(":") for line in lines)}


def proc_command(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]


def healthz(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
        return int(response.status)


# Longer than pytest's 600 s: the wait for the image build counts.
@pytest.mark.timeout(BUILD_WAIT + 300)
def test_image_runs_the_reconciler_under_tini_and_stops_cleanly_on_sigterm(
    image: str,
    container_name: str,
    triton: LocalTriton,
    manifests: ManifestRepo,
    model_repository: Path,
    tmp_path: Path,
) -> None:
    # The reconciler reads each model's base config from spec.modelRepository: a copy the
    # container's user may read (pytest's folders are root's, mode 0700), at the same path.
    readable = tmp_path / "models"
    shutil.copytree(model_repository, readable)
    readable.chmod(0o755)
    manifests.write("servers.yaml", server_doc("edge-a", triton.grpc_address, model_repository))
    manifests.write("echo.yaml", deployment_doc("echo", [1], ["edge-a"]))
    manifests.commit("deploy echo 1")
    port = free_port()
    bare = str(manifests.bare)
    # The remote belongs to root on the host, the container's user is 10001: git refuses a
    # repository of another owner unless a global config names it safe.directory.
    gitconfig = manifests.bare.parent / "container.gitconfig"
    gitconfig.write_text(f"[safe]\n\tdirectory = {bare}\n")
    started = podman(
        "run", "--detach", "--name", container_name, "--network", "host",
        "--volume", f"{bare}:{bare}:ro",
        "--volume", f"{readable}:{model_repository}:ro",
        "--volume", f"{gitconfig}:/etc/triton-gitops/gitconfig:ro",
        "--env", "GIT_CONFIG_GLOBAL=/etc/triton-gitops/gitconfig",
        "--env", f"TRITON_GITOPS_LISTEN=127.0.0.1:{port}",
        image,
        "--repo", manifests.url, "--ref", "main", "--interval", "300", "--jitter", "0",
        "--watch-interval", "1", "--call-timeout", "5",
        "--shutdown-deadline", str(SHUTDOWN_DEADLINE),
    )  # fmt: skip
    assert started.returncode == 0, started.stderr

    def logs() -> str:
        done = podman("logs", container_name)
        return done.stdout + done.stderr

    try:
        wait_until(lambda: healthz(port) == 200, 90, "/healthz answers")
        wait_until(lambda: ready_versions(triton, "echo") == {1}, 90, "a pass loads echo 1")
    except Exception as exc:
        raise AssertionError(f"{exc}; the container's log:\n{logs()}") from exc

    # The image's HEALTHCHECK, run by podman as a runtime would.
    health = podman("healthcheck", "run", container_name)
    assert health.returncode == 0, health.stdout + health.stderr

    # PID 1 is tini (its host pid, seen from the host: rootful podman maps no uids), and the
    # reconciler is its child; both run as the image's user.
    inspected = podman("inspect", "--format", "{{.State.Pid}}", container_name)
    init = int(inspected.stdout.strip())
    assert proc_status(init)["NSpid"].split()[-1] == "1"
    assert Path(proc_command(init)[0]).name == "tini"
    (child,) = map(int, Path(f"/proc/{init}/task/{init}/children").read_text().split())
    command = [Path(word).name for word in proc_command(child)]
    assert command[command.index("triton-gitops") + 1] == "run", command
    for pid in (init, child):
        assert proc_status(pid)["Uid"].split() == [str(UID)] * 4, proc_command(pid)

    # What the reconciler runs is there, what an image must not carry is not; `ps` finds
    # PID 1's child as GitPython's timeout kill looks for a git process's children.
    tools = podman(
        "exec", container_name, "python", "-c",
        "import json, shutil; print(json.dumps({t: shutil.which(t) for t in"
        " ('git', 'gpg', 'ssh', 'ps', 'tini', 'gcc', 'cc', 'pip', 'pip3')}))",
    )  # fmt: skip
    assert tools.returncode == 0, tools.stderr
    found = {name: path for name, path in json.loads(tools.stdout).items() if path}
    assert set(found) == {"git", "gpg", "ssh", "ps", "tini"}, found
    children = podman("exec", container_name, "ps", "-o", "pid=", "--ppid", "1")
    assert children.stdout.split() and children.returncode == 0, children.stderr

    # A model repository in an S3 bucket (moto on the host's loopback): the image reads it
    # (the s3 extra is in its lock), and a version's digest there is the folder's.
    with LocalObjectStore(log_file=tmp_path / "moto.log") as store:
        store.create_bucket("image-models")
        store.upload_folder(readable / "echo", "image-models", "models/echo")
        url = f"{store.triton_url('image-models', 'models')}/echo/1"
        credentials = [f"--env={name}={value}" for name, value in store.environment().items()]
        in_bucket = podman("exec", *credentials, container_name, "triton-gitops", "digest", url)
        listed = [r.path for r in store.requests()]
    in_folder = cli("digest", str(readable / "echo" / "1"))
    assert in_bucket.returncode == 0, in_bucket.stderr + in_bucket.stdout
    assert in_bucket.stdout.strip() == in_folder.out.strip(), (in_bucket.stdout, in_folder.out)
    assert any("list-type=2" in path for path in listed), listed

    # Named, tagged and labelled from pyproject.toml: the tag the Kubernetes example runs.
    release = current_release()
    assert image == release.image_ref
    labels = json.loads(podman("image", "inspect", "--format", "{{json .Labels}}", image).stdout)
    for label in OCI_LABELS:
        assert labels.get(f"org.opencontainers.image.{label}"), label
    assert labels["org.opencontainers.image.version"] == release.version
    assert labels["org.opencontainers.image.source"] == release.source
    version = podman("exec", container_name, "triton-gitops", "--version")
    assert version.stdout.strip() == f"triton-gitops {release.version}", version
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"

    # SIGTERM to PID 1 (tini), which passes it to the reconciler: it finishes, exits 0, and
    # tini exits with its code; podman would SIGKILL after --time (exit 137).
    signalled = time.monotonic()
    stopped = podman("stop", "--time", str(3 * SHUTDOWN_DEADLINE), container_name)
    took = time.monotonic() - signalled
    assert stopped.returncode == 0, stopped.stderr
    code = podman("inspect", "--format", "{{.State.ExitCode}}", container_name).stdout.strip()
    events = [json.loads(line) for line in logs().splitlines() if line.startswith("{")]
    messages = [e.get("message") for e in events]
    assert code == "0", f"exit {code}; the container's log:\n{logs()}"
    assert took < SHUTDOWN_DEADLINE, f"{took:.1f} s after SIGTERM"
    assert {"signal": "SIGTERM"}.items() <= next(
        e for e in events if e.get("message") == "stopping"
    ).items()
    assert messages[-1] == "stopped", messages[-5:]
