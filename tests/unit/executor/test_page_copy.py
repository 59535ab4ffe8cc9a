"""NewSequence.page_copy: a cached partial page's slots copied into a new sequence's page."""

from __future__ import annotations

import pytest
import torch

from radixmesh.cache_types import PageCopy
from radixmesh.errors import InvalidArgument
from radixmesh.step import NewSequence, RunningSequence, StepPlan
from services.executor.core.page_copy import copy_slots, plan_copies
from tests.unit.executor.conftest import TinyModel, greedy, hf_logits, make_core, random_prompt

SAMPLING = greedy(4, logprobs=True, top_logprobs=5, ignore_eos=True)


def new_seq(
    req_id: str, tokens: list[int], pages: list[int], computed: int, copy: PageCopy | None
) -> NewSequence:
    return NewSequence(
        req_id, tokens, len(tokens), computed, len(tokens) - computed, pages, SAMPLING,
        page_copy=copy,
    )  # fmt: skip


def run(core, step_id: int, seq: NewSequence) -> tuple[list[int], list[torch.Tensor]]:
    """The sequence's 4 tokens and each one's top-5 log probabilities, then it is dropped."""
    outs = [core.step(StepPlan(step_id, new_seqs=[seq])).outputs[0]]
    for i in range(3):
        outs.append(core.step(StepPlan(step_id + 1 + i, running_seqs=[RunningSequence(seq.req_id, 1)])).outputs[0])
    core.step(StepPlan(step_id + 4, finished_req_ids=[seq.req_id]))
    tops = [torch.tensor([lp for _, lp in o.logprobs.top]) for o in outs]  # type: ignore[union-attr]
    return [o.token_id for o in outs], tops  # type: ignore[misc]


@pytest.fixture(scope="module")
def core(llama_model: TinyModel):
    return make_core(llama_model)  # page_size 4, 64 pages


@pytest.mark.parametrize("cuda_graphs", [True, False])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_copies_on_cuda_give_the_tokens_of_recomputing(llama_model: TinyModel, cuda_graphs: bool):
    """The copies run on the device stream between a layer's writes and reads; the steps
    that carry them never replay a graph, the decodes after them do."""
    cuda = make_core(llama_model, device="cuda", cuda_graphs=cuda_graphs)
    context, more = random_prompt(10, seed=66), random_prompt(3, seed=67)
    cuda.step(StepPlan(1, new_seqs=[new_seq("ctx", context, [30, 31, 32], 0, None)]))
    cuda.step(StepPlan(2, finished_req_ids=["ctx"]))
    tokens, tops = run(cuda, 3, new_seq("c", context + more, [30, 31, 33, 34], 10, PageCopy(32, 33, 2)))
    expected, expected_tops = run(cuda, 10, new_seq("f", context + more, [40, 41, 42, 43], 0, None))
    assert tokens == expected
    for got, want in zip(tops, expected_tops, strict=True):
        torch.testing.assert_close(got, want, atol=2e-2, rtol=0)


def test_copied_tokens_give_the_logits_of_recomputing_them(core, llama_model: TinyModel) -> None:
    context, more = random_prompt(10, seed=60), random_prompt(5, seed=61)
    # the context computed on pages 30, 31 and 32 (slots 0 and 1 of 32: its partial page)
    core.step(StepPlan(1, new_seqs=[new_seq("ctx", context, [30, 31, 32], 0, None)]))
    core.step(StepPlan(2, finished_req_ids=["ctx"]))
    # a continuation shares 30 and 31 in place and copies the 2 slots of 32 into 33
    copied = new_seq("copy", context + more, [30, 31, 33, 34, 35], 10, PageCopy(32, 33, 2))
    tokens, tops = run(core, 3, copied)
    recomputed = new_seq("full", context + more, [40, 41, 42, 43, 44], 0, None)
    expected_tokens, expected_tops = run(core, 10, recomputed)
    assert tokens == expected_tokens
    for got, want in zip(tops, expected_tops, strict=True):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    reference = hf_logits(llama_model.hf, context + more)[-1].log_softmax(-1).topk(5).values
    torch.testing.assert_close(tops[0], reference, atol=1e-4, rtol=0)
    # the copy is what makes it right: the same plan over a page that lacks those slots
    # (never written: zeros) does not give these log probabilities
    _, wrong = run(core, 20, new_seq("nocopy", context + more, [30, 31, 50, 51, 52], 10, None))
    assert not torch.allclose(wrong[0], tops[0], atol=1e-4, rtol=0)


