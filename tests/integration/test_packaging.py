"""The container image and the deployment examples hang together: no Docker, no cluster.

Nothing is built or applied here: tests/integration/test_image.py builds and runs the image, and
no test applies the Kubernetes files to a cluster or enforces the NetworkPolicy. The
Dockerfile, the lock files, examples/deploy/kubernetes/*.yaml, the example TritonServer
manifest, the Grafana dashboard and the PrometheusRule are parsed and checked against the real
command line (``build_parser``, ``parse_arguments``), the real manifest loader, the real
metrics registry (``ReconcilerMetrics``) and ``promtool``: option names, file paths, ports,
probes, selectors and metric names that do not exist fail here instead of in a cluster.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import io
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import promql_parser
import pytest
import tritonclient.grpc as triton_grpc
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from prometheus_client import generate_latest
from ruamel.yaml import YAML

from reconciler.adapters.files import manifest_files_in, read_in_directory
from reconciler.adapters.metrics import PrometheusQuery, instance_of
from reconciler.adapters.options import ConfigFile, known_keys, misspelled_variables
from reconciler.adapters.pod_readiness import CONDITION as READINESS_CONDITION
from reconciler.cli import build_parser, parse_arguments
from reconciler.core.sequence_affinity import walk
from reconciler.core.spec.crds import crds
from reconciler.core.spec.desired import load_desired_state, read_manifests
from reconciler.core.spec.rules import analysis_source_problems
from reconciler.core.spec.shadow import MAX_SHADOW_FILE_BYTES
from reconciler.model.history import KINDS
from reconciler.service.telemetry import ReconcilerMetrics
from testkit.local_triton import LocalTriton
from testkit.release import current as current_release
from tests.integration.flows import ready_versions
from tests.services import StartPrometheus, find_binary

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
DEPLOY = ROOT / "examples" / "deploy"
KUBE = DEPLOY / "kubernetes"
MANIFESTS = DEPLOY / "manifests"
DASHBOARD = DEPLOY / "grafana" / "triton-gitops-dashboard.json"

# What Triton 2.51 exports on CPU (/work/shared/triton-on-cpu.md, checked on a real server).
TRITON_METRICS = frozenset(
    {
        "nv_inference_request_success",
        "nv_inference_request_failure",
        "nv_inference_count",
        "nv_inference_exec_count",
        "nv_inference_request_duration_us",
        "nv_inference_queue_duration_us",
        "nv_inference_compute_input_duration_us",
        "nv_inference_compute_infer_duration_us",
        "nv_inference_compute_output_duration_us",
        "nv_inference_pending_request_count",
        "nv_cpu_memory_total_bytes",
        "nv_cpu_memory_used_bytes",
        "nv_cpu_utilization",
    }
)
# What Triton exports on a GPU server (its metrics documentation; a 2.x server's output for
# one GPU: nv_gpu_utilization, ..._memory_total_bytes, ..._memory_used_bytes, ..._power_usage,
# ..._power_limit, nv_energy_consumption), and with --metrics-config summary_latencies=true
# (checked on 2.51 here: quantiles 0.5, 0.9, 0.95, 0.99, 0.999).
TRITON_GPU_AND_SUMMARY_METRICS = frozenset(
    {
        "nv_gpu_utilization",
        "nv_gpu_memory_total_bytes",
        "nv_gpu_memory_used_bytes",
        "nv_gpu_power_usage",
        "nv_gpu_power_limit",
        "nv_energy_consumption",
        "nv_inference_request_summary_us",
        "nv_inference_queue_summary_us",
    }
)
# Series Prometheus writes itself for every target it scrapes.
PROMETHEUS_OWN_SERIES = frozenset({"up"})
# The alerts the PrometheusRule must have (issue 15), and the labels each one's annotations
# must name where its expression keeps them.
ALERTS_MUST_HAVE = {
    "TritonGitopsDown": {"instance"},
    "TritonGitopsNoSuccessfulPass": {"instance"},
    "TritonGitopsServerUnreachable": {"server"},
    "TritonGitopsModelHeld": {"model", "server"},
    "TritonGitopsRolloutFailed": {"instance"},
}
# What the dashboard must show at least: every reconciler figure of the issue, and Triton's
# per-version traffic, latency and memory.
DASHBOARD_MUST_SHOW = frozenset(
    {
        "triton_gitops_pass_duration_seconds_bucket",
        "triton_gitops_passes_total",
        "triton_gitops_last_success_timestamp_seconds",
        "triton_gitops_applied_revision_info",
        "triton_gitops_drift_corrections_total",
        "triton_gitops_rollouts_total",
        "triton_gitops_server_reachable",
        "triton_gitops_git_fetch_errors_total",
        "triton_gitops_webhooks_total",
        "nv_inference_request_success",
        "nv_inference_request_failure",
        "nv_inference_request_duration_us",
        "nv_cpu_memory_used_bytes",
    }
)
NAMESPACED = frozenset(
    {
        "ServiceAccount",
        "ConfigMap",
        "Secret",
        "PersistentVolumeClaim",
        "Deployment",
        "Service",
        "ServiceMonitor",
        "PrometheusRule",
        "NetworkPolicy",
    }
)
DNS_1123 = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
LISTEN_ANYWHERE = ("0.0.0.0", "", "::", "[::]")
RSS_TARGET_BYTES = 80 * 1000 * 1000
# PID 1 of the image: it reaps the git processes GitPython kills at a timeout, and passes
# SIGTERM on (the Debian packages of these names).
INITS = ("tini", "dumb-init")


# -- reading the files ------------------------------------------------------------------------


def yaml_documents(path: Path) -> list[Any]:
    return [doc for doc in YAML(typ="safe").load_all(path.read_text()) if doc is not None]


def kube_files() -> list[Path]:
    return sorted(p for p in KUBE.iterdir() if p.suffix in (".yaml", ".yml"))


@functools.cache
def kube_objects() -> list[dict[str, Any]]:
    """Every Kubernetes object of examples/deploy/kubernetes as ``kubectl kustomize`` renders
    it (the namespace is the kustomization's: the files name none)."""
    return kube_documents_of(KUBE)


def find(kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [
        o
        for o in kube_objects()
        if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]


def one(kind: str, name: str | None = None) -> dict[str, Any]:
    found = find(kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def reconciler_deployment() -> dict[str, Any]:
    return one("Deployment", "triton-gitops")


def triton_deployment() -> dict[str, Any]:
    found = [
        d
        for d in find("Deployment")
        if any("tritonserver" in c["image"] for c in d["spec"]["template"]["spec"]["containers"])
    ]
    assert len(found) == 1, "expected one Triton Deployment"
    return found[0]


def only_container(deployment: dict[str, Any]) -> dict[str, Any]:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    container: dict[str, Any] = containers[0]
    return container


def container_env(container: dict[str, Any], namespace: str | None = None) -> dict[str, str]:
    """A container's environment: literal values, and the pod's namespace from the
    downward API (``namespace``: the pod's)."""
    env = {}
    for item in container.get("env", []):
        field_path = item.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        if field_path == "metadata.namespace" and namespace is not None:
            env[item["name"]] = namespace
            continue
        assert "value" in item, f"env {item['name']}: only literal values are checked here"
        env[item["name"]] = str(item["value"])
    return env


def container_port(container: dict[str, Any], port: int | str) -> int:
    """The containerPort a probe or a Service's targetPort (number or name) reaches."""
    for entry in container.get("ports", []):
        if port in (entry["containerPort"], entry.get("name")):
            return int(entry["containerPort"])
    raise AssertionError(f"container {container['name']} declares no port {port!r}")


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def mounted(
    deployment: dict[str, Any], container: dict[str, Any], path: str
) -> tuple[dict[str, Any], dict[str, Any], str]:
    """The volume mount and volume a file path of the container lies on, and the file's key
    in that volume (a ConfigMap's or Secret's key for those)."""
    candidates = [
        m
        for m in container.get("volumeMounts", [])
        if path == m["mountPath"].rstrip("/") or path.startswith(m["mountPath"].rstrip("/") + "/")
    ]
    assert candidates, f"{path} lies on no volume of {container['name']}"
    mount = max(candidates, key=lambda m: len(m["mountPath"].rstrip("/")))
    volume = next(
        v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]
    )
    relative = mount.get("subPath") or path[len(mount["mountPath"].rstrip("/")) + 1 :]
    source = volume.get("configMap") or volume.get("secret") or {}
    for item in source.get("items", []):
        if item["path"] == relative:
            relative = item["key"]
    return mount, volume, relative


def quantity(text: str | int | float) -> float:
    """A Kubernetes quantity ("128Mi", "50m", "1") as a number (bytes or cores)."""
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3, "M": 1e6, "G": 1e9}
    value = str(text)
    if value.endswith("m"):
        return float(value[:-1]) / 1000
    for suffix, factor in units.items():
        if value.endswith(suffix):
            return float(value[: -len(suffix)]) * factor
    return float(value)


@functools.cache
def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuations joined and comment lines dropped."""
    instructions: list[tuple[str, str]] = []
    current = ""
    for line in DOCKERFILE.read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        keyword, _, rest = (current + stripped).partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
        current = ""
    assert not current, "the Dockerfile ends inside a continuation"
    return instructions


def docker(keyword: str) -> list[str]:
    return [rest for key, rest in dockerfile() if key == keyword]


def image_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for rest in docker("ENV"):
        for pair in shlex.split(rest):
            key, sep, value = pair.partition("=")
            assert sep, f"ENV {rest}: use the KEY=VALUE form"
            env[key] = value
    return env


def image_entrypoint() -> list[str]:
    (entrypoint,) = docker("ENTRYPOINT")
    command: list[str] = json.loads(entrypoint)  # exec form: signals reach the process
    return command


def reconciler_command() -> list[str]:
    """What the image's init process starts: its ENTRYPOINT after ``--``."""
    command = image_entrypoint()
    assert Path(command[0]).name in INITS, f"PID 1 is {command[0]}, not an init process"
    return command[command.index("--") + 1 :]


def run_options() -> dict[str, argparse.Action]:
    """The long options of `triton-gitops run`, by name without the dashes."""
    run = build_parser().commands["run"]
    return {
        option[2:]: action
        for action in run._actions
        for option in action.option_strings
        if option.startswith("--") and option != "--help"
    }


def reconciler_config() -> tuple[str, dict[str, Any]]:
    """The config file the reconciler's Deployment points $TRITON_GITOPS_CONFIG at, parsed."""
    deployment = reconciler_deployment()
    container = only_container(deployment)
    path = container_env(container, deployment["metadata"]["namespace"])["TRITON_GITOPS_CONFIG"]
    _, volume, key = mounted(deployment, container, path)
    assert "configMap" in volume, f"{path} is not on a ConfigMap volume"
    config_map = one("ConfigMap", volume["configMap"]["name"])
    assert key in config_map["data"], f"ConfigMap has no key {key} for {path}"
    config = YAML(typ="safe").load(config_map["data"][key])
    assert isinstance(config, dict), "the config file must be a mapping"
    return key, config


def startup_environment() -> dict[str, str]:
    """The reconciler container's environment: the image's ENV, then the Deployment's env."""
    deployment = reconciler_deployment()
    namespace = deployment["metadata"]["namespace"]
    return {**image_env(), **container_env(only_container(deployment), namespace)}


def container_startup() -> argparse.Namespace:
    """Parse the command line the reconciler container runs, the way `triton-gitops` does:
    ENTRYPOINT plus the Deployment's args, defaults from the environment and config file."""
    container = only_container(reconciler_deployment())
    assert "command" not in container, "the image's ENTRYPOINT must not be replaced"
    entrypoint = reconciler_command()
    assert entrypoint[0] == "triton-gitops"
    key, config = reconciler_config()
    return parse_arguments(
        [*entrypoint[1:], *map(str, container.get("args", []))],
        startup_environment(),
        ConfigFile(Path(key), config),
    )


# Grafana's range variables, which stand where PromQL takes a duration ([$__rate_interval]);
# its other variables ($job, $server) stand only inside label values, which are strings.
GRAFANA_RANGES = re.compile(
    r"\$(?:__(?:rate_interval|interval|range)\b|\{__(?:rate_interval|interval|range)\})"
)


def promql_selectors(expr: str) -> list[tuple[str, bool]]:
    """Each series selector of a PromQL expression (with Grafana variables), as promql-parser
    (the project's PromQL parser, core/spec/promql.py) reads it: (metric name, whether it is
    selected over a range, as rate() and increase() take it)."""
    tree = promql_parser.parse(GRAFANA_RANGES.sub("5m", expr))
    found: list[tuple[str, bool]] = []
    ranges = [0]  # range selections (matrix, subquery) around the node visited

    def name(selector: promql_parser.VectorSelector) -> str:
        if selector.name:
            return selector.name
        (named,) = [m.value for m in selector.matchers.matchers if m.name == "__name__"]
        return named

    def enter(node: promql_parser.Expr) -> None:
        if isinstance(node, promql_parser.MatrixSelector | promql_parser.SubqueryExpr):
            ranges[0] += 1
        elif isinstance(node, promql_parser.VectorSelector):
            found.append((name(node), ranges[0] > 0))

    def leave(node: promql_parser.Expr) -> None:
        if isinstance(node, promql_parser.MatrixSelector | promql_parser.SubqueryExpr):
            ranges[0] -= 1

    promql_parser.walk(tree, enter, leave)
    return found


def promql_metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression (with Grafana variables) selects."""
    return {name for name, _ in promql_selectors(expr)}


def exported_metric_names() -> set[str]:
    """Every series name the reconciler's real registry exposes, labelled ones included."""
    names = set()
    for line in generate_latest(ReconcilerMetrics().registry).decode().splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            if kind == "histogram":
                names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
            elif kind == "summary":
                names |= {f"{name}_sum", f"{name}_count"}
            else:
                names.add(name)
        elif line and not line.startswith("#"):
            match = re.match(r"[A-Za-z_:][\w:]*", line)
            assert match is not None
            names.add(match.group())
    return names


def relabel(rule: dict[str, Any], labels: dict[str, str]) -> dict[str, str]:
    """One Prometheus `replace` relabeling (anchored regex, $1 / ${1} in the replacement)."""
    assert rule.get("action", "replace") == "replace"
    value = rule.get("separator", ";").join(labels.get(s, "") for s in rule["sourceLabels"])
    match = re.fullmatch(rule.get("regex", "(.*)"), value)
    if match is None:
        return labels
    replaced = re.sub(
        r"\$\{(\w+)\}|\$(\w+)",
        lambda m: match.group(int(m.group(1) or m.group(2))),
        rule.get("replacement", "$1"),
    )
    return {**labels, rule["targetLabel"]: replaced}


# -- every file -------------------------------------------------------------------------------


def test_every_yaml_and_json_file_parses() -> None:
    yamls = sorted([*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml")])
    jsons = sorted(DEPLOY.rglob("*.json"))
    assert {p.name for p in yamls} >= {
        "kustomization.yaml",
        "serviceaccount.yaml",
        "configmap.yaml",
        "secret.yaml",
        "deployment.yaml",
        "service.yaml",
        "servicemonitor.yaml",
        "prometheusrule.yaml",
        "triton.yaml",
        "networkpolicy.yaml",
    }
    assert DASHBOARD in jsons
    for path in yamls:
        documents = yaml_documents(path)
        assert documents, f"{path} holds no document"
        assert all(isinstance(d, dict) for d in documents), f"{path}: a document is no mapping"
    for path in jsons:
        assert isinstance(json.loads(path.read_text()), dict), path


def test_the_namespace_is_written_in_one_place() -> None:
    """Only the kustomization names the namespace; every namespaced object gets it."""
    files = [p for p in kube_files() if p.name != "kustomization.yaml"]
    written = [
        f"{p.name}: {d['kind']} {d['metadata']['name']}"
        for p in files
        for d in yaml_documents(p)
        if "namespace" in d.get("metadata", {})
        or any("namespace" in s for s in d.get("subjects", []))
    ]
    assert not written, written
    kustomization = YAML(typ="safe").load((KUBE / "kustomization.yaml").read_text())
    assert {o["metadata"].get("namespace") for o in kube_objects() if o["kind"] in NAMESPACED} == {
        kustomization["namespace"]
    }


def test_kubernetes_objects_are_well_formed() -> None:
    objects = kube_objects()
    namespaces = {o["metadata"]["name"] for o in objects if o["kind"] == "Namespace"}
    seen = set()
    for obj in objects:
        for field in ("apiVersion", "kind", "metadata"):
            assert obj.get(field), f"an object without {field}: {obj}"
        name = obj["metadata"].get("name")
        assert isinstance(name, str) and DNS_1123.fullmatch(name), f"bad name {name!r}"
        assert (obj["kind"], name) not in seen, f"{obj['kind']} {name} twice"
        seen.add((obj["kind"], name))
        if obj["kind"] in NAMESPACED:
            assert obj["metadata"].get("namespace") in namespaces, f"{obj['kind']} {name}"
    for deployment in find("Deployment"):
        template = deployment["spec"]["template"]
        assert selects(
            deployment["spec"]["selector"]["matchLabels"], template["metadata"]["labels"]
        )
        names = {v["name"] for v in template["spec"].get("volumes", [])}
        for container in template["spec"]["containers"]:
            for mount in container.get("volumeMounts", []):
                assert mount["name"] in names, f"{container['name']}: no volume {mount['name']}"
        for volume in template["spec"].get("volumes", []):
            for kind, key, field in (
                ("ConfigMap", "configMap", "name"),
                ("Secret", "secret", "secretName"),
                ("PersistentVolumeClaim", "persistentVolumeClaim", "claimName"),
            ):
                if key in volume:
                    one(kind, volume[key][field])
        if "serviceAccountName" in template["spec"]:
            one("ServiceAccount", template["spec"]["serviceAccountName"])


def test_kustomization_lists_exactly_the_files_present() -> None:
    (kustomization,) = yaml_documents(KUBE / "kustomization.yaml")
    assert kustomization["kind"] == "Kustomization"
    resources = kustomization["resources"]
    assert len(resources) == len(set(resources)), "a resource listed twice"
    present = {p.name for p in kube_files()} - {"kustomization.yaml"}
    assert set(resources) == present
    # The rendered Deployment runs the release's image: the name and tag pyproject.toml gives.
    assert only_container(reconciler_deployment())["image"] == current_release().image_ref


def test_kustomize_renders_every_object() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed")
    rendered = subprocess.run(
        [kubectl, "kustomize", str(KUBE)], capture_output=True, text=True, timeout=60
    )
    assert rendered.returncode == 0, rendered.stderr
    objects = [d for d in YAML(typ="safe").load_all(rendered.stdout) if d is not None]
    assert {(o["kind"], o["metadata"]["name"]) for o in objects} == {
        (o["kind"], o["metadata"]["name"]) for o in kube_objects()
    }


def test_kustomize_renders_the_crds_as_generated() -> None:
    """examples/deploy/crds: the optional CustomResourceDefinitions (issue 45, point 4),
    rendered by kubectl's kustomize as ``triton-gitops crds`` generates them."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed")
    rendered = subprocess.run(
        [kubectl, "kustomize", str(ROOT / "examples" / "deploy" / "crds")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert rendered.returncode == 0, rendered.stderr
    objects = [d for d in YAML(typ="safe").load_all(rendered.stdout) if d is not None]
    names = sorted(o["metadata"]["name"] for o in objects)
    assert names == sorted(c["metadata"]["name"] for c in crds()), names
    assert {o["kind"] for o in objects} == {"CustomResourceDefinition"}


# -- the reconciler's Deployment, Service, ConfigMap and Secret -------------------------------


def test_reconciler_runs_once_without_root_on_a_read_only_root() -> None:
    deployment = reconciler_deployment()
    pod = deployment["spec"]["template"]["spec"]
    container = only_container(deployment)
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"]["type"] == "Recreate", "never two reconcilers at once"
    assert pod["securityContext"]["runAsNonRoot"] is True
    uid = docker("USER")[-1].split(":")[0]
    assert uid.isdigit() and pod["securityContext"]["runAsUser"] == int(uid), "the image's user"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    args = container_startup()
    env = startup_environment()
    writable = {
        "state": str(args.state.parent),
        "cache": str(args.cache_dir),
        "home": env["HOME"],
        "tmp": "/tmp",
    }
    for what, path in writable.items():
        mount, volume, _ = mounted(deployment, container, path)
        assert not mount.get("readOnly"), f"{what} ({path}) is on a read-only mount"
        assert "emptyDir" in volume or "persistentVolumeClaim" in volume, f"{what} ({path})"
    _, state_volume, _ = mounted(deployment, container, str(args.state))
    assert "persistentVolumeClaim" in state_volume, "holds and placements must survive restarts"
    requests, limits = container["resources"]["requests"], container["resources"]["limits"]
    assert RSS_TARGET_BYTES <= quantity(requests["memory"]) <= quantity(limits["memory"])
    assert quantity(limits["memory"]) <= 2**30, "sized for an 80 MB process, not more"
    assert 0 < quantity(requests["cpu"]) <= quantity(limits["cpu"])
    assert pod["terminationGracePeriodSeconds"] > args.shutdown_deadline, (
        "Kubernetes would kill the reconciler before the change in progress finishes"
    )


def test_probes_reach_health_endpoints_on_the_port_the_service_exposes() -> None:
    deployment = reconciler_deployment()
    container = only_container(deployment)
    liveness = container["livenessProbe"]["httpGet"]
    readiness = container["readinessProbe"]["httpGet"]
    assert liveness["path"] == "/healthz"
    assert readiness["path"] == "/readyz"
    port = container_port(container, liveness["port"])
    assert container_port(container, readiness["port"]) == port
    host, _, listen_port = container_startup().listen.rpartition(":")
    assert int(listen_port) == port, "the daemon listens where the probes knock"
    assert host in LISTEN_ANYWHERE, "127.0.0.1 is unreachable from the kubelet and Prometheus"
    (service,) = [
        s
        for s in find("Service")
        if selects(s["spec"]["selector"], deployment["spec"]["template"]["metadata"]["labels"])
    ]
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert container_port(container, ports["http"]["targetPort"]) == port
    assert ports["http"]["port"] == 9090
    # The comparator's port: where the daemon listens for the router's mirror.
    comparator = container_startup().comparator_listen
    assert comparator is not None
    assert container_port(container, ports["comparator"]["targetPort"]) == int(
        comparator.rpartition(":")[2]
    )
    # Its HTTP listener, for the copies of generate_stream requests.
    comparator_http = container_startup().comparator_http_listen
    assert comparator_http is not None
    assert container_port(container, ports["comparator-http"]["targetPort"]) == int(
        comparator_http.rpartition(":")[2]
    )
    assert set(ports) == {"http", "comparator", "comparator-http"}


def test_config_file_keys_are_run_options_and_are_accepted() -> None:
    _, config = reconciler_config()
    options = run_options()
    assert set(config) <= set(options), f"not options of run: {set(config) - set(options)}"
    assert {"repo", "ref", "path", "interval", "revert-mode"} <= set(config)
    # raises on a value it cannot take; --repo is required: the file gives it
    args = parse_arguments(["run"], {}, ConfigFile(Path("config.yaml"), config))
    for key, value in config.items():
        action = options[key]
        if action.nargs == 0:  # a flag
            expected: Any = bool(value)
        elif callable(action.type):
            expected = action.type(str(value))
        else:
            expected = str(value)
        assert getattr(args, action.dest) == expected, key
    # A key also set in the environment is silently overridden by it (environment wins).
    shadowed = {
        k for k in config if "TRITON_GITOPS_" + k.upper().replace("-", "_") in startup_environment()
    }
    assert not shadowed, f"set in the environment, ignored in the config file: {shadowed}"


def test_container_command_line_is_accepted() -> None:
    args = container_startup()
    _, config = reconciler_config()
    assert args.command == "run"
    assert args.repo == config["repo"]
    assert args.git_token_file is not None
    assert args.github_secret_file is not None
    assert args.reconcile_token_file is not None


def test_secret_files_are_the_ones_the_file_options_name() -> None:
    deployment = reconciler_deployment()
    container = only_container(deployment)
    args = vars(container_startup())
    file_options = [
        action.dest
        for name, action in run_options().items()
        if name.endswith("-file") or name == "git-ssh-key"
    ]
    secrets: dict[str, set[str]] = {}
    for dest in file_options:
        if args[dest] is None:
            continue
        _, volume, key = mounted(deployment, container, str(args[dest]))
        assert "secret" in volume, f"--{dest}: {args[dest]} is not on a Secret volume"
        secrets.setdefault(volume["secret"]["secretName"], set()).add(key)
    assert secrets, "no credentials file is configured"
    for name, keys in secrets.items():
        secret = one("Secret", name)
        present = set(secret.get("stringData", {})) | set(secret.get("data", {}))
        assert keys == present, f"Secret {name}: files {present}, options name {keys}"
    for volume in deployment["spec"]["template"]["spec"]["volumes"]:
        if "secret" in volume:
            mode = volume["secret"].get("defaultMode", 0o644)
            assert not mode & 0o002, "secret files must not be world-writable"
            assert mode & 0o040 or mode & 0o004, "the non-root user reads them via fsGroup"


def test_servicemonitors_scrape_the_services() -> None:
    monitors = find("ServiceMonitor")
    assert monitors
    scraped = set()
    for monitor in monitors:
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        own = [monitor["metadata"]["namespace"]]  # no namespaceSelector: its own namespace
        namespaces = monitor["spec"].get("namespaceSelector", {}).get("matchNames", own)
        services = [
            s
            for s in find("Service")
            if s["metadata"]["namespace"] in namespaces
            and selects(monitor["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])
        ]
        assert services, f"ServiceMonitor {monitor['metadata']['name']} selects no Service"
        for endpoint in monitor["spec"]["endpoints"]:
            assert endpoint["path"] == "/metrics"
            for service in services:
                assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
                scraped.add(service["metadata"]["name"])
    assert "triton-gitops" in scraped
    triton_service = one("Service", triton_service_name())
    assert triton_service["metadata"]["name"] in scraped


# -- every Deployment, and the NetworkPolicy --------------------------------------------------


@pytest.mark.parametrize("which", ["reconciler", "triton"])
def test_each_deployment_runs_unprivileged_on_a_read_only_root(which: str) -> None:
    deployment = reconciler_deployment() if which == "reconciler" else triton_deployment()
    pod = deployment["spec"]["template"]["spec"]
    container = only_container(deployment)
    context = {**pod.get("securityContext", {}), **container.get("securityContext", {})}
    name = deployment["metadata"]["name"]
    assert context.get("runAsNonRoot") is True, name
    uid = context.get("runAsUser")
    assert isinstance(uid, int) and uid > 0, f"{name}: a numeric non-root runAsUser"
    assert context.get("readOnlyRootFilesystem") is True, name
    assert context.get("allowPrivilegeEscalation") is False, name
    assert context.get("capabilities", {}).get("drop") == ["ALL"], name
    assert not context.get("capabilities", {}).get("add"), name
    assert context.get("seccompProfile", {}).get("type") == "RuntimeDefault", name
    # What the process writes lies on a writable volume, not on the root.
    mount, volume, _ = mounted(deployment, container, "/tmp")
    assert not mount.get("readOnly") and "emptyDir" in volume, f"{name}: /tmp"


def network_policy() -> dict[str, Any]:
    policy = one("NetworkPolicy", "triton-gitops")
    assert policy["apiVersion"] == "networking.k8s.io/v1"
    return policy


def namespace_of(peer: dict[str, Any]) -> str | None:
    """The namespace a policy peer names by its kubernetes.io/metadata.name label."""
    labels = peer.get("namespaceSelector", {}).get("matchLabels", {})
    name: str | None = labels.get("kubernetes.io/metadata.name")
    return name


def allowed_ports(rule: dict[str, Any], container: dict[str, Any] | None = None) -> set[int]:
    """A rule's TCP ports as numbers (a named port is the container's)."""
    ports = set()
    for entry in rule["ports"]:
        if entry.get("protocol", "TCP") != "TCP":
            continue
        port = entry["port"]
        if isinstance(port, str):
            assert container is not None, f"named port {port} outside the selected pods"
            port = container_port(container, port)
        ports.add(int(port))
    return ports


def test_network_policy_lets_in_webhooks_prometheus_and_the_routers_mirror_only() -> None:
    policy = network_policy()
    deployment = reconciler_deployment()
    container = only_container(deployment)
    assert selects(
        policy["spec"]["podSelector"]["matchLabels"],
        deployment["spec"]["template"]["metadata"]["labels"],
    )
    assert set(policy["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    rule, shadow = policy["spec"]["ingress"]
    service = one("Service", "triton-gitops")
    service_ports = {container_port(container, p["targetPort"]) for p in service["spec"]["ports"]}
    assert service_ports == {9090, 8011, 8012}
    assert allowed_ports(rule, container) == {9090}
    # The comparator's ports, where the reconciler listens for it (gRPC copies, HTTP copies
    # of generate_stream requests), from the router's namespace only (the Service exposes
    # them to the router's mirror).
    assert allowed_ports(shadow, container) == {8011, 8012}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TRITON_GITOPS_COMPARATOR_LISTEN"] == "0.0.0.0:8011"
    assert env["TRITON_GITOPS_COMPARATOR_HTTP_LISTEN"] == "0.0.0.0:8012"
    assert [namespace_of(peer) for peer in shadow["from"]] == ["serving"]
    peers = rule["from"]
    assert all(set(peer) == {"namespaceSelector"} for peer in peers), "namespaces, no ipBlock"
    # Prometheus: where the ServiceMonitor's Prometheus and configmap.yaml's prometheus-url are.
    _, config = reconciler_config()
    prometheus = urlsplit(config["prometheus-url"]).hostname
    assert prometheus, "prometheus-url names no host"
    monitoring = prometheus.split(".")[1]  # <service>.<namespace>.svc...
    assert sorted(namespace_of(peer) or "" for peer in peers) == sorted(
        ["ingress-nginx", monitoring]
    )


def test_network_policy_lets_the_reconciler_reach_what_it_calls() -> None:
    policy = network_policy()
    egress = policy["spec"]["egress"]

    def reaches(namespace: str | None, labels: dict[str, str], port: int) -> bool:
        """Whether some rule lets a pod (``labels``) of ``namespace`` (None: the policy's own)
        be reached on TCP ``port``."""
        for rule in egress:
            for peer in rule["to"]:
                if "ipBlock" in peer:
                    continue
                in_namespace = (
                    namespace_of(peer) == namespace
                    if "namespaceSelector" in peer
                    else namespace in (None, policy["metadata"]["namespace"])
                )
                pods = peer.get("podSelector", {}).get("matchLabels", {})
                if in_namespace and selects(pods, labels) and port in allowed_ports(rule):
                    return True
        return False

    # Triton: the ports of the example TritonServer's grpc, http and metrics addresses, on the pods
    # its Service selects.
    triton = triton_deployment()
    triton_labels = triton["spec"]["template"]["metadata"]["labels"]
    service = one("Service", triton_service_name())
    by_service_port = {
        p["port"]: container_port(only_container(triton), p["targetPort"])
        for p in service["spec"]["ports"]
    }
    for path in MANIFESTS.rglob("*.yaml"):
        for doc in yaml_documents(path):
            spec = doc["spec"]
            # gRPC (the reconciler), HTTP (the comparator's generate_stream calls), metrics.
            for address in (spec["grpc"], spec["http"], urlsplit(spec["metrics"]).netloc):
                port = by_service_port[int(address.rpartition(":")[2])]
                assert reaches(None, triton_labels, port), f"Triton at {address}"
    # Prometheus and Alertmanager, where configmap.yaml points.
    _, config = reconciler_config()
    for key in ("prometheus-url", "alertmanager-url"):
        url = urlsplit(config[key])
        assert url.hostname and url.port
        assert reaches(url.hostname.split(".")[1], {}, url.port), key
    # DNS, over UDP and TCP.
    dns = [
        {e.get("protocol", "TCP") for e in rule["ports"] if e["port"] == 53}
        for rule in egress
        if any(namespace_of(peer) == "kube-system" for peer in rule["to"])
    ]
    assert {"UDP", "TCP"} in dns
    # The Git host: https and ssh remotes, outside the cluster.
    git_rules = [r for r in egress if any("ipBlock" in peer for peer in r["to"])]
    assert any({443, 22} <= allowed_ports(rule) for rule in git_rules)
    assert urlsplit(config["repo"]).scheme == "https"


# -- Triton ----------------------------------------------------------------------------------


def triton_args() -> dict[str, str]:
    args = {}
    for arg in only_container(triton_deployment())["args"]:
        key, sep, value = str(arg).partition("=")
        assert sep, f"{arg}: use --flag=value"
        args[key] = value
    return args


def triton_service_name() -> str:
    labels = triton_deployment()["spec"]["template"]["metadata"]["labels"]
    (service,) = [s for s in find("Service") if selects(s["spec"]["selector"], labels)]
    name: str = service["metadata"]["name"]
    return name


def test_triton_is_started_the_way_production_needs() -> None:
    deployment = triton_deployment()
    container = only_container(deployment)
    assert container["image"] == "nvcr.io/nvidia/tritonserver:24.10-py3"
    assert container.get("command") == ["tritonserver"]
    args = triton_args()
    assert args["--model-control-mode"] == "explicit"
    assert int(args["--model-load-thread-count"]) > 0
    exit_timeout = int(args["--exit-timeout-secs"])
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > exit_timeout
    preload = container_env(container)["LD_PRELOAD"].split(":")
    assert "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4" in preload
    ports = {
        "http": int(args["--http-port"]),
        "grpc": int(args["--grpc-port"]),
        "metrics": int(args["--metrics-port"]),
    }
    assert ports == {"http": 8000, "grpc": 8001, "metrics": 8002}
    for name, number in ports.items():
        assert container_port(container, name) == number
    # Not /v2/health/ready (400 while a version loads beside the serving one, 200 on an
    # empty restarted pod): the process answers; the readiness gate says what it serves.
    readiness = container["readinessProbe"]["httpGet"]
    assert readiness["path"] == "/v2/health/live"
    assert container_port(container, readiness["port"]) == ports["http"]
    mount, _, _ = mounted(deployment, container, args["--model-repository"])
    assert mount.get("readOnly") is True, "Triton only reads its model repository"
    assert deployment["spec"]["replicas"] == 1, "one address, one Triton process"
    service = one("Service", triton_service_name())
    assert service["spec"]["clusterIP"] == "None", "headless: the address is the pod's"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert {
        p["port"]: container_port(container, p["targetPort"]) for p in service["spec"]["ports"]
    } == {
        8000: 8000,
        8001: 8001,
        8002: 8002,
    }


def test_the_readiness_gate_is_declared_set_and_allowed() -> None:
    """Triton's pods declare the condition the reconciler sets; the reconciler is told their
    namespace, may find and patch them, has a token, and may reach the API server."""
    triton = triton_deployment()
    gates = triton["spec"]["template"]["spec"]["readinessGates"]
    assert gates == [{"conditionType": READINESS_CONDITION}]
    namespace = triton["metadata"]["namespace"]
    assert container_startup().readiness_gate == namespace  # from the downward API
    reconciler = reconciler_deployment()
    assert reconciler["spec"]["template"]["spec"]["automountServiceAccountToken"] is True
    account = reconciler["spec"]["template"]["spec"]["serviceAccountName"]
    binding = one("RoleBinding", "triton-gitops-readiness-gate")
    assert binding["metadata"]["namespace"] == namespace
    assert {"kind": "ServiceAccount", "name": account,
            "namespace": reconciler["metadata"]["namespace"]} in binding["subjects"]  # fmt: skip
    role = one("Role", binding["roleRef"]["name"])
    granted = {(r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]}
    assert {("pods", "list"), ("pods/status", "patch")} <= granted
    assert not any(v in ("update", "delete", "create") for _, v in granted), granted
    api_rules = [
        r for r in network_policy()["spec"]["egress"]
        if any("ipBlock" in peer for peer in r["to"]) and 6443 in allowed_ports(r)
    ]  # fmt: skip
    assert api_rules, "no egress to the Kubernetes API server"


def test_example_triton_server_manifest_matches_the_service_and_the_scrape() -> None:
    desired = load_desired_state(manifest_files_in(MANIFESTS))  # raises when invalid
    assert analysis_source_problems(desired, prometheus=True) == []
    assert desired.servers
    service = one("Service", triton_service_name())
    namespace = service["metadata"]["namespace"]
    host = f"{service['metadata']['name']}.{namespace}.svc.cluster.local"
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    (monitor,) = [
        m
        for m in find("ServiceMonitor")
        if selects(m["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    ]
    (endpoint,) = monitor["spec"]["endpoints"]
    # The labels Prometheus gives the target before relabeling: the pod's address.
    labels = {
        "__address__": f"10.1.2.3:{ports[endpoint['port']]}",
        "__meta_kubernetes_service_name": service["metadata"]["name"],
        "__meta_kubernetes_namespace": namespace,
        **service_label_meta(service),
    }
    labels["instance"] = labels["__address__"]
    for rule in endpoint.get("relabelings", []):
        labels = relabel(rule, labels)
    for path in MANIFESTS.rglob("*.yaml"):
        for doc in yaml_documents(path):
            assert doc["kind"] == "TritonServer"
            assert doc["spec"]["grpc"] == f"{host}:{ports['grpc']}"
            assert doc["spec"]["metrics"] == f"http://{host}:{ports['metrics']}/metrics"
            # With prometheus-url, the analysis queries instance=<this>: it must be the label.
            assert instance_of(doc["spec"]["metrics"]) == labels["instance"]


def service_label_meta(service: dict[str, Any]) -> dict[str, str]:
    """The __meta_kubernetes_service_label_* labels Kubernetes service discovery gives a
    target of ``service`` (each label name with its non-alphanumerics made _)."""
    return {
        "__meta_kubernetes_service_label_" + re.sub(r"[^A-Za-z0-9_]", "_", name): value
        for name, value in service["metadata"].get("labels", {}).items()
    }


def tritonserver_monitor_endpoint() -> dict[str, Any]:
    (monitor,) = [m for m in find("ServiceMonitor") if m["metadata"]["name"] == "tritonserver"]
    (endpoint,) = monitor["spec"]["endpoints"]
    return dict(endpoint)


def as_relabel_config(rule: dict[str, Any]) -> dict[str, Any]:
    """A ServiceMonitor relabeling in Prometheus's own spelling (what the operator writes)."""
    names = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
    return {names.get(key, key): value for key, value in rule.items()}


@pytest.mark.triton
def test_the_reconciler_finds_each_servers_series_through_the_servicemonitors_relabeling(
    triton: LocalTriton, model_repository: Path, start_prometheus: StartPrometheus
) -> None:
    """A real Prometheus scrapes two real tritonservers with the ServiceMonitor's relabelings:
    one as a TritonServer with its own headless Service (spec.metrics names the Service),
    one as a discovered instance (its pod address). The reconciler's own query finds each."""
    fleet = LocalTriton(model_repository).start()
    try:
        for server in (triton, fleet):
            with triton_grpc.InferenceServerClient(server.grpc_address) as client:
                client.load_model("echo")
        service = one("Service", triton_service_name())
        fixed_meta = {
            "__meta_kubernetes_service_name": service["metadata"]["name"],
            "__meta_kubernetes_namespace": service["metadata"]["namespace"],
            **service_label_meta(service),
        }
        # A discovery fleet's headless Service: one Service, many pods, no instance label.
        fleet_meta = {"__meta_kubernetes_service_name": "triton-fleet",
                      "__meta_kubernetes_namespace": "triton"}  # fmt: skip
        endpoint = tritonserver_monitor_endpoint()
        prometheus = start_prometheus(
            [],
            static_configs=[
                {"targets": [f"127.0.0.1:{triton.metrics_port}"], "labels": fixed_meta},
                {"targets": [f"127.0.0.1:{fleet.metrics_port}"], "labels": fleet_meta},
            ],
            relabel_configs=[as_relabel_config(r) for r in endpoint["relabelings"]],
        )
        host = f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc.cluster.local"
        fixed = PrometheusQuery.for_metrics_url(
            prometheus.url, f"http://{host}:{triton.metrics_port}/metrics"
        )
        # What DesiredState.with_instances makes a discovered instance's metrics URL.
        discovered = PrometheusQuery.for_metrics_url(
            prometheus.url, f"http://127.0.0.1:{fleet.metrics_port}/metrics"
        )
        versions = tuple(sorted(ready_versions(triton, "echo")))
        for name, reader in (("fixed server", fixed), ("discovered instance", discovered)):
            deadline = time.monotonic() + 30
            figures = reader.figures("echo", versions)
            while figures.success is None and time.monotonic() < deadline:
                time.sleep(0.5)
                figures = reader.figures("echo", versions)
            assert figures.error is None and figures.success is not None, (
                f"{name}: no series for instance={reader.instance}\n{prometheus.log_tail()}"
            )
    finally:
        fleet.stop()


def test_the_object_storage_example_points_triton_and_the_reconciler_at_one_bucket() -> None:
    """examples/deploy/object-storage: the Kubernetes example with the model repository in
    a bucket. Triton's --model-repository is the manifest's spec.modelRepository, both
    containers get the store's credentials from one Secret, and no model volume is left."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed")
    example = DEPLOY / "object-storage"
    rendered = subprocess.run(
        [kubectl, "kustomize", str(example)], capture_output=True, text=True, timeout=60
    )
    assert rendered.returncode == 0, rendered.stderr
    objects = [d for d in YAML(typ="safe").load_all(rendered.stdout) if d is not None]
    by_name = {(o["kind"], o["metadata"]["name"]): o for o in objects}
    desired = load_desired_state(manifest_files_in(example / "manifests"))  # raises if invalid
    (server,) = desired.servers.values()
    assert server.model_repository and server.model_repository.startswith("s3://")

    triton = by_name[("Deployment", "tritonserver-edge-a")]["spec"]["template"]["spec"]
    (container,) = triton["containers"]
    assert container["args"][0] == f"--model-repository={server.model_repository}"
    assert ("PersistentVolumeClaim", "triton-model-repository") not in by_name
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in triton["volumes"]}
    assert "/models" not in mounts and set(mounts.values()) <= set(volumes)
    copies = {e["name"]: e.get("value") for e in container["env"]}["TRITON_AWS_MOUNT_DIRECTORY"]
    assert "emptyDir" in volumes[mounts[copies]], "Triton's copies of the models need a volume"

    secret = by_name[("Secret", "model-store")]
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"} <= set(
        secret["stringData"]
    )
    reconciler = by_name[("Deployment", "triton-gitops")]["spec"]["template"]["spec"]
    for spec in (triton, reconciler):
        (only,) = spec["containers"]
        assert only["envFrom"] == [{"secretRef": {"name": "model-store"}}], only["name"]


# -- the Grafana dashboard --------------------------------------------------------------------


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def dashboard_queries() -> list[str]:
    """Every PromQL expression of the dashboard: panel targets and annotations."""
    return [node["expr"] for node in walk(dashboard()) if isinstance(node.get("expr"), str)]


def test_promql_metric_name_extraction() -> None:
    expr = (
        'histogram_quantile(0.9, sum by (le) (rate(a_bucket{job=~"$job"}[$__rate_interval])))'
        " / on (x) group_left (y) sum without (z) (b_total offset 5m) or vector(0) > bool c"
    )
    assert promql_metric_names(expr) == {"a_bucket", "b_total", "c"}


def test_promql_selectors_say_which_are_read_over_a_range() -> None:
    expr = (
        'rate(a_total[$__rate_interval]) + max_over_time(b[${__range}:1m]) + c{x="$y"}'
        ' + {__name__="d"}'
    )
    found = sorted(promql_selectors(expr))
    assert found == [("a_total", True), ("b", True), ("c", False), ("d", False)], found


def test_dashboard_uses_only_metrics_that_exist() -> None:
    used: set[str] = set()
    for expr in dashboard_queries():
        names = promql_metric_names(expr)
        assert names, f"no metric in {expr!r}"
        used |= names
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] != "query":
            continue
        query = (
            variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
        )
        match = re.fullmatch(r"label_values\(\s*([A-Za-z_:][\w:]*).*,\s*\w+\s*\)", query)
        used |= {match.group(1)} if match else promql_metric_names(query)
    known = exported_metric_names() | TRITON_METRICS | TRITON_GPU_AND_SUMMARY_METRICS
    assert "triton_gitops_passes_total" in known and "triton_gitops_webhooks_total" in known
    assert used <= known, f"metrics nobody exports: {sorted(used - known)}"
    assert used >= DASHBOARD_MUST_SHOW, (
        f"not on the dashboard: {sorted(DASHBOARD_MUST_SHOW - used)}"
    )


def test_dashboard_shows_triton_traffic_per_model_version() -> None:
    queries = dashboard_queries()
    for expr in queries:
        if "nv_inference_request" in expr:
            groupings = re.findall(r"\bby\s*\(([^)]*)\)", expr)
            assert groupings, expr
            for grouping in groupings:
                labels = {label.strip() for label in grouping.split(",")}
                assert {"model", "version"} <= labels, expr
    assert any(
        re.search(r"nv_inference_request_duration_us.*\)\s*/\s*.*nv_inference_request_success", e)
        for e in queries
    ), "mean latency: duration over successes"
    assert any(
        "histogram_quantile" in e and "triton_gitops_pass_duration_seconds_bucket" in e
        for e in queries
    )


def test_dashboard_is_a_grafana_schema_39_dashboard() -> None:
    board = dashboard()
    assert board["schemaVersion"] == 39
    assert board["title"] and board["uid"]
    variables = {v["name"] for v in board["templating"]["list"]}
    panels = board["panels"] + [p for row in board["panels"] for p in row.get("panels", [])]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24 and grid["h"] > 0, panel["title"]
        if panel["type"] == "row":
            continue
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            uid = target["datasource"]["uid"]
            assert uid.strip("${}") in variables, f"{panel['title']}: datasource {uid}"


# -- the PrometheusRule ---------------------------------------------------------------------


def prometheus_rule_groups() -> list[dict[str, Any]]:
    """spec.groups of the PrometheusRule: what a plain Prometheus rule file holds."""
    (rule,) = find("PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    groups: list[dict[str, Any]] = rule["spec"]["groups"]
    return groups


def alert_rules() -> list[dict[str, Any]]:
    return [r for group in prometheus_rule_groups() for r in group["rules"] if "alert" in r]


def test_alert_rules_use_only_metrics_that_exist() -> None:
    known = exported_metric_names() | TRITON_METRICS | PROMETHEUS_OWN_SERIES
    assert "triton_gitops_server_unreachable_passes" in known
    used: set[str] = set()
    for rule in alert_rules():
        names = promql_metric_names(rule["expr"])
        assert names, f"{rule['alert']}: no metric in {rule['expr']!r}"
        used |= names
    assert used <= known, f"metrics nobody exports: {sorted(used - known)}"
    assert used >= {
        "up",
        "triton_gitops_last_success_timestamp_seconds",
        "triton_gitops_server_unreachable_passes",
        "triton_gitops_model_state",
        "triton_gitops_rollouts_total",
    }


def test_each_alert_has_a_severity_a_summary_and_a_description_naming_its_labels() -> None:
    rules = {r["alert"]: r for r in alert_rules()}
    assert set(rules) >= set(ALERTS_MUST_HAVE)
    for name, rule in rules.items():
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, name
        annotations = rule["annotations"]
        assert annotations["summary"].strip() and annotations["description"].strip(), name
        named = set(
            re.findall(r"\$labels\.(\w+)", annotations["summary"] + annotations["description"])
        )
        assert named >= ALERTS_MUST_HAVE.get(name, set()), f"{name} names {sorted(named)}"


def test_promtool_accepts_the_alert_rules(tmp_path: Path) -> None:
    promtool = find_binary(("promtool",), "prometheus")
    rules = tmp_path / "rules.yml"
    rules.write_text(json.dumps({"groups": prometheus_rule_groups()}))  # JSON is YAML
    checked = subprocess.run(
        [promtool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in checked.stdout


# -- the Dockerfile --------------------------------------------------------------------------


def test_dockerfile_runs_the_reconciler_as_a_non_root_user() -> None:
    # The official base by default; a build argument so that a base made locally also builds.
    assert "BASE=python:3.11-slim" in docker("ARG")
    build, image = docker("FROM")
    assert build == "${BASE} AS build" and image == "${BASE}"
    users = docker("USER")
    assert users, "no USER: the container would run as root"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "a numeric non-root uid (runAsNonRoot checks it)"
    assert reconciler_command() == ["triton-gitops", "run"]
    (healthcheck,) = docker("HEALTHCHECK")
    assert "/healthz" in healthcheck
    apt = [r for r in docker("RUN") if "apt-get install" in r]
    assert len(apt) == 1 and "apt-get update" in apt[0], "update and install in one layer"
    packages = set(apt[0].split("apt-get install", 1)[1].split("&&")[0].split())
    assert {"git", "ca-certificates", "gnupg", "procps", "--no-install-recommends"} <= packages
    assert Path(image_entrypoint()[0]).name in packages, "the init process is installed"
    assert "rm -rf /var/lib/apt/lists/*" in apt[0]
    env = image_env()
    volumes = [v for rest in docker("VOLUME") for v in json.loads(rest)]
    for key in ("TRITON_GITOPS_STATE", "TRITON_GITOPS_CACHE_DIR", "HOME"):
        assert any(env[key].startswith(v.rstrip("/") + "/") or env[key] == v for v in volumes), key
    # The image's environment alone is a valid configuration of `run`.
    args = parse_arguments([*reconciler_command()[1:], "--repo", "https://example.com/m.git"], env)
    host, _, port = args.listen.rpartition(":")
    assert host in LISTEN_ANYWHERE and port in docker("EXPOSE")[0].split()
    assert str(args.state) == env["TRITON_GITOPS_STATE"]
    assert str(args.cache_dir) == env["TRITON_GITOPS_CACHE_DIR"]


def stages() -> list[list[tuple[str, str]]]:
    """The Dockerfile's instructions by stage (what precedes the first FROM left out)."""
    found: list[list[tuple[str, str]]] = []
    for key, rest in dockerfile():
        if key == "FROM":
            found.append([])
        if found:
            found[-1].append((key, rest))
    return found


def test_dockerfile_installs_the_locked_dependencies_then_the_package_without_extras() -> None:
    build, image = stages()
    runs = [rest for key, rest in build if key == "RUN"]
    # The dependencies by hash from the lock files, without resolving anything else.
    locked = [r for r in runs if "-r requirements.lock" in r]
    assert len(locked) == 1
    for lock in ("requirements.lock", "requirements-build.lock"):
        (install,) = [part for r in runs for part in r.split("&&") if f"-r {lock}" in part]
        assert "--require-hashes" in install and "--no-deps" in install, install
    # The package: a wheel built from ".", installed without its dependencies.
    assert any(re.search(r"\bpip wheel [^&]*\s\.(?:\s|$)", r) for r in runs), "pip wheel ."
    (package,) = [part for r in runs for part in r.split("&&") if ".whl" in part]
    assert "pip install --no-deps" in package, package
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extras = set(project["project"]["optional-dependencies"])
    for run in runs:
        assert ".[" not in run, f"extras installed: {run}"
        assert "nvidia-pytriton" not in run and "pytest" not in run, run
        for extra in extras:
            assert f"[{extra}]" not in run, run
    # Everything the wheel is built from is copied, and exists; .dockerignore lets it through.
    copied: set[str] = set()
    for key, rest in build:
        if key == "COPY":
            parts = [p for p in shlex.split(rest) if not p.startswith("--")]
            for source in parts[:-1]:
                assert (ROOT / source).exists(), f"COPY {source}: no such file"
                copied.add(source.rstrip("/"))
    hatch = project["tool"]["hatch"]["build"]["targets"]["wheel"]
    needed = {"pyproject.toml", project["project"]["readme"], *hatch["packages"]}
    needed |= set(hatch.get("force-include", {}))
    assert needed | {"requirements.lock", "requirements-build.lock"} <= copied, copied
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    assert ignore[ignore.index("*") :].count("*") == 1, "everything is left out first"
    assert {f"!{path}" for path in copied} <= {line.rstrip("/") for line in ignore}
    # Cache-friendly: the dependencies install before the sources arrive.
    order = [f"{key} {rest}" for key, rest in build]
    dependencies = next(i for i, line in enumerate(order) if "-r requirements.lock" in line)
    sources = next(i for i, line in enumerate(order) if line.startswith("COPY reconciler"))
    assert dependencies < sources
    # The image takes the virtualenv from the build stage, and no pip, wheel or source.
    copies = [rest for key, rest in image if key == "COPY"]
    assert copies == ["--from=build /opt/triton-gitops /opt/triton-gitops"], copies
    assert not [rest for key, rest in image if key == "RUN" and "pip" in rest]
    assert "PATH=/opt/triton-gitops/bin:$PATH" in docker("ENV")[-1].split()


def test_lock_files_pin_the_project_requirements_with_hashes() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for lock, requirements in (
        # The s3 extra too: the image reads model repositories in S3 (./dev lock).
        (
            "requirements.lock",
            project["project"]["dependencies"] + project["project"]["optional-dependencies"]["s3"],
        ),
        ("requirements-build.lock", project["build-system"]["requires"]),
    ):
        text = (ROOT / lock).read_text()
        assert "./dev lock" in text.splitlines()[1], f"{lock}: made by ./dev lock"
        pins: dict[str, str] = {}
        for entry in re.split(r"\n(?=\S)", text):
            if entry.startswith("#") or not entry.strip():
                continue
            match = re.match(r"([A-Za-z0-9._-]+)==(\S+)", entry)
            assert match, f"{lock}: not a pin: {entry.splitlines()[0]}"
            assert "--hash=sha256:" in entry, f"{lock}: {match.group(1)} has no hash"
            pins[canonicalize_name(match.group(1))] = match.group(2)
        for line in requirements:
            requirement = Requirement(line)
            name = canonicalize_name(requirement.name)
            assert name in pins, f"{lock} does not pin {name}: run ./dev lock"
            assert requirement.specifier.contains(pins[name], prereleases=True), (
                f"{lock} pins {name}=={pins[name]}, outside {requirement}: run ./dev lock"
            )
            for extra in requirement.extras:  # tritonclient[grpc]: grpcio is pinned too
                assert any(name in entry for entry in text.split("# via")), (lock, extra)


def test_image_labels_say_what_it_is() -> None:
    labels = {
        key.removeprefix("org.opencontainers.image."): value.strip('"')
        for rest in docker("LABEL")
        for key, _, value in (pair.partition("=") for pair in shlex.split(rest))
    }
    assert set(labels) >= {"title", "source", "version", "revision", "licenses", "description"}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    arguments = dict(a.partition("=")[::2] for a in docker("ARG"))
    # The version is pyproject's, passed by ./dev image (test_image checks the built labels);
    # a build without it says it does not know rather than carry a second copy.
    assert labels["version"] == "${VERSION}" and arguments["VERSION"] == "unknown"
    assert labels["source"] == "${SOURCE}" and arguments["SOURCE"] == current_release().source
    assert labels["licenses"] == project["license"]
    assert labels["title"] == project["name"]


class _Health(http.server.ThreadingHTTPServer):
    status = 200
    paths: list[str]


class _HealthHandler(http.server.BaseHTTPRequestHandler):
    server: _Health

    def do_GET(self) -> None:
        self.server.paths.append(self.path)
        self.send_response(self.server.status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def healthcheck(port: int) -> int:
    """Run the image's HEALTHCHECK command against 127.0.0.1:port; its exit code."""
    (healthcheck,) = docker("HEALTHCHECK")
    command = json.loads(healthcheck.split(" CMD ", 1)[1])
    assert command[0] == "python", "curl is not in the slim image"
    env = {**os.environ, "TRITON_GITOPS_LISTEN": f"0.0.0.0:{port}"}
    done = subprocess.run([sys.executable, *command[1:]], env=env, capture_output=True, timeout=30)
    return done.returncode


@pytest.mark.parametrize(("status", "healthy"), [(200, True), (503, False)])
def test_healthcheck_probes_healthz(status: int, healthy: bool) -> None:
    server = _Health(("127.0.0.1", 0), _HealthHandler)
    server.status, server.paths = status, []
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        assert (healthcheck(server.server_address[1]) == 0) is healthy
    finally:
        server.shutdown()
        server.server_close()
    assert server.paths == ["/healthz"]


def test_healthcheck_fails_when_nothing_listens() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert healthcheck(port) != 0


# -- every example validates as written ------------------------------------------------------


# Each example's manifest repository (or folder of it): validated as a whole, as
# `triton-gitops validate DIR` would.
MANIFEST_ROOTS = (
    "examples/repo",
    "examples/envoy/manifests",
    "examples/deploy/manifests",
    "examples/deploy/gateway-api",
    "examples/deploy/object-storage",
)


def test_every_example_manifest_folder_validates_as_written() -> None:
    roots = [ROOT / root for root in MANIFEST_ROOTS]
    # Every manifest of ours under examples/ belongs to one of them: a new example is listed.
    ours = [
        path for path in sorted((ROOT / "examples").rglob("*.y*ml"))
        if "apiVersion: triton-gitops" in path.read_text()
    ]  # fmt: skip
    strays = [str(p.relative_to(ROOT)) for p in ours if not any(r in p.parents for r in roots)]
    assert not strays, f"manifests outside MANIFEST_ROOTS (add their folder): {strays}"
    for folder in roots:
        reading = read_manifests(
            manifest_files_in(folder),
            lambda name, folder=folder: read_in_directory(folder, name, MAX_SHADOW_FILE_BYTES),
            prometheus=True,
        )
        where = folder.relative_to(ROOT)
        assert not reading.problems, f"{where}: " + "; ".join(str(p) for p in reading.problems)
        assert reading.desired.servers, f"{where}: no TritonServer"


def test_every_command_an_alert_tells_on_call_to_run_parses_in_the_reconciler_pod() -> None:
    """The commands in the shipped alerts' annotations, run with `kubectl exec` in the
    reconciler's pod (its environment and config file give --repo and --state), with each
    label template filled in as Alertmanager would."""
    key, config = reconciler_config()
    commands = []
    for rule in alert_rules():
        for text in rule.get("annotations", {}).values():
            commands += re.findall(r"`(triton-gitops [^`]+)`", text)
    assert len(commands) >= 5, commands
    for command in commands:
        filled = re.sub(r"\{\{\s*\$labels\.(\w+)\s*\}\}", lambda m: f"sample-{m[1]}", command)
        argv = shlex.split(filled)[1:]
        try:
            parse_arguments(argv, startup_environment(), ConfigFile(Path(key), config))
        except SystemExit as exc:
            raise AssertionError(f"an alert tells on-call to run {command!r}: {exc}") from None


DOCS = (
    ROOT / "README.md",
    ROOT / "CHANGELOG.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "examples").rglob("*.md")),
)


def doc_commands(text: str) -> list[str]:
    """Every ``triton-gitops`` command of a Markdown text: in inline code, and on a line of a
    code block (``$ `` prompts dropped, ``\\`` continuations joined)."""
    commands = re.findall(r"`(triton-gitops [^`\n]+)`", text)
    for block in re.findall(r"```[\w-]*\n(.*?)```", text, re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.strip().removeprefix("$ ")
            if line.startswith("triton-gitops "):
                commands.append(line)
    return commands


def as_given(synopsis: str) -> list[str]:
    """A command as a person would type it from its synopsis: optional parts (``[...]``) given,
    the first of alternatives (``a|b``), nothing after a shell operator or a comment."""
    # The first alternative of an optional group ([--state FILE \| --service URL]).
    command = re.sub(r"\[([^\]]*)\]", lambda m: m[1].split("\\|")[0], synopsis)
    command = re.split(r"\s(?:\||&&|>|#)\s", command.replace("\\|", "\x00"))[0]
    words = shlex.split(command.replace("...", ""))
    return [w.split("\x00")[0].split("|")[0] for w in words]


def test_every_command_in_the_docs_parses() -> None:
    """Every ``triton-gitops`` command the README, the docs and the examples' READMEs show
    parses with the CLI (the repository given by the environment, as where they run); one
    that only names a command (``triton-gitops gate``) names one that exists."""
    commands = {name for name in build_parser()._subparsers._group_actions[0].choices}  # type: ignore[union-attr]
    checked = 0
    for doc in DOCS:
        for command in doc_commands(doc.read_text()):
            argv = as_given(command)[1:]
            where = f"{doc.relative_to(ROOT)}: {command!r}"
            if len(argv) == 1:
                assert argv[0] in {*commands, "--version", "--help"}, f"{where}: no such command"
                continue
            err = io.StringIO()
            try:
                with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                    parse_arguments(argv, {"TRITON_GITOPS_REPO": "https://example.com/m.git"})
            except SystemExit as exc:
                if exc.code not in (0, None):  # --help exits 0
                    raise AssertionError(f"{where}: {err.getvalue().strip()}") from None
            checked += 1
    assert checked >= 40, checked


def github_anchor(heading: str) -> str:
    """The fragment GitHub gives a Markdown heading."""
    return re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower()).replace(" ", "-")


def test_every_alert_links_its_section_of_the_troubleshooting_page() -> None:
    page = (ROOT / "docs" / "troubleshooting.md").read_text()
    anchors = {github_anchor(h) for h in re.findall(r"^#+ (.+)$", page, re.M)}
    base = "https://github.com/triton-gitops/triton-gitops/blob/main/docs/troubleshooting.md#"
    for rule in alert_rules():
        url = rule["annotations"].get("runbook_url", "")
        assert url.startswith(base), f"{rule['alert']}: runbook_url {url!r}"
        assert url.removeprefix(base) in anchors, f"{rule['alert']}: no section {url}"
    # Every kind of the reconciler's own alerts is explained there too.
    for kind in KINDS:
        assert f"| `{kind}` |" in page, f"alert kind {kind} missing from the troubleshooting page"


# Custom resources the examples use, whose schemas are not Kubernetes' own (their CRDs).
CUSTOM_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
    ("gateway.networking.k8s.io/v1", "Gateway"),
    ("gateway.networking.k8s.io/v1", "GRPCRoute"),
    ("gateway.networking.k8s.io/v1beta1", "ReferenceGrant"),
}


def kube_documents_of(folder: Path) -> list[dict[str, Any]]:
    """The objects a folder gives Kubernetes: its kustomize rendering when it has a
    kustomization, else its YAML files (those of other tools: triton-gitops manifests left
    out)."""
    if (folder / "kustomization.yaml").exists():
        kubectl = shutil.which("kubectl")
        if kubectl is None:
            pytest.skip("kubectl is not installed")
        rendered = subprocess.run(
            [kubectl, "kustomize", str(folder)], capture_output=True, text=True, timeout=60
        )
        assert rendered.returncode == 0, f"{folder}: {rendered.stderr}"
        documents = list(YAML(typ="safe").load_all(rendered.stdout))
    else:
        documents = [d for p in sorted(folder.glob("*.yaml")) for d in yaml_documents(p)]
    return [
        d for d in documents
        if d and not str(d.get("apiVersion", "")).startswith("triton-gitops")
    ]  # fmt: skip


def test_the_gateway_api_kustomization_takes_every_cluster_object_of_its_folder() -> None:
    folder = DEPLOY / "gateway-api"
    listed = set(YAML(typ="safe").load((folder / "kustomization.yaml").read_text())["resources"])
    cluster_files = {
        p.name
        for p in folder.glob("*.yaml")
        if p.name != "kustomization.yaml"
        and any(
            d and not str(d.get("apiVersion", "")).startswith("triton-gitops")
            for d in yaml_documents(p)
        )
    }
    assert listed == cluster_files


@pytest.mark.parametrize("example", ["kubernetes", "object-storage", "gateway-api"])
def test_the_kubernetes_objects_validate_against_the_apis_own_schemas(example: str) -> None:
    """Strictly (no unknown field), offline, with kubernetes-validate's bundled schemas; the
    custom resources (Prometheus Operator, Gateway API) have no schema there."""
    import kubernetes_validate

    version = kubernetes_validate.latest_version()
    unchecked = set()
    documents = kube_documents_of(DEPLOY / example)
    assert documents, example
    for document in documents:
        where = f"{example}: {document['kind']} {document['metadata']['name']}"
        try:
            kubernetes_validate.validate(document, version, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            unchecked.add((document["apiVersion"], document["kind"]))
        except kubernetes_validate.ValidationError as exc:
            raise AssertionError(f"{where}: {exc.message} at {list(exc.path)}") from None
    assert unchecked <= CUSTOM_KINDS, f"no schema for {sorted(unchecked - CUSTOM_KINDS)}"


def test_every_variable_the_container_sets_is_an_option_the_reconciler_reads() -> None:
    """The environment is not refused as a whole (the prefix is shared): the shipped one is
    checked here instead, the image's ENV and the Deployment's env together."""
    options = {
        "TRITON_GITOPS_" + key.upper().replace("-", "_")
        for key in known_keys(build_parser().commands)
    }
    environment = startup_environment()
    unread = sorted(
        name
        for name in environment
        if name.startswith("TRITON_GITOPS_") and name not in {*options, "TRITON_GITOPS_CONFIG"}
    )
    assert unread == []
    assert misspelled_variables(environment, known_keys(build_parser().commands)) == []
