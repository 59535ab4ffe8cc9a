"""From a `Constraint` to an xgrammar grammar, and the token masks every constraint shares.

One compile function per constraint kind, in a registry; errors become
`InvalidArgument` naming the constraint field with the compiler's reason.
`CompiledConstraint` is what a compile yields: the grammar and the masks that go with it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import xgrammar as xgr

from radixmesh.errors import InvalidArgument
from radixmesh.sampling import Constraint, ConstraintKind
from radixmesh.schema import check_enforceable, plan_json_schema

if TYPE_CHECKING:
    from services.executor.core.grammar.utf8 import Utf8Guard

JSON_KINDS = frozenset({ConstraintKind.JSON_SCHEMA, ConstraintKind.JSON_OBJECT})
_JSON_OBJECT_SCHEMA = plan_json_schema({"type": "object", "additionalProperties": True}).grammar_text
"""Any object; its numbers bounded like a schema's (radixmesh.schema.plan)."""


@dataclass(frozen=True, slots=True, eq=False)
class CompiledConstraint:
    """A constraint ready to match; shared by every sequence with the same constraint."""

    constraint: Constraint
    grammar: xgr.CompiledGrammar
    compile_seconds: float
    token_mask: torch.Tensor | None = field(default=None, repr=False)
    """int32 [ceil(V/32)] ANDed into every mask row, or None: special tokens other than
    the stop tokens are off, and for JSON also tokens with raw control bytes."""
    banned_token_ids: frozenset[int] = field(default=frozenset(), repr=False)
    """The tokens `token_mask` turns off."""
    stop_token_ids: tuple[int, ...] = ()
    """Tokens that end the output once the grammar is complete."""
    utf8: Utf8Guard | None = field(default=None, repr=False)
    """The vocabulary's surrogate hole (utf8.py), None when it has none."""


def constraint_field(constraint: Constraint) -> str:
    """The request field an error about this constraint names, e.g. "constraint.json_schema"."""
    return f"constraint.{constraint.kind.value}"


def choices_ebnf(choices: Iterable[str]) -> str:
    """An EBNF grammar matching exactly one of `choices` (literals escaped as JSON strings)."""
    literals = (json.dumps(choice, ensure_ascii=False) for choice in choices)
    return "root ::= " + " | ".join(literals)


def _json_schema(compiler: xgr.GrammarCompiler, c: Constraint, any_ws: bool, strict: bool):
    try:
        schema = json.loads(c.value)
    except json.JSONDecodeError as e:
        raise InvalidArgument(f"constraint.json_schema: not valid JSON: {e}") from None
    if not isinstance(schema, dict | bool):
        kind = type(schema).__name__
        raise InvalidArgument(f"constraint.json_schema: must be a JSON object, got {kind}")
    # the gateway's own plan, again: a strict schema it let through compiles exactly here
    try:
        plan = plan_json_schema(schema)
    except InvalidArgument as e:
        raise InvalidArgument(f"constraint.json_schema: {e}") from None
    if not c.best_effort:
        check_enforceable(plan, "constraint.json_schema")
    return compiler.compile_json_schema(plan.grammar_text, any_whitespace=any_ws, strict_mode=strict)


def _json_object(compiler: xgr.GrammarCompiler, c: Constraint, any_ws: bool, strict: bool):
    return compiler.compile_json_schema(_JSON_OBJECT_SCHEMA, any_whitespace=any_ws, strict_mode=True)


def _regex(compiler: xgr.GrammarCompiler, c: Constraint, any_ws: bool, strict: bool):
    return compiler.compile_regex(c.value)


def _ebnf(compiler: xgr.GrammarCompiler, c: Constraint, any_ws: bool, strict: bool):
    return compiler.compile_grammar(c.value)


def _choices(compiler: xgr.GrammarCompiler, c: Constraint, any_ws: bool, strict: bool):
    return compiler.compile_grammar(choices_ebnf(c.choices))


