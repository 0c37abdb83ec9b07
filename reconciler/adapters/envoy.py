"""Envoy as the router in front of Triton pools, through its admin API.

Why runtime keys through the admin API, not xDS or watched files: the route stays the
user's own Envoy config (static, or from their control plane), and the reconciler changes
only numbers in it. A route's ``weighted_clusters`` with a ``runtime_key_prefix`` reads
each cluster's weight from the runtime key ``<prefix>.<cluster>``, and a request mirror
policy's ``runtime_fraction`` its share from its ``runtime_key``; one ``POST
/runtime_modify`` sets all of them in one runtime snapshot, which Envoy applies to the next
request it routes, without a restart, a drain or a dropped request (measured: about 1 ms
per call). ``GET /runtime`` reads them back every pass, as the reconciler reads Triton's
repository index, and ``GET /config_dump`` gives the defaults Envoy falls back to when a key
is unset (after a restart: the admin layer starts empty). xDS would make the reconciler a
control plane that must serve the whole route config; a watched file needs a shared
volume and a file the reconciler owns beside the user's.

A mirror share is written as a ``FractionalPercent`` in JSON, exact to 0.01%:
``{"numerator":2000,"denominator":"TEN_THOUSAND"}`` for 20%. Envoy reads a plain integer
runtime value for a ``runtime_fraction`` as a *percent* (denominator HUNDRED), and any
integer above 100 as always (``SnapshotImpl::featureEnabled``): the 2000 written for 20%
before mirrored every request (measured: 413 mirrored of 413 routed). Query values are
percent-encoded with ``%20`` for a space: Envoy's admin does not decode ``+`` as one.

Which Envoy answers is told by a marker: each ``route`` writes a fresh random value under
``<weight prefix>.triton_gitops_marker`` in the same ``runtime_modify`` as the weights, and
``identity`` reads it back from ``GET /runtime``. The admin layer lives in the process's
memory, so any restart, cold or hot (measured: a hot-restarted child's ``/runtime`` is
empty), loses it, however briefly the admin API was away (a cold restart measured 0.12 s;
a hot restart's admin port refused one read in 1,700 made every millisecond) and even when
Envoy comes back routing exactly as set (a phase at the bootstrap's defaults).
``/server_info`` cannot tell so much: its uptimes are in whole seconds and a hot restart
keeps ``uptime_all_epochs``.

Statistics come from ``GET /stats/prometheus``: per cluster, the ``grpc_stats`` filter's
``grpc.success`` and ``grpc.total`` (a request answered with a non-OK gRPC status, a
Python model's error response among them, is in total and not in success: what Triton's
own counters miss) and the ``upstream_rq_time`` histogram (milliseconds). The bootstrap
needs ``stats_flush_on_admin: true`` for the histogram to be current when read.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from reconciler.core.sequence_affinity import (
    affinity_drift,
    discovery_response,
    walk,
    weighted_route_config,
    with_affinity,
)
from reconciler.model.analysis import PoolFigures
from reconciler.model.errors import RouterUnavailable
from reconciler.model.traffic import WEIGHT_SCALE, RouterSpec, RouteState

_DENOMINATORS = {"HUNDRED": 100, "TEN_THOUSAND": 10_000, "MILLION": 1_000_000}
# The runtime key, under the route's weight prefix, of the marker ``route`` writes; no
# route reads it (a weighted cluster's key is ``<prefix>.<cluster>``).
MARKER = "triton_gitops_marker"
# Seconds between the further reads of the statistics while the timings lag (figures).
_MERGE_WAITS = (0.01, 0.02, 0.04, 0.08)


class EnvoyRouter:
    """One Router manifest's Envoy (``spec.envoy``), observed and set through its admin
    API; every call is a short HTTP request with ``timeout``."""

    def __init__(self, spec: RouterSpec, timeout: float = 2.0) -> None:
        assert spec.envoy is not None
        self.spec, self.envoy, self.timeout = spec, spec.envoy, timeout
        self.pools = tuple(p.name for p in spec.pools)
        # The route's mirror policies as last read from Envoy's config: a switch back on a
        # failure is then one request, not two.
        self._mirrors: dict[str, tuple[str, int, int]] | None = None

    def _where(self) -> str:
        return f"router {self.spec.name} (Envoy admin {self.envoy.admin})"

    def _call(self, path: str, method: str = "GET") -> bytes:
        request = urllib.request.Request(f"{self.envoy.admin.rstrip('/')}{path}", method=method)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return bytes(response.read())
        except urllib.error.HTTPError as exc:
            body = exc.read().decode(errors="replace").strip()
            raise RouterUnavailable(
                f"{self._where()}: {method} {path.split('?')[0]} answered {exc.code}: {body}"
            ) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise RouterUnavailable(f"{self._where()}: not reachable ({reason})") from None

    def _dump(self) -> dict[str, Any]:
        dump: dict[str, Any] = json.loads(self._call("/config_dump"))
        return dump

    def _defaults(
        self, dump: Mapping[str, Any] | None = None
    ) -> tuple[dict[str, int], dict[str, tuple[str, int, int]]]:
        """From the config Envoy runs: each pool's default weight, and for each pool a
        mirror policy to it names, (its runtime key, default numerator, denominator)."""
        dump = dump if dump is not None else self._dump()
        prefix = self.envoy.weight_prefix
        found = [
            route
            for route in _routes(dump)
            if route["weighted_clusters"].get("runtime_key_prefix") == prefix
        ]
        if not found:
            raise RouterUnavailable(
                f"{self._where()}: no route has weighted_clusters with runtime_key_prefix "
                f"{prefix!r}; declare the route as examples/envoy/envoy.yaml does"
            )
        route = found[0]
        weights = {
            c["name"]: int(c.get("weight", 0)) for c in route["weighted_clusters"]["clusters"]
        }
        missing = [p for p in self.pools if p not in weights]
        if missing:
            raise RouterUnavailable(
                f"{self._where()}: the route with runtime_key_prefix {prefix!r} has no "
                f"weighted cluster {', '.join(missing)} (it has {', '.join(sorted(weights))})"
            )
        mirrors = mirror_policies(found, self.spec.mirror_targets, self.envoy.mirror_prefix)
        self._mirrors = mirrors
        return {p: weights[p] for p in self.pools}, mirrors

    def _runtime(self) -> dict[str, str]:
        entries = json.loads(self._call("/runtime")).get("entries", {})
        return {key: str(entry.get("final_value", "")) for key, entry in entries.items()}

    def observe(self) -> RouteState:
        try:
            dump = self._dump()
            defaults, mirrors = self._defaults(dump)
            runtime = self._runtime()
        except RouterUnavailable as exc:
            return RouteState(self.spec.name, False, error=str(exc))
        drift: tuple[str, ...] = ()
        if self.spec.sequence_affinity is not None:
            drift, _ = affinity_drift(dump, self.spec)
        weights = {
            pool: _integer(runtime.get(f"{self.envoy.weight_prefix}.{pool}"), default)
            for pool, default in defaults.items()
        }
        mirror = {
            pool: mirror_share(runtime.get(key), _fraction(numerator, denominator))
            for pool, (key, numerator, denominator) in mirrors.items()
        }
        return RouteState(self.spec.name, True, weights, mirror, affinity_drift=drift)

    def keep_affinity(self) -> None:
        """Write the route configuration with the declared sequence affinity to
        ``routesFile`` (a new file renamed over the old one, as Envoy's watched directory
        expects), then wait until Envoy runs it; RouterUnavailable when writing the file
        cannot restore it (the filter missing from the listener, a static route), or Envoy
        has not taken it within ``timeout``."""
        assert self.spec.sequence_affinity is not None
        dump = self._dump()
        drift, writable = affinity_drift(dump, self.spec)
        if not drift:
            return
        if not writable or self.envoy.routes_file is None:
            raise RouterUnavailable(
                f"{self._where()}: cannot restore its sequence affinity: {'; '.join(drift)}"
            )
        live, _ = weighted_route_config(dump, self.envoy.weight_prefix)
        wanted = with_affinity(live, self.spec)
        target = Path(self.envoy.routes_file)
        text = json.dumps(discovery_response(wanted, secrets.token_hex(8)), indent=1)
        try:
            partial = target.with_name(f".{target.name}.{secrets.token_hex(4)}")
            partial.write_text(text)
            os.replace(partial, target)
        except OSError as exc:
            raise RouterUnavailable(f"{self._where()}: cannot write {target}: {exc}") from None
        deadline = time.monotonic() + self.timeout
        while drift:
            if time.monotonic() > deadline:
                raise RouterUnavailable(
                    f"{self._where()}: wrote {target}, and Envoy does not run it after "
                    f"{self.timeout:g}s (is it the file its RDS reads?): {'; '.join(drift)}"
                )
            time.sleep(0.05)
            drift, _ = affinity_drift(self._dump(), self.spec)

    def route(self, weights: Mapping[str, int], mirror: Mapping[str, int]) -> str:
        """Set the weights and mirror shares; the marker written with them (``identity``)."""
        mirrors = self._mirrors if self._mirrors is not None else self._defaults()[1]
        keys = {f"{self.envoy.weight_prefix}.{pool}": str(int(w)) for pool, w in weights.items()}
        for pool, share in mirror.items():
            if pool not in mirrors:
                if share:
                    raise RouterUnavailable(
                        f"{self._where()}: the route has no request mirror policy to {pool} "
                        f"with a runtime_fraction key under {self.envoy.mirror_prefix!r}"
                    )
                continue
            keys[mirrors[pool][0]] = mirror_value(share)
        # Fresh at every update: the identity then also changes when another writer
        # routes, and no Envoy holds it that did not take this very update.
        marker = secrets.token_hex(8)
        keys[self._marker_key()] = marker
        # One call, one runtime snapshot: weights, mirror shares and the marker change
        # together. Spaces as %20: Envoy's admin takes a ``+`` in a query value literally.
        query = urllib.parse.urlencode(keys, quote_via=urllib.parse.quote)
        self._call(f"/runtime_modify?{query}", method="POST")
        return marker

    def identity(self) -> str:
        """The marker Envoy's runtime holds now; empty when none (restarted since)."""
        return self._runtime().get(self._marker_key(), "")

    def _marker_key(self) -> str:
        return f"{self.envoy.weight_prefix}.{MARKER}"

    def figures(self, pools: Iterable[str]) -> Mapping[str, PoolFigures]:
        wanted = tuple(pools)
        names = "|".join(map(_escape, wanted))
        stat = rf"^cluster\.({names})\.(grpc\.(success|total)|upstream_rq_time)$"
        path = f"/stats/prometheus?{urllib.parse.urlencode({'filter': stat})}"
        # With stats_flush_on_admin a read asks the workers to merge their histograms and is
        # answered before they have: the first read after a burst of requests shows none of
        # its timings. Read again while a pool's timings lag its gRPC count (a busy host
        # merges late: clean-clone run 20 read 0 timed of 95 on the second read), a few
        # times; a pool whose requests never reached an upstream keeps the lag.
        self._call(path)
        values = self._stat_values(path, wanted)
        for wait in _MERGE_WAITS:
            if all(_timed(values, pool) >= _total(values, pool) for pool in wanted):
                break
            time.sleep(wait)
            values = self._stat_values(path, wanted)
        return {
            pool: PoolFigures(
                # No sample yet: no request has reached the pool since Envoy started.
                total=_total(values, pool),
                success=values.get((pool, "envoy_cluster_grpc_success"), 0.0),
                time_ms=values.get((pool, "envoy_cluster_upstream_rq_time_sum")),
                timed=values.get((pool, "envoy_cluster_upstream_rq_time_count")),
            )
            for pool in wanted
        }

    def _stat_values(self, path: str, wanted: tuple[str, ...]) -> dict[tuple[str, str], float]:
        """(pool, metric name) -> value, from one read of Envoy's Prometheus statistics."""
        values: dict[tuple[str, str], float] = {}
        for family in text_string_to_metric_families(self._call(path).decode()):
            for sample in family.samples:
                cluster = sample.labels.get("envoy_cluster_name")
                if cluster in wanted and "le" not in sample.labels:
                    # The parser names a counter's sample with a _total suffix.
                    name = sample.name.removesuffix("_success_total") + (
                        "_success" if sample.name.endswith("_success_total") else ""
                    )
                    values[(cluster, name)] = float(sample.value)
        return values

    def close(self) -> None:
        pass


