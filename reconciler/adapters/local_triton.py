"""Start and stop a real tritonserver on this machine: the ``gate`` command's isolated
server, and the demo's, the test suite's and the benchmarks'.

The server is a given ``tritonserver`` binary (as in Triton's own container image, with its
``backends`` folder beside ``bin``), or the one the ``nvidia-pytriton`` wheel ships: the wheel
has the server binary, the Python backend and one backend stub per Python version; it is
copied once into a cache folder (never written into site-packages). Either way it runs as a
plain process in EXPLICIT model-control mode on loopback, and every process started here is
ended by its pid (``LocalTriton.stop``).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path


class LocalTritonError(RuntimeError):
    """The local tritonserver could not be found, started or made ready."""


def _wheel_root() -> Path:
    spec = importlib.util.find_spec("pytriton")
    if spec is None or spec.origin is None:
        raise LocalTritonError(
            "nvidia-pytriton is not installed; install the 'local' extra: "
            "pip install 'triton-gitops[local]'"
        )
    return Path(spec.origin).parent


def _server_copy(cache_dir: Path | None = None) -> Path:
    """Return a writable copy of the wheel's tritonserver with this Python's backend stub."""
    wheel = _wheel_root()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    base = cache_dir or Path(
        os.environ.get("TRITON_GITOPS_CACHE", Path.home() / ".cache" / "triton-gitops")
    )
    target = base / f"tritonserver-py{version}"
    marker = target / ".complete"
    if marker.exists():
        return target
    base.mkdir(parents=True, exist_ok=True)
    # Copy into a temporary sibling first and rename, so concurrent starters never see a
    # half-copied server.
    staging = Path(tempfile.mkdtemp(prefix="tritonserver-", dir=base))
    shutil.copytree(wheel / "tritonserver", staging / "server", symlinks=True)
    stub = wheel / "tritonserver" / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.exists():
        raise LocalTritonError(f"the wheel has no Python backend stub for Python {version}")
    shutil.copy2(stub, staging / "server" / "backends" / "python" / "triton_python_backend_stub")
    (staging / "server" / ".complete").touch()
    try:
        staging.joinpath("server").rename(target)
    except OSError:
        if not marker.exists():
            raise
    shutil.rmtree(staging, ignore_errors=True)
    return target


def end_process_group(process: subprocess.Popen[bytes] | None, timeout: float) -> None:
    """End a process started with start_new_session=True, and everything in its group, by
    its pid: SIGTERM, then SIGKILL if it has not exited within ``timeout``."""
    if process is None or process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _resident_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


# Triton's own spellings of a model repository in object storage (S3, GCS, Azure).
REMOTE_REPOSITORY_SCHEMES = ("s3://", "gs://", "as://")


def is_remote_repository(location: Path | str) -> bool:
    """Whether ``location`` is a model repository URL in object storage, passed to Triton
    as written (a ``Path`` would fold the "//" of ``s3://http://host:port/bucket``)."""
    return isinstance(location, str) and location.startswith(REMOTE_REPOSITORY_SCHEMES)


# Where Triton copies each model folder it loads from object storage (default /tmp), by the
# repository's scheme (Triton's docs/user_guide/model_repository.md).
MOUNT_DIRECTORY_VARIABLES = {
    "s3://": "TRITON_AWS_MOUNT_DIRECTORY",
    "gs://": "TRITON_GCS_MOUNT_DIRECTORY",
    "as://": "TRITON_AZURE_MOUNT_DIRECTORY",
}


def mount_directory_variable(model_repository: Path | str) -> str | None:
    """The variable that names Triton's local copy folder for this repository (None: a
    local folder, read in place)."""
    if not is_remote_repository(model_repository):
        return None
    return next(
        v for k, v in MOUNT_DIRECTORY_VARIABLES.items() if str(model_repository).startswith(k)
    )


@dataclass
class LocalTriton:
    """One tritonserver process in EXPLICIT mode over ``model_repository``: a folder, or a
    URL in object storage in Triton's spelling (``s3://http://127.0.0.1:9000/bucket/models``),
    kept as the string it is; any other string is taken as a folder."""

    model_repository: Path | str
    host: str = "127.0.0.1"
    http_port: int = 0
    grpc_port: int = 0
    metrics_port: int = 0
    log_file: Path | None = None
    extra_args: tuple[str, ...] = ()
    # Set in the server's environment only (its backend stubs inherit it), e.g. LD_PRELOAD
    # of another malloc for the soak benchmark; never in this process's own environment.
    extra_env: Mapping[str, str] = field(default_factory=dict)
    # A tritonserver binary (its backends in ../backends); None: the nvidia-pytriton wheel's.
    binary: Path | None = None
    # stop() ends the server at once (SIGKILL, then its shared memory removed) instead of
    # Triton's graceful shutdown, which takes 1 to 3 s (it unloads every model and polls once
    # a second): for the tests, which start a server per test and need no graceful end.
    fast_stop: bool = False
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    # The Python backend's shared-memory regions (/dev/shm) of this server are named with
    # this prefix, so that a server ended by SIGKILL leaves none behind (kill() removes them).
    shm_prefix: str = field(default_factory=lambda: f"triton_gitops_{uuid.uuid4().hex[:12]}_")
    # True from just before the server is started until its Popen is kept: an interruption in
    # between (the gate's SIGTERM) leaves a server no Popen names, found by its shm prefix.
    _launching: bool = field(default=False, init=False, repr=False)
    # Over object storage, each start gets a copy folder of its own for Triton's copies of
    # the loaded models, removed when the server has ended (SIGKILL leaves them behind),
    # unless extra_env names one.
    mount_directory: Path | None = field(default=None, init=False)
    _owns_mount: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        if not is_remote_repository(self.model_repository):
            self.model_repository = Path(self.model_repository)
        variable = mount_directory_variable(self.model_repository)
        self._owns_mount = variable is not None and variable not in self.extra_env

    @property
    def grpc_address(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def http_address(self) -> str:
        return f"{self.host}:{self.http_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"

    def start(self, ready_timeout: float = 60.0) -> LocalTriton:
        variable = mount_directory_variable(self.model_repository)
        if self._owns_mount and variable is not None and self.mount_directory is None:
            self.mount_directory = Path(tempfile.mkdtemp(prefix="triton-mount-"))
            self.extra_env = {**self.extra_env, variable: str(self.mount_directory)}
        try:
            return self._start(ready_timeout)
        except BaseException:
            self._remove_mount_directory()
            raise

    def _start(self, ready_timeout: float) -> LocalTriton:
        env = dict(os.environ)
        if self.binary is not None:
            if not self.binary.is_file():
                raise LocalTritonError(f"tritonserver binary {self.binary} not found")
            server = self.binary.resolve().parent.parent
            executable = self.binary
        else:
            server = _server_copy()
            executable = server / "bin" / "tritonserver"
            libs = _wheel_root().parent / "nvidia_pytriton.libs"
            env["LD_LIBRARY_PATH"] = os.pathsep.join(
                p for p in (str(libs), env.get("LD_LIBRARY_PATH", "")) if p
            )
        for name in ("http_port", "grpc_port", "metrics_port"):
            # Each port is free when asked, but two asks may be given the same one: distinct.
            while (
                not getattr(self, name)
                or [self.http_port, self.grpc_port, self.metrics_port].count(getattr(self, name))
                > 1
            ):
                setattr(self, name, free_port(self.host))
        # The backend stub runs model.py with the first python on PATH; it must be the one
        # that has numpy, i.e. this interpreter's environment.
        env["PATH"] = os.pathsep.join((str(Path(sys.executable).parent), env.get("PATH", "")))
        env.update(self.extra_env)
        command = [
            str(executable),
            f"--model-repository={self.model_repository}",
            "--model-control-mode=explicit",
            f"--backend-directory={server / 'backends'}",
            f"--http-address={self.host}",
            f"--grpc-address={self.host}",
            f"--metrics-address={self.host}",
            f"--http-port={self.http_port}",
            f"--grpc-port={self.grpc_port}",
            f"--metrics-port={self.metrics_port}",
            "--exit-timeout-secs=5",
            f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}",
            *self.extra_args,
        ]
        if self.log_file is None:
            self.log_file = Path(tempfile.mkstemp(prefix="tritonserver-", suffix=".log")[1])
        with open(self.log_file, "ab") as log:
            self._launching = True
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
            self._launching = False
        self._wait_ready(ready_timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        """Until the server says it is ready and its metrics endpoint answers: Triton starts
        that endpoint after HTTP, and on a busy host a scrape right after /v2/health/ready
        was refused (clean-clone run 18)."""
        deadline = time.monotonic() + timeout
        waiting = [f"http://{self.http_address}/v2/health/ready", self.metrics_url]
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise LocalTritonError(
                    f"tritonserver exited with {self.process.returncode}; log: {self.log_file}\n"
                    + self.log_tail()
                )
            try:
                with urllib.request.urlopen(waiting[0], timeout=1) as response:
                    if response.status == 200:
                        waiting.pop(0)
                        if not waiting:
                            return
                        continue
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.1)
        self.stop()
        raise LocalTritonError(f"tritonserver not ready after {timeout}s; log: {self.log_file}")

    def log_tail(self, lines: int = 30) -> str:
        if self.log_file is None or not self.log_file.exists():
            return ""
        return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, timeout: float = 20.0) -> None:
        """End the server by its pid: SIGTERM, then SIGKILL if it has not exited in time
        (``fast_stop``: SIGKILL at once)."""
        if self.fast_stop:
            self.kill()
            return
        process, self.process = self.process, None
        # The server starts one backend stub process per model instance in its session;
        # signalling the process group ends them together with the server.
        end_process_group(process, timeout)
        self._end_unrecorded()
        self._remove_shared_memory()
        self._remove_mount_directory()

    def kill(self) -> None:
        """End the server at once (SIGKILL), as a crash would; its shared memory is removed
        (a crashed server's would stay in /dev/shm until the host restarts)."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        self._end_unrecorded()
        self._remove_shared_memory()
        self._remove_mount_directory()

    def _remove_mount_directory(self) -> None:
        """After the server has ended (or failed to start): its copy folder goes."""
        if self.mount_directory is not None and (
            self.process is None or self.process.poll() is not None
        ):
            shutil.rmtree(self.mount_directory, ignore_errors=True)
            self.mount_directory = None

    def _end_unrecorded(self) -> None:
        """A server started but not kept (``start`` interrupted inside ``Popen``): found by
        its own shm prefix among this process's children, its group killed by its pid."""
        if not self._launching:
            return
        self._launching = False
        marker = f"shm-region-prefix-name={self.shm_prefix}".encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            try:
                status = (entry / "status").read_text()
                parent = next(x for x in status.splitlines() if x.startswith("PPid:"))
                if int(parent.split()[1]) != os.getpid() or os.getpgid(pid) != pid:
                    continue
                if marker not in (entry / "cmdline").read_bytes():
                    continue
                os.killpg(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (OSError, ValueError, StopIteration):
                continue  # ended meanwhile, or not ours

    def _remove_shared_memory(self) -> None:
        for region in Path("/dev/shm").glob(f"{self.shm_prefix}*"):
            region.unlink(missing_ok=True)

    def version_memory(self, model: str, version: int) -> int | None:
        """Resident memory of the Python-backend stub processes that run ``version`` of
        ``model`` (one per instance; each runs ``<repository>/<model>/<version>/model.py``),
        in bytes; None when no stub runs it (another backend runs inside the server). Over a
        bucket Triton runs the stub from a copy named ``folderXXXXXX``, not ``<model>``:
        this finds none there (None)."""
        total, found = 0, False
        for pid, argv in self._group_processes():
            if len(argv) > 1 and argv[0].endswith("triton_python_backend_stub"):
                script = Path(argv[1])
                if script.parent.name == str(version) and script.parent.parent.name == model:
                    rss = _resident_bytes(pid)
                    if rss is not None:
                        total, found = total + rss, True
        return total if found else None

    def server_memory(self) -> int | None:
        """Resident memory of the server process itself, in bytes (None: not running)."""
        if self.process is None or self.process.poll() is not None:
            return None
        return _resident_bytes(self.process.pid)

    def _group_processes(self) -> list[tuple[int, list[str]]]:
        """(pid, argv) of every process in the server's process group (its backend stubs)."""
        if self.process is None:
            return []
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if os.getpgid(int(entry.name)) != self.process.pid:
                    continue
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except (OSError, ProcessLookupError):
                continue  # ended meanwhile
            found.append((int(entry.name), [a.decode(errors="replace") for a in argv if a]))
        return found

    def __enter__(self) -> LocalTriton:
        return self.start() if self.process is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()
