"""Workloads: deterministic (seeded) streams of conversations to send.

Every workload yields `Script`s: one conversation of one or more `Turn`s run in
order by one client slot (single-turn workloads yield one-turn scripts).
Prompts are built from common English words, about one token each with a
real tokenizer; the report counts the server-reported usage, not these
approximations.

Workloads (`WORKLOADS`): random (uniform lengths around input_len/output_len,
spread by range_ratio), mix (named length profiles drawn by weight),
shared-prefix (groups sharing a system prompt, each with its own questions),
multi-turn (conversations, optionally carried by session_id), json (every
request held to `TICKET_SCHEMA`). Any workload can be mixed with JSON
requests (json_fraction) and batch-priority requests (batch_fraction).
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from radixmesh.errors import InvalidArgument

_WORD_TEXT = (
    "the of and to in is that it was for on are as with his they at be this from have or by "
    "one had not but what all were when we there can an your which their said if do will each "
    "about how up out them then she many some so these would other into has more her two like "
    "him see time could no make than first been its who now people my made over did down only "
    "way find use may water long little very after words called just where most know get "
    "through back much go good new write our me man too any day same right look think also "
    "around another came come work three word must because does part even place well such "
    "here take why things help put years different away again off went old number great tell "
    "men say small every found still between name should home big give air line set own under "
    "read last never us left end along while might next sound below saw something thought both "
    "few those always looked show large often together asked house world going want school"
)
WORDS = tuple(_WORD_TEXT.split())

TICKET_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "customer": {"type": "string", "maxLength": 24},
        "category": {"type": "string", "enum": ["billing", "shipping", "account", "other"]},
        "urgency": {"type": "integer", "minimum": 1, "maximum": 5},
        "refund": {"type": "boolean"},
        "tags": {
            "type": "array",
            "items": {"type": "string", "enum": ["late", "damaged", "wrong", "lost", "repeat"]},
            "maxItems": 3,
        },
    },
    "required": ["customer", "category", "urgency", "refund", "tags"],
    "additionalProperties": False,
}
"""A support-ticket extraction schema: bounded strings, enums, an integer range, an array."""

JSON_INSTRUCTION = (
    "Extract the support ticket as JSON with customer, category, urgency, refund, tags: "
)
DEFAULT_PROFILES: dict[str, tuple[int, int]] = {"short": (64, 32), "long": (512, 128)}
"""Length profile name -> (input words, output tokens)."""


@dataclass(frozen=True, slots=True)
class Turn:
    user: str
    """This turn's user message."""
    max_tokens: int
    json_schema: dict[str, Any] | None = None
    """When set, the output is held to this schema (response_format json_schema)."""
    priority: str = "interactive"
    """"interactive" or "batch"."""


