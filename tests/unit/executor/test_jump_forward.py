"""Jump-forward in the executor core: the tokens a constraint forces are verified as a draft.

Real compiled constraints (JSON Schema, regex, choices) on the tiny model's tokenizer:
outputs are token- and text-identical with jump-forward on and off (greedy and seeded),
forced tokens are always kept and counted, each one saves a forward pass, and the
sequence's position stays exactly past its tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from mesh.tiny_model import write_tiny_model
from radixmesh.sampling import Constraint, ConstraintKind, SamplingParams
from radixmesh.step import NewSequence, RunningSequence, SequenceOutput, StepPlan
from services.executor.core.config import ExecutorConfig
from services.executor.core.executor import ExecutorCore
from services.executor.core.grammar import GrammarConfig, GrammarService, SequenceGrammar
from services.executor.core.spec import SpeculativeConfig
from services.executor.core.spec.forced import ForcedTokens, single_allowed

PAGE_SIZE = 4
PAGES_PER_SEQ = 40  # 160 positions a sequence
MAX_FORCED = 8
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "kind": {"enum": ["administrator", "user", "guest"]},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "active": {"type": "boolean"},
    },
    "required": ["name", "kind", "age", "active"],
}
CONSTRAINTS = {
    "json_schema": Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(SCHEMA)),
    "regex": Constraint(ConstraintKind.REGEX, r"(station|stadium)-[0-9]{2}-(northbound|south)"),
    "choices": Constraint(
        ConstraintKind.CHOICES, choices=("alpha centauri", "alpha draconis", "beta pictoris")
    ),
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny-jump"), arch="llama", seed=0)


@pytest.fixture(scope="module")
def grammar(model_dir: Path):
    service = GrammarService.from_model_dir(model_dir, config=GrammarConfig(compile_timeout_s=60))
    yield service
    service.close(wait=True)


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path):
    return AutoTokenizer.from_pretrained(model_dir)


class Counted:
    """An executor core with its forward passes counted."""

    def __init__(self, model_dir: Path, grammar, **speculative) -> None:
        speculative.setdefault("jump_forward", True)  # asked for: its default is off for now
        config = ExecutorConfig(
            model_path=str(model_dir), device="cpu", page_size=PAGE_SIZE, num_pages=1024,
            max_num_seqs=16, speculative=SpeculativeConfig(**speculative),
        )  # fmt: skip
        self.core = ExecutorCore(config, grammar)
        self.num_forwards = 0
        forward = self.core.model.forward

        def counting(*args, **kwargs):
            self.num_forwards += 1
            return forward(*args, **kwargs)

        self.core.model.forward = counting


def generate(
    counted: Counted,
    prompts: list[list[int]],
    sampling: list[SamplingParams],
    constraint: Constraint,
    num_draft_tokens: int,
) -> tuple[list[list[int]], list[str], list[SequenceOutput]]:
    """Every prompt to its end, decoding together (as the scheduler plans them, with
    `num_draft_tokens` per decode); each output's tokens and finish reason, every output.
    Checks after each step that every live sequence's position is just past its tokens."""
    core = counted.core
    ids = [f"r{i}" for i in range(len(prompts))]
    news = [
        NewSequence(
            rid, p, len(p), 0, len(p),
            list(range(i * PAGES_PER_SEQ, (i + 1) * PAGES_PER_SEQ)), s, constraint,
        )
        for i, (rid, p, s) in enumerate(zip(ids, prompts, sampling, strict=True))
    ]  # fmt: skip
    tokens: dict[str, list[int]] = {rid: [] for rid in ids}
    reasons: dict[str, str] = {}
    outputs: list[SequenceOutput] = []
    plan = StepPlan(1, new_seqs=news)
    live = set(ids)
    while live:
        for out in core.step(plan).outputs:
            outputs.append(out)
            if out.token_id is not None:
                tokens[out.req_id] += [*out.accepted_token_ids, out.token_id]
            if out.finish_reason is not None:
                reasons[out.req_id] = out.finish_reason
                live.discard(out.req_id)
        for rid in live:
            seq = core._seqs[rid]
            assert seq.num_known_tokens == len(seq.token_ids)
            assert seq.num_computed_tokens == len(seq.token_ids) - 1  # the last is not fed
            assert seq.token_ids[seq.num_prompt_tokens :] == tokens[rid]
        running = [RunningSequence(r, 1, [], num_draft_tokens) for r in sorted(live)]
        plan = StepPlan(plan.step_id + 1, running_seqs=running)
    return [tokens[r] for r in ids], [reasons[r] for r in ids], outputs


def prompts(n: int) -> list[list[int]]:
    return [[10 + (7 * i + 13 * j) % 900 for i in range(6 + j)] for j in range(n)]


