"""The Triton servers the manifests declare: where each answers, and how its instances are
found (DNS). Its own module so that routes (``model.traffic``) and specs (``model.spec``)
both name servers without importing each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Location:
    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True)
class Discovery:
    """Instances of a server found through DNS: every A/AAAA record is one instance."""

    dns: str
    grpc_port: int
    metrics_port: int | None = None
    refresh: float = 10.0
    http_port: int | None = None  # Triton's HTTP port: where SSE shadow copies are asked


@dataclass(frozen=True)
class TritonServer:
    name: str
    grpc: str  # "" for a server found through discovery (its instances have one each)
    labels: Mapping[str, str] = field(default_factory=dict)
    metrics: str | None = None
    model_repository: str | None = None
    location: Location = Location("<memory>", 0)
    discovery: Discovery | None = None
    instance_of: str | None = None  # for a discovered instance: the declared server's name
    # Triton's HTTP endpoint (host:port), where the comparator asks ``generate_stream`` for
    # the SSE copies a router mirrors; "" when not declared (the reconciler needs only gRPC).
    http: str = ""
