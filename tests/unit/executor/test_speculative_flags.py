"""`--speculative` and its sizes reach the executor's config, and `radixmesh serve
--speculative` reaches every executor's command line."""

from __future__ import annotations

import pytest

from mesh.launcher import MeshPorts, plan_stages
from radixmesh.errors import InvalidArgument
from services.executor.main import build_parser, executor_config
from tests.unit.gateway.test_executor_flags import executor_args, serve_config


def test_flags_reach_the_speculative_config():
    config = executor_config(
        executor_args(
            "--speculative", "suffix", "--num-speculative-tokens", "6",
            "--speculative-max-batch-size", "16",
        )
    ).speculative  # fmt: skip
    assert (config.method, config.max_draft_tokens, config.max_batch_size) == ("suffix", 6, 16)
    assert executor_config(executor_args()).speculative.method == "off"


def test_a_bad_size_names_the_field():
    with pytest.raises(InvalidArgument, match=r"speculative\.max_draft_tokens"):
        executor_config(executor_args("--speculative", "ngram", "--num-speculative-tokens", "0"))
    with pytest.raises(SystemExit):
        executor_args("--speculative", "eagle")


@pytest.mark.parametrize("method", ["ngram", "suffix", "off"])
def test_serve_passes_the_method_to_every_executor(tmp_path, method):
    config = serve_config(tmp_path, "--speculative", method, "--executors", "2")
    stages = plan_stages(config, MeshPorts.pick(config.num_executors))
    executors = [s for stage in stages for s in stage if s.name.startswith("executor-")]
    methods = [
        executor_config(build_parser().parse_args(s.argv[3:])).speculative.method
        for s in executors
    ]
    assert methods == [method, method]
