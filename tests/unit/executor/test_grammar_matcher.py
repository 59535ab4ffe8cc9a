"""ConstraintMatcher and the batch bitmask: outputs sampled from random logits at temperature
1.0 through the mask (the hardest case for a constraint) must satisfy the constraint."""

from __future__ import annotations

import ast
import json
import os
import re

import jsonschema
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from mesh.tiny_model import write_tiny_model
from radixmesh.errors import FailedPrecondition, InvalidArgument
from radixmesh.sampling import Constraint, ConstraintKind
from radixmesh_kernels.bitmask import apply_bitmask_ref, unpack_bitmask
from services.executor.core.grammar import (
    ConstraintMatcher,
    GrammarConfig,
    GrammarService,
    accept_batch,
    fill_batch_bitmask,
)

MAX_TOKENS = 512
PAD = 45
"""Extra logits columns past the tokenizer's vocabulary (the model's padded vocab)."""


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    model_dir = write_tiny_model(tmp_path_factory.mktemp("tiny"), arch="llama", seed=0)
    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def service(tokenizer):
    service = GrammarService.from_tokenizer(
        tokenizer, len(tokenizer) + PAD, config=GrammarConfig(compile_timeout_s=30)
    )
    yield service
    service.close(wait=True)


def sample(service: GrammarService, matcher: ConstraintMatcher, seed: int) -> list[int]:
    """Random logits, masked, sampled at temperature 1.0 until the matcher terminates."""
    generator = torch.Generator().manual_seed(seed)
    bitmask = service.allocate_bitmask(1)
    for _ in range(MAX_TOKENS):
        if matcher.is_terminated:
            break
        matcher.fill_bitmask(bitmask, 0)
        logits = torch.randn(1, service.vocab_size, generator=generator)
        apply_bitmask_ref(logits, bitmask)
        token_id = int(torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator))
        assert matcher.accept(token_id), f"sampled token {token_id} refused by its own mask"
    assert matcher.is_terminated, f"no end within {MAX_TOKENS} tokens"
    return list(matcher.token_ids)


def generate(service, tokenizer, constraint: Constraint, seed: int) -> str:
    compiled = service.compile_sync(constraint)
    token_ids = sample(service, service.new_matcher(compiled), seed)
    assert token_ids[-1] in compiled.stop_token_ids
    return tokenizer.decode(token_ids[:-1], skip_special_tokens=False)


# ----- hypothesis JSON Schemas -----

_names = st.from_regex(r"[a-z][a-z0-9_]{0,7}", fullmatch=True)
_enum_values = st.one_of(
    st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=6),
    st.integers(-50, 50),
    st.booleans(),
    st.none(),
)
_PATTERNS = ["[a-z]{1,6}", "[A-Z][a-z]{0,4}", r"\d{2,4}-\d{2}", "(yes|no|maybe)", '[^"\\\\]{0,5}']


@st.composite
def _bounded_number(draw, kind: str):
    low = draw(st.integers(-1000, 1000))
    return {"type": kind, "minimum": low, "maximum": low + draw(st.integers(0, 2000))}


@st.composite
def _bounded_string(draw):
    min_length = draw(st.integers(0, 3))
    return {
        "type": "string",
        "minLength": min_length,
        "maxLength": min_length + draw(st.integers(0, 8)),
    }


_leaves = st.one_of(
    _bounded_number("integer"),
    _bounded_number("number"),
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.lists(_enum_values, min_size=1, max_size=4, unique=True).map(lambda v: {"enum": v}),
    _bounded_string(),
    st.sampled_from(_PATTERNS).map(lambda p: {"type": "string", "pattern": p}),
)


@st.composite
def _object(draw, children):
    properties = draw(st.dictionaries(_names, children, min_size=1, max_size=4))
    required = draw(st.lists(st.sampled_from(sorted(properties)), unique=True))
    return {"type": "object", "properties": properties, "required": required}


