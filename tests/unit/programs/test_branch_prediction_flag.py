"""`radixmesh serve --program-branch-prediction` reaches every gateway's command line, and
the gateway's flag turns its predictor on or off (on by default)."""

from __future__ import annotations

import pytest

from gateway.main import build_parser
from mesh.launcher import MeshPorts, plan_stages
from tests.unit.gateway.test_executor_flags import serve_config


def gateway_flags(config) -> list[str]:
    stages = plan_stages(config, MeshPorts.pick(config.num_executors, num_gateways=config.num_gateways))
    gateways = [s for stage in stages for s in stage if s.name.startswith("gateway")]
    assert len(gateways) == config.num_gateways
    return [build_parser().parse_args(s.argv[3:]).program_branch_prediction for s in gateways]


@pytest.mark.parametrize(
    ("flag", "expected"),
    [((), "on"), (("--program-branch-prediction", "off"), "off"), (("--program-branch-prediction", "on"), "on")],
)
def test_serve_passes_branch_prediction_to_every_gateway(tmp_path, flag, expected):
    config = serve_config(tmp_path, *flag, "--gateways", "2")
    assert config.program_branch_prediction is (expected == "on")
    assert gateway_flags(config) == [expected, expected]


def test_a_bad_value_is_refused(tmp_path):
    with pytest.raises(SystemExit):
        serve_config(tmp_path, "--program-branch-prediction", "maybe")
