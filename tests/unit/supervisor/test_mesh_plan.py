"""`radixmesh serve`'s plan: each service's command line parses with its own main's flags."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gateway.main import build_parser as gateway_parser
from mesh.launcher import MeshPorts, plan_stages
from mesh.mesh_config import MeshConfig
from mesh.restarts import RestartPolicy
from radixmesh.errors import InvalidArgument
from services.cache.main import parse_args as cache_args
from services.executor.core.spec import SpeculativeConfig
from services.executor.main import build_parser as executor_parser
from services.scheduler.core import SchedulerConfig
from services.scheduler.main import build_parser as scheduler_parser

PARSERS = {
    "cache": cache_args,
    "executor": lambda argv: executor_parser().parse_args(argv),
    "scheduler": lambda argv: scheduler_parser().parse_args(argv),
    "gateway": lambda argv: gateway_parser().parse_args(argv),
}


@pytest.fixture
def model_dir(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    return tmp_path


def _parsed(config: MeshConfig, ports: MeshPorts) -> dict:
    parsed = {}
    for stage in plan_stages(config, ports):
        for spec in stage:
            module = spec.argv[2]  # python -m <module> ...
            kind = spec.name.split("-")[0]
            assert module.split(".")[-2] == kind or module == "gateway.main"
            parsed[spec.name] = PARSERS[kind](list(spec.argv[3:]))
    return parsed


def test_services_are_wired_to_each_other(model_dir, tmp_path):
    config = MeshConfig(
        model_dir=model_dir,
        log_dir=tmp_path / "logs",
        num_executors=2,
        api_keys=("k1", "k2"),
        rate_limit_per_s=3.0,
        redis_url="redis://127.0.0.1:1/0",
        result_cache=True,
        device="cpu",
    )
    ports = MeshPorts.pick(2)
    args = _parsed(config, ports)
    assert [name for name in args] == ["cache", "executor-0", "executor-1", "scheduler", "gateway"]
    cache = f"127.0.0.1:{ports.cache}"
    assert args["cache"].port == ports.cache and args["cache"].redis_url == config.redis_url
    for i in range(2):
        executor = args[f"executor-{i}"]
        assert (executor.port, executor.cache_address) == (ports.executors[i][0], cache)
        assert (executor.executor_id, executor.device) == (f"exec-{i}", "cpu")
    assert args["scheduler"].executor == [f"127.0.0.1:{p}" for p, _ in ports.executors]
    assert args["scheduler"].cache_address == cache
    gateway = args["gateway"]
    assert gateway.scheduler_address == f"127.0.0.1:{ports.scheduler}"
    assert (gateway.cache_address, gateway.result_cache) == (cache, True)
    assert (gateway.api_key, gateway.rate_limit_per_s) == (["k1", "k2"], 3.0)
    assert gateway.model == executor.model == str(model_dir)
    every_port = [
        ports.cache, ports.cache_metrics, *[p for pair in ports.executors for p in pair],
        ports.scheduler, ports.scheduler_metrics, ports.gateway, ports.gateway_http,
        ports.gateway_metrics, ports.admin,
    ]  # fmt: skip
    assert len(set(every_port)) == len(every_port)


def test_gateway_replicas_have_their_own_ports_and_share_the_rest(model_dir, tmp_path):
    config = MeshConfig(
        model_dir=model_dir, log_dir=tmp_path / "logs", num_gateways=3, api_keys=("k1",)
    )
    ports = MeshPorts.pick(1, num_gateways=3)
    args = _parsed(config, ports)
    names = [f"gateway-{i}" for i in range(3)]
    assert list(args) == ["cache", "executor-0", "scheduler", *names]
    for name, (grpc_port, http_port, metrics_port) in zip(names, ports.gateways, strict=True):
        gateway = args[name]
        assert (gateway.port, gateway.http_port, gateway.metrics_port) == (
            grpc_port, http_port, metrics_port,
        )  # fmt: skip
        assert gateway.scheduler_address == f"127.0.0.1:{ports.scheduler}"
        assert gateway.api_key == ["k1"]
    every_port = [p for triple in ports.gateways for p in triple]
    assert len(set(every_port)) == 9
    assert ports.gateway == ports.gateways[0][0]


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"num_executors": 0}, "executors"),
        ({"num_gateways": 0}, "gateways"),
        ({"num_gateways": 65}, "gateways"),
        ({"device": "tpu"}, "device"),
        ({"public_port": 0}, "port"),
        ({"redis_url": "localhost:6379"}, "redis_url"),
        ({"rate_limit_per_s": -1.0}, "rate_limit_per_s"),
        ({"rate_limit_per_s": float("nan")}, "^rate_limit_per_s"),
        ({"rate_limit_burst": float("inf")}, "^rate_limit_burst"),
        ({"start_timeout_s": 0.0}, "^start_timeout_s"),
        ({"start_timeout_s": float("nan")}, "^start_timeout_s"),
        ({"status_port": -2}, "^status_port"),
        ({"status_port": 65536}, "^status_port"),
        ({"admin_port": 8080}, "^admin_port: must differ from public_port"),
        ({"max_queue_wait_s": -1.0}, "^max_queue_wait_s"),
        ({"device": "cuda:x"}, "^device"),
        ({"device": "cuda:"}, "^device"),
        ({"public_host": "localhost"}, "^public_host: must be an IP address"),
        ({"restart_policy": RestartPolicy(window_s=0)}, "^restart_policy.window_s"),
    ],
)
def test_bad_settings_name_the_field(model_dir, tmp_path, fields, field):
    with pytest.raises(InvalidArgument, match=field):
        MeshConfig(model_dir=model_dir, log_dir=tmp_path, **fields)


@pytest.mark.parametrize(
    "fields",
    [
        {"status_port": -1},
        {"status_port": 0},
        {"max_queue_wait_s": 0.0},
        {"device": "cuda:12"},
        {"public_host": "::1"},
        {"restart_policy": RestartPolicy(max_restarts=0, window_s=0)},
    ],
)
def test_edge_settings_are_accepted(model_dir, tmp_path, fields):
    MeshConfig(model_dir=model_dir, log_dir=tmp_path, **fields)


def test_a_folder_without_config_is_refused(tmp_path):
    with pytest.raises(InvalidArgument, match=r"model: .* has no config\.json"):
        MeshConfig(model_dir=tmp_path, log_dir=tmp_path)


@pytest.mark.parametrize(
    ("device", "expected"),
    [("cuda", ["cuda:0", "cuda:1"]), ("cuda:1", ["cuda:1"] * 2), ("auto", ["auto"] * 2)],
)
def test_executor_devices(model_dir, tmp_path, device, expected):
    config = MeshConfig(model_dir=model_dir, log_dir=tmp_path, num_executors=2, device=device)
    args = _parsed(config, MeshPorts.pick(2))
    assert [args[f"executor-{i}"].device for i in range(2)] == expected


def test_drain_grace_and_queue_wait_reach_the_gateway_and_the_scheduler(model_dir, tmp_path):
    config = MeshConfig(
        model_dir=model_dir, log_dir=tmp_path / "logs", grace_s=12.5, max_queue_wait_s=7.0
    )
    args = _parsed(config, MeshPorts.pick(1))
    assert args["gateway"].grace_seconds == 12.5
    assert args["scheduler"].max_queue_wait_s == 7.0
    default = _parsed(MeshConfig(model_dir=model_dir, log_dir=tmp_path / "l2"), MeshPorts.pick(1))
    assert default["gateway"].grace_seconds == 30.0
    assert default["scheduler"].max_queue_wait_s == 30.0  # the scheduler's own default


def test_decode_steps_per_plan_reaches_the_scheduler(model_dir, tmp_path):
    config = MeshConfig(model_dir=model_dir, log_dir=tmp_path / "logs", decode_steps_per_plan=8)
    assert _parsed(config, MeshPorts.pick(1))["scheduler"].decode_steps_per_plan == 8
    default = _parsed(MeshConfig(model_dir=model_dir, log_dir=tmp_path / "l2"), MeshPorts.pick(1))
    assert default["scheduler"].decode_steps_per_plan == SchedulerConfig().decode_steps_per_plan


def test_max_steps_in_flight_reaches_the_scheduler(model_dir, tmp_path):
    config = MeshConfig(model_dir=model_dir, log_dir=tmp_path / "logs", max_steps_in_flight=5)
    assert _parsed(config, MeshPorts.pick(1))["scheduler"].max_steps_in_flight == 5
    default = _parsed(MeshConfig(model_dir=model_dir, log_dir=tmp_path / "l2"), MeshPorts.pick(1))
    assert default["scheduler"].max_steps_in_flight == SchedulerConfig().max_steps_in_flight


def test_max_num_seqs_reaches_every_executor_and_the_scheduler(model_dir, tmp_path):
    config = MeshConfig(model_dir=model_dir, log_dir=tmp_path / "logs", num_executors=2, max_num_seqs=1024)
    args = _parsed(config, MeshPorts.pick(2))
    assert [args[name].max_num_seqs for name in ("executor-0", "executor-1", "scheduler")] == [1024] * 3
    default = _parsed(MeshConfig(model_dir=model_dir, log_dir=tmp_path / "l2"), MeshPorts.pick(1))
    assert default["executor-0"].max_num_seqs == default["scheduler"].max_num_seqs == 256


def test_num_speculative_tokens_reaches_every_executor(model_dir, tmp_path):
    config = MeshConfig(
        model_dir=model_dir, log_dir=tmp_path / "logs", num_executors=2,
        speculative="ngram", num_speculative_tokens=5,
    )  # fmt: skip
    args = _parsed(config, MeshPorts.pick(2))
    assert [args[f"executor-{i}"].num_speculative_tokens for i in range(2)] == [5, 5]
    default = _parsed(MeshConfig(model_dir=model_dir, log_dir=tmp_path / "l2"), MeshPorts.pick(1))
    assert default["executor-0"].num_speculative_tokens == SpeculativeConfig().max_draft_tokens == 8


@pytest.mark.parametrize("tokens", [0, -1, 65])
def test_a_bad_num_speculative_tokens_names_the_flag(model_dir, tmp_path, tokens):
    with pytest.raises(InvalidArgument, match=r"^num_speculative_tokens: must be in \[1, 64\]"):
        MeshConfig(model_dir=model_dir, log_dir=tmp_path / "logs", num_speculative_tokens=tokens)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("decode_steps_per_plan", 0, r"^decode_steps_per_plan: must be in \[1, 64\], got 0"),
        ("decode_steps_per_plan", 65, r"^decode_steps_per_plan: must be in \[1, 64\]"),
        ("max_steps_in_flight", 0, r"^max_steps_in_flight: must be in \[1, 65\], got 0"),
        ("max_steps_in_flight", 66, r"^max_steps_in_flight: must be in \[1, 65\]"),
    ],
)
def test_a_bad_pipeline_setting_names_the_flag(model_dir, tmp_path, field, value, message):
    with pytest.raises(InvalidArgument, match=message):
        MeshConfig(model_dir=model_dir, log_dir=tmp_path / "logs", **{field: value})


@pytest.mark.parametrize("num_seqs", [0, -3, 4097])
def test_a_bad_max_num_seqs_names_the_flag(model_dir, tmp_path, num_seqs):
    with pytest.raises(InvalidArgument, match=r"^max_num_seqs: must be in \[1, 4096\]"):
        MeshConfig(model_dir=model_dir, log_dir=tmp_path / "logs", max_num_seqs=num_seqs)


def test_max_num_batched_tokens_reaches_every_executor(model_dir, tmp_path):
    config = MeshConfig(
        model_dir=model_dir, log_dir=tmp_path / "logs", num_executors=2, max_num_batched_tokens=1024
    )
    args = _parsed(config, MeshPorts.pick(2))
    assert [args[f"executor-{i}"].max_num_batched_tokens for i in range(2)] == [1024, 1024]
    default = _parsed(MeshConfig(model_dir=model_dir, log_dir=tmp_path / "l2"), MeshPorts.pick(1))
    assert default["executor-0"].max_num_batched_tokens == 8192


@pytest.mark.parametrize("num_tokens", [0, -1, (1 << 20) + 1])
def test_a_bad_max_num_batched_tokens_names_the_flag(model_dir, tmp_path, num_tokens):
    with pytest.raises(InvalidArgument, match=r"^max_num_batched_tokens: must be in \[1, 1048576\]"):
        MeshConfig(model_dir=model_dir, log_dir=tmp_path / "logs", max_num_batched_tokens=num_tokens)


def test_extend_graphs_larger_than_a_step_are_refused(model_dir, tmp_path):
    with pytest.raises(InvalidArgument, match=r"^extend_graph_tokens: must be at most max_num_batched_tokens \(512\)"):
        MeshConfig(
            model_dir=model_dir, log_dir=tmp_path / "logs", max_num_batched_tokens=512, extend_graph_tokens=1024
        )


@pytest.mark.parametrize("grace", [-1.0, float("nan"), 4000.0])
def test_a_bad_grace_names_the_flag(model_dir, tmp_path, grace):
    with pytest.raises(InvalidArgument, match=r"^grace:"):
        MeshConfig(model_dir=model_dir, log_dir=tmp_path / "logs", grace_s=grace)


def test_child_env_puts_the_project_first_and_keeps_the_callers_import_path(monkeypatch):
    """Every service child (and the services a bench starts) imports this project first, and
    still finds what the caller's PYTHONPATH adds (packages installed to a folder of
    their own): replacing PYTHONPATH lost them, and a bench's services loaded an older
    grpcio than the generated stubs need."""
    from mesh.launcher import child_env

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/opt/site", "/opt/more"]))
    paths = child_env()["PYTHONPATH"].split(os.pathsep)
    assert paths[1:] == ["/opt/site", "/opt/more"]
    assert Path(paths[0], "radixmesh", "__init__.py").is_file()
    monkeypatch.delenv("PYTHONPATH")
    assert child_env()["PYTHONPATH"].split(os.pathsep) == paths[:1]