@st.composite
def _array(draw, children):
    min_items = draw(st.integers(0, 2))
    items = draw(children)
    return {
        "type": "array",
        "items": items,
        "minItems": min_items,
        "maxItems": min_items + draw(st.integers(0, 3)),
    }


def _extend(children):
    return st.one_of(
        _object(children),
        _array(children),
        st.lists(children, min_size=2, max_size=3).map(lambda s: {"anyOf": s}),
    )


json_schemas = st.recursive(_leaves, _extend, max_leaves=8)


@settings(  # fixed examples in CI; GRAMMAR_SCHEMA_EXAMPLES=500 explores more, at random
    max_examples=int(os.environ.get("GRAMMAR_SCHEMA_EXAMPLES", "100")),
    derandomize="GRAMMAR_SCHEMA_EXAMPLES" not in os.environ,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(schema=json_schemas, seed=st.integers(0, 2**32 - 1))
def test_sampled_json_always_validates_against_its_schema(service, tokenizer, schema, seed):
    constraint = Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(schema))
    for offset in range(2):
        text = generate(service, tokenizer, constraint, seed + offset)
        jsonschema.validate(json.loads(text), schema)  # strict json: no raw control characters


def test_json_object_mode_gives_an_object(service, tokenizer):
    for seed in range(5):
        assert isinstance(
            json.loads(generate(service, tokenizer, Constraint(ConstraintKind.JSON_OBJECT), seed)),
            dict,
        )


@pytest.mark.parametrize(
    "regex",
    [
        r"\d{3}-\d{4}",
        r"(cat|dog|bird)s?",
        r"[A-Z][a-z]{2,8}( [A-Z][a-z]{2,8}){0,2}",
        r"(0|[1-9][0-9]{0,3})\.[0-9]{2}",
        r"[a-f0-9]{8}",
        r"https?://[a-z]{3,10}\.(com|org)(/[a-z]{1,5}){0,3}",
    ],
)
def test_sampled_text_fully_matches_its_regex(service, tokenizer, regex):
    for seed in range(8):
        text = generate(service, tokenizer, Constraint(ConstraintKind.REGEX, regex), seed)
        assert re.fullmatch(regex, text), text


ARITHMETIC = """
root ::= expr
expr ::= term (("+" | "-") term)*
term ::= factor (("*" | "/") factor)*
factor ::= num | "(" expr ")"
num ::= [1-9] [0-9]{0,2}
"""
_ARITHMETIC_NODES = (ast.Expression, ast.BinOp, ast.Constant, ast.Add, ast.Sub, ast.Mult, ast.Div)


def test_sampled_text_parses_with_its_ebnf_grammar(service, tokenizer):
    for seed in range(10):
        text = generate(service, tokenizer, Constraint(ConstraintKind.EBNF, ARITHMETIC), seed)
        tree = ast.parse(text, mode="eval")  # the grammar is a subset of Python expressions
        assert all(isinstance(node, _ARITHMETIC_NODES) for node in ast.walk(tree)), text
        assert " " not in text


def test_sampled_text_is_one_of_the_choices(service, tokenizer):
    choices = ("no", "none", "nonetheless", 'say "yes"', "back\\slash", "naïve ✓")
    seen = {
        generate(service, tokenizer, Constraint(ConstraintKind.CHOICES, choices=choices), seed)
        for seed in range(30)
    }
    assert seen <= set(choices)
    assert len(seen) >= 3


# ----- matcher state -----


def _json_constraint(schema: dict) -> Constraint:
    return Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(schema))


def _masks_along(service, matcher, token_ids) -> list[torch.Tensor]:
    """The mask before each token, accepting the tokens one by one."""
    bitmask = service.allocate_bitmask(1)
    masks = []
    for token_id in token_ids:
        matcher.fill_bitmask(bitmask, 0)
        masks.append(bitmask[0].clone())
        assert matcher.accept(token_id)
    return masks


def _mask(service, matcher) -> torch.Tensor:
    bitmask = service.allocate_bitmask(1)
    matcher.fill_bitmask(bitmask, 0)
    return bitmask[0].clone()


