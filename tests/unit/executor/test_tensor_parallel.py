"""Tensor parallelism on CPU: two gloo ranks in two processes against one core.

Rank 0 drives its core through `LeaderCore` (each plan broadcast to rank 1, which runs
`run_follower`); greedy tokens must equal the single-process core's, and the logits of
a prompt must agree within float32 rounding (the sums of the row-parallel projections
are taken in a different order).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from radixmesh.errors import InvalidArgument
from services.executor.core.config import ExecutorConfig
from services.executor.core.executor import ExecutorCore
from services.executor.core.forward_batch import BatchEntry, build_forward_batch
from services.executor.core.models.fp8 import Fp8Weight, quantize_weight
from services.executor.core.models.spec import ModelSpec
from services.executor.core.models.tensor_parallel import (
    TensorParallel,
    check_divisible,
    shard_spec,
    shard_weights,
)
from services.executor.core.tensor_parallel import LeaderCore, init_group, run_follower
from tests.fixtures.executor_driver import generate
from tests.unit.executor.conftest import (
    TinyModel,
    greedy,
    make_core,
    random_prompt,
    save_tiny_model,
)

WORLD_SIZE = 2
MAX_TOKENS = 10
LOGITS_ATOL = 2e-4


def prompts() -> list[list[int]]:
    return [random_prompt(23, seed=3), random_prompt(9, seed=4), random_prompt(40, seed=5)]


def prompt_logits(core: Any, prompt: list[int]) -> torch.Tensor:
    """Every row's logits of `prompt` run alone on pages 0.. (after the generation)."""
    page_size = core.config.page_size
    pages = list(range(-(-len(prompt) // page_size)))
    batch = build_forward_batch([BatchEntry(0, prompt, pages, True)], page_size, core.device)
    batch.logits_indices = torch.arange(batch.num_tokens)
    return core.model.forward(batch, core.kv_pool)


def config_for(path: Path, world_size: int, **overrides: Any) -> ExecutorConfig:
    fields: dict[str, Any] = {"model_path": str(path), "device": "cpu", "page_size": 4,
                              "num_pages": 64, "tensor_parallel_size": world_size}  # fmt: skip
    return ExecutorConfig(**{**fields, **overrides})


def _rank(rank: int, init_file: str, path: str, out: str, overrides: dict[str, Any]) -> None:
    group = init_group(rank, WORLD_SIZE, f"file://{init_file}", torch.device("cpu"))
    try:
        core = ExecutorCore(config_for(Path(path), WORLD_SIZE, **overrides), None, group.tp)
        result: dict[str, Any] = {"num_pages": core.info.num_pages}
        if rank == 0:
            leader = LeaderCore(core, group)
            outputs = generate(leader, prompts(), greedy(MAX_TOKENS, ignore_eos=True))  # type: ignore[arg-type]
            result["tokens"] = [o.token_ids for o in outputs]
            leader.stop_followers()
        else:
            result["steps"] = run_follower(core, group)
        result["logits"] = prompt_logits(core, prompts()[2])
        torch.save(result, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def run_group(model: TinyModel, tmp_path: Path, **overrides: Any) -> list[dict[str, Any]]:
    args = (str(tmp_path / "init"), str(model.path), str(tmp_path), overrides)
    mp.start_processes(_rank, args=args, nprocs=WORLD_SIZE, join=True, start_method="spawn")
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD_SIZE)]


def single(model: TinyModel, **overrides: Any) -> tuple[list[list[int]], torch.Tensor]:
    core = make_core(model, **overrides)
    outputs = generate(core, prompts(), greedy(MAX_TOKENS, ignore_eos=True))
    return [o.token_ids for o in outputs], prompt_logits(core, prompts()[2])


def check_group_equals_single(model: TinyModel, tmp_path: Path, **overrides: Any) -> None:
    leader, follower = run_group(model, tmp_path, **overrides)
    tokens, logits = single(model, **overrides)
    assert leader["tokens"] == tokens
    assert all(len(t) == MAX_TOKENS for t in tokens)
    assert follower["steps"] > 0
    assert leader["num_pages"] == follower["num_pages"] == 64
    torch.testing.assert_close(leader["logits"], logits, atol=LOGITS_ATOL, rtol=0)
    assert torch.equal(leader["logits"], follower["logits"])  # gathered: the same bits


def test_tp2_greedy_tokens_and_logits_equal_tp1(tiny_model: TinyModel, tmp_path: Path) -> None:
    """Llama (tied and untied, llama3 rope), Mistral, Qwen2 (q/k/v bias), Qwen3 (q/k norm,
    head_dim 32 != hidden / heads)."""
    check_group_equals_single(tiny_model, tmp_path)


def test_tp2_with_one_kv_head_replicated_and_a_vocabulary_padded(tmp_path: Path) -> None:
    """One KV head for two ranks (each keeps a copy) and 127 tokens (64 rows a rank, the
    last one padding)."""
    model = save_tiny_model(tmp_path / "mqa", "qwen2-tied", num_key_value_heads=1, vocab_size=127)
    check_group_equals_single(model, tmp_path)


def test_tp2_fp8_projections_equal_tp1_fp8(llama_model: TinyModel, tmp_path: Path) -> None:
    """FP8 weights shard with their row scales: the group equals one FP8 core."""
    check_group_equals_single(llama_model, tmp_path, quantization="fp8")


def test_fp8_shards_keep_their_rows_scales(llama_model: TinyModel) -> None:
    core = make_core(llama_model, quantization="fp8")
    spec: ModelSpec = core.model.spec
    full = core.model.weights
    for rank in range(WORLD_SIZE):
        part = shard_weights(full, spec, TensorParallel(rank, WORLD_SIZE))
        layer, whole = part.layers[0], full.layers[0]
        assert isinstance(layer.gate_up, Fp8Weight) and isinstance(whole.gate_up, Fp8Weight)
        inter = spec.intermediate_size // WORLD_SIZE
        gate_rows = slice(rank * inter, (rank + 1) * inter)
        assert torch.equal(layer.gate_up.scale[:inter], whole.gate_up.scale[gate_rows])
        assert isinstance(layer.down, Fp8Weight) and isinstance(whole.down, Fp8Weight)
        assert torch.equal(layer.down.scale, whole.down.scale)  # row-parallel: every row
        assert torch.equal(layer.down.weight.view(torch.uint8),
                           whole.down.weight[:, gate_rows].view(torch.uint8))  # fmt: skip


def test_quantizing_a_shard_equals_sharding_the_quantized_weight() -> None:
    weight = torch.randn(8, 6)
    rows = quantize_weight(weight[4:])
    sharded = quantize_weight(weight)[slice(4, 8)]
    assert torch.equal(rows.scale, sharded.scale)


def test_sizes_that_do_not_split_are_refused_naming_the_field(llama_model: TinyModel) -> None:
    spec = make_core(llama_model).model.spec  # 4 heads, 2 KV heads, intermediate 96
    with pytest.raises(InvalidArgument, match="tensor_parallel_size 3 must divide num_attention_heads"):
        check_divisible(spec, 3)
    with pytest.raises(InvalidArgument, match="num_key_value_heads"):
        check_divisible(dataclasses.replace(spec, num_heads=12, num_kv_heads=3), 4)
    with pytest.raises(InvalidArgument, match="intermediate_size"):
        check_divisible(dataclasses.replace(spec, intermediate_size=90), 4)
    local = shard_spec(spec, TensorParallel(1, 4))
    assert (local.num_heads, local.num_kv_heads, local.intermediate_size) == (1, 1, 24)


def test_a_core_refuses_a_group_of_another_size(llama_model: TinyModel) -> None:
    with pytest.raises(InvalidArgument, match="tensor_parallel_size is 2 but the core was given a group of 1"):
        ExecutorCore(config_for(llama_model.path, 2))


def multi_step_tokens(core: Any) -> dict[str, list[int]]:
    """Two sequences prefilled, then one plan of 6 decode steps; "b" is stopped (as an
    abort plan arriving does) after the plan's second step. Each one's tokens."""
    from radixmesh.step import NewSequence, RunningSequence, StepPlan

    tokens: dict[str, list[int]] = {"a": [], "b": []}
    news = [
        NewSequence(r, p, len(p), 0, len(p), pages, greedy(20, ignore_eos=True))
        for r, p, pages in (("a", random_prompt(7, seed=8), [0, 1, 2, 3]),
                            ("b", random_prompt(5, seed=9), [4, 5, 6, 7]))
    ]  # fmt: skip
    plans = [StepPlan(1, new_seqs=news)]
    plans.append(StepPlan(2, running_seqs=[RunningSequence(r, 1) for r in tokens], num_steps=6))
    results = [core.execute(core.prepare(plans[0])), core.execute(core.prepare(plans[1]))]
    results.append(core.execute(core.prepare_next(plans[1], 1)))
    core.stop(["b"])
    results += [core.execute(core.prepare_next(plans[1], i)) for i in range(2, 6)]
    for result in results:
        for out in result.outputs:
            tokens[out.req_id].append(out.token_id)
    return tokens


def _rank_multi_step(rank: int, init_file: str, path: str, out: str) -> None:
    group = init_group(rank, WORLD_SIZE, f"file://{init_file}", torch.device("cpu"))
    try:
        core = ExecutorCore(config_for(Path(path), WORLD_SIZE), None, group.tp)
        result: dict[str, Any] = {}
        if rank == 0:
            leader = LeaderCore(core, group)
            result["tokens"] = multi_step_tokens(leader)
            leader.stop_followers()
        else:
            result["steps"] = run_follower(core, group)
        torch.save(result, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_tp2_runs_a_multi_step_plan_and_a_stop_inside_it_on_every_rank(
    llama_model: TinyModel, tmp_path: Path
) -> None:
    args = (str(tmp_path / "init"), str(llama_model.path), str(tmp_path))
    mp.start_processes(_rank_multi_step, args=args, nprocs=WORLD_SIZE, join=True, start_method="spawn")  # fmt: skip
    leader, follower = (torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD_SIZE))
    expected = multi_step_tokens(make_core(llama_model))
    assert leader["tokens"] == expected
    assert (len(expected["a"]), len(expected["b"])) == (7, 3)
    assert follower["steps"] == 7  # the prefill and the plan's 6 steps, as on the leader
