"""Triton rmsnorm, rotary, silu_and_mul, kv_store and copy_kv_slots against their torch references."""

from __future__ import annotations

import pytest
import torch
from kernel_factories import DEVICE, tolerance

from radixmesh_kernels.kv_store import (
    copy_kv_slots_ref,
    copy_kv_slots_triton,
    kv_store_ref,
    kv_store_triton,
)
from radixmesh_kernels.rmsnorm import rmsnorm_ref, rmsnorm_triton
from radixmesh_kernels.rotary import rope_cos_sin_cache, rotary_ref, rotary_triton
from radixmesh_kernels.silu_and_mul import silu_and_mul_ref, silu_and_mul_triton

DTYPES = [torch.float32, torch.bfloat16]
LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


def _randn(*shape: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen).to(dtype).to(DEVICE)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("hidden", [96, 1000])
def test_rmsnorm_matches_reference(hidden, with_residual, dtype):
    x = _randn(5, hidden, dtype=dtype, seed=hidden)
    weight = _randn(hidden, dtype=dtype, seed=1)
    residual = _randn(5, hidden, dtype=dtype, seed=2) if with_residual else None
    x_before = x.clone()
    out, new_residual = rmsnorm_triton(x, weight, 1e-6, residual)
    ref_out, ref_residual = rmsnorm_ref(x, weight, 1e-6, residual)
    torch.testing.assert_close(out, ref_out, **tolerance(dtype))
    # one rounding of the sum in both; the interpreter rounds to bf16 toward zero, not to nearest
    torch.testing.assert_close(new_residual, ref_residual, **tolerance(dtype))
    assert torch.equal(x, x_before)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 4), (8, 2), (8, 1)])
@pytest.mark.parametrize("head_dim", [64, 80, 128])
def test_rotary_matches_reference(head_dim, num_heads, num_kv_heads, dtype):
    num_tokens = 7
    cache = rope_cos_sin_cache(head_dim, 256, 500000.0, LLAMA3_SCALING).to(DEVICE)
    # q and k as views of one fused projection, as an attention layer produces them
    qkv = _randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim, dtype=dtype, seed=head_dim)
    q = qkv[:, : num_heads * head_dim].view(num_tokens, num_heads, head_dim)
    k = qkv[:, num_heads * head_dim : (num_heads + num_kv_heads) * head_dim].view(
        num_tokens, num_kv_heads, head_dim
    )
    positions = torch.tensor([0, 1, 5, 63, 64, 200, 255], device=DEVICE)
    qkv_before = qkv.clone()
    q_out, k_out = rotary_triton(q, k, positions, cache)
    q_ref, k_ref = rotary_ref(q, k, positions, cache)
    torch.testing.assert_close(q_out, q_ref, **tolerance(dtype))
    torch.testing.assert_close(k_out, k_ref, **tolerance(dtype))
    assert torch.equal(qkv, qkv_before)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("intermediate", [72, 1500])
