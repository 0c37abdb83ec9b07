"""Real Prometheus and Alertmanager processes, for the metrics and alerts tests.

Debian's ``prometheus`` and ``prometheus-alertmanager`` packages, started as plain processes
on free 127.0.0.1 ports with a config file each test writes, in their own process group, and
ended by pid (SIGTERM, then SIGKILL). ``tests/services.py`` finds the binaries (skipping a
test without them) and turns these into pytest fixtures.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testkit.local_triton import end_process_group, free_port

PROMETHEUS_BINARIES = ("prometheus",)
ALERTMANAGER_BINARIES = ("prometheus-alertmanager", "alertmanager")


class ServiceError(RuntimeError):
    """A service could not be started or made ready."""


@dataclass
class _Service:
    """One server process with a config file of its own, on a loopback port."""

    binary: str
    workdir: Path
    host: str = "127.0.0.1"
    port: int = 0
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    name = "service"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.workdir / f"{self.name}.log"

    @property
    def ready_url(self) -> str:
        """What answers 200 once the service is ready."""
        return f"{self.url}/-/ready"

    def config(self) -> dict[str, Any]:
        raise NotImplementedError

    def command(self, config_file: Path) -> list[str]:
        raise NotImplementedError

    def start(self, ready_timeout: float = 30.0) -> _Service:
        """Start (or start again, on the same port) and wait until ``/-/ready`` answers."""
        if self.process is not None:
            return self
        self.workdir.mkdir(parents=True, exist_ok=True)
        if not self.port:
            self.port = free_port(self.host)
        config_file = self.workdir / f"{self.name}.yml"
        config_file.write_text(json.dumps(self.config(), indent=2))  # JSON is YAML
        with open(self.log_file, "ab") as log:
            self.process = subprocess.Popen(
                self.command(config_file),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self._wait_ready(ready_timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                code = self.process.returncode
                self.process = None
                raise ServiceError(f"{self.name} exited with {code}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.ready_url, timeout=1) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.05)
        self.stop()
        raise ServiceError(f"{self.name} not ready after {timeout}s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        if not self.log_file.exists():
            return ""
        return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, timeout: float = 10.0) -> None:
        """End the process by its pid: SIGTERM, then SIGKILL if it has not exited in time."""
        process, self.process = self.process, None
        end_process_group(process, timeout)


@dataclass
class Prometheus(_Service):
    """A Prometheus server scraping ``targets`` (host:port, path /metrics)."""

    targets: list[str] = field(default_factory=list)
    scrape_interval: str = "1s"  # also how often the rules are evaluated
    job: str = "triton"
    rule_files: list[Path] = field(default_factory=list)
    # A scrape config's own targets (each with labels, e.g. the __meta_kubernetes_* labels
    # service discovery would set) and relabelings, instead of ``targets``.
    static_configs: list[dict[str, Any]] | None = None
    relabel_configs: list[dict[str, Any]] = field(default_factory=list)

    name = "prometheus"

    def config(self) -> dict[str, Any]:
        return {
            "global": {
                "scrape_interval": self.scrape_interval,
                "evaluation_interval": self.scrape_interval,
            },
            "rule_files": [str(path) for path in self.rule_files],
            "scrape_configs": [
                {
                    "job_name": self.job,
                    "static_configs": self.static_configs or [{"targets": list(self.targets)}],
                    "relabel_configs": self.relabel_configs,
                }
            ],
        }

    def command(self, config_file: Path) -> list[str]:
        return [
            self.binary,
            f"--config.file={config_file}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address={self.host}:{self.port}",
            "--log.level=warn",
        ]


@dataclass
class Alertmanager(_Service):
    """An Alertmanager with clustering off and one receiver that sends nothing."""

    name = "alertmanager"
    # How long an alert nobody sends again stays active (Alertmanager's default: 5m).
    resolve_timeout: str = "5m"

    def config(self) -> dict[str, Any]:
        return {
            "global": {"resolve_timeout": self.resolve_timeout},
            "route": {"receiver": "null"},
            "receivers": [{"name": "null"}],
        }

    def command(self, config_file: Path) -> list[str]:
        return [
            self.binary,
            f"--config.file={config_file}",
            f"--storage.path={self.workdir / 'data'}",
            f"--web.listen-address={self.host}:{self.port}",
            "--cluster.listen-address=",
            "--log.level=warn",
        ]

    def alerts(self, **params: str) -> list[dict[str, Any]]:
        """What ``GET /api/v2/alerts`` answers (``active``, ``silenced``... as params)."""
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v2/alerts?{query}", timeout=5) as answer:
            return list(json.load(answer))
