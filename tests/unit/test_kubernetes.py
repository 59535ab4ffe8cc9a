"""deploy/kubernetes: every kustomization renders, validates against the Kubernetes schemas
offline (kubernetes-validate), and is consistent with itself and with the services' flags."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from tests.fixtures.kustomize import Resource, render, render_with_kubectl

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kubernetes"
KUSTOMIZATIONS = ["base", "overlays/cpu", "overlays/tp2"]
KUBERNETES_VERSION = "1.33.0"
EXTERNAL_SECRETS = {"radixmesh-api-keys"}
"""Created by the operator (docs/operations.md), never committed."""
WORKLOADS = {"Deployment", "StatefulSet"}


def _parser(module: str) -> Callable[[], argparse.ArgumentParser]:
    def build() -> argparse.ArgumentParser:
        mod = __import__(module, fromlist=["build_parser"])
        parser: argparse.ArgumentParser = mod.build_parser()
        return parser

    return build


PARSERS = {
    "services.cache.main": _parser("services.cache.main"),
    "services.scheduler.main": _parser("services.scheduler.main"),
    "services.executor.main": _parser("services.executor.main"),
    "gateway.main": _parser("gateway.main"),
    "gateway.envoy": _parser("gateway.envoy.__main__"),
}


@pytest.fixture(scope="module", params=KUSTOMIZATIONS)
def rendered(request: pytest.FixtureRequest) -> tuple[str, list[Resource]]:
    return request.param, render(DEPLOY / request.param)


def by_kind(resources: list[Resource], kind: str) -> dict[str, Resource]:
    return {r["metadata"]["name"]: r for r in resources if r["kind"] == kind}


def pod_spec(workload: Resource) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def config_env(resources: list[Resource]) -> dict[str, str]:
    env: dict[str, str] = by_kind(resources, "ConfigMap")["radixmesh-config"]["data"]
    return env


def expand(arg: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion of container args."""
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), arg)


def container_env(container: dict[str, Any], resources: list[Resource]) -> dict[str, str]:
    env = dict(config_env(resources))
    for item in container.get("env", []):
        env[item["name"]] = item.get("value", f"<{item['name']}>")
    return env


def parsed_args(container: dict[str, Any], resources: list[Resource]) -> argparse.Namespace:
    command = container["command"]
    assert command[:2] == ["python", "-m"], command
    module = command[2]
    env = container_env(container, resources)
    args = [expand(a, env) for a in container.get("args", [])]
    unexpanded = [a for a in args if "$(" in a]
    assert not unexpanded, f"{module}: args name unset variables: {unexpanded}"
    parser = PARSERS[module]()
    return parser.parse_args(args)


def test_renders_like_kubectl_kustomize(rendered: tuple[str, list[Resource]]) -> None:
    name, ours = rendered
    theirs = render_with_kubectl(DEPLOY / name)
    if theirs is None:
        pytest.skip("kubectl is not installed; the offline renderer alone is used")
    key = lambda r: (r["kind"], r["metadata"]["name"])  # noqa: E731
    assert sorted(ours, key=key) == sorted(theirs, key=key)


def test_validates_against_the_kubernetes_schemas(rendered: tuple[str, list[Resource]]) -> None:
    _, resources = rendered
    for resource in resources:
        kubernetes_validate.validate(resource, KUBERNETES_VERSION, strict=True)


def test_the_validator_rejects_a_broken_manifest(rendered: tuple[str, list[Resource]]) -> None:
    """The schema check above can fail: a misspelt field of a real Deployment is refused."""
    _, resources = rendered
    broken = dict(by_kind(resources, "Deployment")["gateway"])
    broken["spec"] = {**broken["spec"], "replica": 2}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_labels_selectors_and_service_ports_match(rendered: tuple[str, list[Resource]]) -> None:
    _, resources = rendered
    workloads = [r for r in resources if r["kind"] in WORKLOADS]
    for w in workloads:
        labels = w["spec"]["template"]["metadata"]["labels"]
        selector = w["spec"]["selector"]["matchLabels"]
        assert selector.items() <= labels.items(), w["metadata"]["name"]
    for name, service in by_kind(resources, "Service").items():
        selector = service["spec"]["selector"]
        pods = [w for w in workloads if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()]
        assert len(pods) == 1, f"Service {name} selects {len(pods)} workloads"
        ports = {
            p["name"]: p["containerPort"]
            for c in pod_spec(pods[0])["containers"]
            for p in c.get("ports", [])
        }
        for port in service["spec"]["ports"]:
            target = port["targetPort"]
            assert target in ports or target in ports.values(), f"{name}: {target} is no pod port"
    for name, sts in by_kind(resources, "StatefulSet").items():
        service = by_kind(resources, "Service")[sts["spec"]["serviceName"]]
        assert service["spec"].get("clusterIP") == "None", f"{name}: its Service is not headless"
    for name, hpa in by_kind(resources, "HorizontalPodAutoscaler").items():
        ref = hpa["spec"]["scaleTargetRef"]
        assert ref["name"] in by_kind(resources, ref["kind"]), name


