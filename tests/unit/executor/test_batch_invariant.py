"""The batch-invariant mode: a sequence's logits are the same bits alone or in a batch of 8,
and as a verification extend or as plain decodes; greedy outputs with speculation equal the
outputs without it, and batch 1's equal batch 8's."""

from __future__ import annotations

import pytest
import torch

from radixmesh.errors import InvalidArgument
from services.executor.core.config import ExecutorConfig
from services.executor.core.executor import ExecutorCore
from services.executor.core.forward_batch import BatchEntry, build_forward_batch
from services.executor.core.spec import SpeculativeConfig
from tests.unit.executor.conftest import (
    TinyModel,
    greedy,
    hf_greedy,
    hf_logits,
    make_core,
    random_prompt,
)
from tests.unit.executor.test_speculative import generate, repeating_prompt

PAGES = 16  # pages per sequence in `logits_of`
PAGE_SIZE = 4
DRAFT = [11, 12, 13]


def invariant_core(model: TinyModel, method: str = "off", **overrides) -> ExecutorCore:
    fields = {"num_pages": 1024, "max_num_seqs": 64, "batch_invariant": True, **overrides}
    if method != "off":
        fields["speculative"] = SpeculativeConfig(method=method, max_batch_size=64)
    return make_core(model, **fields)


def _forward(core: ExecutorCore, entries: list[BatchEntry]) -> torch.Tensor:
    batch = build_forward_batch(entries, PAGE_SIZE, core.device)
    return core.model.forward(batch, core.kv_pool)


def verify_and_decode_logits(core: ExecutorCore, prompts: list[list[int]]) -> tuple:
    """Sequence 0's logits at the positions of its last prompt token and the 3 draft tokens:
    as one k + 1 row verification extend beside 7 other sequences (extends and a decode),
    and as 4 decodes of it alone."""
    pages = [list(range(i * PAGES, (i + 1) * PAGES)) for i in range(len(prompts))]
    _forward(core, [BatchEntry(0, p[:-1], pages[i], True) for i, p in enumerate(prompts)])
    entries = [BatchEntry(len(prompts[0]) - 1, [prompts[0][-1], *DRAFT], pages[0], True)]
    for i, p in enumerate(prompts[1:], start=1):
        tokens = [p[-1], *DRAFT[: i % 4]]  # 1 to 4 rows: decodes and extends
        entries.append(BatchEntry(len(p) - 1, tokens, pages[i], True))
    batch = build_forward_batch(entries, PAGE_SIZE, core.device)
    rows = batch.cu_seqlens_q[1:].tolist()
    batch.logits_indices = torch.arange(rows[-1], device=core.device)  # every row's logits
    verified = core.model.forward(batch, core.kv_pool)[: rows[0]]
    decoded = []
    for j, token in enumerate([prompts[0][-1], *DRAFT]):
        entry = BatchEntry(len(prompts[0]) - 1 + j, [token], pages[0], True)
        decoded.append(_forward(core, [entry])[0])
    return verified, torch.stack(decoded)


def test_verification_rows_are_the_bits_of_plain_decodes(tiny_model: TinyModel) -> None:
    """Every architecture (q/k/v bias, q/k norm, tied embeddings, a sliding window)."""
    prompts = [random_prompt(5 + 3 * i, 70 + i) for i in range(8)]
    verified, decoded = verify_and_decode_logits(invariant_core(tiny_model), prompts)
    assert torch.equal(verified, decoded)


def test_the_mode_computes_the_model(tiny_model: TinyModel) -> None:
    """Every prompt row's logits (the prefill's attention as decode rows) are transformers'."""
    core = invariant_core(tiny_model)
    prompt = repeating_prompt(1)
    entry = BatchEntry(0, prompt, list(range(PAGES)), True)
    batch = build_forward_batch([entry], PAGE_SIZE, core.device)
    batch.logits_indices = torch.arange(len(prompt))
    ours = core.model.forward(batch, core.kv_pool)
    torch.testing.assert_close(ours, hf_logits(tiny_model.hf, prompt), atol=1e-4, rtol=1e-4)


