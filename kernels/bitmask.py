"""Grammar bitmask apply: logits of tokens the grammar forbids become -inf.

Layout contract: logits is [num_rows, vocab_size] float; bitmask is
[num_rows, ceil(vocab_size / 32)] int32 where bit j of word i allows token
32 * i + j (xgrammar's layout). Applied in place.
"""

from __future__ import annotations

import torch


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[num_rows, vocab_size] bool, True where the token is allowed."""
    shifts = torch.arange(32, device=bitmask.device, dtype=torch.int32)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab_size].bool()


def apply_bitmask_ref(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    allowed = unpack_bitmask(bitmask, logits.shape[-1])
    logits.masked_fill_(~allowed, float("-inf"))
