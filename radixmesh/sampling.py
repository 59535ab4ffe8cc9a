"""Sampling parameters, constraints and priority classes, as every core sees them.

Validated once, at construction; a bad value raises `InvalidArgument` naming
the field. Defaults follow OpenAI's and Hugging Face's meanings.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from enum import Enum, IntEnum

from radixmesh.errors import InvalidArgument

MAX_TOP_LOGPROBS = 20
MAX_N = 16
MAX_STOP_STRINGS = 16
"""Most stop strings one request may give (the same on every API)."""
MAX_STOP_CHARS = 1024
"""Longest stop string."""
INT32_LIMIT = 2**31
"""Counts (max_tokens, min_tokens, top_k, token ids) travel as 32-bit integers: below this."""

# Constraint sizes. A compile's time and memory grow faster than its text (a regex of
# 600,000 characters takes 6 s and 160 MB with a 2k vocabulary; of 3,000,000, minutes and
# gigabytes), it cannot be interrupted (a compile refused at the time limit,
# `GrammarConfig.compile_timeout_s`, still finishes in its thread), and the gateway parses
# and plans a schema on its event loop before any compile: these bound the work one request
# can ask for to seconds. The slowest compiles found within them on the 2-core build VM: a
# schema of 5,000 optional properties (144,000 characters) 2.5 s; a 2,000-branch anyOf
# (176,000) 0.4 s; a chain of 30 $refs each used twice, 0.01 s (2026-12-07).
MAX_JSON_SCHEMA_CHARS = 256 * 1024
"""Longest JSON Schema text. OpenAI's own limits on strict schemas (5,000 object properties,
10 levels of nesting, 120,000 characters of property names and enum values, 1,000 enum
values) fit inside it."""
MAX_GRAMMAR_CHARS = 64 * 1024
"""Longest regex or EBNF grammar. Real ones (a date or phone number, a SQL or JSON grammar, a
2,000-word alternation) run to a few thousand characters; one this long compiles in about
0.3 s on a 2-core CPU, with a 2k or a 128k vocabulary."""
MAX_CHOICES = 1024
"""Most strings in a list of choices (OpenAI allows 1,000 enum values in a schema)."""
MAX_CHOICES_CHARS = 64 * 1024
"""Most characters in a list of choices, all strings together (as a grammar, MAX_GRAMMAR_CHARS)."""
_MAX_CONSTRAINT_CHARS = {
    "json_schema": MAX_JSON_SCHEMA_CHARS,
    "regex": MAX_GRAMMAR_CHARS,
    "ebnf": MAX_GRAMMAR_CHARS,
}


def as_float32(value: float) -> float:
    """`value` as a 32-bit float carries it on the wire (infinite past its range; a tiny
    value rounds to 0), so a range is checked on what the services will read."""
    try:
        return struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:
        return math.copysign(math.inf, value)


def _as_sent(value: float) -> str:
    """`value` for an error message, with what a 32-bit float makes of it where it differs."""
    wire = as_float32(value)
    return f"{value}" if wire == value or math.isnan(value) else f"{value} ({wire} as a 32-bit float)"


class Priority(IntEnum):
    """Scheduling class; a lower value is served first.

    The values are the numbers of the protobuf enum `radixmesh.v1.Priority`
    (whose PRIORITY_UNSPECIFIED, 0, reads as INTERACTIVE: `wire.priority_from_proto`).
    """

    INTERACTIVE = 1
    """Latency-sensitive traffic; scheduled first."""
    BATCH = 2
    """Throughput traffic; runs when interactive work leaves room."""
    SHEDDABLE = 3
    """Dropped first (ResourceExhausted) under overload."""
    SPECULATIVE = 4
    """Work done ahead on a guess (a program's branch prediction): admitted only when no
    other class waits, never aged past another class, the first preempted."""


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_tokens: int | None = None
    """Most tokens to generate; None means up to the model's context limit."""
    min_tokens: int = 0
    """EOS and stop token ids are suppressed until this many tokens exist, and a stop string
    counts only where it ends after them (`gateway.core.stop.StopMatcher`), as in vLLM."""
    temperature: float = 1.0
    """0 is greedy."""
    top_p: float = 1.0
    top_k: int = -1
    """-1 (or 0) is off."""
    min_p: float = 0.0
    seed: int | None = None
    """Seed of the request's own generator; None draws from the executor's."""
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    stop: tuple[str, ...] = ()
    """Stop strings; matched by the gateway on text."""
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    """Alternatives per position; needs logprobs (or prompt_logprobs_start: for the prompt)."""
    n: int = 1
    prompt_logprobs_start: int | None = None
    """Score the prompt: the log probability of every prompt token at positions >= this
    (>= 1), each given the tokens before it. Positions from here minus one are never served
    from the prefix cache. With it, max_tokens may be 0 (score only, nothing sampled)."""

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> InvalidArgument:
            return InvalidArgument(f"sampling.{name} {why}")

        for name in ("max_tokens", "min_tokens", "top_k"):
            value = getattr(self, name)
            if value is not None and value >= INT32_LIMIT:
                raise bad(name, f"must be below 2^31, got {value}")
        if self.prompt_logprobs_start is not None and self.prompt_logprobs_start < 1:
            raise bad(
                "prompt_logprobs_start", f"must be >= 1, got {self.prompt_logprobs_start}"
            )
        if self.max_tokens is not None and self.max_tokens < self.min_max_tokens:
            raise bad(
                "max_tokens",
                f"must be >= 1 (0 only with prompt_logprobs_start), got {self.max_tokens}"
                if self.prompt_logprobs_start is None
                else f"must be >= 0, got {self.max_tokens}",
            )
        if self.min_tokens < 0:
            raise bad("min_tokens", f"must be >= 0, got {self.min_tokens}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise bad(
                "min_tokens", f"({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})"
            )
        if not (math.isfinite(self.temperature) and 0.0 <= self.temperature <= 2.0):
            raise bad("temperature", f"must be in [0, 2], got {self.temperature}")
        if not (0.0 < as_float32(self.top_p) <= 1.0):  # a tiny one reads as 0 on the wire
            raise bad("top_p", f"must be in (0, 1], got {_as_sent(self.top_p)}")
        if self.top_k < -1:
            raise bad("top_k", f"must be -1 (off), 0 (off) or positive, got {self.top_k}")
        if not (0.0 <= self.min_p <= 1.0):
            raise bad("min_p", f"must be in [0, 1], got {self.min_p}")
        if self.seed is not None and not (0 <= self.seed < 2**64):
            raise bad("seed", f"must be in [0, 2**64), got {self.seed}")
        penalty = as_float32(self.repetition_penalty)  # past float32's range: inf
        if not (math.isfinite(penalty) and penalty > 0.0):
            raise bad(
                "repetition_penalty",
                f"must be > 0 and finite, got {_as_sent(self.repetition_penalty)}",
            )
        for name in ("frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            if not (-2.0 <= value <= 2.0):
                raise bad(name, f"must be in [-2, 2], got {value}")
        if any(not s for s in self.stop):
            raise bad("stop", "must not contain empty strings")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise bad("stop", f"at most {MAX_STOP_STRINGS} stop strings, got {len(self.stop)}")
        if any(len(s) > MAX_STOP_CHARS for s in self.stop):
            raise bad("stop", f"a stop string has at most {MAX_STOP_CHARS} characters")
        if any(not 0 <= t < INT32_LIMIT for t in self.stop_token_ids):
            raise bad("stop_token_ids", "must be token ids in [0, 2^31)")
        if not (0 <= self.top_logprobs <= MAX_TOP_LOGPROBS):
            raise bad(
                "top_logprobs", f"must be in [0, {MAX_TOP_LOGPROBS}], got {self.top_logprobs}"
            )
        if self.top_logprobs and not self.logprobs and self.prompt_logprobs_start is None:
            raise bad(
                "top_logprobs",
                f"({self.top_logprobs}) requires logprobs to be true (or prompt_logprobs_start)",
            )
        if not (1 <= self.n <= MAX_N):
            raise bad("n", f"must be in [1, {MAX_N}], got {self.n}")

    @property
    def min_max_tokens(self) -> int:
        """0 when scoring the prompt (max_tokens 0 samples nothing), else 1."""
        return 0 if self.prompt_logprobs_start is not None else 1

    @property
    def score_only(self) -> bool:
        """max_tokens 0: the prompt is prefilled and scored, no token is sampled."""
        return self.max_tokens == 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def deterministic(self) -> bool:
        """Same input, same output: greedy, or sampled with a fixed seed."""
        return self.greedy or self.seed is not None

    @property
    def has_penalties(self) -> bool:
        """A repetition, frequency or presence penalty applies (sampling reads the token
        history)."""
        return (
            self.repetition_penalty != 1.0
            or self.frequency_penalty != 0.0
            or self.presence_penalty != 0.0
        )


class ConstraintKind(Enum):
    JSON_SCHEMA = "json_schema"
    JSON_OBJECT = "json_object"
    REGEX = "regex"
    EBNF = "ebnf"
    CHOICES = "choices"


@dataclass(frozen=True, slots=True)
class Constraint:
    kind: ConstraintKind
    value: str = ""
    """The schema (JSON text), regex or grammar; empty for JSON_OBJECT."""
    choices: tuple[str, ...] = field(default=())
    """The allowed strings, for CHOICES."""
    best_effort: bool = False
    """JSON_SCHEMA only: compile what the grammar enforces and report the rest, instead of
    refusing a schema with a keyword the grammar cannot enforce."""

    def __post_init__(self) -> None:
        name = f"constraint.{self.kind.value}"
        if self.kind is ConstraintKind.CHOICES:
            if not self.choices or any(not c for c in self.choices):
                raise InvalidArgument(f"{name}: must be a non-empty list of non-empty strings")
            if len(self.choices) > MAX_CHOICES:
                raise InvalidArgument(
                    f"{name}: must hold at most {MAX_CHOICES} strings, got {len(self.choices)}"
                )
            num_chars = sum(len(c) for c in self.choices)
            if num_chars > MAX_CHOICES_CHARS:
                raise InvalidArgument(
                    f"{name}: must hold at most {MAX_CHOICES_CHARS} characters in all, "
                    f"got {num_chars}"
                )
        elif self.kind is not ConstraintKind.JSON_OBJECT:
            if not self.value:
                raise InvalidArgument(f"{name}: must not be empty")
            limit = _MAX_CONSTRAINT_CHARS[self.kind.value]
            if len(self.value) > limit:
                raise InvalidArgument(
                    f"{name}: must be at most {limit} characters, got {len(self.value)}"
                )
        if self.best_effort and self.kind is not ConstraintKind.JSON_SCHEMA:
            raise InvalidArgument(
                f"constraint.best_effort: applies to json_schema only, not {self.kind.value}"
            )
