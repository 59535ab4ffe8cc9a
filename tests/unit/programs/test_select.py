"""Select: each choice's score equals the log-probability sum the model itself gives its
tokens after the context (transformers on the same weights), for every method. The
choice's tokens are those of the context's text and the choice's encoded together, after
the context's tokens they agree with: after a trailing space ("Route: ") a choice's first
word takes the space into its first token, which replaces the context's last one."""

from __future__ import annotations

import math

import pytest
import torch
import transformers

from gateway.programs.core import events as ev
from gateway.programs.core.context import start_tokens
from gateway.programs.core.runtime import ProgramRun
from radixmesh.v1 import program_pb2 as pb
from tests.unit.programs.builders import compile_program, gen, program, ret, select, text

CHOICES = ["retrieve", "chat", "escalate to a human"]
HEADER = "<|user|>\nRoute this request: my parcel is late.<|eos|>\n<|assistant|>\n"
# after the assistant's marker alone, and after text ending in a space the choices merge with
LEADS = ["", "Route: "]


@pytest.fixture(params=LEADS, ids=["newline", "space"])
def lead(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir):
    return transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def logprob_sum(model, context: list[int], choice: list[int]) -> tuple[float, int]:
    """Sum of the choice's token logprobs after context, and how many of its leading tokens
    are the argmax."""
    ids = torch.tensor([context + choice])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    total, greedy, following = 0.0, 0, True
    for j, token in enumerate(choice):
        row = logprobs[len(context) + j - 1]
        total += row[token].item()
        following = following and int(row.argmax()) == token
        greedy += following
    return total, greedy


async def scores_of(deps, method: int, lead: str = "") -> tuple[ev.SelectScores, ev.ProgramResult]:
    message = program(
        text("Route this request: my parcel is late.", "user"),
        text("", "assistant", pb.ROLE_PART_BEGIN),
        *([text(lead)] if lead else []),
        select("route", CHOICES, method),
        gen("after", max_tokens=3),
        ret(var="route"),
    )
    events = [e async for e in ProgramRun(compile_program(message), {}, deps, "s").events()]
    return next(e for e in events if isinstance(e, ev.SelectScores)), events[-1]


def context_tokens(tokenizer, lead: str = "") -> list[int]:
    """The program's context as the runtime builds it: each appended text encoded alone."""
    return start_tokens(tokenizer) + tokenizer.encode_text(HEADER) + tokenizer.encode_text(lead)


def in_context(tokenizer, lead: str, choice: str) -> tuple[list[int], list[int]]:
    """encode(context text + choice) split where it parts from the context's tokens: the
    context's tokens kept, and the choice's tokens in context."""
    joint = start_tokens(tokenizer) + tokenizer.encode_text(HEADER + lead + choice)
    context = context_tokens(tokenizer, lead)
    keep = 0
    while keep < len(context) and joint[keep] == context[keep]:
        keep += 1
    return joint[:keep], joint[keep:]


def test_the_space_lead_merges_a_choices_first_word_with_the_space(tokenizer):
    """What the space lead tests: the context's last token (the space) is rewritten."""
    context = context_tokens(tokenizer, "Route: ")
    kept, ids = in_context(tokenizer, "Route: ", "retrieve")
    assert len(kept) == len(context) - 1 and ids != tokenizer.encode_text("retrieve")
    assert in_context(tokenizer, "", "retrieve") == (context_tokens(tokenizer), tokenizer.encode_text("retrieve"))


async def test_token_length_normalized_scores_equal_the_models_logprob_sums(deps, tokenizer, hf_model, lead):
    scored, result = await scores_of(deps, pb.SELECT_METHOD_TOKEN_LENGTH_NORMALIZED, lead)
    means = []
    for score, choice in zip(scored.scores, CHOICES, strict=True):
        context, ids = in_context(tokenizer, lead, choice)
        total, _ = logprob_sum(hf_model, context, ids)
        assert score.choice == choice and score.num_tokens == len(ids)
        assert math.isclose(score.logprob_sum, total, abs_tol=2e-3)
        assert math.isclose(score.score, total / len(ids), abs_tol=2e-3)
        means.append(total / len(ids))
    assert result.value == CHOICES[means.index(max(means))]


async def test_greedy_token_scores_count_the_tokens_greedy_decoding_follows(deps, tokenizer, hf_model, lead):
    scored, _ = await scores_of(deps, pb.SELECT_METHOD_GREEDY_TOKEN, lead)
    for score, choice in zip(scored.scores, CHOICES, strict=True):
        _, following = logprob_sum(hf_model, *in_context(tokenizer, lead, choice))
        assert score.score == following


async def test_unconditional_normalized_scores_subtract_the_choice_without_context(
    deps, tokenizer, hf_model, lead
):
    scored, _ = await scores_of(deps, pb.SELECT_METHOD_UNCONDITIONAL_LIKELIHOOD_NORMALIZED, lead)
    head = start_tokens(tokenizer)
    for score, choice in zip(scored.scores, CHOICES, strict=True):
        conditional, _ = logprob_sum(hf_model, *in_context(tokenizer, lead, choice))
        # after the start tokens alone the choice begins a text: its tokens are its own
        plain, _ = logprob_sum(hf_model, head, tokenizer.encode_text(choice))
        assert math.isclose(score.score, conditional - plain, abs_tol=4e-3)


async def test_the_chosen_text_continues_the_context(deps, engine, tokenizer, lead):
    _, result = await scores_of(deps, pb.SELECT_METHOD_TOKEN_LENGTH_NORMALIZED, lead)
    kept, ids = in_context(tokenizer, lead, result.value)
    prompt = kept + ids
    from radixmesh.sampling import SamplingParams

    done = await engine.complete(prompt, SamplingParams(max_tokens=3, temperature=0.0))
    assert result.variables["after"] == tokenizer.decode(done.token_ids)