def test_the_greedy_continuation_with_drafts_is_transformers(llama_model: TinyModel) -> None:
    prompt = repeating_prompt(1)  # its drafts are accepted
    spec = invariant_core(llama_model, "ngram")
    tokens, _ = generate(spec, [prompt], [greedy(max_tokens=16, ignore_eos=True)], 4)
    assert spec.spec_stats.snapshot().num_accepted_tokens > 0
    assert tokens[0] == hf_greedy(llama_model.hf, prompt, 16, ignore_eos=True)


def test_a_step_alone_is_the_bits_of_the_step_in_a_batch(llama_model: TinyModel) -> None:
    """A prefill and then a decode of one sequence, alone and beside 7 longer and shorter
    ones (in another order), give the same logits bits."""
    core = invariant_core(llama_model)
    prompts = [random_prompt(4 + 5 * i, 90 + i) for i in range(8)]
    pages = [list(range(i * PAGES, (i + 1) * PAGES)) for i in range(8)]
    together = _forward(core, [BatchEntry(0, p, pages[i], True) for i, p in enumerate(prompts)])
    alone = _forward(core, [BatchEntry(0, prompts[3], pages[3], True)])
    assert torch.equal(alone[0], together[3])
    order = [5, 3, 0, 7]
    decodes = [BatchEntry(len(prompts[i]), [7], pages[i], True) for i in order]
    batched = _forward(core, decodes)
    assert torch.equal(_forward(core, [decodes[1]])[0], batched[1])


@pytest.mark.parametrize("method", ["ngram", "suffix"])
def test_greedy_outputs_equal_without_speculation_and_at_batch_one(
    llama_model: TinyModel, method: str
) -> None:
    prompts = [repeating_prompt(s) for s in range(5)] + [random_prompt(9, 60 + s) for s in range(3)]
    sampling = [greedy(max_tokens=20, ignore_eos=True)] * len(prompts)
    off, _ = generate(invariant_core(llama_model), prompts, sampling, 0)
    core = invariant_core(llama_model, method)
    on, _ = generate(core, prompts, sampling, 4)
    stats = core.spec_stats.snapshot()
    assert stats.num_drafts > 0 and stats.num_accepted_tokens > 0  # drafts ran and were kept
    assert on == off
    for i in (1, 6):
        alone, _ = generate(invariant_core(llama_model, method), [prompts[i]], sampling[:1], 4)
        assert alone[0] == on[i]


def test_the_op_set_names_the_mode(llama_model: TinyModel) -> None:
    core = invariant_core(llama_model)
    assert core.model.ops.batch_invariant and core.model.batch_invariant
    assert core.model.ops.name.endswith("+batch-invariant")
    assert not make_core(llama_model).model.ops.batch_invariant


def test_fp8_and_tensor_parallel_are_refused_naming_both_fields(llama_model: TinyModel) -> None:
    with pytest.raises(InvalidArgument, match=r"batch_invariant.*quantization fp8"):
        ExecutorConfig(model_path=str(llama_model.path), batch_invariant=True, quantization="fp8")
    with pytest.raises(InvalidArgument, match=r"batch_invariant.*tensor_parallel_size 2"):
        ExecutorConfig(
            model_path=str(llama_model.path), batch_invariant=True, tensor_parallel_size=2
        )


def test_fp8_weights_are_refused_by_the_model(llama_model: TinyModel) -> None:
    """quantization auto on an FP8 checkpoint resolves at load: the model refuses it."""
    from radixmesh_kernels.batch_invariant import batch_invariant_ops
    from services.executor.core.models.decoder import Decoder, quantize_projections

    core = make_core(llama_model)
    quantize_projections(core.model.weights)
    with pytest.raises(InvalidArgument, match=r"batch_invariant.*FP8"):
        Decoder(core.model.spec, core.model.weights, batch_invariant_ops(core.model.ops, "cpu"), 64)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("graphs", [False, True])
