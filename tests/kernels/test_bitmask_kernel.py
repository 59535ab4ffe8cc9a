"""Triton grammar bitmask apply against the torch reference and xgrammar's own apply."""

from __future__ import annotations

import pytest
import torch
from kernel_factories import DEVICE

from radixmesh_kernels.bitmask import apply_bitmask_ref, apply_bitmask_triton


def _random_bitmask(num_rows: int, vocab_size: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    words = torch.randint(-(2**31), 2**31, (num_rows, (vocab_size + 31) // 32), generator=gen)
    words[0] = -1  # a row allowing everything
    words[1] = 0  # a row allowing nothing
    return words.to(torch.int32).to(DEVICE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab_size", [100, 5001])
def test_apply_bitmask_matches_reference(vocab_size, dtype):
    bitmask = _random_bitmask(3, vocab_size, seed=vocab_size)
    logits = (
        torch.randn(3, vocab_size, generator=torch.Generator().manual_seed(1)).to(dtype).to(DEVICE)
    )
    expected = logits.clone()
    apply_bitmask_ref(expected, bitmask)
    apply_bitmask_triton(logits, bitmask)
    assert torch.equal(logits, expected)
    assert logits[0].isfinite().all()
    assert logits[1].isneginf().all()


def test_apply_bitmask_matches_xgrammar():
    xgr = pytest.importorskip("xgrammar")
    vocab_size = 1234
    bitmask = _random_bitmask(2, vocab_size, seed=2)
    logits = torch.randn(2, vocab_size, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    expected = logits.clone().cpu()
    xgr.apply_token_bitmask_inplace(expected, bitmask.cpu())
    apply_bitmask_triton(logits, bitmask)
    assert torch.equal(logits.cpu(), expected)


def test_apply_bitmask_rejects_a_short_bitmask():
    logits = torch.zeros(2, 100, device=DEVICE)
    with pytest.raises(ValueError, match="bitmask"):
        apply_bitmask_triton(logits, torch.zeros(2, 3, dtype=torch.int32, device=DEVICE))
