"""Tensor parallelism inside one executor: each rank holds a shard of every layer.

Megatron's split, over `torch.distributed` (gloo on CPU, NCCL on CUDA):

- q/k/v and gate/up are column-parallel: a rank keeps the rows of its heads (of its
  slice of the intermediate size), so attention and the MLP's activation run on local
  heads with no communication;
- o_proj and down are row-parallel: a rank keeps the matching columns, and one
  all-reduce per projection sums the partial outputs (two per layer). A bias of a
  row-parallel projection is added by rank 0 only;
- KV heads are sharded like the q heads; with fewer KV heads than ranks each KV head is
  replicated on the `world_size / num_kv_heads` ranks whose q heads read it;
- the embedding and lm_head are vocab-parallel: a rank keeps `vocab / world_size` rows
  (padded up to a multiple), looks up only its ids (one all-reduce assembles the
  embeddings) and computes its slice of the logits (one all-gather).

FP8 projections (`fp8.Fp8Weight`, one scale per output row) shard the same way: a
column-parallel shard keeps its rows' scales, a row-parallel shard keeps every row and
its scale and only a slice of the columns.

    tp = TensorParallel(rank, world_size, group)
    spec_r = shard_spec(spec, tp)                 # this rank's heads and sizes
    weights_r = shard_weights(weights, spec, tp)  # slices of the full weights
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from radixmesh.errors import InvalidArgument
from services.executor.core.models.decoder import DecoderWeights, LayerWeights
from services.executor.core.models.fp8 import Fp8Weight, Weight
from services.executor.core.models.spec import ModelSpec


@dataclass(frozen=True, slots=True)
class TensorParallel:
    """This process's place in its group; collectives go over `group`."""

    rank: int
    world_size: int
    group: Any = None
    """The torch.distributed process group of the ranks (None: the default group)."""

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise InvalidArgument(
                f"tensor parallel rank {self.rank} must be in [0, {self.world_size})"
            )

    def all_reduce(self, x: Tensor) -> Tensor:
        """Sums `x` over the ranks, in place; returns it."""
        if self.world_size > 1:
            dist.all_reduce(x, group=self.group)
        return x

    def all_gather_last(self, x: Tensor) -> Tensor:
        """Every rank's `x` side by side along the last dimension (rank order)."""
        if self.world_size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)

    def min_over_ranks(self, value: int, device: torch.device) -> int:
        """The smallest of every rank's `value` (each rank sizes its own memory; the
        group agrees on the least, e.g. one number of KV pages for every rank)."""
        if self.world_size == 1:
            return value
        t = torch.tensor([value], dtype=torch.int64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.group)
        return int(t.item())


SINGLE = TensorParallel(0, 1)


def check_divisible(spec: ModelSpec, world_size: int) -> None:
    """Raises InvalidArgument naming the size that does not split over `world_size` ranks."""
    where = "executor.tensor_parallel_size"
    if spec.num_heads % world_size:
        raise InvalidArgument(
            f"{where} {world_size} must divide num_attention_heads ({spec.num_heads})"
        )
    if spec.num_kv_heads % world_size and world_size % spec.num_kv_heads:
        raise InvalidArgument(
            f"{where} {world_size} must divide num_key_value_heads ({spec.num_kv_heads}) "
            "or be a multiple of it"
        )
    if spec.intermediate_size % world_size:
        raise InvalidArgument(
            f"{where} {world_size} must divide intermediate_size ({spec.intermediate_size})"
        )