def test_silu_and_mul_matches_reference(intermediate, dtype):
    x = _randn(3, 2 * intermediate, dtype=dtype, seed=intermediate)
    torch.testing.assert_close(silu_and_mul_triton(x), silu_and_mul_ref(x), **tolerance(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize(("num_kv_heads", "head_dim"), [(2, 64), (1, 80), (3, 128)])
def test_kv_store_writes_the_same_slots_as_reference(num_kv_heads, head_dim, page_size, dtype):
    num_pages, num_tokens = 6, 5
    gen = torch.Generator().manual_seed(head_dim + page_size)
    slots = torch.randperm(num_pages * page_size, generator=gen)[:num_tokens].to(DEVICE)
    kv = _randn(num_tokens, 2 * num_kv_heads, head_dim, dtype=dtype, seed=head_dim)
    k, v = kv[:, :num_kv_heads], kv[:, num_kv_heads:]  # strided views
    shape = (num_pages, page_size, num_kv_heads, head_dim)
    k_cache, v_cache = _randn(*shape, dtype=dtype, seed=1), _randn(*shape, dtype=dtype, seed=2)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    kv_store_triton(k, v, k_cache, v_cache, slots)
    kv_store_ref(k, v, k_ref, v_ref, slots)
    assert torch.equal(k_cache, k_ref)
    assert torch.equal(v_cache, v_ref)


def test_kv_store_skips_negative_slots():
    k = _randn(3, 2, 64, dtype=torch.float32, seed=0)
    v = _randn(3, 2, 64, dtype=torch.float32, seed=1)
    k_cache = torch.zeros(2, 16, 2, 64, device=DEVICE)
    v_cache = torch.zeros(2, 16, 2, 64, device=DEVICE)
    kv_store_triton(k, v, k_cache, v_cache, torch.tensor([17, -1, 3], device=DEVICE))
    flat_k, flat_v = k_cache.view(-1, 2, 64), v_cache.view(-1, 2, 64)
    assert torch.equal(flat_k[17], k[0]) and torch.equal(flat_k[3], k[2])
    assert torch.equal(flat_v[17], v[0]) and torch.equal(flat_v[3], v[2])
    assert int((flat_k != 0).any(dim=(1, 2)).sum()) == 2


@pytest.mark.parametrize("dtype", [*DTYPES, torch.float8_e4m3fn])
@pytest.mark.parametrize(("num_kv_heads", "head_dim"), [(2, 64), (3, 80), (8, 128), (16, 256)])
def test_copy_kv_slots_copies_the_same_slots_as_reference(num_kv_heads, head_dim, dtype):
    """Random slots of random caches; a slot wider than one block (16 x 256) is copied whole,
    and every slot not a destination is untouched."""
    if dtype == torch.float8_e4m3fn and DEVICE.type != "cuda":
        pytest.skip("FP8 KV caches are a GPU's")
    num_pages, page_size, num_copies = 7, 4, 6
    gen = torch.Generator().manual_seed(num_kv_heads * head_dim)
    slots = torch.randperm(num_pages * page_size, generator=gen)[: 2 * num_copies].to(DEVICE)
    src, dst = slots[:num_copies], slots[num_copies:]
    shape = (num_pages, page_size, num_kv_heads, head_dim)
    k_cache = _randn(*shape, dtype=torch.float32, seed=3).to(dtype)
    v_cache = _randn(*shape, dtype=torch.float32, seed=4).to(dtype)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    k_before = k_cache.clone()
    copy_kv_slots_triton(k_cache, v_cache, src, dst)
    copy_kv_slots_ref(k_ref, v_ref, src, dst)
    for got, want in ((k_cache, k_ref), (v_cache, v_ref)):
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    # slots copied onto themselves (a graph's padding) change nothing
    copy_kv_slots_triton(k_cache, v_cache, dst[:2].repeat(3), dst[:2].repeat(3))
    assert torch.equal(k_cache.view(torch.uint8), k_ref.view(torch.uint8))
    flat, before = k_cache.view(-1, num_kv_heads * head_dim), k_before.view(-1, num_kv_heads * head_dim)
    assert torch.equal(flat[dst].view(torch.uint8), before[src].view(torch.uint8))
    kept = torch.ones(num_pages * page_size, dtype=torch.bool, device=DEVICE)
    kept[dst] = False
    assert torch.equal(flat[kept].view(torch.uint8), before[kept].view(torch.uint8))


@pytest.mark.gpu
def test_fused_residual_add_rounds_like_torch_on_gpu():
    """On a GPU (round to nearest) the fused add gives exactly the unfused bf16 add."""
    x = _randn(64, 4096, dtype=torch.bfloat16, seed=11)
    residual = _randn(64, 4096, dtype=torch.bfloat16, seed=12)
    weight = _randn(4096, dtype=torch.bfloat16, seed=13)
    out, new_residual = rmsnorm_triton(x, weight, 1e-5, residual)
    ref_out, ref_residual = rmsnorm_ref(x, weight, 1e-5, residual)
    assert torch.equal(new_residual, ref_residual)
    torch.testing.assert_close(out, ref_out, **tolerance(torch.bfloat16))
