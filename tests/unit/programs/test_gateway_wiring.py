"""The gateway's main builds the Programs servicer from its flags: --tools-config adds
tools and plugins beside the built-ins, and the plugins reach plain requests too."""

from __future__ import annotations

import json
import re

import pytest

from gateway.core.models import ModelRegistry
from gateway.main import build_parser, programs_servicer
from gateway.programs.backend import SchedulerBackend
from gateway.programs.core.model import Limits
from radixmesh.errors import InvalidArgument
from services.scheduler.client import SchedulerClient


async def test_tools_config_adds_tools_and_plugins(tmp_path, monkeypatch, tokenizer):
    (tmp_path / "site_tools_main.py").write_text(
        "def echo(text):\n    return text\n"
        "class Upper:\n    def pre_request(self, text):\n        return text.upper()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    config = tmp_path / "tools.json"
    config.write_text(
        json.dumps(
            {
                "tools": [{"name": "echo", "callable": "site_tools_main:echo", "cache_ttl_s": 9}],
                "plugins": ["site_tools_main:Upper"],
            }
        )
    )
    args = build_parser().parse_args(
        ["--model", "m", "--scheduler-address", "127.0.0.1:1", "--tools-config", str(config)]
    )
    models = ModelRegistry({"tiny": tokenizer})
    servicer, plugins = programs_servicer(args, models, SchedulerClient("127.0.0.1:1"), None, None)
    deps = servicer._deps
    assert {"echo", "retrieve", "calculator"} <= deps.tools.names
    assert deps.tools.get("echo").cache_ttl_s == 9
    assert plugins.pre_request("quiet") == "QUIET" and deps.plugins is plugins
    assert isinstance(deps.backend, SchedulerBackend) and deps.backend.supports_holds
    assert deps.limits == Limits()


async def test_program_limit_flags_set_the_servers_bounds(tokenizer):
    flags = ["--program-max-total-tokens", "64", "--program-max-wall-time-s", "2.5"]
    args = build_parser().parse_args(["--model", "m", "--scheduler-address", "x:1", *flags])
    models = ModelRegistry({"tiny": tokenizer})
    servicer, _ = programs_servicer(args, models, SchedulerClient("127.0.0.1:1"), None, None)
    assert servicer._deps.limits == Limits(max_total_tokens=64, max_wall_time_s=2.5)
    args.program_max_total_tokens = 0
    with pytest.raises(InvalidArgument, match=re.escape("limits.max_total_tokens: must be > 0, got 0")):
        programs_servicer(args, models, SchedulerClient("127.0.0.1:1"), None, None)


@pytest.mark.parametrize(
    ("flag", "field", "value"),
    [
        ("--program-max-statements", "max_statements", 12),
        ("--program-max-fork-width", "max_fork_width", 3),
        ("--program-max-depth", "max_depth", 2),
    ],
)
async def test_structure_limit_flags_set_the_servers_bounds(tokenizer, flag, field, value):
    args = build_parser().parse_args(["--model", "m", "--scheduler-address", "x:1", flag, str(value)])
    models = ModelRegistry({"tiny": tokenizer})
    servicer, _ = programs_servicer(args, models, SchedulerClient("127.0.0.1:1"), None, None)
    assert getattr(servicer._deps.limits, field) == value
    assert servicer._deps.limits == Limits(**{field: value})
    setattr(args, field.replace("max_", "program_max_", 1), -1)
    with pytest.raises(InvalidArgument, match=re.escape(f"limits.{field}: must be > 0, got -1")):
        programs_servicer(args, models, SchedulerClient("127.0.0.1:1"), None, None)


async def test_structure_limit_flags_bound_what_a_program_may_ask(tokenizer):
    flags = ["--program-max-fork-width", "2", "--program-max-depth", "1"]
    args = build_parser().parse_args(["--model", "m", "--scheduler-address", "x:1", *flags])
    servicer, _ = programs_servicer(
        args, ModelRegistry({"tiny": tokenizer}), SchedulerClient("127.0.0.1:1"), None, None
    )
    bound = servicer._deps.limits
    assert bound.lowered(max_fork_width=1).max_fork_width == 1
    with pytest.raises(InvalidArgument, match=re.escape("limits.max_fork_width: must be in (0, 2], got 3")):
        bound.lowered(max_fork_width=3)
    with pytest.raises(InvalidArgument, match=re.escape("limits.max_depth: must be in (0, 1], got 2")):
        bound.lowered(max_depth=2)