def test_cuda_bf16_verification_and_greedy_identity(llama_model: TinyModel, graphs: bool) -> None:
    """The same on CUDA in bf16 (the Triton matmul and decode attention), eager and with the
    decode and verification steps replayed as graphs."""
    cuda = {"device": "cuda", "dtype": "bfloat16", "cuda_graphs": graphs}
    prompts = [random_prompt(5 + 3 * i, 70 + i) for i in range(8)]
    verified, decoded = verify_and_decode_logits(
        invariant_core(llama_model, cuda_graphs=False, device="cuda", dtype="bfloat16"), prompts
    )
    assert torch.equal(verified, decoded)
    prompts = [repeating_prompt(s) for s in range(5)] + [random_prompt(9, 60 + s) for s in range(3)]
    sampling = [greedy(max_tokens=20, ignore_eos=True)] * len(prompts)
    off, _ = generate(invariant_core(llama_model, **cuda), prompts, sampling, 0)
    for method in ("ngram", "suffix"):
        core = invariant_core(llama_model, method, **cuda)
        on, _ = generate(core, prompts, sampling, 4)
        assert core.spec_stats.snapshot().num_accepted_tokens > 0
        assert on == off, method
    alone, _ = generate(invariant_core(llama_model, "ngram", **cuda), prompts[:1], sampling[:1], 4)
    assert alone[0] == off[0]


@pytest.mark.parametrize(("flag", "expected"), [((), False), (("--batch-invariant",), True)])
def test_serve_batch_invariant_reaches_every_executor(tmp_path, flag, expected) -> None:
    from mesh.launcher import MeshPorts, plan_stages
    from services.executor.main import build_parser, executor_config
    from tests.unit.gateway.test_executor_flags import executor_args, serve_config

    assert executor_config(executor_args(*flag)).batch_invariant is expected
    config = serve_config(tmp_path, *flag, "--executors", "2")
    assert config.batch_invariant is expected
    stages = plan_stages(config, MeshPorts.pick(config.num_executors))
    executors = [s for stage in stages for s in stage if s.name.startswith("executor-")]
    values = [executor_config(build_parser().parse_args(s.argv[3:])).batch_invariant for s in executors]
    assert values == [expected, expected]


def test_serve_refuses_batch_invariant_with_fp8(tmp_path) -> None:
    from tests.unit.gateway.test_executor_flags import serve_config

    with pytest.raises(InvalidArgument, match=r"batch_invariant.*fp8"):
        serve_config(tmp_path, "--batch-invariant", "--quantization", "fp8")


def test_speculative_bench_passes_the_mode_and_reports_it(monkeypatch, capsys) -> None:
    import asyncio
    import importlib
    import types

    from tests.unit.engine.test_bench_warmup import _FakeEngine, _Tokenizer

    bench = importlib.import_module("bench.speculative")
    configs: list[dict] = []

    async def run_batch(engine, prompts, output_len):
        return [[11] * output_len for _ in prompts], 1.0, [0.01] * len(prompts)

    monkeypatch.setattr(bench, "Engine", lambda config: _FakeEngine())
    monkeypatch.setattr(
        bench, "EngineConfig", types.SimpleNamespace(for_model=lambda *a, **k: configs.append(k))
    )
    monkeypatch.setattr(bench, "run_batch", run_batch)
    for flag, expected in (([], False), (["--batch-invariant"], True)):
        args = bench.parse_args([
            "--workloads", "random", "--batch-sizes", "1", "--prompt-len", "16",
            "--output-len", "4", "--device", "cpu", "--modes", "off", "ngram", *flag,
        ])  # fmt: skip
        results = asyncio.run(bench.bench_modes(args, _Tokenizer()))
        assert configs[-1]["batch_invariant"] is expected
        summary = bench.summarize(results, args.batch_invariant)
        assert [row["batch_invariant"] for row in summary.values()] == [expected, expected]


def test_speculative_bench_compares_each_batch_with_the_smaller_ones() -> None:
    import importlib

    bench = importlib.import_module("bench.speculative")
    rows = {"code_edit/b1": {"outputs": [[1, 2]]}, "code_edit/b2": {"outputs": [[1, 2], [3]]},
            "code_edit/b4": {"outputs": [[1, 9], [3], [4], [5]]}, "random/b2": {"outputs": [[7], [8]]}}  # fmt: skip
    assert bench.same_as_smaller_batches(rows, "code_edit/b2")
    assert not bench.same_as_smaller_batches(rows, "code_edit/b4")
    assert bench.same_as_smaller_batches(rows, "random/b2")


