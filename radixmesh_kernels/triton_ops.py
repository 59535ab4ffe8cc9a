"""The Triton implementation set, registered as the "cuda" backend of `radixmesh_kernels.get_ops`."""

from __future__ import annotations

from radixmesh_kernels import Ops, register_backend
from radixmesh_kernels.bitmask import apply_bitmask_triton
from radixmesh_kernels.fp8_linear import fp8_linear_triton
from radixmesh_kernels.gemv import dense_linear_triton
from radixmesh_kernels.gemv_chain import GEMV_CHAIN
from radixmesh_kernels.kv_store import copy_kv_slots_triton, kv_store_triton
from radixmesh_kernels.paged_decode_attention import paged_decode_attention_triton
from radixmesh_kernels.prefill_attention import prefill_attention_triton
from radixmesh_kernels.rmsnorm import rmsnorm_triton
from radixmesh_kernels.rotary import rotary_triton
from radixmesh_kernels.rotary_kv_store import rotary_kv_store_triton
from radixmesh_kernels.silu_and_mul import silu_and_mul_triton
from radixmesh_kernels.silu_mul_linear import silu_mul_linear_triton

TRITON_OPS = Ops(
    name="triton",
    rmsnorm=rmsnorm_triton,
    rotary=rotary_triton,
    silu_and_mul=silu_and_mul_triton,
    kv_store=kv_store_triton,
    paged_attention=prefill_attention_triton,
    paged_decode_attention=paged_decode_attention_triton,
    apply_bitmask=apply_bitmask_triton,
    fp8_linear=fp8_linear_triton,
    linear=dense_linear_triton,
    rotary_kv_store=rotary_kv_store_triton,
    silu_mul_linear=silu_mul_linear_triton,
    copy_kv_slots=copy_kv_slots_triton,
    gemv_chain=GEMV_CHAIN,
)

register_backend("cuda", lambda: TRITON_OPS)
