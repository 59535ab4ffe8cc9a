"""Workloads: deterministic per seed, the shapes each promises, config errors naming the field."""

from __future__ import annotations

import itertools
import json
import math

import jsonschema
import pytest
from fake_openai import BAD_TICKET, VALID_TICKET

from mesh.loadgen.workloads import (
    JSON_INSTRUCTION,
    TICKET_SCHEMA,
    WORKLOADS,
    WorkloadConfig,
    iter_scripts,
)
from radixmesh.errors import InvalidArgument


def take(config: WorkloadConfig, n: int):
    return list(itertools.islice(iter_scripts(config), n))


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_same_seed_same_scripts_other_seed_other_scripts(name):
    config = WorkloadConfig(name=name, seed=7, input_len=20, system_prompt_len=10)
    assert take(config, 20) == take(config, 20)
    other = take(WorkloadConfig(name=name, seed=8, input_len=20, system_prompt_len=10), 20)
    assert other != take(config, 20)


def test_random_lengths_stay_in_range_and_a_ratio_of_one_fixes_them():
    spread = take(WorkloadConfig(input_len=40, output_len=10, range_ratio=0.5), 300)
    num_words = [len(s.turns[0].user.split()) for s in spread]
    assert min(num_words) >= 20 and max(num_words) <= 40
    assert len(set(num_words)) > 10  # actually spread
    assert {s.turns[0].max_tokens for s in spread} <= set(range(5, 11))
    fixed = take(WorkloadConfig(input_len=40, output_len=10), 50)
    assert {len(s.turns[0].user.split()) for s in fixed} == {40}
    assert {s.turns[0].max_tokens for s in fixed} == {10}


def test_mix_draws_profiles_by_weight_with_their_lengths():
    config = WorkloadConfig(
        name="mix", mix=(("short", 0.7), ("long", 0.3)), profiles=(("short", 8, 4), ("long", 50, 9))
    )
    scripts = take(config, 2000)
    num_short = sum(s.group == "short" for s in scripts)
    sigma = math.sqrt(2000 * 0.7 * 0.3)
    assert abs(num_short - 1400) < 4 * sigma
    for s in scripts:
        num_in, num_out = (8, 4) if s.group == "short" else (50, 9)
        assert len(s.turns[0].user.split()) == num_in
        assert s.turns[0].max_tokens == num_out


def test_shared_prefix_covers_every_group_and_question_once_per_round():
    config = WorkloadConfig(
        name="shared-prefix", groups=3, prompts_per_group=5, system_prompt_len=30, question_len=6
    )
    scripts = take(config, 30)
    for round_ in (scripts[:15], scripts[15:]):
        pairs = {(s.system, s.turns[0].user) for s in round_}
        assert len(pairs) == 15
    systems = {s.group: s.system for s in scripts}
    assert len(set(systems.values())) == 3
    assert all(s.system == systems[s.group] for s in scripts)
    assert all(len(s.system.split()) == 30 + 2 for s in scripts)  # "group <g>:" + words


@pytest.mark.parametrize("use_sessions", [False, True])
def test_multi_turn_conversations_carry_a_session_id_only_when_asked(use_sessions):
    config = WorkloadConfig(name="multi-turn", num_turns=4, use_sessions=use_sessions)
    scripts = take(config, 10)
    assert all(len(s.turns) == 4 for s in scripts)
    sessions = [s.session_id for s in scripts]
    if use_sessions:
        assert len(set(sessions)) == 10 and all(sessions)
    else:
        assert sessions == [""] * 10


def test_json_and_batch_fractions_mark_that_share_of_requests():
    config = WorkloadConfig(json_fraction=0.25, batch_fraction=0.5, input_len=4)
    scripts = take(config, 2000)
    num_json = sum(s.turns[0].json_schema is not None for s in scripts)
    num_batch = sum(s.turns[0].priority == "batch" for s in scripts)
    assert abs(num_json - 500) < 4 * math.sqrt(2000 * 0.25 * 0.75)
    assert abs(num_batch - 1000) < 4 * math.sqrt(2000 * 0.25)
    for s in scripts:
        turn = s.turns[0]
        if turn.json_schema is not None:
            assert turn.user.startswith(JSON_INSTRUCTION)
            assert turn.max_tokens == config.json_max_tokens


def test_ticket_schema_is_valid_and_tells_a_good_ticket_from_a_bad_one():
    jsonschema.Draft202012Validator.check_schema(TICKET_SCHEMA)
    jsonschema.validate(json.loads(VALID_TICKET), TICKET_SCHEMA)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(json.loads(BAD_TICKET), TICKET_SCHEMA)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"name": "zipf"}, "workload"),
        ({"input_len": 0}, "input_len"),
        ({"range_ratio": 0.0}, "range_ratio"),
        ({"json_fraction": 1.5}, "json_fraction"),
        ({"batch_fraction": -0.1}, "batch_fraction"),
        ({"mix": (("tiny", 1.0),)}, "mix"),
        ({"mix": ()}, "mix"),
        ({"num_turns": 0}, "num_turns"),
        ({"profiles": (("short", 0, 3),)}, "profile"),
    ],
)
def test_bad_config_names_the_field(fields, field):
    with pytest.raises(InvalidArgument, match=field):
        WorkloadConfig(**fields)