def test_the_graph_estimate_counts_the_modes_attention_workspace(llama_model: TinyModel) -> None:
    from radixmesh_kernels.batch_invariant import workspace_bytes
    from services.executor.core.graph_setup import estimate_graph_bytes, plan_graphs
    from services.executor.core.loader import read_model_folder

    spec = read_model_folder(str(llama_model.path)).spec
    fields = {"model_path": str(llama_model.path), "max_num_seqs": 64}
    ngram = SpeculativeConfig(method="ngram", max_batch_size=64, max_draft_tokens=4)
    plain = plan_graphs(ExecutorConfig(**fields, speculative=ngram), 0)
    mode = plan_graphs(ExecutorConfig(**fields, speculative=ngram, batch_invariant=True), 0)
    assert mode.batch_invariant and not plain.batch_invariant and mode.shapes() == plain.shapes()
    args = (spec, torch.bfloat16, spec.vocab_size, 4096, 16)
    grown = estimate_graph_bytes(mode, *args) - estimate_graph_bytes(plain, *args)
    # the verification set's 64 x 5 rows, 16 splits of 256 positions each
    assert grown == workspace_bytes(64 * 5, spec.num_heads, spec.head_dim, 257, 16, None)
    assert grown > 64 * 5 * spec.num_heads * 16 * spec.head_dim * 4


async def test_through_the_engine_with_a_shared_cached_prefix(llama_model: TinyModel) -> None:
    """The in-process engine (scheduler, cache and executor cores): 8 greedy requests whose
    shared 8-token prefix the cache holds (a request of it ran first) give the same tokens
    with ngram drafts as without, and each alone on a fresh engine (its prefix computed, not
    read from the cache) as in the batch."""
    import asyncio

    from mesh.engine import Engine, EngineConfig

    shared = random_prompt(8, 5)
    prompts = [shared + repeating_prompt(s) for s in range(5)]
    prompts += [shared + random_prompt(9, 60 + s) for s in range(3)]
    sampling = greedy(max_tokens=20, ignore_eos=True)

    async def run(method: str, batch: list[list[int]], warm: bool) -> tuple[list, int, int]:
        spec = SpeculativeConfig(method=method, max_batch_size=64)
        config = EngineConfig.for_model(
            str(llama_model.path), device="cpu", page_size=PAGE_SIZE, num_pages=1024,
            max_num_seqs=16, batch_invariant=True, speculative=spec,
        )  # fmt: skip
        async with Engine(config) as engine:
            if warm:
                await (await engine.generate([*shared, 7, 8, 9], sampling)).collect()
            streams = [await engine.generate(p, sampling) for p in batch]
            results = await asyncio.gather(*(s.collect() for s in streams))
            accepted = engine.executors[0].spec_stats.snapshot().num_accepted_tokens
        cached = sum(r.num_cached_tokens for r in results)
        return [r.token_ids for r in results], accepted, cached

    off, _, cached = await run("off", prompts, warm=True)
    assert cached >= 8 * len(prompts)  # every request read the shared prefix's pages
    on, accepted, _ = await run("ngram", prompts, warm=True)
    assert accepted > 0
    assert on == off
    for i in (1, 6):
        alone, _, cached = await run("ngram", [prompts[i]], warm=False)
        assert cached == 0 and alone[0] == off[i]


def test_the_speculative_bench_fails_only_a_broken_promise_of_identity() -> None:
    import importlib

    bench = importlib.import_module("bench.speculative")
    same = {"identical": True, "same_as_smaller_batches": True}
    parted = {"identical": False, "same_as_smaller_batches": True}
    smaller = {"identical": True, "same_as_smaller_batches": False}
    assert bench.exit_status({"a": same, "b": parted}, batch_invariant=False) == 0
    assert bench.exit_status({"a": same, "b": same}, batch_invariant=True) == 0
    assert bench.exit_status({"a": same, "b": parted}, batch_invariant=True) == 1
    assert bench.exit_status({"a": smaller}, batch_invariant=True) == 1
