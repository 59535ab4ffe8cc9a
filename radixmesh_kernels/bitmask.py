"""Grammar bitmask apply: logits of tokens the grammar forbids become -inf.

Layout contract: logits is [num_rows, vocab_size] float; bitmask is
[num_rows, ceil(vocab_size / 32)] int32 where bit j of word i allows token
32 * i + j (xgrammar's layout). Applied in place.

`apply_bitmask_triton` runs a 2D grid of (row, vocab block) programs and only
writes the forbidden entries.
"""

from __future__ import annotations

import torch

from radixmesh_kernels._triton import check, tl, triton


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[num_rows, vocab_size] bool, True where the token is allowed."""
    shifts = torch.arange(32, device=bitmask.device, dtype=torch.int32)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab_size].bool()


def apply_bitmask_ref(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    allowed = unpack_bitmask(bitmask, logits.shape[-1])
    logits.masked_fill_(~allowed, float("-inf"))


@triton.jit
def _apply_bitmask_kernel(
    logits_ptr,
    bitmask_ptr,
    vocab_size,
    stride_logits,
    stride_bitmask,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    in_vocab = offs < vocab_size
    words = tl.load(bitmask_ptr + row * stride_bitmask + offs // 32, mask=in_vocab, other=-1)
    allowed = ((words >> (offs % 32)) & 1) != 0
    tl.store(logits_ptr + row * stride_logits + offs, float("-inf"), mask=in_vocab & ~allowed)


def apply_bitmask_triton(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    check(
        logits.dim() == 2 and logits.stride(-1) == 1,
        "apply_bitmask: logits must be [num_rows, vocab_size]",
    )
    num_rows, vocab_size = logits.shape
    num_words = (vocab_size + 31) // 32
    check(
        bitmask.dim() == 2 and bitmask.shape[0] == num_rows and bitmask.shape[1] >= num_words,
        f"apply_bitmask: bitmask must be [{num_rows}, >= {num_words}] int32",
    )
    check(
        bitmask.dtype == torch.int32 and bitmask.stride(-1) == 1,
        "apply_bitmask: bitmask must be int32",
    )
    if num_rows == 0:
        return
    block_v = 4096
    grid = (num_rows, triton.cdiv(vocab_size, block_v))
    _apply_bitmask_kernel[grid](
        logits,
        bitmask,
        vocab_size,
        logits.stride(0),
        bitmask.stride(0),
        BLOCK_V=block_v,
        num_warps=8,
    )