def num_local_kv_heads(spec: ModelSpec, world_size: int) -> int:
    return max(1, spec.num_kv_heads // world_size)


def shard_spec(spec: ModelSpec, tp: TensorParallel) -> ModelSpec:
    """The shapes one rank runs: its q heads, its KV heads, its slice of the MLP. The
    vocabulary stays whole: logits are gathered before anyone reads them."""
    check_divisible(spec, tp.world_size)
    return dataclasses.replace(
        spec,
        num_heads=spec.num_heads // tp.world_size,
        num_kv_heads=num_local_kv_heads(spec, tp.world_size),
        intermediate_size=spec.intermediate_size // tp.world_size,
    )


def vocab_shard(spec: ModelSpec, tp: TensorParallel) -> tuple[int, int]:
    """[start, start + rows) of the (padded) vocabulary this rank's embedding rows hold."""
    rows = -(-spec.vocab_size // tp.world_size)
    return tp.rank * rows, rows


def _rows(weight: Weight, parts: list[slice]) -> Weight:
    """The rows `parts` of a weight (with their scales for FP8), stacked, as new tensors."""
    if isinstance(weight, Fp8Weight):
        return Fp8Weight(
            torch.cat([weight.weight[p] for p in parts]).contiguous(),
            torch.cat([weight.scale[p] for p in parts]).contiguous(),
        )
    return torch.cat([weight[p] for p in parts]).contiguous()


def _columns(weight: Weight, cols: slice) -> Weight:
    """The columns `cols` of every row; an FP8 weight keeps every row's scale."""
    if isinstance(weight, Fp8Weight):
        return Fp8Weight(weight.weight[:, cols].contiguous(), weight.scale.clone())
    return weight[:, cols].contiguous()


def _vocab_rows(table: Tensor, start: int, rows: int) -> Tensor:
    part = table[start : start + rows]
    if part.shape[0] == rows:
        return part.contiguous()
    padded = torch.zeros(rows, table.shape[1], dtype=table.dtype, device=table.device)
    padded[: part.shape[0]] = part
    return padded


def shard_weights(weights: DecoderWeights, spec: ModelSpec, tp: TensorParallel) -> DecoderWeights:
    """This rank's slices of the full weights of `spec` (new tensors: the full ones can go)."""
    check_divisible(spec, tp.world_size)
    world, rank, d = tp.world_size, tp.rank, spec.head_dim
    heads = spec.num_heads // world
    q_part = slice(rank * heads * d, (rank + 1) * heads * d)
    kv_heads = num_local_kv_heads(spec, world)
    kv_first = rank * spec.num_kv_heads // world if spec.num_kv_heads < world else rank * kv_heads
    q, kv = spec.q_size, spec.kv_size
    k_part = slice(q + kv_first * d, q + (kv_first + kv_heads) * d)
    v_part = slice(q + kv + kv_first * d, q + kv + (kv_first + kv_heads) * d)
    inter = spec.intermediate_size // world
    gate = slice(rank * inter, (rank + 1) * inter)
    up = slice(spec.intermediate_size + rank * inter, spec.intermediate_size + (rank + 1) * inter)
    layers = []
    for layer in weights.layers:
        qkv_parts = [q_part, k_part, v_part]
        layers.append(
            LayerWeights(
                input_norm=layer.input_norm,
                qkv=_rows(layer.qkv, qkv_parts),
                qkv_bias=None
                if layer.qkv_bias is None
                else torch.cat([layer.qkv_bias[p] for p in qkv_parts]).contiguous(),
                q_norm=layer.q_norm,
                k_norm=layer.k_norm,
                o_proj=_columns(layer.o_proj, q_part),
                o_bias=layer.o_bias if rank == 0 else None,
                post_norm=layer.post_norm,
                gate_up=_rows(layer.gate_up, [gate, up]),
                down=_columns(layer.down, gate),
            )
        )
    start, rows = vocab_shard(spec, tp)
    embed = _vocab_rows(weights.embed, start, rows)
    tied = weights.lm_head is weights.embed
    lm_head = embed if tied else _vocab_rows(weights.lm_head, start, rows)
    return DecoderWeights(embed=embed, layers=layers, norm=weights.norm, lm_head=lm_head)



def weights_to(weights: DecoderWeights, device: torch.device) -> DecoderWeights:
    """The same weights on `device` (the tie of embed and lm_head kept)."""

    def move(w: Any) -> Any:
        if w is None:
            return None
        if isinstance(w, Fp8Weight):
            return Fp8Weight(w.weight.to(device), w.scale.to(device))
        return w.to(device)

    layers = [
        LayerWeights(**{f.name: move(getattr(layer, f.name)) for f in dataclasses.fields(layer)})
        for layer in weights.layers
    ]
    embed = move(weights.embed)
    lm_head = embed if weights.lm_head is weights.embed else move(weights.lm_head)
    return DecoderWeights(embed=embed, layers=layers, norm=move(weights.norm), lm_head=lm_head)
