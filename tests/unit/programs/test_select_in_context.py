"""Select tokenizes each choice as the tokenizer writes it after the context
(gateway/programs/core/scoring.py, Boundary): the scoring request is the context's tokens
that encode(context text + choice) agrees with, then the rest of that encoding, scored
from where they part. The chosen choice's scored tokens are what the context continues
with, and the statement after the select finds them cached."""

from __future__ import annotations

import math

import pytest
import structlog
import torch
import transformers

from gateway.programs import convert
from gateway.programs.core import events as ev
from gateway.programs.core import scoring
from gateway.programs.core.context import start_tokens
from gateway.programs.core.runtime import ProgramRun
from gateway.programs.core.scoring import Boundary, InContext
from tests.unit.programs.builders import compile_program, gen, program, select, text

PAGE_SIZE = 4  # the engine fixture's
PREFIX = "Find the answer to the question.\nQuestion: where is my parcel?\nAnswer: "
# each choice's first word merges with the trailing space (" find", " ask") or not ("escalate")
CHOICES = ["find the parcel and refund the order", "ask the carrier where it is", "escalate to a human agent"]


def tokens_of(tokenizer, *texts: str) -> list[int]:
    """A context as the runtime builds it: the start tokens, then each text encoded alone."""
    return start_tokens(tokenizer) + [t for s in texts for t in tokenizer.encode_text(s)]


def joint(tokenizer, context_text: str, choice: str) -> list[int]:
    return start_tokens(tokenizer) + tokenizer.encode_text(context_text + choice)


def agreeing(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


# --- the boundary alone --------------------------------------------------------------------


def test_a_first_word_takes_the_contexts_trailing_space(tokenizer):
    context = tokens_of(tokenizer, PREFIX)
    placed = Boundary(tokenizer, context).choice("find")
    assert placed == InContext(len(context) - 1, (tokenizer.encode_text(" find")[0],))
    assert len(tokenizer.encode_text("find")) == 2  # alone it is "f", "ind"
    assert context[: placed.keep] + list(placed.token_ids) == joint(tokenizer, PREFIX, "find")


def test_a_choice_the_boundary_swallows_is_scored_from_the_merged_token(tokenizer):
    context = tokens_of(tokenizer, "The best is num")
    placed = Boundary(tokenizer, context).choice("ber")
    # "ber" has no token of its own: " number" starts inside the context's " num"
    assert placed.keep == len(context) - 1 and len(placed.token_ids) == 1
    assert tokenizer.decode(placed.token_ids) == " number"


def test_a_choice_that_does_not_merge_keeps_every_context_token(tokenizer):
    context = tokens_of(tokenizer, PREFIX)
    placed = Boundary(tokenizer, context).choice("escalate")
    assert placed == InContext(len(context), tuple(tokenizer.encode_text("escalate")))


def test_special_tokens_in_the_window_round_trip(tokenizer):
    context = tokens_of(tokenizer, "<|user|>\nRoute it.<|eos|>\n<|assistant|>\n", "Answer: ")
    placed = Boundary(tokenizer, context).choice("find")
    assert context[: placed.keep] + list(placed.token_ids) == joint(
        tokenizer, "<|user|>\nRoute it.<|eos|>\n<|assistant|>\nAnswer: ", "find"
    )
    after_marker = tokens_of(tokenizer, "<|user|>\nRoute it.<|eos|>\n<|assistant|>")
    placed = Boundary(tokenizer, after_marker).choice("<|eos|>")
    assert placed == InContext(len(after_marker), (tokenizer.eos_token_ids[0],))


def test_a_context_of_only_the_start_tokens_begins_the_choices_text(tokenizer):
    head = start_tokens(tokenizer)
    assert len(head) == 1
    placed = Boundary(tokenizer, head).choice("find")
    assert placed == InContext(1, tuple(tokenizer.encode_text("find")))
    assert list(placed.token_ids) == tokenizer.encode_prompt("find")[1:]


class NoStartTokens:
    """The tiny tokenizer without its BOS."""

    def __init__(self, tokenizer) -> None:
        self._t = tokenizer
        self.name = "no-start"

    def encode_prompt(self, text: str) -> list[int]:
        return self._t.encode_text(text)

    def __getattr__(self, name):
        return getattr(self._t, name)


class NoRoundTrip(NoStartTokens):
    """Decodes to text that does not encode back to the tokens."""

    def __init__(self, tokenizer, name: str) -> None:
        super().__init__(tokenizer)
        self.name = name

    def decode(self, token_ids, skip_special_tokens=True) -> str:
        return self._t.decode(token_ids, skip_special_tokens).upper() + "\u00a7"


def test_a_one_token_context_the_choice_would_rewrite_keeps_its_token(tokenizer):
    bare = NoStartTokens(tokenizer)
    scoring._warned.clear()
    context = tokenizer.encode_text(" num")
    assert len(context) == 1
    # in context " number" would replace the only token, leaving nothing to score after
    with structlog.testing.capture_logs() as logs:
        placed = Boundary(bare, context).choice("ber")
    assert placed == InContext(1, tuple(tokenizer.encode_text("ber")), alone=True)
    assert [(e["event"], e["reason"]) for e in logs] == [
        ("select_choice_tokenized_alone", "in context the choice would rewrite the context's only token")
    ]


def test_a_tokenizer_without_a_round_trip_scores_choices_alone_and_says_so_once(tokenizer):
    odd = NoRoundTrip(tokenizer, name=f"odd-{id(tokenizer)}")
    scoring._warned.clear()
    context = tokens_of(tokenizer, PREFIX)
    with structlog.testing.capture_logs() as logs:
        first = [Boundary(odd, context).choice(c) for c in ("find", "ask")]
        again = Boundary(odd, context).choice("find")
    assert first[0] == again == InContext(len(context), tuple(tokenizer.encode_text("find")), alone=True)
    assert first[1].alone
    lines = [e for e in logs if e["event"] == "select_choice_tokenized_alone"]
    assert len(lines) == 1 and lines[0]["model"] == odd.name
    assert lines[0]["reason"] == "the context's last tokens do not encode back from their text"


# --- through the runtime and the engine ----------------------------------------------------


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir):
    return transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


