"""The one decoder-only transformer behind every registered architecture.

Llama, Mistral, Qwen2 and Qwen3 differ only in the options of `ModelSpec`
(q/k/v bias, per-head q/k RMSNorm, head_dim, rotary parameters, Mistral's
sliding window). Weights are plain tensors with q/k/v and gate/up fused at load
time (the four projections may instead be FP8, see `fp8.py`); every op comes from
`radixmesh_kernels.get_ops(device)`, matrix products go to torch.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from radixmesh.errors import InvalidArgument
from radixmesh_kernels import Ops
from radixmesh_kernels.batch_invariant import decode_rows
from radixmesh_kernels.gemv_chain import ChainLayer, ChainPlan
from radixmesh_kernels.rotary import rope_cos_sin_cache
from services.executor.core.forward_batch import ForwardBatch
from services.executor.core.kv_pool import KVPool
from services.executor.core.models.fp8 import (
    Fp8Weight,
    Weight,
    empty_fp8,
    linear,
    projection,
    quantize_weight,
    silu_mul_linear,
)
from services.executor.core.models.spec import ModelSpec

if TYPE_CHECKING:
    from services.executor.core.models.tensor_parallel import TensorParallel


@dataclass(slots=True)
class LayerWeights:
    input_norm: Tensor
    qkv: Weight
    """[q_size + 2 * kv_size, hidden]: q, then k, then v."""
    qkv_bias: Tensor | None
    q_norm: Tensor | None
    k_norm: Tensor | None
    o_proj: Weight
    o_bias: Tensor | None
    post_norm: Tensor
    gate_up: Weight
    """[2 * intermediate, hidden]: gate, then up."""
    down: Weight

    PROJECTIONS = ("qkv", "o_proj", "gate_up", "down")
    """The fields holding matrices that may be FP8."""


@dataclass(slots=True)
class DecoderWeights:
    embed: torch.Tensor
    layers: list[LayerWeights]
    norm: torch.Tensor
    lm_head: torch.Tensor
    """The same tensor as `embed` when the model ties them."""

    def decode_read_bytes(self) -> int:
        """Bytes a decode step reads from the weights: every layer's tensors (an FP8
        projection's scales included), the final norm and the head; the embedding is
        gathered a few rows a step and not counted. A batch-1 step's floor is this over
        the device's copy bandwidth."""
        tensors = [self.norm, self.lm_head]
        for layer in self.layers:
            for name in layer.__slots__:
                field = getattr(layer, name)
                if isinstance(field, Fp8Weight):
                    tensors += [field.weight, field.scale]
                elif isinstance(field, Tensor):
                    tensors.append(field)
        return sum(t.numel() * t.element_size() for t in tensors)


def empty_weights(
    spec: ModelSpec, dtype: torch.dtype, device: torch.device, fp8: bool = False
) -> DecoderWeights:
    """Uninitialised weights of the right shapes; the loader fills every one.

    With `fp8` the four projections are FP8 weights with per-row scales (an FP8
    checkpoint is copied into them as it is); norms, embeddings and lm_head keep `dtype`.
    """

    def empty(*shape: int) -> Tensor:
        return torch.empty(shape, dtype=dtype, device=device)

    def matrix(rows: int, cols: int) -> Weight:
        return empty_fp8(rows, cols, device) if fp8 else empty(rows, cols)

    qkv_rows = spec.q_size + 2 * spec.kv_size
    layers = [
        LayerWeights(
            input_norm=empty(spec.hidden_size),
            qkv=matrix(qkv_rows, spec.hidden_size),
            qkv_bias=empty(qkv_rows) if spec.qkv_bias else None,
            q_norm=empty(spec.head_dim) if spec.qk_norm else None,
            k_norm=empty(spec.head_dim) if spec.qk_norm else None,
            o_proj=matrix(spec.hidden_size, spec.q_size),
            o_bias=empty(spec.hidden_size) if spec.o_bias else None,
            post_norm=empty(spec.hidden_size),
            gate_up=matrix(2 * spec.intermediate_size, spec.hidden_size),
            down=matrix(spec.hidden_size, spec.intermediate_size),
        )
        for _ in range(spec.num_layers)
    ]
    embed = empty(spec.vocab_size, spec.hidden_size)
    lm_head = embed if spec.tie_word_embeddings else empty(spec.vocab_size, spec.hidden_size)
    return DecoderWeights(embed=embed, layers=layers, norm=empty(spec.hidden_size), lm_head=lm_head)