def test_a_copy_from_a_page_written_in_the_same_step_reads_it_written(
    core, llama_model: TinyModel
) -> None:
    """A group's member takes its leader's whole pages in place and the first slots of the
    leader's partial page by copy, in the step where the leader computes them."""
    context = random_prompt(10, seed=63)
    leader = context + random_prompt(4, seed=64)
    member = context + random_prompt(5, seed=65)
    plan = StepPlan(
        30,
        new_seqs=[
            new_seq("leader", leader, [30, 31, 32, 33], 0, None),
            new_seq("member", member, [30, 31, 34, 35], 10, PageCopy(32, 34, 2)),
        ],
    )
    outs = {o.req_id: o for o in core.step(plan).outputs}
    core.step(StepPlan(31, finished_req_ids=["leader", "member"]))
    for req_id, tokens in (("leader", leader), ("member", member)):
        top = torch.tensor([lp for _, lp in outs[req_id].logprobs.top])  # type: ignore[union-attr]
        reference = hf_logits(llama_model.hf, tokens)[-1].log_softmax(-1).topk(5).values
        torch.testing.assert_close(top, reference, atol=1e-4, rtol=0)


CUDA = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
def test_copies_of_one_step_are_batched_over_every_layer(device: str) -> None:
    def cache(dtype: torch.dtype) -> torch.Tensor:
        return torch.arange(6 * 4 * 2 * 3, device=device).view(6, 4, 2, 3).to(dtype)

    caches = [cache(torch.float32) for _ in range(3)] + [cache(torch.bfloat16)]
    if device == "cuda":  # an FP8 KV tensor is copied as its bytes
        caches.append(cache(torch.float8_e4m3fn))
    before = [c.clone() for c in caches]
    copies = plan_copies([PageCopy(1, 4, 3), PageCopy(2, 5, 1)], 4, pin=device == "cuda")
    assert copies is not None
    copy_slots(caches, copies)
    for got, old in zip((c.view(torch.uint8) for c in caches), before, strict=True):
        old = old.view(torch.uint8)
        assert torch.equal(got[4, :3], old[1, :3]) and torch.equal(got[4, 3], old[4, 3])
        assert torch.equal(got[5, :1], old[2, :1]) and torch.equal(got[5, 1:], old[5, 1:])
        assert torch.equal(got[:4], old[:4])
    assert plan_copies([], 4, pin=False) is None


@pytest.mark.parametrize(
    ("pages", "computed", "copy", "message"),
    [
        ([30, 31, 33], 10, PageCopy(32, 33, 0), "num_tokens must be in"),
        ([30, 31, 33], 10, PageCopy(32, 33, 4), "num_tokens must be in"),
        ([30, 31, 33], 10, PageCopy(64, 33, 2), "src_page_id must be in"),
        ([30, 31, 33], 10, PageCopy(32, -1, 2), "dst_page_id must be in"),
        ([30, 31, 33], 9, PageCopy(32, 33, 2), "must end 2 tokens into a page"),
        ([30, 31, 33], 10, PageCopy(32, 34, 2), r"dst_page_id \(34\) must be page_ids\[2\]"),
        ([30, 32, 33], 10, PageCopy(32, 33, 2), "src_page_id must not be in"),
    ],
)
def test_a_bad_copy_is_refused_naming_the_field_and_changes_nothing(
    core, pages, computed, copy, message
) -> None:
    tokens = random_prompt(12, seed=62)
    with pytest.raises(InvalidArgument, match=message) as info:
        core.step(StepPlan(1, new_seqs=[new_seq("bad", tokens, pages, computed, copy)]))
    assert "new_seqs['bad'].page_copy" in str(info.value)
    assert not core.has_seq("bad")
