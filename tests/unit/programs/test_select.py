"""Select: each choice's score equals the log-probability sum the model itself gives its
tokens after the context (transformers on the same weights), for every method."""

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


async def scores_of(deps, method: int) -> tuple[ev.SelectScores, ev.ProgramResult]:
    message = program(
        text("Route this request: my parcel is late.", "user"),
        text("", "assistant", pb.ROLE_PART_BEGIN),
        select("route", CHOICES, method),
        gen("after", max_tokens=3),
        ret(var="route"),
    )
    events = [e async for e in ProgramRun(compile_program(message), {}, deps, "s").events()]
    return next(e for e in events if isinstance(e, ev.SelectScores)), events[-1]


def context_tokens(tokenizer) -> list[int]:
    return start_tokens(tokenizer) + tokenizer.encode_text(
        "<|user|>\nRoute this request: my parcel is late.<|eos|>\n<|assistant|>\n"
    )


async def test_token_length_normalized_scores_equal_the_models_logprob_sums(deps, tokenizer, hf_model):
    scored, result = await scores_of(deps, pb.SELECT_METHOD_TOKEN_LENGTH_NORMALIZED)
    context = context_tokens(tokenizer)
    means = []
    for score, choice in zip(scored.scores, CHOICES, strict=True):
        ids = tokenizer.encode_text(choice)
        total, _ = logprob_sum(hf_model, context, ids)
        assert score.choice == choice and score.num_tokens == len(ids)
        assert math.isclose(score.logprob_sum, total, abs_tol=2e-3)
        assert math.isclose(score.score, total / len(ids), abs_tol=2e-3)
        means.append(total / len(ids))
    assert result.value == CHOICES[means.index(max(means))]


async def test_greedy_token_scores_count_the_tokens_greedy_decoding_follows(deps, tokenizer, hf_model):
    scored, _ = await scores_of(deps, pb.SELECT_METHOD_GREEDY_TOKEN)
    context = context_tokens(tokenizer)
    for score, choice in zip(scored.scores, CHOICES, strict=True):
        _, following = logprob_sum(hf_model, context, tokenizer.encode_text(choice))
        assert score.score == following


async def test_unconditional_normalized_scores_subtract_the_choice_without_context(
    deps, tokenizer, hf_model
):
    scored, _ = await scores_of(deps, pb.SELECT_METHOD_UNCONDITIONAL_LIKELIHOOD_NORMALIZED)
    context, head = context_tokens(tokenizer), start_tokens(tokenizer)
    for score, choice in zip(scored.scores, CHOICES, strict=True):
        ids = tokenizer.encode_text(choice)
        conditional, _ = logprob_sum(hf_model, context, ids)
        plain, _ = logprob_sum(hf_model, head, ids)
        assert math.isclose(score.score, conditional - plain, abs_tol=4e-3)


async def test_the_chosen_text_continues_the_context(deps, engine, tokenizer):
    _, result = await scores_of(deps, pb.SELECT_METHOD_TOKEN_LENGTH_NORMALIZED)
    prompt = context_tokens(tokenizer) + tokenizer.encode_text(result.value)
    from radixmesh.sampling import SamplingParams

    done = await engine.complete(prompt, SamplingParams(max_tokens=3, temperature=0.0))
    assert result.variables["after"] == tokenizer.decode(done.token_ids)