def forced_positions(grammar: GrammarService, constraint: Constraint, tokens: list[int]) -> int:
    """Output positions at which the grammar allowed exactly one token (replayed)."""
    matcher = grammar.new_matcher(grammar.compile_sync(constraint))
    row = grammar.allocate_bitmask(1)
    count = 0
    for token_id in tokens:
        matcher.fill_bitmask(row, 0)
        count += single_allowed(row[0], grammar.vocab_size) == token_id
        assert matcher.accept(token_id)
    return count


@pytest.mark.parametrize("kind", list(CONSTRAINTS))
def test_greedy_outputs_are_identical_and_each_forced_token_saves_a_forward(
    model_dir, grammar, tokenizer, kind
):
    constraint = CONSTRAINTS[kind]
    work = prompts(2)
    sampling = [SamplingParams(temperature=0.0, max_tokens=60)] * len(work)
    off = Counted(model_dir, grammar, jump_forward=False)
    on = Counted(model_dir, grammar, jump_forward=True, max_forced_tokens=MAX_FORCED)
    try:
        expected, expected_reasons, _ = generate(off, work, sampling, constraint, MAX_FORCED)
        got, reasons, outputs = generate(on, work, sampling, constraint, MAX_FORCED)
        stats = on.core.spec_stats.snapshot()
    finally:
        off.core.shutdown()
        on.core.shutdown()
    assert got == expected and reasons == expected_reasons
    assert [tokenizer.decode(t) for t in got] == [tokenizer.decode(t) for t in expected]
    assert "stop" in reasons  # a complete output, not only length
    # every forced token is kept, and each is one the grammar alone chose
    assert stats.num_forced_tokens == sum(o.num_forced_tokens for o in outputs) > 0
    assert stats.num_forced_tokens == stats.num_accepted_tokens == stats.num_draft_tokens
    assert all(o.num_forced_tokens == len(o.accepted_token_ids) for o in outputs)
    replayed = sum(forced_positions(grammar, constraint, t) for t in got)
    assert stats.num_forced_tokens <= replayed
    # the sequences decode together: a step's forward serves all of them, so the forwards
    # saved are at least the forced tokens of the sequence that ran longest in steps
    assert on.num_forwards < off.num_forwards


def test_one_sequence_saves_exactly_one_forward_per_forced_token(model_dir, grammar):
    constraint = CONSTRAINTS["json_schema"]
    work, sampling = prompts(1), [SamplingParams(temperature=0.0, max_tokens=60)]
    off = Counted(model_dir, grammar, jump_forward=False)
    on = Counted(model_dir, grammar, max_forced_tokens=MAX_FORCED)
    try:
        expected, _, _ = generate(off, work, sampling, constraint, MAX_FORCED)
        got, _, _ = generate(on, work, sampling, constraint, MAX_FORCED)
        forced = on.core.spec_stats.snapshot().num_forced_tokens
    finally:
        off.core.shutdown()
        on.core.shutdown()
    assert got == expected
    assert forced > 0
    assert off.num_forwards - on.num_forwards == forced


@pytest.mark.parametrize("kind", list(CONSTRAINTS))
def test_seeded_sampling_is_identical(model_dir, grammar, kind):
    constraint = CONSTRAINTS[kind]
    work = prompts(3)
    sampling = [
        SamplingParams(temperature=1.0, top_p=0.95, seed=40 + i, max_tokens=40)
        for i in range(len(work))
    ]
    off = Counted(model_dir, grammar, jump_forward=False)
    on = Counted(model_dir, grammar, max_forced_tokens=MAX_FORCED)
    try:
        expected, expected_reasons, _ = generate(off, work, sampling, constraint, MAX_FORCED)
        got, reasons, _ = generate(on, work, sampling, constraint, MAX_FORCED)
        forced = on.core.spec_stats.snapshot().num_forced_tokens
    finally:
        off.core.shutdown()
        on.core.shutdown()
    assert got == expected and reasons == expected_reasons
    assert forced > 0


def test_forced_tokens_come_first_then_the_proposers_draft(model_dir, grammar):
    """ngram speculation beside jump-forward: same output as neither, a draft may hold
    forced tokens and the proposer's guess after them, and only the guess is ever refused."""
    constraint = CONSTRAINTS["json_schema"]
    work = prompts(3)
    sampling = [SamplingParams(temperature=0.0, max_tokens=60)] * len(work)
    off = Counted(model_dir, grammar, jump_forward=False)
    both = Counted(
        model_dir, grammar, method="ngram", max_batch_size=16, max_draft_tokens=4,
        max_forced_tokens=MAX_FORCED, min_match_len=1,
    )  # fmt: skip
    try:
        expected, _, _ = generate(off, work, sampling, constraint, 0)
        got, _, outputs = generate(both, work, sampling, constraint, MAX_FORCED)
        stats = both.core.spec_stats.snapshot()
    finally:
        off.core.shutdown()
        both.core.shutdown()
    assert got == expected
    assert stats.num_forced_tokens > 0
    assert stats.num_draft_tokens > stats.num_forced_tokens  # the proposer drafted too
    assert all(o.num_forced_tokens <= len(o.accepted_token_ids) for o in outputs)
    assert any(o.num_draft_tokens > o.num_forced_tokens > 0 for o in outputs)