async def run_select(deps, name: str):
    message = program(text(PREFIX), select("answer", CHOICES), gen("after", max_tokens=4))
    events = [e async for e in ProgramRun(compile_program(message), {}, deps, name).events()]
    result = events[-1]
    assert isinstance(result, ev.ProgramResult)
    return next(e for e in events if isinstance(e, ev.SelectScores)), result


async def test_scores_are_the_models_logprobs_of_the_choice_encoded_with_the_context(
    deps, backend, tokenizer, hf_model
):
    scores, _ = await run_select(deps, "ic")
    context = tokens_of(tokenizer, PREFIX)
    requests = [r for r in backend.requests if r.sampling.max_tokens == 0]
    assert len(requests) == len(CHOICES)
    keeps = []
    for choice, score, request in zip(CHOICES, scores.scores, requests, strict=True):
        ids = joint(tokenizer, PREFIX, choice)
        keep = agreeing(ids, context)
        keeps.append(keep)
        # the scoring request is exactly what a client sending context + choice as text sends
        assert list(request.prompt_token_ids) == ids
        assert request.sampling.prompt_logprobs_start == keep
        with torch.no_grad():
            logprobs = torch.log_softmax(hf_model(torch.tensor([ids])).logits[0].float(), dim=-1)
        expected = [logprobs[p - 1, ids[p]].item() for p in range(keep, len(ids))]
        total = sum(expected)
        assert score.num_tokens == len(ids) - keep
        # the per-token logprobs reported are those of the in-context tokens
        assert [t.token_id for t in score.tokens] == ids[keep:]
        assert [t.text for t in score.tokens] == [tokenizer.token_text(i) for i in ids[keep:]]
        for reported, model_logprob in zip(score.tokens, expected, strict=True):
            assert math.isclose(reported.logprob, model_logprob, abs_tol=2e-3)
        assert math.isclose(score.logprob_sum, total, abs_tol=2e-3), (choice, score, total)
        assert math.isclose(score.score, total / score.num_tokens, abs_tol=2e-3)
    # the first two choices take the context's trailing space, the third keeps it
    assert keeps == [len(context) - 1, len(context) - 1, len(context)]
    assert scores.scores[0].tokens[0].text == " find"
    wire = convert.event_to_proto(scores).select.scores[0]
    assert [(t.token_id, t.token) for t in wire.tokens] == [(t.token_id, t.text) for t in scores.scores[0].tokens]
    assert math.isclose(wire.tokens[0].logprob, scores.scores[0].tokens[0].logprob, rel_tol=1e-6)


async def test_the_chosen_tokens_continue_the_context_and_the_next_statement_reads_them_cached(
    deps, backend, tokenizer
):
    scores, result = await run_select(deps, "next")
    chosen = result.variables["answer"]
    scoring_requests = [r for r in backend.requests if r.sampling.max_tokens == 0]
    scored = next(
        r for r, c in zip(scoring_requests, CHOICES, strict=True) if c == chosen
    ).prompt_token_ids
    after = next(r for r in backend.requests if r.sampling.max_tokens == 4)
    # the Gen continues with the tokens the choice was scored on, not the choice alone
    assert after.prompt_token_ids == scored
    assert list(after.prompt_token_ids) == joint(tokenizer, PREFIX, chosen)
    usage = next(u.usage for u in result.usage if u.statement.endswith(".gen"))
    num_choice_tokens = next(s.num_tokens for s in scores.scores if s.choice == chosen)
    # the scoring request's KV is reused, the choice's tokens included: all of the prompt
    # but its last position, which the Gen computes for its first token's logits
    assert num_choice_tokens > 1
    assert usage.cached_tokens == len(scored) - 1


async def test_after_a_held_gen_the_choice_rewrites_the_unheld_space_and_is_read_cached(deps, backend):
    message = program(
        text("Question: where is my parcel?\n"),
        gen("note", max_tokens=3, ignore_eos=True),
        text("\nAnswer: "),
        select("answer", CHOICES),
        gen("after", max_tokens=4),
    )
    events = [e async for e in ProgramRun(compile_program(message), {}, deps, "held").events()]
    result = events[-1]
    assert isinstance(result, ev.ProgramResult)
    note = next(r for r in backend.requests if r.sampling.max_tokens == 3)
    tokenizer = deps.models.resolve("")[1]
    # the held prompt, the 3 tokens generated, then the appended text (not held yet)
    num_context = len(note.prompt_token_ids) + 3 + len(tokenizer.encode_text("\nAnswer: "))
    scoring_requests = [r for r in backend.requests if r.sampling.max_tokens == 0]
    # " find" takes the space's place, "escalate" keeps it
    assert [r.sampling.prompt_logprobs_start for r in scoring_requests] == [num_context - 1] * 2 + [num_context]
    chosen = CHOICES.index(result.variables["answer"])
    scored = scoring_requests[chosen].prompt_token_ids
    after = next(r for r in backend.requests if r.sampling.max_tokens == 4)
    assert after.prompt_token_ids == scored
    usage = next(u.usage for u in result.usage if u.statement == "body[4].gen")
    assert usage.cached_tokens == len(scored) - 1
