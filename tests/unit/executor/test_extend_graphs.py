"""Extend graphs: the padded layout gives the eager forward's logits, hidden states and KV."""

from __future__ import annotations

import pytest
import torch

from radixmesh.step import NewSequence, RunningSequence, StepPlan
from services.executor.core.config import ExecutorConfig
from services.executor.core.extend_graphs import (
    MAX_COPY_SLOTS,
    ExtendGraphs,
    extend_shapes,
    seq_buckets,
    token_buckets,
)
from services.executor.core.forward_batch import ForwardBatch
from services.executor.core.graph_setup import (
    GRAPH_OVERHEAD_BYTES,
    GraphPlan,
    estimate_graph_bytes,
    plan_graphs,
)
from services.executor.metrics import GraphStepsCollector
from tests.unit.executor.conftest import TinyModel, greedy, make_core, random_prompt
from tests.unit.executor.test_verify_graphs import PAGE_SIZE, extend_batch

MAX_PAGES = 16


def graphs_for(core, max_tokens: int = 64, max_seqs: int = 8) -> ExtendGraphs:
    return ExtendGraphs(
        core.model, core.kv_pool, max_tokens, max_seqs, MAX_PAGES, core.kv_pool.num_pages - 1
    )


def mixed_step(core) -> tuple[ForwardBatch, list[list[int]], list[int]]:
    """Four cached contexts, then one step: two decodes, an extend of 6 and a prefill of
    9 (sequence 4, pages 32.. of its own). Logits for every sequence but the extend."""
    device = core.kv_pool.k_caches[0].device
    contexts = [random_prompt(n, seed=n) for n in (5, 9, 2, 7)]
    core.model.forward(extend_batch([0, 0, 0, 0], contexts, device), core.kv_pool)
    news = [[11], [12], random_prompt(6, seed=60), random_prompt(9, seed=90)]
    starts = [len(contexts[0]), len(contexts[1]), len(contexts[2]), 0]
    batch = extend_batch(starts, news, device)
    ends = batch.cu_seqlens_q[1:] - 1
    batch.logits_indices = ends[[0, 1, 3]].to(torch.int64)
    return batch, news, starts


def test_buckets() -> None:
    assert token_buckets(64) == [32, 64]
    assert token_buckets(100) == [32, 64, 100]
    assert seq_buckets(8) == [4, 8]
    assert seq_buckets(300) == [4, 8, 16, 32, 64, 128, 256, 300]


def test_the_smallest_shape_that_holds_a_step_runs_it(llama_model: TinyModel) -> None:
    core = make_core(llama_model, page_size=PAGE_SIZE, num_pages=64)
    graphs = ExtendGraphs(core.model, core.kv_pool, 512, 64, MAX_PAGES, 63)
    assert graphs.shape_of(20, 3) == (32, 4)
    assert graphs.shape_of(20, 10) == (32, 16)
    assert graphs.shape_of(33, 17) == (64, 32)
    assert graphs.shape_of(40, 40) == (64, 64)
    assert graphs.shape_of(30, 30) == (32, 32)
    assert graphs.shape_of(512, 64) == (512, 64)
    assert graphs.shape_of(513, 1) is None and graphs.shape_of(8, 65) is None


def test_the_padded_layout_gives_the_eager_logits_and_touches_only_the_scratch_page(
    llama_model: TinyModel,
) -> None:
    core = make_core(llama_model, page_size=PAGE_SIZE, num_pages=64)
    graphs = graphs_for(core)
    batch, _, _ = mixed_step(core)
    expected = core.model.forward(batch, core.kv_pool)
    before = [k.clone() for k in core.kv_pool.k_caches]
    got = graphs.run_eagerly(batch)
    assert graphs._shape(batch) == (32, 4)  # 17 rows of 4 sequences
    assert got.shape == expected.shape == (3, expected.shape[1])
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    assert torch.equal(got.argmax(-1), expected.argmax(-1))
    keep = [p for p in range(core.kv_pool.num_pages) if p != core.kv_pool.num_pages - 1]
    for old, new in zip(before, core.kv_pool.k_caches, strict=True):
        # the real rows write their own keys again; a pad row writing into a real page
        # would change it completely
        torch.testing.assert_close(new[keep], old[keep], rtol=1e-5, atol=1e-5)