_COMPILERS: dict[ConstraintKind, Callable[..., xgr.CompiledGrammar]] = {
    ConstraintKind.JSON_SCHEMA: _json_schema,
    ConstraintKind.JSON_OBJECT: _json_object,
    ConstraintKind.REGEX: _regex,
    ConstraintKind.EBNF: _ebnf,
    ConstraintKind.CHOICES: _choices,
}


def compile_constraint(
    compiler: xgr.GrammarCompiler,
    constraint: Constraint,
    *,
    any_whitespace: bool,
    strict_json_schema: bool,
    max_error_chars: int = 300,
) -> xgr.CompiledGrammar:
    """Compiles one constraint; InvalidArgument("constraint.<kind>: <reason>") if refused."""
    compile_kind = _COMPILERS[constraint.kind]
    try:
        return compile_kind(compiler, constraint, any_whitespace, strict_json_schema)
    except InvalidArgument:
        raise
    except Exception as e:  # the compiler refuses a grammar with RuntimeError and kin
        reason = compiler_reason(e, max_error_chars)
        raise InvalidArgument(f"{constraint_field(constraint)}: {reason}") from None


# xgrammar prefixes its messages with "[hh:mm:ss] /path/file.cc:123: " and check noise.
_LOG_PREFIX = re.compile(r"^\s*\[[\d:]+\]\s+\S+:\d+:\s*")
_CHECK_NOISE = re.compile(r"^Check failed: \(.*?\) is false:\s*")


def compiler_reason(error: BaseException, max_chars: int = 300) -> str:
    """The compiler's own reason for refusing a grammar, without its log prefix."""
    text = str(error).strip() or type(error).__name__
    text = _CHECK_NOISE.sub("", _LOG_PREFIX.sub("", text)).strip()
    text = " ".join(text.split())
    return text if len(text) <= max_chars else text[: max_chars - 3] + "..."


def pack_token_mask(allowed: torch.Tensor) -> torch.Tensor:
    """bool [V] -> int32 [ceil(V/32)] in the bitmask layout (bit j of word i is token 32i+j)."""
    num_words = (allowed.numel() + 31) // 32
    padded = torch.zeros(num_words * 32, dtype=torch.int64)
    padded[: allowed.numel()] = allowed.to(torch.int64)
    words = (padded.view(num_words, 32) << torch.arange(32, dtype=torch.int64)).sum(dim=1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def banned_token_mask(vocab_size: int, banned: Iterable[int]) -> torch.Tensor:
    """int32 [ceil(vocab_size/32)] allowing every token but `banned`."""
    allowed = torch.ones(vocab_size, dtype=torch.bool)
    allowed[sorted(banned)] = False
    return pack_token_mask(allowed)


def control_byte_token_ids(decoded_vocab: list[bytes], any_whitespace: bool) -> frozenset[int]:
    """Tokens holding a raw byte 0x00-0x1f (but \\t \\n \\r when any_whitespace is on).

    JSON text never holds them raw (strings escape them); xgrammar's strings with
    minLength/maxLength would let them through, so JSON constraints turn them off.
    """
    allowed_ws = b"\t\n\r" if any_whitespace else b""
    banned_bytes = frozenset(b for b in range(0x20) if b not in allowed_ws)
    return frozenset(
        token_id for token_id, text in enumerate(decoded_vocab) if not banned_bytes.isdisjoint(text)
    )


def special_token_ids(tokenizer) -> frozenset[int]:
    """A Hugging Face tokenizer's special tokens (BOS, PAD, chat markers, reserved ones).

    Constrained output is text, so these are off in every constraint but the stop
    tokens; xgrammar would otherwise match a marker like "<|user|>" as its letters.
    """
    ids = set(getattr(tokenizer, "all_special_ids", ()) or ())
    for token_id, added in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        if getattr(added, "special", False):
            ids.add(int(token_id))
    return frozenset(ids)