def test_jump_forward_drafts_at_a_batch_size_where_speculation_is_off(model_dir, grammar):
    constraint = CONSTRAINTS["regex"]
    work = prompts(4)
    sampling = [SamplingParams(temperature=0.0, max_tokens=40)] * len(work)
    counted = Counted(
        model_dir, grammar, method="ngram", max_batch_size=2, max_forced_tokens=MAX_FORCED
    )
    try:
        generate(counted, work, sampling, constraint, MAX_FORCED)
        stats = counted.core.spec_stats.snapshot()
    finally:
        counted.core.shutdown()
    assert stats.num_forced_tokens > 0
    assert stats.num_draft_tokens == stats.num_forced_tokens  # no ngram draft above 2 decodes


def test_no_draft_tokens_planned_means_no_jump(model_dir, grammar):
    counted = Counted(model_dir, grammar, max_forced_tokens=MAX_FORCED)
    sampling = [SamplingParams(temperature=0.0, max_tokens=40)]
    try:
        _, _, outputs = generate(counted, prompts(1), sampling, CONSTRAINTS["regex"], 0)
    finally:
        counted.core.shutdown()
    assert all(o.num_draft_tokens == 0 for o in outputs)
    assert counted.core.spec_stats.snapshot().num_drafts == 0


def test_the_executor_info_states_jump_forward(model_dir, grammar):
    on = Counted(model_dir, grammar, max_forced_tokens=5)
    off = Counted(model_dir, grammar, jump_forward=False)
    no_grammar = Counted(model_dir, None)
    try:
        assert on.core.info.max_forced_tokens == 5
        assert off.core.info.max_forced_tokens == 0
        assert no_grammar.core.info.max_forced_tokens == 0  # constraints are refused there
        assert on.core.info.max_draft_tokens == 0  # speculation itself stays off
    finally:
        for counted in (on, off, no_grammar):
            counted.core.shutdown()


def test_forced_run_leaves_the_matcher_where_it_was(grammar, tokenizer):
    compiled = grammar.compile_sync(CONSTRAINTS["choices"])
    matcher = grammar.new_matcher(compiled)
    seq_grammar = SequenceGrammar(matcher, 0, (2,))
    forced = ForcedTokens(grammar.vocab_size, 32)
    assert forced.propose(seq_grammar, 32) == []  # "alpha ..." or "beta ...": none forced
    (first,) = tokenizer.encode("al", add_special_tokens=False)
    seq_grammar.pending_token = first  # sampled last, not accepted yet
    run = forced.propose(seq_grammar, 32)
    assert seq_grammar.pending_token is None and matcher.token_ids == (first,)
    assert tokenizer.decode(run) == "pha"  # then " centauri" or " draconis"
    assert forced.propose(seq_grammar, 2) == run[:2]  # capped, from the same state
    assert matcher.token_ids == (first,)


def test_a_stop_token_is_never_forced(grammar, tokenizer):
    """After a complete output only the stop token fits, and the token sampled after the
    draft takes it in the same step: a run ends before it."""
    compiled = grammar.compile_sync(Constraint(ConstraintKind.CHOICES, choices=("yes",)))
    matcher = grammar.new_matcher(compiled)
    seq_grammar = SequenceGrammar(matcher, 0, compiled.stop_token_ids)
    for token_id in tokenizer.encode("yes", add_special_tokens=False):
        assert matcher.accept(token_id)
    forced = ForcedTokens(grammar.vocab_size, 32)
    row = grammar.allocate_bitmask(1)
    matcher.fill_bitmask(row, 0)
    assert single_allowed(row[0], grammar.vocab_size) in compiled.stop_token_ids
    assert forced.propose(seq_grammar, 32) == []


def test_a_refused_pending_token_stays_pending(grammar, tokenizer):
    matcher = grammar.new_matcher(grammar.compile_sync(CONSTRAINTS["choices"]))
    seq_grammar = SequenceGrammar(matcher, 0, (2,))
    (wrong,) = tokenizer.encode("z", add_special_tokens=False)
    seq_grammar.pending_token = wrong
    assert ForcedTokens(grammar.vocab_size, 8).propose(seq_grammar, 8) == []
    assert seq_grammar.pending_token == wrong and matcher.token_ids == ()


def test_single_allowed_reads_one_bit_only():
    tensor = torch.zeros(4, dtype=torch.int32)
    assert single_allowed(tensor, 128) is None
    tensor[2] = 1 << 5
    assert single_allowed(tensor, 128) == 69
    tensor[3] = -(1 << 31)  # bit 31 of the last word: token 127
    assert single_allowed(tensor, 128) is None  # two words
    tensor[2] = 0
    assert single_allowed(tensor, 128) == 127
    assert single_allowed(tensor, 100) is None  # past the vocabulary
    tensor[3] = 3
    assert single_allowed(tensor, 128) is None  # two bits of one word