def test_a_step_with_page_copies_copies_exactly_its_slots(llama_model: TinyModel) -> None:
    """A prefill whose first page starts with 3 slots copied from another sequence's page:
    the same logits as the eager forward, and the same caches after."""
    core_a = make_core(llama_model, page_size=PAGE_SIZE, num_pages=64)
    core_b = make_core(llama_model, page_size=PAGE_SIZE, num_pages=64)
    graphs = graphs_for(core_b)
    results = []
    for core, run in ((core_a, None), (core_b, graphs.run_eagerly)):
        batch, _, _ = mixed_step(core)
        device = core.kv_pool.k_caches[0].device
        # sequence 4 (pages 32..) continues 3 copied slots of sequence 0's page 0
        src = torch.tensor([0, 1, 2], dtype=torch.int64, device=device)
        dst = torch.tensor([32 * PAGE_SIZE + i for i in range(3)], dtype=torch.int64, device=device)
        batch.slot_copies = (src, dst)
        logits = core.model.forward(batch, core.kv_pool) if run is None else run(batch)
        results.append((logits, [k.clone() for k in core.kv_pool.k_caches]))
    (want, want_k), (got, got_k) = results
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    scratch = core_b.kv_pool.num_pages - 1
    for a, b in zip(want_k, got_k, strict=True):
        torch.testing.assert_close(b[:scratch], a[:scratch], rtol=1e-5, atol=1e-5)
        assert torch.equal(b[32, :3], b[0, :3])  # the copied slots arrived


def test_sequences_that_run_nothing_pad_the_bucket(llama_model: TinyModel) -> None:
    """Three sequences in the bucket of four: the fourth runs no token, the padding rows
    are the fifth's."""
    core = make_core(llama_model, page_size=PAGE_SIZE, num_pages=64)
    graphs = graphs_for(core)
    device = core.kv_pool.k_caches[0].device
    contexts = [random_prompt(n, seed=n) for n in (5, 9, 2)]
    core.model.forward(extend_batch([0, 0, 0], contexts, device), core.kv_pool)
    news = [[11], random_prompt(4, seed=4), [13]]
    batch = extend_batch([len(c) for c in contexts], news, device)
    batch.logits_indices = (batch.cu_seqlens_q[1:] - 1).to(torch.int64)
    assert graphs._shape(batch) == (32, 4)
    torch.testing.assert_close(
        graphs.run_eagerly(batch), core.model.forward(batch, core.kv_pool), rtol=1e-4, atol=1e-4
    )


def test_the_hidden_states_of_the_layout_are_the_forwards(llama_model: TinyModel) -> None:
    """What a scoring step reads: the final hidden state of each real row, in its place."""
    core = make_core(llama_model, page_size=PAGE_SIZE, num_pages=64)
    graphs = graphs_for(core)
    batch, _, _ = mixed_step(core)
    rows = torch.tensor([2, 3, 7, 16], dtype=torch.int64)
    _, want = core.model.forward_scored(batch, core.kv_pool, rows)
    shape = graphs._lay_out(batch)
    hidden = core.model.hidden_states(graphs._static_batch(*shape), core.kv_pool)
    torch.testing.assert_close(hidden[rows], want, rtol=1e-4, atol=1e-4)


def test_what_no_graph_holds_is_refused(llama_model: TinyModel) -> None:
    core = make_core(llama_model, page_size=PAGE_SIZE, num_pages=64)
    graphs = graphs_for(core, max_tokens=32, max_seqs=4)
    graphs._graphs[(32, 4)] = object()  # as if captured
    device = core.kv_pool.k_caches[0].device
    batch, _, _ = mixed_step(core)
    assert graphs.can_run(batch)
    decode = extend_batch([3], [[7]], device)
    decode.is_decode = True
    assert not graphs.can_run(decode)  # plain decodes are the decode graphs'
    assert not graphs.can_run(extend_batch([0], [list(range(33))], device))  # 33 rows
    assert not graphs.can_run(extend_batch([0] * 5, [[1]] * 5, device))  # 5 sequences
    slots = torch.arange(MAX_COPY_SLOTS + 1, dtype=torch.int64)
    batch.slot_copies = (slots, slots)
    assert not graphs.can_run(batch)
    with pytest.raises(ValueError, match="batch-invariant"):
        invariant = make_core(llama_model, page_size=PAGE_SIZE, num_pages=64, batch_invariant=True)
        graphs_for(invariant)


