"""KV store: writes the new tokens' keys and values into their pages.

Layout contract: k, v are [num_tokens, num_kv_heads, head_dim]; k_cache, v_cache
are [num_pages, page_size, num_kv_heads, head_dim]; slot_mapping is [num_tokens]
int64 with slot = page_id * page_size + offset_in_page.

`kv_store_triton` runs one program per token; it accepts k and v as strided
views (e.g. slices of a fused qkv projection) and skips tokens whose slot is
negative (padding rows of a captured batch).
"""

from __future__ import annotations

import torch

from radixmesh_kernels._triton import check, tl, triton


def kv_store_ref(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    k_cache.view(-1, num_kv_heads, head_dim)[slot_mapping] = k.to(k_cache.dtype)
    v_cache.view(-1, num_kv_heads, head_dim)[slot_mapping] = v.to(v_cache.dtype)


@triton.jit
def _store_token(
    src_ptr, dst_ptr, stride_src_h, stride_dst_h, num_kv_heads, head_dim, offs_h, offs_d
):
    mask = (offs_h[:, None] < num_kv_heads) & (offs_d[None, :] < head_dim)
    vals = tl.load(src_ptr + offs_h[:, None] * stride_src_h + offs_d[None, :], mask=mask)
    tl.store(
        dst_ptr + offs_h[:, None] * stride_dst_h + offs_d[None, :],
        vals.to(dst_ptr.dtype.element_ty),
        mask=mask,
    )


@triton.jit
def _kv_store_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    num_kv_heads,
    head_dim,
    stride_k_t,
    stride_k_h,
    stride_v_t,
    stride_v_h,
    stride_kc_slot,
    stride_kc_h,
    stride_vc_slot,
    stride_vc_h,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot >= 0:
        offs_h = tl.arange(0, BLOCK_H)
        offs_d = tl.arange(0, BLOCK_D)
        _store_token(
            k_ptr + token * stride_k_t,
            k_cache_ptr + slot * stride_kc_slot,
            stride_k_h,
            stride_kc_h,
            num_kv_heads,
            head_dim,
            offs_h,
            offs_d,
        )
        _store_token(
            v_ptr + token * stride_v_t,
            v_cache_ptr + slot * stride_vc_slot,
            stride_v_h,
            stride_vc_h,
            num_kv_heads,
            head_dim,
            offs_h,
            offs_d,
        )


def kv_store_triton(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    check(k_cache.dim() == 4 and k_cache.is_contiguous(), "kv_store: k_cache must be contiguous 4D")
    check(
        v_cache.shape == k_cache.shape and v_cache.is_contiguous(),
        "kv_store: v_cache must match k_cache",
    )
    _, _, num_kv_heads, head_dim = k_cache.shape
    num_tokens = k.shape[0]
    for name, t in (("k", k), ("v", v)):
        check(
            t.shape == (num_tokens, num_kv_heads, head_dim) and t.stride(-1) == 1,
            f"kv_store: {name} must be [num_tokens, num_kv_heads, head_dim] with contiguous head_dim",
        )
    check(slot_mapping.shape == (num_tokens,), "kv_store: slot_mapping must be [num_tokens]")
    if num_tokens == 0:
        return
    _kv_store_kernel[(num_tokens,)](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        num_kv_heads,
        head_dim,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(1),
        v_cache.stride(2),
        BLOCK_H=triton.next_power_of_2(num_kv_heads),
        BLOCK_D=triton.next_power_of_2(head_dim),
        num_warps=4,
    )


def copy_cache_slots(cache: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
    """Copies slot src[i] to slot dst[i] (slot = page_id * page_size + offset) of one
    contiguous [num_pages, page_size, ...] cache, as raw bytes whatever its dtype. src and
    dst are [n] int64 on the cache's device; a destination is never another copy's source
    (a slot copied onto itself is allowed: it changes nothing)."""
    if not cache.is_contiguous():
        raise ValueError("a paged KV tensor must be contiguous to copy its slots")
    slots = cache.view(torch.uint8).view(cache.shape[0] * cache.shape[1], -1)
    slots.index_copy_(0, dst, slots.index_select(0, src))


def copy_kv_slots_ref(
    k_cache: torch.Tensor, v_cache: torch.Tensor, src: torch.Tensor, dst: torch.Tensor
) -> None:
    """`copy_cache_slots` in a layer's K and V caches."""
    copy_cache_slots(k_cache, src, dst)
    copy_cache_slots(v_cache, src, dst)


@triton.jit
def _copy_kv_slots_kernel(
    k_cache_ptr, v_cache_ptr, src_ptr, dst_ptr, slot_elems, BLOCK: tl.constexpr
):
    i = tl.program_id(0)
    src = tl.load(src_ptr + i).to(tl.int64) * slot_elems
    dst = tl.load(dst_ptr + i).to(tl.int64) * slot_elems
    if src != dst:  # a slot onto itself (a captured graph's padding) moves nothing
        for lo in range(0, slot_elems, BLOCK):
            offs = lo + tl.arange(0, BLOCK)
            mask = offs < slot_elems
            k = tl.load(k_cache_ptr + src + offs, mask=mask)
            tl.store(k_cache_ptr + dst + offs, k, mask=mask)
            v = tl.load(v_cache_ptr + src + offs, mask=mask)
            tl.store(v_cache_ptr + dst + offs, v, mask=mask)


def copy_kv_slots_triton(
    k_cache: torch.Tensor, v_cache: torch.Tensor, src: torch.Tensor, dst: torch.Tensor
) -> None:
    """`copy_kv_slots_ref` in one launch for both caches (a step's page copies run in every
    layer, between its KV store and its attention: one launch a layer, not four ops)."""
    check(
        k_cache.dim() == 4 and k_cache.is_contiguous() and v_cache.shape == k_cache.shape
        and v_cache.is_contiguous() and v_cache.dtype == k_cache.dtype,
        "copy_kv_slots: k_cache and v_cache must be contiguous [num_pages, page_size, ...] alike",
    )  # fmt: skip
    check(
        src.shape == dst.shape and src.dim() == 1,
        "copy_kv_slots: src and dst must be [n] slot indices",
    )
    if src.shape[0] == 0:
        return
    slot_elems = k_cache.shape[2] * k_cache.shape[3]
    _copy_kv_slots_kernel[(src.shape[0],)](
        k_cache, v_cache, src, dst, slot_elems,
        BLOCK=min(triton.next_power_of_2(slot_elems), 2048), num_warps=4,
    )  # fmt: skip