def quantize_projections(weights: DecoderWeights) -> None:
    """Replaces every layer's projections by FP8 weights with per-row scales, in place."""
    for layer in weights.layers:
        for name in LayerWeights.PROJECTIONS:
            weight = getattr(layer, name)
            if isinstance(weight, Tensor):
                setattr(layer, name, quantize_weight(weight))


def hf_weight_targets(spec: ModelSpec, weights: DecoderWeights) -> dict[str, Tensor]:
    """Hugging Face tensor name -> the view of our weights it is copied into.

    An FP8 projection has two targets per checkpoint matrix: `<name>.weight` (float8) and
    `<name>.weight_scale` (its rows' scales; a per-tensor scale is spread over them).
    """
    q, kv, inter = spec.q_size, spec.kv_size, spec.intermediate_size
    targets: dict[str, Tensor] = {
        "model.embed_tokens.weight": weights.embed,
        "model.norm.weight": weights.norm,
    }

    def add_matrix(name: str, weight: Weight, rows: slice = slice(None)) -> None:
        part = weight[rows]
        if isinstance(part, Fp8Weight):
            targets[name + ".weight"] = part.weight
            targets[name + ".weight_scale"] = part.scale
        else:
            targets[name + ".weight"] = part

    if not spec.tie_word_embeddings:
        targets["lm_head.weight"] = weights.lm_head
    for i, layer in enumerate(weights.layers):
        p = f"model.layers.{i}."
        targets[p + "input_layernorm.weight"] = layer.input_norm
        targets[p + "post_attention_layernorm.weight"] = layer.post_norm
        for name, rows in (("q", slice(0, q)), ("k", slice(q, q + kv)), ("v", slice(q + kv, None))):
            add_matrix(f"{p}self_attn.{name}_proj", layer.qkv, rows)
            if layer.qkv_bias is not None:
                targets[f"{p}self_attn.{name}_proj.bias"] = layer.qkv_bias[rows]
        add_matrix(p + "self_attn.o_proj", layer.o_proj)
        if layer.o_bias is not None:
            targets[p + "self_attn.o_proj.bias"] = layer.o_bias
        if layer.q_norm is not None and layer.k_norm is not None:
            targets[p + "self_attn.q_norm.weight"] = layer.q_norm
            targets[p + "self_attn.k_norm.weight"] = layer.k_norm
        add_matrix(p + "mlp.gate_proj", layer.gate_up, slice(0, inter))
        add_matrix(p + "mlp.up_proj", layer.gate_up, slice(inter, None))
        add_matrix(p + "mlp.down_proj", layer.down)
    return targets


