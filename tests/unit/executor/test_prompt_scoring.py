"""Prompt log probabilities from the executor: equal to log_softmax of a full forward."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import transformers

from radixmesh.sampling import SamplingParams
from radixmesh.step import NewSequence, RunningSequence, StepPlan
from services.executor.core.config import ExecutorConfig
from services.executor.core.executor import ExecutorCore
from tests.fixtures.tiny_llama import write_tiny_llama


@dataclass(slots=True)
class TinyModel:
    hf: transformers.LlamaForCausalLM
    path: Path


@pytest.fixture(scope="module")
def llama_model(tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    path = tmp_path_factory.mktemp("scoring-llama")
    return TinyModel(write_tiny_llama(path), path)


@pytest.fixture(scope="module")
def core(llama_model: TinyModel):
    config = ExecutorConfig(
        model_path=str(llama_model.path), device="cpu", page_size=4, num_pages=64
    )
    core = ExecutorCore(config)
    yield core
    core.shutdown()


def greedy(max_tokens: int | None, **fields) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, **fields)


def random_prompt(length: int, seed: int) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, 256, (length,), generator=generator).tolist()


def new_seq(
    req_id: str,
    token_ids: list[int],
    *,
    sampling: SamplingParams,
    page_ids: list[int] | None = None,
    num_computed_tokens: int = 0,
    num_scheduled_tokens: int | None = None,
) -> NewSequence:
    return NewSequence(
        req_id=req_id,
        token_ids=token_ids,
        num_prompt_tokens=len(token_ids),
        num_computed_tokens=num_computed_tokens,
        num_scheduled_tokens=(
            len(token_ids) - num_computed_tokens
            if num_scheduled_tokens is None
            else num_scheduled_tokens
        ),
        page_ids=list(range(8)) if page_ids is None else page_ids,
        sampling=sampling,
    )


def reference(model: TinyModel, prompt: list[int], start: int, top: int = 0):
    """(token_id, logprob, top ids) of every prompt position >= start, from transformers."""
    with torch.no_grad():
        logits = model.hf(torch.tensor([prompt])).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    out = []
    for p in range(start, len(prompt)):
        row = logprobs[p - 1]
        out.append((prompt[p], row[prompt[p]].item(), row.topk(top).indices.tolist() if top else []))
    return out


def check(entries, expected) -> None:
    assert [e.token_id for e in entries] == [t for t, _, _ in expected]
    for entry, (_, logprob, top_ids) in zip(entries, expected, strict=True):
        assert entry.logprob == pytest.approx(logprob, abs=2e-4)
        assert [t for t, _ in entry.top] == top_ids


@pytest.mark.parametrize("start", [1, 5, 13])
def test_prompt_logprobs_of_a_whole_prefill_equal_a_full_forward(core, llama_model, start):
    prompt = random_prompt(14, seed=start)
    sampling = greedy(max_tokens=1, prompt_logprobs_start=start, top_logprobs=3)
    result = core.step(StepPlan(1, [new_seq(f"p{start}", prompt, sampling=sampling)]))
    (out,) = result.outputs
    assert out.token_id is not None and out.finish_reason == "length"
    assert out.prompt_logprobs_position == start
    check(out.prompt_logprobs, reference(llama_model, prompt, start, top=3))


def test_prompt_logprobs_over_a_cached_prefix_and_across_chunks(core, llama_model):
    """An extend over 8 cached tokens, in two chunks: the positions each chunk computes."""
    prompt = random_prompt(17, seed=7)
    warm = greedy(max_tokens=1)
    core.step(StepPlan(1, [new_seq("ctx", prompt[:9], page_ids=[10, 11, 12], sampling=warm)]))
    core.step(StepPlan(2, finished_req_ids=["ctx"]))
    sampling = greedy(max_tokens=0, prompt_logprobs_start=9)
    first = new_seq(
        "ext", prompt, num_scheduled_tokens=4, num_computed_tokens=8,
        page_ids=[10, 11, 20, 21, 22], sampling=sampling,
    )  # fmt: skip
    (a,) = core.step(StepPlan(3, [first])).outputs
    (b,) = core.step(StepPlan(4, running_seqs=[RunningSequence("ext", 5)])).outputs
    assert (a.prompt_logprobs_position, len(a.prompt_logprobs)) == (9, 4)
    assert a.token_id is None and a.finish_reason is None
    assert (b.prompt_logprobs_position, len(b.prompt_logprobs)) == (13, 4)
    assert b.token_id is None and b.finish_reason == "length"  # score only: nothing sampled
    check(a.prompt_logprobs + b.prompt_logprobs, reference(llama_model, prompt, 9))
    assert not core.has_seq("ext")


def test_a_batch_of_scoring_requests_runs_in_one_forward(core, llama_model, monkeypatch):
    """Four continuations of one cached context scored in one step: one forward. As the
    scheduler does, the cached prefix stops a page before the first scored row."""
    context = random_prompt(8, seed=3)
    choices = [random_prompt(n, seed=10 + n) for n in (1, 2, 3, 5)]
    core.step(StepPlan(1, [new_seq("c", context, page_ids=[30, 31], sampling=greedy(1))]))
    core.step(StepPlan(2, finished_req_ids=["c"]))
    forwards = []
    scored = core.model.forward_scored
    monkeypatch.setattr(
        core.model, "forward_scored", lambda *a: forwards.append(1) or scored(*a)
    )
    seqs = [
        new_seq(
            f"s{i}", context + choice, num_computed_tokens=4,
            page_ids=[30, 40 + 3 * i, 41 + 3 * i, 42 + 3 * i],
            sampling=greedy(max_tokens=0, prompt_logprobs_start=8),
        )
        for i, choice in enumerate(choices)
    ]  # fmt: skip
    outputs = core.step(StepPlan(3, seqs)).outputs
    assert len(forwards) == 1
    for out, choice in zip(outputs, choices, strict=True):
        assert out.finish_reason == "length" and out.token_id is None
        check(out.prompt_logprobs, reference(llama_model, context + choice, 8))


def test_requests_without_prompt_scoring_plan_none(core):
    prompt = random_prompt(6, seed=1)
    seq = new_seq("plain", prompt, sampling=greedy(max_tokens=2))
    prepared = core.prepare(StepPlan(1, [seq]))
    assert prepared.scoring is None and not prepared.scored_to_end
    (out,) = core.execute(prepared).outputs
    assert out.prompt_logprobs == [] and out.token_id is not None
    core.step(StepPlan(2, finished_req_ids=["plain"]))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_scoring_extends_run_eagerly_and_decodes_keep_their_graphs(llama_model):
    config = ExecutorConfig(
        model_path=str(llama_model.path), device="cuda", dtype="float32", page_size=4,
        num_pages=64, max_num_seqs=8,
    )  # fmt: skip
    core = ExecutorCore(config)
    assert core.forward.decode is not None
    replays = []
    run = core.forward.decode.run
    core.forward.decode.run = lambda batch: replays.append(batch.num_seqs) or run(batch)
    prompt = random_prompt(15, seed=21)
    sampling = greedy(max_tokens=3, prompt_logprobs_start=2, top_logprobs=2)
    (out,) = core.step(StepPlan(1, [new_seq("g", prompt, sampling=sampling)])).outputs
    assert not replays  # the scoring prefill ran eagerly
    check(out.prompt_logprobs, reference(llama_model, prompt, 2, top=2))
    core.step(StepPlan(2, running_seqs=[RunningSequence("g", 1)]))
    assert replays == [1]  # the decode after it replayed its graph
    core.shutdown()
