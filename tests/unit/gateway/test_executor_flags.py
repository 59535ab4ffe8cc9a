"""The executor's --kv-memory-fraction, --no-cuda-graphs and --extend-graph-tokens flags,
and `radixmesh serve`'s reaching every executor's command line."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from mesh.commands import serve as serve_command
from mesh.commands import serve_checks
from mesh.launcher import MeshPorts, plan_stages
from mesh.mesh_config import MeshConfig
from radixmesh.errors import InvalidArgument
from services.executor.core.config import ExecutorConfig
from services.executor.main import build_parser, executor_config

DEFAULTS = {f.name: f.default for f in dataclasses.fields(ExecutorConfig)}


def executor_args(*flags: str) -> argparse.Namespace:
    return build_parser().parse_args(["--model", "/models/m", *flags])


def test_flags_reach_the_executor_config():
    config = executor_config(executor_args("--kv-memory-fraction", "0.5", "--no-cuda-graphs"))
    assert (config.kv_memory_fraction, config.cuda_graphs) == (0.5, False)


def test_without_the_flags_the_config_keeps_its_defaults():
    config = executor_config(executor_args())
    assert config.kv_memory_fraction == DEFAULTS["kv_memory_fraction"]
    assert config.cuda_graphs is DEFAULTS["cuda_graphs"] is True


@pytest.mark.parametrize("value", ["0", "1.5", "-0.2"])
def test_a_fraction_out_of_range_names_the_field(value):
    with pytest.raises(InvalidArgument, match=r"executor\.kv_memory_fraction"):
        executor_config(executor_args("--kv-memory-fraction", value))


def serve_config(tmp_path, *flags: str) -> MeshConfig:
    (tmp_path / "config.json").write_text("{}")
    parser = argparse.ArgumentParser()
    serve_command.add_arguments(parser)
    args = parser.parse_args(["--model", str(tmp_path), "--log-dir", str(tmp_path), *flags])
    return serve_checks._config(args)


def executor_fractions(config: MeshConfig) -> list[float]:
    stages = plan_stages(config, MeshPorts.pick(config.num_executors))
    executors = [s for stage in stages for s in stage if s.name.startswith("executor-")]
    return [executor_config(build_parser().parse_args(s.argv[3:])).kv_memory_fraction
            for s in executors]  # fmt: skip


def test_serve_passes_the_fraction_to_every_executor(tmp_path):
    config = serve_config(tmp_path, "--kv-memory-fraction", "0.6", "--executors", "2")
    assert config.kv_memory_fraction == 0.6
    assert executor_fractions(config) == [0.6, 0.6]


def test_serve_without_the_flag_leaves_the_executor_default(tmp_path):
    config = serve_config(tmp_path)
    assert executor_fractions(config) == [DEFAULTS["kv_memory_fraction"]]


def test_serve_refuses_a_fraction_out_of_range(tmp_path):
    with pytest.raises(InvalidArgument, match="kv_memory_fraction"):
        serve_config(tmp_path, "--kv-memory-fraction", "2")


def test_serve_passes_the_extend_graph_tokens_to_every_executor(tmp_path):
    config = serve_config(tmp_path, "--extend-graph-tokens", "512", "--executors", "2")
    stages = plan_stages(config, MeshPorts.pick(config.num_executors))
    executors = [s for stage in stages for s in stage if s.name.startswith("executor-")]
    tokens = [executor_config(build_parser().parse_args(s.argv[3:])).extend_graph_tokens
              for s in executors]  # fmt: skip
    assert tokens == [512, 512]
    assert executor_config(executor_args()).extend_graph_tokens == 0  # off by default


@pytest.mark.parametrize("value", ["16", "-1", "9000"])
def test_serve_refuses_extend_graph_tokens_out_of_range(tmp_path, value):
    with pytest.raises(InvalidArgument, match="extend_graph_tokens"):
        serve_config(tmp_path, "--extend-graph-tokens", value)


def test_extend_graphs_and_the_batch_invariant_mode_are_refused_together(tmp_path):
    with pytest.raises(InvalidArgument, match="extend_graph_tokens"):
        serve_config(tmp_path, "--extend-graph-tokens", "256", "--batch-invariant")
    with pytest.raises(InvalidArgument, match=r"executor\.extend_graph_tokens"):
        executor_config(executor_args("--extend-graph-tokens", "256", "--batch-invariant"))
