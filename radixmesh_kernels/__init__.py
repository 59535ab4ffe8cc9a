"""Compute kernels, one op per module: a torch reference beside each Triton kernel.

`get_ops(device)` picks the implementation set an executor calls: the torch
references on CPU, the Triton kernels on CUDA. Kernels import nothing of the
services.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from radixmesh_kernels.bitmask import apply_bitmask_ref
from radixmesh_kernels.fp8_linear import fp8_linear_ref
from radixmesh_kernels.gemv import dense_linear_ref
from radixmesh_kernels.kv_store import copy_kv_slots_ref, kv_store_ref
from radixmesh_kernels.paged_attention import paged_attention_ref
from radixmesh_kernels.paged_decode_attention import paged_decode_attention_ref
from radixmesh_kernels.rmsnorm import rmsnorm_ref
from radixmesh_kernels.rotary import rotary_ref
from radixmesh_kernels.rotary_kv_store import rotary_kv_store_ref
from radixmesh_kernels.silu_and_mul import silu_and_mul_ref
from radixmesh_kernels.silu_mul_linear import silu_mul_linear_ref


@dataclass(frozen=True, slots=True)
class Ops:
    """One implementation of every op, with the reference signatures.

    Both attention ops take an optional `sliding_window` (keyword, after `scale`):
    a query at position p then attends only the keys at p - sliding_window < k <= p.
    """

    name: str
    rmsnorm: Callable
    rotary: Callable
    silu_and_mul: Callable
    kv_store: Callable
    paged_attention: Callable
    paged_decode_attention: Callable
    apply_bitmask: Callable
    fp8_linear: Callable
    linear: Callable = dense_linear_ref
    """x @ weight.T + bias for plain (not FP8) weights: `F.linear`, or on CUDA the per-shape
    choice between cuBLAS and a split-K GEMV for one or two rows (radixmesh_kernels/gemv.py)."""
    rotary_kv_store: Callable | None = None
    """`rotary` then `kv_store` of the rotated keys in one op (returns the rotated q); None
    when the set has no fused form, or a backend replaced `rotary` or `kv_store` (the model
    then calls those two)."""
    silu_mul_linear: Callable | None = None
    """`silu_and_mul` then `linear` (scale None) or `fp8_linear` (an FP8 weight and its
    scale) in one op: the gated MLP's down projection. None when the set has no fused form,
    or one of those ops was replaced (`FUSED_OPS`; the model then calls them)."""
    copy_kv_slots: Callable = copy_kv_slots_ref
    """Slot src[i] -> dst[i] in a layer's K and V caches (a step's partial-page copies, run
    in every layer between its KV store and its attention)."""
    gemv_chain: Any = None
    """`radixmesh_kernels.gemv_chain.GemvChain`: a decoder layer's projections at decode
    batch sizes as GEMVs that carry the norms between them (not an op: None on sets without
    it, and when an op it does the work of was replaced, `FUSED_OPS`)."""
    batch_invariant: bool = False
    """The set of `radixmesh_kernels.batch_invariant.batch_invariant_ops`: a row's linear and decode
    attention do not depend on the rest of the batch, and the model runs an extend's
    attention as decode rows (not an op: backends cannot replace it)."""


OP_FIELDS_NOT_OPS = frozenset({"name", "gemv_chain", "batch_invariant"})
"""Fields of `Ops` that are not ops (a backend cannot replace them)."""

FUSED_OPS: dict[str, frozenset[str]] = {
    "rotary_kv_store": frozenset({"rotary", "kv_store"}),
    "silu_mul_linear": frozenset({"silu_and_mul", "linear", "fp8_linear"}),
    "gemv_chain": frozenset({"rmsnorm", "silu_and_mul", "linear", "fp8_linear", "silu_mul_linear"}),
}
"""A field doing the work of other ops -> those ops: where one of them is replaced and the
field is not, the field becomes None (its launches would bypass the replacement)."""


def replace_ops(ops: Ops, name: str, **replaced: Any) -> Ops:
    """`ops` named `name` with the fields `replaced`, and each fused field whose ops were
    replaced set to None (`FUSED_OPS`)."""
    for fused, parts in FUSED_OPS.items():
        if fused not in replaced and parts & replaced.keys():
            replaced[fused] = None
    return dataclasses.replace(ops, name=name, **replaced)


def op_names() -> list[str]:
    """The names of the ops an `Ops` set holds, in field order."""
    return [f.name for f in dataclasses.fields(Ops) if f.name not in OP_FIELDS_NOT_OPS]


REFERENCE_OPS = Ops(
    name="torch-reference",
    rmsnorm=rmsnorm_ref,
    rotary=rotary_ref,
    silu_and_mul=silu_and_mul_ref,
    kv_store=kv_store_ref,
    paged_attention=paged_attention_ref,
    paged_decode_attention=paged_decode_attention_ref,
    apply_bitmask=apply_bitmask_ref,
    fp8_linear=fp8_linear_ref,
    linear=dense_linear_ref,
    rotary_kv_store=rotary_kv_store_ref,
    silu_mul_linear=silu_mul_linear_ref,
    copy_kv_slots=copy_kv_slots_ref,
)

_BACKENDS: dict[str, Callable[[], Ops]] = {"cpu": lambda: REFERENCE_OPS}


def register_backend(device_type: str, factory: Callable[[], Ops]) -> None:
    """Plugs an implementation set in for a device type (e.g. "cuda" -> Triton ops)."""
    _BACKENDS[device_type] = factory


def get_ops(device: torch.device | str) -> Ops:
    device_type = torch.device(device).type
    factory = _BACKENDS.get(device_type)
    if factory is None and device_type == "cuda":
        from radixmesh_kernels import triton_ops  # registers the "cuda" backend

        factory = _BACKENDS.get("cuda")
        del triton_ops
    return factory() if factory is not None else REFERENCE_OPS
