"""Factories for kernel tests: paged batches and per-dtype tolerances."""

from __future__ import annotations

from dataclasses import dataclass

import torch

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@dataclass(frozen=True, slots=True)
class PagedBatch:
    """A batch laid out as the attention kernels read it: caches, page table, lengths."""

    k_cache: torch.Tensor
    v_cache: torch.Tensor
    page_table: torch.Tensor
    seq_lens: torch.Tensor
    cu_seqlens_q: torch.Tensor
    q: torch.Tensor
    scale: float


def make_paged_batch(
    q_lens: list[int],
    seq_lens: list[int],
    *,
    num_kv_heads: int,
    group: int,
    head_dim: int,
    page_size: int,
    dtype: torch.dtype,
    seed: int,
    device: torch.device = DEVICE,
) -> PagedBatch:
    """Random KV for every sequence in shuffled pages of a NaN-filled cache.

    Slots past a sequence's length, spare pages and unused page-table entries
    (pointing at a NaN page) hold NaN, so a kernel that reads outside the
    contract produces NaN.
    """
    gen = torch.Generator().manual_seed(seed)
    pages_per_seq = [-(-n // page_size) for n in seq_lens]
    max_pages = max(max(pages_per_seq), 1) + 1  # one unused column at least
    num_pages = sum(pages_per_seq) + 2
    shape = (num_pages, page_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=dtype)
    v_cache = torch.full(shape, float("nan"), dtype=dtype)
    order = torch.randperm(num_pages, generator=gen).to(torch.int32)
    spare_page = order[-1]
    page_table = torch.full((len(seq_lens), max_pages), int(spare_page), dtype=torch.int32)
    used = 0
    for b, (n, num_seq_pages) in enumerate(zip(seq_lens, pages_per_seq, strict=True)):
        page_row = order[used : used + num_seq_pages]
        used += num_seq_pages
        page_table[b, :num_seq_pages] = page_row
        if n == 0:
            continue
        slots = (page_row.long()[:, None] * page_size + torch.arange(page_size)).flatten()[:n]
        kv_shape = (n, num_kv_heads, head_dim)
        k_cache.view(-1, num_kv_heads, head_dim)[slots] = torch.randn(kv_shape, generator=gen).to(
            dtype
        )
        v_cache.view(-1, num_kv_heads, head_dim)[slots] = torch.randn(kv_shape, generator=gen).to(
            dtype
        )
    cu = [0]
    for n in q_lens:
        cu.append(cu[-1] + n)
    q = torch.randn((cu[-1], num_kv_heads * group, head_dim), generator=gen).to(dtype)
    return PagedBatch(
        k_cache=k_cache.to(device),
        v_cache=v_cache.to(device),
        page_table=page_table.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        cu_seqlens_q=torch.tensor(cu, dtype=torch.int32, device=device),
        q=q.to(device),
        scale=head_dim**-0.5,
    )


def tolerance(dtype: torch.dtype) -> dict[str, float]:
    """assert_close tolerances for a kernel output of this dtype against its reference."""
    return {
        torch.float32: {"atol": 2e-5, "rtol": 2e-5},
        torch.float16: {"atol": 2e-3, "rtol": 2e-3},
        torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2},
    }[dtype]


def seeded_randn(*shape: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Standard normal values from a seeded CPU generator, on the test device."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen).to(DEVICE, dtype)


def fp8_rows(out_features: int, in_features: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A random float8_e4m3fn weight [out, in] with per-row scales (each row's max at 448)."""
    w = seeded_randn(out_features, in_features, seed=seed).cpu()
    scale = w.abs().amax(dim=1) / 448.0
    return (w / scale[:, None]).to(torch.float8_e4m3fn).to(DEVICE), scale.to(DEVICE)