def mirror_policies(
    routes: Iterable[Mapping[str, Any]], targets: Iterable[str], prefix: str
) -> dict[str, tuple[str, int, int]]:
    """Per mirror target (a pool, or the comparator), the runtime key its share is set by,
    with the default numerator and denominator, from the request mirror policies of
    ``routes`` (every route whose weights the reconciler sets: a gRPC one, and one for
    Triton's HTTP API over the same pools). A policy is a target's when it mirrors to the
    target's cluster under a key below ``prefix``, or when its key is the target's own,
    ``<prefix>.<target>``, whatever cluster it names: the HTTP route mirrors the SSE copies
    to the comparator's HTTP listener (a cluster of its own) at the comparator's key, so
    that one share moves both. The first policy found for a target gives its key."""
    wanted = tuple(targets)
    keyed = {f"{prefix}.{target}": target for target in wanted}
    mirrors: dict[str, tuple[str, int, int]] = {}
    for route in routes:
        for policy in route.get("request_mirror_policies", ()):
            fraction = policy.get("runtime_fraction", {})
            key = fraction.get("runtime_key", "")
            cluster = policy.get("cluster")
            target = cluster if cluster in wanted and key.startswith(prefix) else keyed.get(key)
            if target is None or target in mirrors:
                continue
            default = fraction.get("default_value", {})
            denominator = _DENOMINATORS[default.get("denominator", "HUNDRED")]
            mirrors[target] = (key, int(default.get("numerator", 0)), denominator)
    return mirrors


