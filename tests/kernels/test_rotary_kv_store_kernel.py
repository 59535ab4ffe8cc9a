"""The fused rotary + KV store kernel against the two reference ops, on random inputs."""

from __future__ import annotations

import pytest
import torch
from kernel_factories import DEVICE

from radixmesh_kernels.kv_store import kv_store_ref
from radixmesh_kernels.rotary import rope_cos_sin_cache, rotary_ref
from radixmesh_kernels.rotary_kv_store import rotary_kv_store_ref, rotary_kv_store_triton

PAGE_SIZE = 4


def _inputs(num_tokens, num_heads, num_kv_heads, head_dim, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    # q, k, v as views of one fused projection, as the model hands them over
    width = (num_heads + 2 * num_kv_heads) * head_dim
    qkv = torch.randn(num_tokens, width, generator=gen).to(DEVICE, dtype)
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
    q = q.reshape(num_tokens, num_heads, head_dim)
    k = k.reshape(num_tokens, num_kv_heads, head_dim)
    v = v.reshape(num_tokens, num_kv_heads, head_dim)
    num_pages = 2 * num_tokens // PAGE_SIZE + 2
    shape = (num_pages, PAGE_SIZE, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(DEVICE, dtype)
    v_cache = torch.randn(shape, generator=gen).to(DEVICE, dtype)
    slots = torch.randperm(num_pages * PAGE_SIZE, generator=gen)[:num_tokens].to(DEVICE)
    positions = torch.randint(0, 200, (num_tokens,), generator=gen).to(DEVICE)
    cache = rope_cos_sin_cache(head_dim, 256, 500000.0).to(DEVICE)
    return q, k, v, positions, cache, k_cache, v_cache, slots


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("num_tokens", "num_heads", "num_kv_heads", "head_dim"),
    [(1, 32, 8, 128), (7, 4, 2, 80), (13, 6, 1, 64)],
)
def test_fused_kernel_equals_rotary_then_kv_store(num_tokens, num_heads, num_kv_heads, head_dim, dtype):
    args = _inputs(num_tokens, num_heads, num_kv_heads, head_dim, dtype, seed=num_tokens)
    q, k, v, positions, cache, k_cache, v_cache, slots = args
    ref_k_cache, ref_v_cache = k_cache.clone(), v_cache.clone()
    ref_q, ref_k = rotary_ref(q, k, positions, cache)
    kv_store_ref(ref_k, v, ref_k_cache, ref_v_cache, slots)
    got_q = rotary_kv_store_triton(q, k, v, positions, cache, k_cache, v_cache, slots)
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 1e-2}
    torch.testing.assert_close(got_q, ref_q, **tol)
    torch.testing.assert_close(k_cache, ref_k_cache, **tol)
    assert torch.equal(v_cache, ref_v_cache)  # values are copied, never rounded again


def test_negative_slots_are_skipped_and_other_slots_untouched():
    q, k, v, positions, cache, k_cache, v_cache, slots = _inputs(6, 4, 2, 64, torch.float32, seed=3)
    slots[1] = -1
    slots[4] = -1
    before_k, before_v = k_cache.clone(), v_cache.clone()
    rotary_kv_store_triton(q, k, v, positions, cache, k_cache, v_cache, slots)
    flat_k = k_cache.view(-1, 2, 64)
    changed = (flat_k != before_k.view(-1, 2, 64)).flatten(1).any(1).nonzero().flatten()
    assert set(changed.tolist()) == {int(s) for s in slots.tolist() if s >= 0}
    ref_k_cache, ref_v_cache = before_k.clone(), before_v.clone()
    ref_q = rotary_kv_store_ref(q, k, v, positions, cache, ref_k_cache, ref_v_cache, slots)
    torch.testing.assert_close(k_cache, ref_k_cache)
    torch.testing.assert_close(v_cache, ref_v_cache)
    torch.testing.assert_close(rotary_ref(q, k, positions, cache)[0], ref_q)


def test_bad_layouts_are_refused_naming_the_argument():
    q, k, v, positions, cache, k_cache, v_cache, slots = _inputs(3, 4, 2, 64, torch.float32, seed=1)
    with pytest.raises(ValueError, match="v must be"):
        rotary_kv_store_triton(q, k, v[:, :1], positions, cache, k_cache, v_cache, slots)
    with pytest.raises(ValueError, match="slot_mapping"):
        rotary_kv_store_triton(q, k, v, positions, cache, k_cache, v_cache, slots[:2])
    with pytest.raises(ValueError, match="cos_sin_cache"):
        rotary_kv_store_triton(q, k, v, positions, cache.double(), k_cache, v_cache, slots)
