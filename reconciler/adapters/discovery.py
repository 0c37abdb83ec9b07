"""Finding a server's instances: every address a DNS name resolves to is one Triton.

``SystemResolver`` asks the operating system (A and AAAA records, e.g. a Kubernetes headless
Service). ``HostsFileResolver`` reads names from a file first (``name address...`` lines,
``#`` comments), so tests and local fleets can point a name at loopback addresses they
control; names it does not list go to the system.
"""

from __future__ import annotations

import ipaddress
import socket
from pathlib import Path
from typing import Protocol

from reconciler.model.errors import DiscoveryFailed


class Resolver(Protocol):
    def resolve(self, name: str) -> list[str]: ...


class SystemResolver:
    def resolve(self, name: str) -> list[str]:
        try:
            answers = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise DiscoveryFailed(f"cannot resolve {name}: {exc.strerror}") from exc
        return sorted({str(answer[4][0]) for answer in answers}, key=_address_key)


class HostsFileResolver:
    def __init__(self, path: Path, fallback: Resolver | None = None) -> None:
        self.path = path
        self.fallback = fallback or SystemResolver()

    def resolve(self, name: str) -> list[str]:
        try:
            lines = self.path.read_text().splitlines()
        except OSError as exc:
            raise DiscoveryFailed(f"cannot read hosts file {self.path}: {exc}") from exc
        for line in lines:
            fields = line.split("#", 1)[0].split()
            if fields and fields[0] == name:
                for address in fields[1:]:
                    ipaddress.ip_address(address)  # refuse anything but an address
                return sorted(set(fields[1:]), key=_address_key)
        return self.fallback.resolve(name)


def _address_key(address: str) -> tuple[int, int]:
    parsed = ipaddress.ip_address(address)
    return parsed.version, int(parsed)
