"""Verification steps as CUDA graphs (core/cuda_graphs.py, `StepGraphs` of k + 1 rows per
sequence): the padded layout a graph runs
gives the eager extend's logits and writes no KV but the scratch page's (on CPU, run
eagerly); on a GPU the replayed graphs give the same logits and greedy outputs, and
jump-forward with speculation off verifies its forced runs in them."""

from __future__ import annotations

import pytest
import torch

from radixmesh.sampling import SamplingParams
from services.executor.core.cuda_graphs import StepGraphs
from services.executor.core.forward_batch import ForwardBatch
from tests.unit.executor.conftest import TinyModel, make_core, random_prompt

PAGE_SIZE = 4
NUM_ROWS = 5  # a draft of 4 and the decoded token


def extend_batch(contexts: list[int], news: list[list[int]], device) -> ForwardBatch:
    """Sequence i has contexts[i] tokens cached in pages 8 i, 8 i + 1, ... and runs news[i]."""
    ids, positions, slots, cu, seq_lens = [], [], [], [0], []
    width = max(-(-(c + len(n)) // PAGE_SIZE) for c, n in zip(contexts, news, strict=True))
    table = torch.zeros(len(contexts), width, dtype=torch.int32)
    for i, (ctx, new) in enumerate(zip(contexts, news, strict=True)):
        pages = [8 * i + p for p in range(width)]
        table[i] = torch.tensor(pages, dtype=torch.int32)
        for j, token in enumerate(new):
            pos = ctx + j
            ids.append(token)
            positions.append(pos)
            slots.append(pages[pos // PAGE_SIZE] * PAGE_SIZE + pos % PAGE_SIZE)
        cu.append(cu[-1] + len(new))
        seq_lens.append(ctx + len(new))

    def t(values, dtype):
        return torch.tensor(values, dtype=dtype, device=device)

    return ForwardBatch(
        input_ids=t(ids, torch.int64), positions=t(positions, torch.int64),
        cu_seqlens_q=t(cu, torch.int32), seq_lens=t(seq_lens, torch.int32),
        page_table=table.to(device), slot_mapping=t(slots, torch.int64),
        logits_indices=torch.arange(len(ids), dtype=torch.int64, device=device),
        is_decode=False, max_q_len=max(len(n) for n in news),
    )  # fmt: skip


def check_layout(core, run, tol: float = 1e-4) -> None:
    """Prefill three contexts, then an extend of 1, 3 and 5 rows: `run`'s logits against the
    eager forward's, and no KV but the scratch page's changes."""
    device = core.kv_pool.k_caches[0].device
    contexts = [random_prompt(n, seed=n) for n in (5, 9, 2)]
    core.model.forward(extend_batch([0, 0, 0], contexts, device), core.kv_pool)
    news = [random_prompt(q, seed=40 + q) for q in (1, 3, 5)]
    batch = extend_batch([len(c) for c in contexts], news, device)
    expected = core.model.forward(batch, core.kv_pool)
    before = [k.clone() for k in core.kv_pool.k_caches]
    got = run(batch)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=tol, atol=tol)
    assert torch.equal(got.argmax(-1), expected.argmax(-1))
    scratch = core.kv_pool.num_pages - 1
    for old, new in zip(before, core.kv_pool.k_caches, strict=True):
        keep = [p for p in range(core.kv_pool.num_pages) if p != scratch]
        # the real rows write their own keys again (other shapes: within rounding); a pad
        # row writing into a real page would change it completely
        torch.testing.assert_close(new[keep], old[keep], rtol=1e-5, atol=1e-5)


def graphs_for(core, max_num_seqs: int = 4) -> StepGraphs:
    return StepGraphs(
        core.model, core.kv_pool, max_num_seqs, NUM_ROWS,
        max_pages_per_seq=16, scratch_page=core.kv_pool.num_pages - 1,
    )  # fmt: skip


def test_the_padded_layout_gives_the_eager_extends_logits(llama_model: TinyModel) -> None:
    core = make_core(llama_model, page_size=PAGE_SIZE, num_pages=64)
    graphs = graphs_for(core)
    assert graphs.buckets == [1, 2, 4]
    check_layout(core, graphs.run_eagerly)  # three sequences in the bucket of four
    decode = extend_batch([3], [[7]], core.kv_pool.k_caches[0].device)
    decode.is_decode = True
    assert not graphs.can_run(decode)  # plain decodes are the 1-row graphs'
    long = extend_batch([0], [list(range(6, 6 + NUM_ROWS + 1))], core.kv_pool.k_caches[0].device)
    assert not graphs.can_run(long)  # more rows than a graph has


def test_a_step_runs_at_the_narrowest_captured_width_that_holds_its_pages(
    llama_model: TinyModel,
) -> None:
    core = make_core(llama_model, page_size=PAGE_SIZE, num_pages=64)
    scratch = core.kv_pool.num_pages - 1
    graphs = StepGraphs(core.model, core.kv_pool, 4, 1, 16, scratch, widths=[3, 16])
    assert [graphs.width_of(n) for n in (1, 3, 4, 16)] == [3, 3, 16, 16]
    device = core.kv_pool.k_caches[0].device
    contexts = [random_prompt(n, seed=n) for n in (5, 9, 2)]
    core.model.forward(extend_batch([0, 0, 0], contexts, device), core.kv_pool)
    decode = extend_batch([len(c) for c in contexts], [[7], [8], [9]], device)
    decode.is_decode = True
    assert decode.page_table.shape[1] == 3  # 10 positions at most: the table of 3 runs it
    torch.testing.assert_close(
        graphs.run_eagerly(decode), core.model.forward(decode, core.kv_pool), rtol=1e-4, atol=1e-4
    )
    for rows, widths in ((1, [0, 16]), (1, [3, 8]), (NUM_ROWS, [3, 16])):
        with pytest.raises(ValueError, match="widths"):
            StepGraphs(core.model, core.kv_pool, 4, rows, 16, scratch, widths)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_replayed_graphs_give_the_eager_logits_on_cuda(llama_model: TinyModel) -> None:
    core = make_core(llama_model, device="cuda", dtype="float32", page_size=PAGE_SIZE,
                     num_pages=64, cuda_graphs=False)  # fmt: skip
    graphs = graphs_for(core)
    graphs.capture()
    check_layout(core, graphs.run, tol=2e-3)  # other shapes, other reduction orders


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_greedy_outputs_are_the_same_with_verification_graphs(llama_model: TinyModel) -> None:
    from services.executor.core.spec import SpeculativeConfig
    from tests.unit.executor.conftest import greedy
    from tests.unit.executor.test_speculative import generate, repeating_prompt

    prompts = [repeating_prompt(s) for s in range(6)] + [random_prompt(9, 70)]
    sampling = [greedy(max_tokens=24, ignore_eos=True)] * len(prompts)
    outputs = {}
    for graphs in (False, True):
        core = make_core(
            llama_model, device="cuda", dtype="float32", num_pages=1024, max_num_seqs=8,
            cuda_graphs=graphs, speculative=SpeculativeConfig(method="ngram", max_batch_size=8),
        )  # fmt: skip
        outputs[graphs] = generate(core, prompts, sampling, 4)[0]
        if graphs:
            assert core.forward.verify is not None and core.forward.verify.num_runs > 0
            assert core.spec_stats.snapshot().num_accepted_tokens > 0
        core.shutdown()
    assert outputs[True] == outputs[False]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_jump_forward_verifies_in_graphs_with_speculation_off(tmp_path) -> None:
    from mesh.tiny_model import write_tiny_model
    from services.executor.core.config import ExecutorConfig
    from services.executor.core.executor import ExecutorCore
    from services.executor.core.grammar import GrammarConfig, GrammarService
    from services.executor.core.spec import SpeculativeConfig
    from tests.unit.executor.test_jump_forward import CONSTRAINTS, MAX_FORCED, generate, prompts

    model_dir = write_tiny_model(tmp_path, arch="llama", seed=0)
    grammar = GrammarService.from_model_dir(model_dir, config=GrammarConfig(compile_timeout_s=60))

    class OnCuda:  # what jump-forward's generate drives
        def __init__(self, jump_forward: bool) -> None:
            config = ExecutorConfig(
                model_path=str(model_dir), device="cuda", dtype="float32", page_size=4,
                num_pages=1024, max_num_seqs=16,
                speculative=SpeculativeConfig(jump_forward=jump_forward, max_forced_tokens=MAX_FORCED),
            )  # fmt: skip
            self.core = ExecutorCore(config, grammar)

    work = prompts(3)
    sampling = [SamplingParams(temperature=0.0, max_tokens=60)] * len(work)
    constraint = CONSTRAINTS["json_schema"]
    off, on = OnCuda(False), OnCuda(True)
    try:
        expected, _, _ = generate(off, work, sampling, constraint, MAX_FORCED)
        got, _, _ = generate(on, work, sampling, constraint, MAX_FORCED)
        graphs, no_graphs = on.core.forward.verify, off.core.forward.verify
        switch = on.core.forced_switch
        forced = on.core.spec_stats.snapshot().num_forced_tokens
    finally:
        off.core.shutdown()
        on.core.shutdown()
        grammar.close(wait=True)
    assert no_graphs is None  # nothing drafts: no verification graphs
    assert graphs is not None and graphs.num_rows == MAX_FORCED + 1
    assert switch is not None and switch.cost_ratios  # timed at start-up
    assert forced > 0 and graphs.num_runs > 0  # forced runs verified as graph replays
    assert got == expected