@dataclass(frozen=True, slots=True)
class Script:
    script_id: int
    group: str
    """Profile or prefix-group label, for per-group numbers."""
    turns: tuple[Turn, ...]
    system: str = ""
    """System prompt (empty: none)."""
    session_id: str = ""
    """When set, each turn sends only its new message with this session_id."""


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    name: str = "random"
    """One of WORKLOADS."""
    seed: int = 0
    input_len: int = 128
    """random: mean prompt length in words."""
    output_len: int = 64
    """random, shared-prefix, multi-turn, json: max_tokens per request."""
    range_ratio: float = 1.0
    """random: lengths are uniform in [len * range_ratio, len]; 1.0 fixes them."""
    mix: tuple[tuple[str, float], ...] = (("short", 0.7), ("long", 0.3))
    """mix: (profile, weight) pairs."""
    profiles: tuple[tuple[str, int, int], ...] = tuple(
        (k, i, o) for k, (i, o) in DEFAULT_PROFILES.items()
    )
    """(name, input words, output tokens) of each length profile."""
    groups: int = 4
    """shared-prefix: number of distinct system prompts."""
    prompts_per_group: int = 8
    """shared-prefix: distinct questions per group."""
    system_prompt_len: int = 256
    """shared-prefix and multi-turn: system prompt length in words."""
    question_len: int = 32
    """shared-prefix and multi-turn: question length in words."""
    num_turns: int = 3
    """multi-turn: turns per conversation."""
    use_sessions: bool = False
    """multi-turn: carry the conversation with session_id instead of resending it."""
    json_fraction: float = 0.0
    """Fraction of turns held to TICKET_SCHEMA (the json workload defaults to 1)."""
    batch_fraction: float = 0.0
    """Fraction of scripts sent with priority "batch"."""
    json_max_tokens: int = 96
    """max_tokens of a JSON turn (enough to close the object)."""
    session_prefix: str = field(default="bench")
    """multi-turn: session ids are <prefix>-<seed>-<script id>."""

    def __post_init__(self) -> None:
        if self.name not in WORKLOADS:
            raise InvalidArgument(
                f"workload: expected one of {sorted(WORKLOADS)}, got {self.name!r}"
            )
        for key in ("input_len", "output_len", "groups", "prompts_per_group", "num_turns"):
            if getattr(self, key) < 1:
                raise InvalidArgument(f"{key}: must be >= 1, got {getattr(self, key)}")
        for key in ("system_prompt_len", "question_len"):
            if getattr(self, key) < 0:
                raise InvalidArgument(f"{key}: must be >= 0, got {getattr(self, key)}")
        if self.json_max_tokens < 1:
            raise InvalidArgument(f"json_max_tokens: must be >= 1, got {self.json_max_tokens}")
        if not 0.0 < self.range_ratio <= 1.0:
            raise InvalidArgument(f"range_ratio: must be in (0, 1], got {self.range_ratio}")
        for key in ("json_fraction", "batch_fraction"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise InvalidArgument(f"{key}: must be in [0, 1], got {getattr(self, key)}")
        names = {p[0] for p in self.profiles}
        for name, num_in, num_out in self.profiles:
            if num_in < 1 or num_out < 1:
                raise InvalidArgument(f"profile: {name} needs input and output >= 1")
        if not self.mix or any(w <= 0 for _, w in self.mix):
            raise InvalidArgument("mix: needs at least one profile with a weight > 0")
        for name, _ in self.mix:
            if name not in names:
                raise InvalidArgument(f"mix: unknown profile {name!r} (known: {sorted(names)})")

    def profile(self, name: str) -> tuple[int, int]:
        for pname, num_in, num_out in self.profiles:
            if pname == name:
                return num_in, num_out
        raise InvalidArgument(f"mix: unknown profile {name!r}")


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _draw_len(rng: random.Random, length: int, range_ratio: float) -> int:
    return rng.randint(max(1, int(length * range_ratio)), length)


def _random(config: WorkloadConfig, rng: random.Random) -> Iterator[Script]:
    for i in itertools.count():
        num_in = _draw_len(rng, config.input_len, config.range_ratio)
        num_out = _draw_len(rng, config.output_len, config.range_ratio)
        yield Script(i, "random", (Turn(words(rng, num_in), num_out),))


def _mix(config: WorkloadConfig, rng: random.Random) -> Iterator[Script]:
    names = [name for name, _ in config.mix]
    weights = [w for _, w in config.mix]
    for i in itertools.count():
        name = rng.choices(names, weights)[0]
        num_in, num_out = config.profile(name)
        yield Script(i, name, (Turn(words(rng, num_in), num_out),))


def _shared_prefix(config: WorkloadConfig, rng: random.Random) -> Iterator[Script]:
    systems = [f"group {g}: " + words(rng, config.system_prompt_len) for g in range(config.groups)]
    questions = [
        [words(rng, config.question_len) for _ in range(config.prompts_per_group)]
        for _ in range(config.groups)
    ]
    pairs = [(g, q) for g in range(config.groups) for q in range(config.prompts_per_group)]
    ids = itertools.count()
    while True:
        rng.shuffle(pairs)  # every (group, question) once per round, in a seeded order
        for g, q in pairs:
            turn = Turn(questions[g][q], config.output_len)
            yield Script(next(ids), f"group-{g}", (turn,), system=systems[g])


def _multi_turn(config: WorkloadConfig, rng: random.Random) -> Iterator[Script]:
    for i in itertools.count():
        system = words(rng, config.system_prompt_len)
        turns = tuple(
            Turn(words(rng, config.question_len), config.output_len)
            for _ in range(config.num_turns)
        )
        session = f"{config.session_prefix}-{config.seed}-{i}" if config.use_sessions else ""
        yield Script(i, "conversation", turns, system=system, session_id=session)


WORKLOADS: dict[str, Callable[[WorkloadConfig, random.Random], Iterator[Script]]] = {
    "random": _random,
    "mix": _mix,
    "shared-prefix": _shared_prefix,
    "multi-turn": _multi_turn,
    "json": _random,  # the random shape, every turn constrained (json_fraction defaults to 1)
}


def iter_scripts(config: WorkloadConfig) -> Iterator[Script]:
    """The workload's scripts, forever, the same sequence for the same config."""
    rng = random.Random(config.seed)
    modifiers = random.Random(config.seed ^ 0x5EED)  # fractions drawn apart from the prompts
    for script in WORKLOADS[config.name](config, rng):
        priority = "batch" if modifiers.random() < config.batch_fraction else "interactive"
        turns = []
        for turn in script.turns:
            if modifiers.random() < config.json_fraction:
                turn = replace(
                    turn,
                    user=JSON_INSTRUCTION + turn.user,
                    max_tokens=config.json_max_tokens,
                    json_schema=TICKET_SCHEMA,
                )
            turns.append(replace(turn, priority=priority))
        yield replace(script, turns=tuple(turns))


def schema_text(schema: dict[str, Any]) -> str:
    return json.dumps(schema, separators=(",", ":"), sort_keys=True)
