"""Every Triton kernel compiles for sm_90 (H100/H200), checked on any machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("hopper_compile.py")
KERNELS = {
    "prefill",
    "prefill packed",
    "decode split",
    "decode reduce",
    "rmsnorm",
    "rotary",
    "silu_and_mul",
    "kv_store",
    "copy_kv_slots",
    "apply_bitmask",
    "gemv",
    "rotary_kv_store",
    "batch-invariant matmul",
    "batch-invariant decode split",
    "batch-invariant decode merge",
}

PDL_KERNELS = {"decode", "rmsnorm", "rotary_kv_store", "silu_and_mul", "gemv"}
"""The decode step's chain: launched as programmatic dependents on Hopper."""


@pytest.mark.slow
def test_every_kernel_compiles_for_sm90_within_shared_memory():
    """In its own process: this one imported triton for the interpreter."""
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    result = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=280, env=env
    )
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    compiled = {name for name in KERNELS for row in rows if row["kernel"].startswith(name)}
    assert compiled == KERNELS
    assert all(row["fits"] for row in rows)
    # the decode chain's dependent launches: every kernel waits for the one ahead before it
    # reads an activation; only the GEMV reads (its first weight tile) ahead of the wait
    dependent = {row["kernel"]: row for row in rows if row["kernel"].endswith(" pdl")}
    assert {name.split()[0] for name in dependent} == PDL_KERNELS
    for name, row in dependent.items():
        assert row["waits"] and row["launches_after_wait"], row
        assert row["loads_before_wait"] == name.startswith("gemv"), row
    plain = [row for row in rows if not row["kernel"].endswith(" pdl")]
    assert plain and all("waits" not in row for row in plain)
