"""SiLU-and-mul: the gated MLP activation, silu(gate) * up.

Layout contract: x is [num_tokens, 2 * intermediate] with gate first, then up.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up