def test_ports_and_probes_follow_the_services_flags(rendered: tuple[str, list[Resource]]) -> None:
    _, resources = rendered
    checked = 0
    for w in (r for r in resources if r["kind"] in WORKLOADS):
        spec = pod_spec(w)
        for c in spec["containers"]:
            if c.get("command", [None])[0] != "python":
                continue
            args = parsed_args(c, resources)
            ports = {p["name"]: p["containerPort"] for p in c["ports"]}
            flags = {"grpc": "port", "metrics": "metrics_port", "http": "http_port", "public": "public_port", "admin": "admin_port"}
            for port_name, flag in flags.items():
                if port_name in ports:
                    assert getattr(args, flag) == ports[port_name], (c["name"], port_name)
            annotations = w["spec"]["template"]["metadata"].get("annotations", {})
            if "prometheus.io/port" in annotations:
                scraped = int(annotations["prometheus.io/port"])
                assert scraped in (ports.get("metrics"), ports.get("admin")), c["name"]
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                if "grpc" in c.get(probe, {}):
                    assert c[probe]["grpc"]["port"] == ports["grpc"], (c["name"], probe)
            checked += 1
    assert checked == 5  # cache, executor, scheduler, gateway, envoy


def _service_port(resources: list[Resource], address: str) -> None:
    """`address` (host:port) names a Service of the namespace and one of its ports."""
    host, _, port = address.rpartition(":")
    pod, _, service_name = host.rpartition(".") if "." in host else ("", "", host)
    services = by_kind(resources, "Service")
    assert service_name in services, f"{address}: no Service {service_name}"
    assert int(port) in [p["port"] for p in services[service_name]["spec"]["ports"]], address
    if pod:
        sts = by_kind(resources, "StatefulSet")[service_name]
        ordinal = int(pod.rpartition("-")[2])
        assert ordinal < sts["spec"]["replicas"], f"{address}: no pod {pod}"


def test_addresses_point_at_services(rendered: tuple[str, list[Resource]]) -> None:
    _, resources = rendered
    env = config_env(resources)
    _service_port(resources, env["RADIXMESH_CACHE_ADDRESS"])
    _service_port(resources, env["RADIXMESH_REDIS_URL"].split("//")[1].split("/")[0])
    executors = env["RADIXMESH_EXECUTORS"].split(",")
    assert len(executors) == by_kind(resources, "StatefulSet")["executor"]["spec"]["replicas"]
    for address in executors:
        _service_port(resources, address)
    gateway = by_kind(resources, "Deployment")["gateway"]
    _service_port(resources, parsed_args(pod_spec(gateway)["containers"][0], resources).scheduler_address)
    envoy = by_kind(resources, "Deployment")["envoy"]
    for spec in parsed_args(pod_spec(envoy)["containers"][0], resources).gateway:
        host, grpc_port, http_port = spec.split(":")
        _service_port(resources, f"{host}:{grpc_port}")
        _service_port(resources, f"{host}:{http_port}")


def test_referenced_configmaps_secrets_and_claims_exist(rendered: tuple[str, list[Resource]]) -> None:
    _, resources = rendered
    configmaps = by_kind(resources, "ConfigMap")
    claims = by_kind(resources, "PersistentVolumeClaim")
    secrets = set(by_kind(resources, "Secret")) | EXTERNAL_SECRETS
    for w in (r for r in resources if r["kind"] in WORKLOADS):
        spec = pod_spec(w)
        for volume in spec.get("volumes", []):
            if "configMap" in volume:
                assert volume["configMap"]["name"] in configmaps
            if "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["claimName"] in claims
        for c in spec["containers"]:
            for source in c.get("envFrom", []):
                assert source["configMapRef"]["name"] in configmaps
            for item in c.get("env", []):
                ref = item.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["name"] in secrets


def test_executor_pod_is_one_tensor_parallel_group(rendered: tuple[str, list[Resource]]) -> None:
    """The GPUs a pod asks for are the ranks of its group; NVLink multicast stays off."""
    name, resources = rendered
    executor = by_kind(resources, "StatefulSet")["executor"]
    container = pod_spec(executor)["containers"][0]
    args = parsed_args(container, resources)
    gpus = int(container["resources"].get("limits", {}).get("nvidia.com/gpu", 0))
    if name == "overlays/cpu":
        assert gpus == 0 and args.device == "cpu"
    else:
        assert gpus == args.tensor_parallel_size == (2 if name == "overlays/tp2" else 1)
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["NCCL_NVLS_ENABLE"] == "0"