def test_replay_restores_the_state_the_tokens_gave(service):
    schema = {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 3},
            "n": {"type": "integer", "minimum": 0, "maximum": 999},
        },
        "required": ["tags", "n"],
    }
    compiled = service.compile_sync(_json_constraint(schema))
    token_ids = sample(service, service.new_matcher(compiled), seed=7)
    masks = _masks_along(service, service.new_matcher(compiled), token_ids[:-1])
    k = len(token_ids) // 2

    resumed = service.new_matcher(compiled)
    resumed.replay(token_ids[:k])
    assert resumed.token_ids == tuple(token_ids[:k])
    assert torch.equal(_mask(service, resumed), masks[k])
    resumed.replay(token_ids)
    assert resumed.is_terminated


def test_replay_of_tokens_off_the_grammar_fails_and_resets(service, tokenizer):
    compiled = service.compile_sync(Constraint(ConstraintKind.REGEX, r"[0-9]{4}"))
    matcher = service.new_matcher(compiled)
    digits = tokenizer.encode("12", add_special_tokens=False)
    letter = tokenizer.encode("x", add_special_tokens=False)
    with pytest.raises(
        FailedPrecondition, match=rf"token {letter[0]} at output position {len(digits)}"
    ):
        matcher.replay(digits + letter)
    assert matcher.token_ids == ()
    assert torch.equal(_mask(service, matcher), _mask(service, service.new_matcher(compiled)))


def test_refused_token_leaves_the_state_unchanged(service, tokenizer):
    matcher = service.new_matcher(
        service.compile_sync(Constraint(ConstraintKind.REGEX, r"[0-9]{4}"))
    )
    before = _mask(service, matcher)
    assert not matcher.accept(tokenizer.encode("x", add_special_tokens=False)[0])
    assert matcher.token_ids == ()
    assert torch.equal(_mask(service, matcher), before)


def test_terminated_matcher_allows_only_stop_tokens(service, tokenizer):
    compiled = service.compile_sync(Constraint(ConstraintKind.CHOICES, choices=("ok",)))
    matcher = service.new_matcher(compiled)
    for token_id in tokenizer.encode("ok", add_special_tokens=False):
        assert matcher.accept(token_id)
    allowed = unpack_bitmask(_mask(service, matcher)[None], service.vocab_size)[0]
    assert allowed.nonzero().flatten().tolist() == [tokenizer.eos_token_id]  # grammar complete
    assert matcher.accept(tokenizer.eos_token_id) and matcher.is_terminated
    allowed = unpack_bitmask(_mask(service, matcher)[None], service.vocab_size)[0]
    assert allowed.nonzero().flatten().tolist() == list(compiled.stop_token_ids)


def test_padding_and_special_tokens_are_never_allowed(service, tokenizer):
    matcher = service.new_matcher(service.compile_sync(Constraint(ConstraintKind.JSON_OBJECT)))
    assert matcher.accept(tokenizer.encode('{"', add_special_tokens=False)[0])
    allowed = unpack_bitmask(_mask(service, matcher)[None], service.vocab_size)[0]
    assert not allowed[len(tokenizer) :].any()
    specials = [t for t in tokenizer.all_special_ids if t != tokenizer.eos_token_id]
    assert specials and not allowed[specials].any()
    assert not any(matcher.accept(t) for t in specials)


def test_json_strings_never_hold_raw_control_characters(service, tokenizer):
    schema = {"type": "string", "minLength": 1, "maxLength": 5}
    matcher = service.new_matcher(service.compile_sync(_json_constraint(schema)))
    assert matcher.accept(tokenizer.encode('"', add_special_tokens=False)[0])
    allowed = unpack_bitmask(_mask(service, matcher)[None], service.vocab_size)[0]
    control = [
        t for t in range(len(tokenizer)) if any(ord(c) < 0x20 for c in tokenizer.decode([t]))
    ]
    assert control and not allowed[control].any()
    assert allowed[tokenizer.encode("a", add_special_tokens=False)[0]]
    assert not matcher.accept(control[0])


