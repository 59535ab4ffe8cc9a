"""The executor's grammar path with real compiled constraints on the tiny model's tokenizer.

Checks the per-step bitmask (filled beside the forward on CPU, one buffer reused across
steps) and that a finished grammar ends the sequence even while min_tokens holds EOS back.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from mesh.tiny_model import write_tiny_model
from radixmesh.sampling import Constraint, ConstraintKind, SamplingParams
from radixmesh.step import NewSequence, RunningSequence, StepPlan
from services.executor.core.config import ExecutorConfig
from services.executor.core.executor import ExecutorCore
from services.executor.core.grammar import (
    ConstraintMatcher,
    Grammar,
    GrammarConfig,
    GrammarService,
    accept_batch,
)

PAGES_PER_SEQ = 16  # page_size 4: 64 tokens per sequence
YES = Constraint(ConstraintKind.CHOICES, choices=("yes",))
DIGITS = Constraint(ConstraintKind.REGEX, "[0-9]{30}")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny-grammar"), arch="llama", seed=0)


@pytest.fixture(scope="module")
def grammar(model_dir: Path):
    service = GrammarService.from_model_dir(model_dir, config=GrammarConfig(compile_timeout_s=60))
    yield service
    service.close(wait=True)


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path):
    return AutoTokenizer.from_pretrained(model_dir)


def make_core(model_dir: Path, grammar: Grammar | None) -> ExecutorCore:
    config = ExecutorConfig(
        model_path=str(model_dir), device="cpu", page_size=4, num_pages=128, max_num_seqs=8
    )
    return ExecutorCore(config, grammar)


def new_seq(
    req_id: str,
    slot: int,
    prompt: list[int],
    sampling: SamplingParams,
    constraint: Constraint | None = None,
) -> NewSequence:
    pages = list(range(slot * PAGES_PER_SEQ, (slot + 1) * PAGES_PER_SEQ))
    return NewSequence(req_id, prompt, len(prompt), 0, len(prompt), pages, sampling, constraint)


def run(core: ExecutorCore, arrivals: dict[int, list[NewSequence]], max_steps: int = 80):
    """Steps the core as a scheduler would; arrivals: step_id -> sequences first sent then.

    Returns req_id -> (output token ids, finish reason).
    """
    running: list[str] = []
    outputs: dict[str, list[int]] = {}
    reasons: dict[str, str] = {}
    for step_id in range(1, max_steps + 1):
        new = arrivals.get(step_id, [])
        plan = StepPlan(step_id, list(new), [RunningSequence(r, 1) for r in running])
        running += [n.req_id for n in new]
        for out in core.step(plan).outputs:
            if out.token_id is not None:
                outputs.setdefault(out.req_id, []).append(out.token_id)
            if out.finish_reason is not None:
                reasons[out.req_id] = out.finish_reason
                running.remove(out.req_id)
        if not running and step_id >= max(arrivals):
            break
    return {r: (outputs.get(r, []), reasons.get(r)) for r in outputs.keys() | reasons.keys()}


def prompt(n: int, offset: int) -> list[int]:
    return [10 + (7 * i + offset) % 500 for i in range(n)]


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(max_tokens=30, min_tokens=20, temperature=0.0),
        SamplingParams(max_tokens=30, min_tokens=20, temperature=1.0, seed=3),
    ],
    ids=["greedy", "sampled"],
)
def test_a_finished_grammar_ends_the_sequence_despite_min_tokens(
    model_dir, grammar, tokenizer, sampling
):
    core = make_core(model_dir, grammar)
    try:
        result = run(core, {1: [new_seq("yes", 0, prompt(6, 0), sampling, YES)]})
    finally:
        core.shutdown()
    token_ids, reason = result["yes"]
    assert reason == "stop"
    assert token_ids[-1] in core.info.eos_token_ids  # the grammar's only choice at its end
    assert tokenizer.decode(token_ids[:-1]) == "yes"
    assert len(token_ids) < sampling.min_tokens


def test_min_tokens_still_holds_eos_back_where_the_grammar_allows_more(model_dir, grammar):
    """A grammar that may end or go on: min_tokens keeps it going, as without a grammar."""
    more = Constraint(ConstraintKind.REGEX, "[0-9]{1,40}")
    sampling = SamplingParams(max_tokens=40, min_tokens=12, temperature=0.0)
    core = make_core(model_dir, grammar)
    try:
        token_ids, reason = run(core, {1: [new_seq("n", 0, prompt(5, 3), sampling, more)]})["n"]
    finally:
        core.shutdown()
    assert len(token_ids) >= sampling.min_tokens
    assert reason in ("stop", "length")


def test_unconstrained_rows_stay_unmasked_when_a_constrained_rows_buffer_is_reused(
    model_dir, grammar, tokenizer
):
    """'yes' ends after a few steps; 'free' arrives later and samples in the row 'yes' filled,
    beside 'digits', still constrained. Its output is the one it has alone, ungrammared."""
    greedy = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    core = make_core(model_dir, grammar)
    try:
        result = run(
            core,
            {
                1: [
                    new_seq("yes", 0, prompt(6, 0), greedy, YES),
                    new_seq("digits", 1, prompt(7, 1), greedy, DIGITS),
                ],
                6: [new_seq("free", 2, prompt(8, 2), greedy)],
            },
        )
    finally:
        core.shutdown()
    alone_core = make_core(model_dir, None)
    try:
        alone = run(alone_core, {1: [new_seq("free", 0, prompt(8, 2), greedy)]})
    finally:
        alone_core.shutdown()
    assert result["yes"][1] == "stop" and len(result["yes"][0]) < 6  # ended before step 6
    assert result["digits"][1] == "length"
    assert tokenizer.decode(result["digits"][0]).isdigit()
    assert result["free"] == alone["free"]


def test_on_cpu_the_bitmask_is_filled_while_the_forward_runs(model_dir, grammar):
    """The forward waits for the fill to start: it only returns if the two run together."""
    fill_started = threading.Event()
    fill_threads: list[str] = []

    class Recording(ConstraintMatcher):
        __slots__ = ()

        def fill_bitmask(self, bitmask, row=0):
            fill_threads.append(threading.current_thread().name)
            fill_started.set()
            super().fill_bitmask(bitmask, row)

    class RecordingGrammar:
        def matcher_for(self, constraint: Constraint) -> Recording:
            return Recording(grammar.compile_sync(constraint))

        def accept_batch(self, matchers, token_ids):
            return accept_batch(matchers, token_ids)

    core = make_core(model_dir, RecordingGrammar())
    forward = core.model.forward

    def forward_beside_the_fill(*args, **kwargs):
        assert fill_started.wait(timeout=30), "the fill did not start beside the forward"
        fill_started.clear()
        return forward(*args, **kwargs)

    core.model.forward = forward_beside_the_fill
    sampling = SamplingParams(max_tokens=4, temperature=0.0)
    try:
        token_ids, reason = run(core, {1: [new_seq("d", 0, prompt(5, 4), sampling, DIGITS)]})["d"]
    finally:
        core.shutdown()
    assert (len(token_ids), reason) == (4, "length")
    assert len(fill_threads) == 4
    assert all(name.startswith("grammar-fill") for name in fill_threads)