def test_the_graph_plan_and_its_memory_estimate_count_the_extend_graphs(
    tiny_model: TinyModel,
) -> None:
    from services.executor.core.loader import read_model_folder

    config = ExecutorConfig(str(tiny_model.path), max_num_seqs=64, extend_graph_tokens=256)
    plan = plan_graphs(config, 0)
    assert plan == GraphPlan(64, extend_tokens=256, extend_seqs=64)
    assert plan_graphs(ExecutorConfig(str(tiny_model.path), max_num_seqs=64), 0) == GraphPlan(64)
    spec = read_model_folder(str(tiny_model.path)).spec
    args = (spec, torch.bfloat16, spec.vocab_size, 256, 16)
    grown = estimate_graph_bytes(plan, *args) - estimate_graph_bytes(GraphPlan(64), *args)
    shapes = extend_shapes(256, 64)
    kept_hidden = sum(t * spec.hidden_size * 2 for t, _ in shapes)
    assert grown >= len(shapes) * GRAPH_OVERHEAD_BYTES + kept_hidden


def staggered(core, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Greedy outputs of prompts admitted one a step while the earlier ones decode: every
    step but the last ones mixes a prefill with decodes."""
    ids = [f"r{i}" for i in range(len(prompts))]
    tokens: dict[str, list[int]] = {rid: [] for rid in ids}
    live: set[str] = set()
    step = 0
    while step < len(prompts) or live:
        new = []
        if step < len(prompts):
            p, rid = prompts[step], ids[step]
            pages = list(range(step * 16, (step + 1) * 16))
            new = [NewSequence(rid, p, len(p), 0, len(p), pages, greedy(max_tokens, ignore_eos=True))]
        running = [RunningSequence(r, 1) for r in sorted(live)]
        result = core.step(StepPlan(step + 1, new_seqs=new, running_seqs=running))
        live |= {n.req_id for n in new}
        for out in result.outputs:
            if out.token_id is not None:
                tokens[out.req_id].append(out.token_id)
            if out.finish_reason is not None:
                live.discard(out.req_id)
        step += 1
    return [tokens[rid] for rid in ids]


class EagerExtendGraphs(ExtendGraphs):
    """Extend graphs whose replay runs the captured layout's forward eagerly into the same
    buffers: the executor's use of them (which steps, their logits, hidden states and
    copies) checked on the CPU."""

    def capture_eagerly(self) -> None:
        vocab = self.model.weights.lm_head.shape[0]
        self._logits = torch.empty(self.max_rows, vocab)
        for shape in self.shapes:
            self._graphs[shape] = None  # type: ignore[assignment]
            self._batches[shape] = self._static_batch(*shape)
            self._hidden[shape] = torch.empty(shape[0], self.model.spec.hidden_size)

    def _replay(self, shape: tuple[int, int]) -> None:
        batch = self._batches[shape]
        hidden = self.model.hidden_states(batch, self.kv_pool)
        self._hidden[shape].copy_(hidden)
        out = self.model.lm_head(hidden[batch.logits_indices])
        assert self._logits is not None
        self._logits[: out.shape[0]].copy_(out)


def with_eager_extend_graphs(core, max_tokens: int = 64) -> EagerExtendGraphs:
    graphs = EagerExtendGraphs(
        core.model, core.kv_pool, max_tokens, core.config.max_num_seqs, MAX_PAGES,
        core.kv_pool.num_pages - 1,
    )  # fmt: skip
    graphs.capture_eagerly()
    core.forward.extend = graphs
    return graphs


def test_the_executor_runs_mixed_steps_in_the_extend_graphs(llama_model: TinyModel) -> None:
    prompts = [random_prompt(3 + 5 * i, seed=80 + i) for i in range(6)]
    plain = make_core(llama_model, page_size=PAGE_SIZE, num_pages=128, max_num_seqs=8)
    core = make_core(llama_model, page_size=PAGE_SIZE, num_pages=128, max_num_seqs=8)
    assert core.forward.extend is None  # none on the CPU
    graphs = with_eager_extend_graphs(core)
    assert staggered(core, prompts, max_tokens=12) == staggered(plain, prompts, max_tokens=12)
    assert graphs.num_runs == len(prompts)  # each prefill beside the decodes of the ones before
    assert core.forward.graph_steps() == {"extend": graphs.num_runs}
    assert plain.forward.graph_steps() == {} and graphs.num_runs == len(prompts)
    (family,) = GraphStepsCollector(core.forward.graph_steps).collect()
    assert [(s.labels, s.value) for s in family.samples if s.name.endswith("_total")] == [
        ({"graphs": "extend"}, len(prompts))
    ]
    assert list(GraphStepsCollector(plain.forward.graph_steps).collect()) == []


def test_scoring_steps_read_the_extend_graphs_hidden_states(llama_model: TinyModel) -> None:
    """Four choices scored over a cached context in one step: the same log probabilities
    through the extend graphs as through the eager forward."""
    context = random_prompt(8, seed=3)
    choices = [random_prompt(n, seed=10 + n) for n in (1, 2, 3, 5)]
    scores = []
    for extend in (False, True):
        core = make_core(llama_model, page_size=PAGE_SIZE, num_pages=64, max_num_seqs=8)
        graphs = with_eager_extend_graphs(core) if extend else None
        first = NewSequence("c", context, len(context), 0, len(context), [30, 31], greedy(1))
        core.step(StepPlan(1, [first]))
        core.step(StepPlan(2, finished_req_ids=["c"]))
        seqs = [
            NewSequence(
                f"s{i}", context + choice, len(context) + len(choice), 4,
                len(context) + len(choice) - 4, [30, 40 + 3 * i, 41 + 3 * i, 42 + 3 * i],
                greedy(max_tokens=0, prompt_logprobs_start=8),
            )
            for i, choice in enumerate(choices)
        ]  # fmt: skip
        outputs = core.step(StepPlan(3, seqs)).outputs
        scores.append([[e.logprob for e in out.prompt_logprobs] for out in outputs])
        if graphs is not None:
            assert graphs.num_runs == 2  # the context's prefill and the scoring step
    assert [len(s) for s in scores[1]] == [len(c) for c in choices]
    for got, want in zip(scores[1], scores[0], strict=True):
        assert got == pytest.approx(want, abs=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_greedy_outputs_are_the_same_with_extend_graphs_on_cuda(llama_model: TinyModel) -> None:
    prompts = [random_prompt(3 + 5 * i, seed=80 + i) for i in range(6)]
    outputs = {}
    for tokens in (0, 64):
        core = make_core(
            llama_model, device="cuda", dtype="float32", page_size=PAGE_SIZE, num_pages=256,
            max_num_seqs=8, extend_graph_tokens=tokens,
        )  # fmt: skip
        outputs[tokens] = staggered(core, prompts, max_tokens=12)
        if tokens:
            assert core.forward.extend is not None and core.forward.extend.num_runs >= 5
            assert core.graph_bytes is not None and core.graph_bytes[1] > 0
        core.shutdown()
    assert outputs[64] == outputs[0]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_replayed_extend_graphs_give_the_eager_logits_on_cuda(llama_model: TinyModel) -> None:
    core = make_core(llama_model, device="cuda", dtype="float32", page_size=PAGE_SIZE,
                     num_pages=64, cuda_graphs=False)  # fmt: skip
    graphs = graphs_for(core)
    graphs.capture()
    batch, _, _ = mixed_step(core)
    expected = core.model.forward(batch, core.kv_pool)
    rows = torch.tensor([2, 3, 16], dtype=torch.int64, device="cuda")
    _, want_hidden = core.model.forward_scored(batch, core.kv_pool, rows)
    got, hidden = graphs.run_scored(batch, rows)
    torch.testing.assert_close(got, expected, rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(hidden, want_hidden, rtol=2e-3, atol=2e-3)
    assert graphs.num_runs == 1