class Decoder:
    """Runs one flattened batch through the model and returns the logits rows asked for.

    Under tensor parallelism (`tp`, see tensor_parallel.py) `spec` and `weights` are this
    rank's shard; every rank runs the same batches, and the logits are whole on each.

    With a batch-invariant op set (`ops.batch_invariant`, radixmesh_kernels/batch_invariant.py) every
    query row of an extend (a verified draft, a prefill) attends through the decode
    attention as the decode of its own position would, so a row's logits do not depend on
    the batch or on how its positions were grouped into steps.
    """

    def __init__(
        self,
        spec: ModelSpec,
        weights: DecoderWeights,
        ops: Ops,
        max_positions: int,
        tp: TensorParallel | None = None,
    ) -> None:
        self.spec = spec
        self.weights = weights
        self.ops = ops
        self.tp = tp if tp is not None and tp.world_size > 1 else None
        self._vocab_start = self.tp.rank * weights.embed.shape[0] if self.tp is not None else 0
        self.scale = spec.head_dim**-0.5
        self.cos_sin_cache = rope_cos_sin_cache(
            spec.head_dim, max_positions, spec.rope_theta, spec.rope_scaling
        ).to(weights.embed.device)
        # Kernels that size their grid from max_q_len take it from the host (no device read).
        attention_params = inspect.signature(ops.paged_attention).parameters
        self._attention_kwargs = ("max_q_len",) if "max_q_len" in attention_params else ()
        # A prefill kernel that reads the new tokens' K/V densely gets them (rotated) too, in
        # steps of at least its min_dense_q_len new tokens in one sequence.
        dense_new_kv = "k_new" in attention_params and "v_new" in attention_params
        self._dense_min_q_len: int | None = (
            int(getattr(ops.paged_attention, "min_dense_q_len", 1)) if dense_new_kv else None
        )
        self.batch_invariant = ops.batch_invariant
        # each layer's projections and norms as the GEMV chain takes them (where the set has it)
        self._chain_layers = [] if ops.gemv_chain is None else [
            ChainLayer(
                projection(layer.qkv, layer.qkv_bias),
                projection(layer.o_proj, layer.o_bias),
                projection(layer.gate_up),
                projection(layer.down),
                layer.input_norm,
                layer.post_norm,
            )
            for layer in weights.layers
        ]
        if self.batch_invariant:
            self._dense_min_q_len = None  # every extend runs as decode rows
            if any(
                not isinstance(getattr(layer, name), torch.Tensor)
                for layer in weights.layers
                for name in LayerWeights.PROJECTIONS
            ):
                raise InvalidArgument(
                    "executor.batch_invariant cannot be combined with FP8 weights "
                    "(executor.quantization fp8, or auto on an FP8 checkpoint): serve the "
                    "model with executor.quantization none"
                )

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, kv_pool: KVPool) -> torch.Tensor:
        """[len(batch.logits_indices), vocab_size] float32 logits."""
        return self.lm_head(self._hidden(batch, kv_pool)[batch.logits_indices])

    @torch.inference_mode()
    def forward_scored(
        self, batch: ForwardBatch, kv_pool: KVPool, rows: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward`'s logits, and the final hidden states at token rows `rows` (for
        prompt log probabilities: the caller applies `lm_head` to the rows it needs)."""
        hidden = self._hidden(batch, kv_pool)
        return self.lm_head(hidden[batch.logits_indices]), hidden[rows]

    @torch.inference_mode()
    def hidden_states(self, batch: ForwardBatch, kv_pool: KVPool) -> torch.Tensor:
        """The final-norm hidden state of every token of the batch (what `forward` takes
        its logits rows from)."""
        return self._hidden(batch, kv_pool)

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final-norm hidden rows -> float32 logits."""
        logits = self.ops.linear(hidden, self.weights.lm_head).float()
        if self.tp is None:
            return logits
        return self.tp.all_gather_last(logits)[:, : self.spec.vocab_size]

    def _embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings; vocab-parallel, each rank looks up the ids it holds (zeros
        elsewhere) and one all-reduce adds them up."""
        if self.tp is None:
            return F.embedding(input_ids, self.weights.embed)
        local = input_ids - self._vocab_start
        outside = (local < 0) | (local >= self.weights.embed.shape[0])
        hidden = F.embedding(local.masked_fill(outside, 0), self.weights.embed)
        return self.tp.all_reduce(hidden.masked_fill_(outside.unsqueeze(-1), 0))

    def _reduce(self, partial: torch.Tensor) -> torch.Tensor:
        """A row-parallel projection's output summed over the ranks."""
        return partial if self.tp is None else self.tp.all_reduce(partial)

    def _hidden(self, batch: ForwardBatch, kv_pool: KVPool) -> torch.Tensor:
        """The final-norm hidden state of every token of the batch."""
        spec, ops = self.spec, self.ops
        hidden = self._embed(batch.input_ids)
        chain = self._chain_plan(hidden)
        if chain is not None:
            return self._hidden_chained(hidden, batch, kv_pool, chain)
        residual: torch.Tensor | None = None
        rows = None  # the batch-invariant mode's extend rows as decode rows (page table, lens)
        if self.batch_invariant and not batch.is_decode:
            rows = decode_rows(batch.cu_seqlens_q, batch.positions, batch.page_table)
        for i, layer in enumerate(self.weights.layers):
            normed, residual = ops.rmsnorm(hidden, layer.input_norm, spec.rms_norm_eps, residual)
            qkv = linear(normed, layer.qkv, layer.qkv_bias, ops)
            attn = self._attention(layer, qkv, batch, kv_pool.k_caches[i], kv_pool.v_caches[i], rows)
            hidden = self._reduce(linear(attn, layer.o_proj, layer.o_bias, ops))
            normed, residual = ops.rmsnorm(hidden, layer.post_norm, spec.rms_norm_eps, residual)
            gate_up = linear(normed, layer.gate_up, None, ops)
            hidden = self._reduce(silu_mul_linear(gate_up, layer.down, ops))
        hidden, _ = ops.rmsnorm(hidden, self.weights.norm, spec.rms_norm_eps, residual)
        return hidden

    def _chain_plan(self, hidden: torch.Tensor) -> ChainPlan | None:
        """The GEMV chain's configurations if this forward takes it (`Ops.gemv_chain`)."""
        chain = self.ops.gemv_chain
        if chain is None or self.tp is not None or hidden.shape[0] > chain.max_rows:
            return None
        return chain.plan(
            hidden.shape[0], hidden.dtype, self._chain_layers[0], self.spec.rms_norm_eps
        )

    def _hidden_chained(
        self, hidden: torch.Tensor, batch: ForwardBatch, kv_pool: KVPool, plan: ChainPlan
    ) -> torch.Tensor:
        """`_hidden` through the GEMV chain (radixmesh_kernels/gemv_chain.py): the norms
        between a layer's projections are formed in the projections' reads."""
        eps, ops, chain = self.spec.rms_norm_eps, self.ops, self.ops.gemv_chain
        layers = self.weights.layers
        normed, residual = ops.rmsnorm(hidden, layers[0].input_norm, eps)
        rstd: torch.Tensor | None = None
        for i, (layer, c) in enumerate(zip(layers, self._chain_layers, strict=True)):
            if rstd is None:  # the first layer: its input norm ran as a kernel
                qkv = linear(normed, layer.qkv, layer.qkv_bias, ops)
            else:
                qkv = chain.norm_linear(residual, rstd, c.input_norm, c.qkv, plan.qkv)
            attn = self._attention(layer, qkv, batch, kv_pool.k_caches[i], kv_pool.v_caches[i])
            residual, rstd = chain.linear_residual(attn, c.o_proj, residual, eps, plan.o_proj)
            gate_up = chain.norm_linear(residual, rstd, c.post_norm, c.gate_up, plan.gate_up)
            residual, rstd = chain.linear_residual(
                gate_up, c.down, residual, eps, plan.down, gated=True
            )
        hidden, _ = ops.rmsnorm(residual, self.weights.norm, eps)
        return hidden

    def _attention(
        self,
        layer: LayerWeights,
        qkv: torch.Tensor,
        batch: ForwardBatch,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        rows: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """The attention of a layer's projected q/k/v (rotary, KV store, attention)."""
        spec, ops = self.spec, self.ops
        num_tokens = qkv.shape[0]
        q, k, v = qkv.split([spec.q_size, spec.kv_size, spec.kv_size], dim=-1)
        q = q.reshape(num_tokens, spec.num_heads, spec.head_dim)
        k = k.reshape(num_tokens, spec.num_kv_heads, spec.head_dim)
        v = v.reshape(num_tokens, spec.num_kv_heads, spec.head_dim)
        if layer.q_norm is not None and layer.k_norm is not None:
            q = self._head_norm(q, layer.q_norm)
            k = self._head_norm(k, layer.k_norm)
        dense_new_kv = (
            self._dense_min_q_len is not None
            and not batch.is_decode
            and batch.dense_attention
            and batch.max_q_len >= self._dense_min_q_len
        )
        if ops.rotary_kv_store is not None and not dense_new_kv:
            # the rotated keys go straight to the cache
            q = ops.rotary_kv_store(
                q, k, v, batch.positions, self.cos_sin_cache, k_cache, v_cache, batch.slot_mapping
            )
        else:
            q, k = ops.rotary(q, k, batch.positions, self.cos_sin_cache)
            ops.kv_store(k, v, k_cache, v_cache, batch.slot_mapping)
        if batch.slot_copies is not None:  # a partial page's KV, after this step's writes
            ops.copy_kv_slots(k_cache, v_cache, *batch.slot_copies)
        window = spec.sliding_window
        if batch.is_decode or rows is not None:
            page_table, seq_lens = rows or (batch.page_table, batch.seq_lens)
            out = ops.paged_decode_attention(
                q, k_cache, v_cache, page_table, seq_lens, self.scale, window
            )
        else:
            extra = {name: getattr(batch, name) for name in self._attention_kwargs}
            if dense_new_kv:
                extra.update(k_new=k, v_new=v)
            out = ops.paged_attention(
                q,
                k_cache,
                v_cache,
                batch.page_table,
                batch.cu_seqlens_q,
                batch.seq_lens,
                self.scale,
                window,
                **extra,
            )
        return out.reshape(num_tokens, spec.q_size)

    def _head_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        normed, _ = self.ops.rmsnorm(x.reshape(-1, shape[-1]), weight, self.spec.rms_norm_eps)
        return normed.reshape(shape)