def test_batch_fill_matches_row_fills_and_leaves_unconstrained_rows_open(service):
    regex = service.compile_sync(Constraint(ConstraintKind.REGEX, r"[0-9]{4}"))
    choices = service.compile_sync(Constraint(ConstraintKind.CHOICES, choices=("left", "right")))
    matchers = [service.new_matcher(regex), None, service.new_matcher(choices), None]
    bitmask = service.allocate_bitmask(6)
    bitmask.zero_()
    assert fill_batch_bitmask(matchers, bitmask)
    assert torch.equal(bitmask[0], _mask(service, matchers[0]))
    assert torch.equal(bitmask[2], _mask(service, matchers[2]))
    assert (bitmask[[1, 3]] == -1).all()
    assert (bitmask[4:] == 0).all()  # rows past the batch are not touched
    assert not fill_batch_bitmask([None, None], bitmask)


def test_batch_fill_refuses_a_bitmask_of_the_wrong_shape(service):
    matcher = service.new_matcher(service.compile_sync(Constraint(ConstraintKind.REGEX, "a")))
    with pytest.raises(InvalidArgument, match="bitmask: has 1 rows for 2 sequences"):
        fill_batch_bitmask([matcher, matcher], service.allocate_bitmask(1))
    with pytest.raises(InvalidArgument, match="bitmask: must be a 2-D int32 host tensor"):
        fill_batch_bitmask([matcher], service.allocate_bitmask(1).to(torch.int64))


def test_each_matcher_counts_as_a_constrained_request(tokenizer):
    service = GrammarService.from_tokenizer(tokenizer, len(tokenizer))
    try:
        constraint = Constraint(ConstraintKind.REGEX, "a")
        compiled = service.compile_sync(constraint)
        for _ in range(2):
            service.new_matcher(compiled)
        assert service.matcher_for(constraint).compiled is compiled
        assert service.metrics.num_constrained_requests == 3
        assert service.metrics.num_compiles == 1
    finally:
        service.close()


def test_accept_batch_agrees_with_one_accept_at_a_time(service, tokenizer):
    """Each step, every matcher is offered a token: mostly one its mask allows, sometimes a
    random one (often refused) or a banned one; the batched call and the single calls
    must agree on every answer and leave the same state behind."""
    regex = service.compile_sync(Constraint(ConstraintKind.REGEX, r"[0-9]{2,6}-[a-z]{3}"))
    schema = service.compile_sync(
        _json_constraint({"type": "object", "properties": {"k": {"type": "integer"}}})
    )
    compiled = [regex, schema, regex, schema, schema]
    batched = [service.new_matcher(c) for c in compiled]
    single = [service.new_matcher(c) for c in compiled]
    banned = min(tokenizer.all_special_ids)
    generator = torch.Generator().manual_seed(3)
    bitmask = service.allocate_bitmask(len(compiled))
    num_refused = 0
    for step in range(24):
        fill_batch_bitmask(single, bitmask)
        token_ids = []
        for row in range(len(compiled)):
            logits = torch.randn(1, service.vocab_size, generator=generator)
            if (step + row) % 4:  # a token the mask allows
                apply_bitmask_ref(logits, bitmask[row : row + 1])
            token_ids.append(banned if (step + row) % 7 == 0 else int(logits.argmax()))
        expected = [m.accept(t) for m, t in zip(single, token_ids, strict=True)]
        assert service.accept_batch(batched, token_ids) == expected
        num_refused += expected.count(False)
        assert [m.token_ids for m in batched] == [m.token_ids for m in single]
        assert [m.is_terminated for m in batched] == [m.is_terminated for m in single]
    assert 0 < num_refused < 24 * len(compiled)  # both answers were exercised
    fill_batch_bitmask(single, bitmask)
    other = service.allocate_bitmask(len(compiled))
    fill_batch_bitmask(batched, other)
    assert torch.equal(bitmask, other)
    with pytest.raises(InvalidArgument, match="2 matchers for 1 tokens"):
        accept_batch(batched[:2], [1])
