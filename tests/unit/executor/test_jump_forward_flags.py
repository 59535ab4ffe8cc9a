"""`--jump-forward` and `--max-forced-tokens` reach the executor's config (auto by default:
on the CPU, not on CUDA, where verifying a forced run was measured slower than the decode
step it saves), and `radixmesh serve --jump-forward` reaches every executor's command line."""

from __future__ import annotations

import pytest

from mesh.launcher import MeshPorts, plan_stages
from radixmesh.errors import InvalidArgument
from services.executor.main import build_parser, executor_config
from tests.unit.gateway.test_executor_flags import executor_args, serve_config


def test_jump_forward_is_auto_by_default_and_the_flags_reach_the_config():
    default = executor_config(executor_args()).speculative
    assert (default.jump_forward, default.max_forced_tokens, default.method) == (None, 8, "off")
    assert (default.jump_forward_on("cpu"), default.jump_forward_on("cuda")) == (True, False)
    config = executor_config(
        executor_args("--jump-forward", "off", "--max-forced-tokens", "12")
    ).speculative
    assert (config.jump_forward, config.max_forced_tokens) == (False, 12)
    assert not config.jump_forward_on("cpu")
    forced = executor_config(executor_args("--jump-forward", "on")).speculative
    assert forced.jump_forward_on("cuda") and forced.jump_forward_on("cpu")


def test_a_bad_value_names_the_field():
    with pytest.raises(InvalidArgument, match=r"speculative\.max_forced_tokens"):
        executor_config(executor_args("--max-forced-tokens", "0"))
    with pytest.raises(SystemExit):
        executor_args("--jump-forward", "maybe")


@pytest.mark.parametrize(
    ("flag", "expected"),
    [((), None), (("--jump-forward", "on"), True), (("--jump-forward", "off"), False)],
)
def test_serve_passes_jump_forward_to_every_executor(tmp_path, flag, expected):
    config = serve_config(tmp_path, *flag, "--executors", "2")
    stages = plan_stages(config, MeshPorts.pick(config.num_executors))
    executors = [s for stage in stages for s in stage if s.name.startswith("executor-")]
    values = [
        executor_config(build_parser().parse_args(s.argv[3:])).speculative.jump_forward
        for s in executors
    ]
    assert values == [expected, expected]