def _total(values: Mapping[tuple[str, str], float], pool: str) -> float:
    return values.get((pool, "envoy_cluster_grpc_total"), 0.0)


def _timed(values: Mapping[tuple[str, str], float], pool: str) -> float:
    return values.get((pool, "envoy_cluster_upstream_rq_time_count"), 0.0)


def _escape(name: str) -> str:
    return "".join(f"\\{c}" if not c.isalnum() and c != "_" else c for c in name)


def _integer(value: str | None, default: int) -> int:
    """A runtime value as Envoy reads it: an integer, else the config's default."""
    try:
        return int(value) if value not in (None, "") else default
    except ValueError:
        return default


def mirror_value(share: int) -> str:
    """The runtime value for a mirror share out of ``WEIGHT_SCALE``: a FractionalPercent
    over TEN_THOUSAND in compact JSON (Envoy parses a runtime value that is not a number as
    a FractionalPercent in YAML, of which JSON is a subset)."""
    numerator = max(0, min(int(share), WEIGHT_SCALE))  # WEIGHT_SCALE is TEN_THOUSAND
    fraction = {"numerator": numerator, "denominator": "TEN_THOUSAND"}
    return json.dumps(fraction, separators=(",", ":"))


def mirror_share(value: str | None, default: int) -> int:
    """The share out of ``WEIGHT_SCALE`` that Envoy mirrors for a ``runtime_fraction``
    whose runtime value is ``value`` (``default``: the config's default_value as a share),
    as ``SnapshotImpl`` parses the value and ``featureEnabled`` reads it:

    - a non-negative number (what this adapter wrote before: 2000 for 20%) is a *percent*,
      its fraction dropped, and anything above 100 mirrors every request;
    - else a FractionalPercent (JSON or YAML; denominator HUNDRED when left out), a
      numerator at or above its denominator mirroring every request;
    - unset, empty, or anything else (``true``, a negative number, a malformed proto):
      the default.
    """
    if value is None or not value.strip():
        return default
    number = _number(value)
    if number is not None:
        percent = int(number)
        return WEIGHT_SCALE if percent > 100 else percent * WEIGHT_SCALE // 100
    try:
        parsed = YAML(typ="safe", pure=True).load(value)
    except (YAMLError, ValueError):
        return default
    if not isinstance(parsed, dict) or not set(parsed) <= {"numerator", "denominator"}:
        return default
    numerator = parsed.get("numerator", 0)
    if isinstance(numerator, str) and numerator.isdigit():
        numerator = int(numerator)  # proto JSON takes an integer as a string too
    names = list(_DENOMINATORS)
    named = parsed.get("denominator", "HUNDRED")
    if isinstance(named, int) and not isinstance(named, bool) and 0 <= named < len(names):
        named = names[named]  # the enum's number
    denominator = _DENOMINATORS.get(named) if isinstance(named, str) else None
    if type(numerator) is not int or numerator < 0 or denominator is None:
        return default
    return _fraction(numerator, denominator)


def _fraction(numerator: int, denominator: int) -> int:
    """A FractionalPercent as a share out of WEIGHT_SCALE. Envoy mirrors a request when a
    random number modulo the denominator is below the numerator: a numerator at or above
    the denominator mirrors every request."""
    return min(numerator * WEIGHT_SCALE // denominator, WEIGHT_SCALE)


def _number(value: str) -> float | None:
    """A runtime value Envoy takes as a number (``absl::SimpleAtod``, non-negative and
    finite), else None."""
    text = value.strip()
    if "_" in text:  # Python's float() takes 1_000, Envoy does not
        return None
    try:
        number = float(text)
    except ValueError:
        return None
    return number if math.isfinite(number) and 0 <= number < 2**64 else None


def _routes(node: Any) -> Iterator[dict[str, Any]]:
    """Every route action with weighted clusters in a config dump (static and RDS)."""
    return (found for found in walk(node) if "weighted_clusters" in found)
