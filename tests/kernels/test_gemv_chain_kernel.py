"""The GEMV chain's two fused launches against the ops they replace, on random inputs:
the residual add with each row's 1/rms after a projection, and the RMSNorm formed in the
next projection's read."""

from __future__ import annotations

import pytest
import torch
from kernel_factories import DEVICE, fp8_rows, seeded_randn

from radixmesh_kernels import gemv
from radixmesh_kernels.fp8_linear import fp8_linear_ref
from radixmesh_kernels.rmsnorm import rmsnorm_ref
from radixmesh_kernels.tuning import graphed

CONFIGS = [
    gemv.GemvConfig(block_n=8, block_k=32, split_k=1, num_warps=2),
    gemv.GemvConfig(block_n=16, block_k=64, split_k=3, num_warps=4),
    gemv.GemvConfig(block_n=16, block_k=64, split_k=2, num_warps=4, prefetch=True),
]
EPS = 1e-5


def _product(x, weight, scale, cfg):
    return gemv.gemv_splitk(x, weight, scale, None, cfg)


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.describe())
@pytest.mark.parametrize("num_rows", [1, 2, 5])
@pytest.mark.parametrize(("hidden", "in_features"), [(96, 200), (40, 72)])
@pytest.mark.parametrize("fp8", [False, True], ids=["plain", "fp8"])
def test_residual_then_norm_is_rmsnorm_between_two_projections(cfg, num_rows, hidden, in_features, fp8):
    """fp32 (the interpreter's casts to bf16 truncate): the residual rows are the plain
    product plus the residual exactly, the 1/rms and the next projection's product that of
    `rmsnorm` to rounding."""
    x = seeded_randn(num_rows, in_features, seed=num_rows)
    weight, scale = fp8_rows(hidden, in_features, seed=hidden) if fp8 else (seeded_randn(hidden, in_features, seed=hidden), None)
    residual = seeded_randn(num_rows, hidden, seed=7)
    new_residual, rstd = gemv.gemv_splitk_residual(x, weight, scale, None, residual, EPS, cfg)
    product = _product(x, weight, scale, cfg)
    norm_weight = 1.0 + 0.2 * seeded_randn(hidden, seed=8)
    normed, want_residual = rmsnorm_ref(product, norm_weight, EPS, residual)
    if fp8:  # the device may fuse the scale's product and the add (one rounding, not two)
        torch.testing.assert_close(new_residual, want_residual, atol=1e-5, rtol=1e-6)
    else:
        assert torch.equal(new_residual, want_residual)
    torch.testing.assert_close(rstd, torch.rsqrt(want_residual.pow(2).mean(-1) + EPS))
    next_weight = seeded_randn(50, hidden, seed=9)
    out = gemv.gemv_splitk(new_residual, next_weight, None, None, cfg, norm=(rstd, norm_weight))
    torch.testing.assert_close(out, normed @ next_weight.T, atol=1e-4, rtol=1e-4)
    if fp8:
        ref = fp8_linear_ref(normed, *fp8_rows(50, hidden, seed=10))
        got = gemv.gemv_splitk(new_residual, *fp8_rows(50, hidden, seed=10), None, cfg, norm=(rstd, norm_weight))
        torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)


def test_gated_residual_is_silu_and_mul_then_the_residual_add():
    cfg = CONFIGS[1]
    x = seeded_randn(3, 2 * 200, seed=1)
    weight, residual = seeded_randn(96, 200, seed=2), seeded_randn(3, 96, seed=3)
    got, rstd = gemv.gemv_splitk_residual(x, weight, None, None, residual, EPS, cfg, gated=True)
    want = gemv.gemv_splitk(x, weight, None, None, cfg, gated=True) + residual
    assert torch.equal(got, want)
    torch.testing.assert_close(rstd, torch.rsqrt(want.pow(2).mean(-1) + EPS))


def test_row_tickets_reset_so_calls_repeat_and_rows_do_not_mix():
    """The last tile of a row pair resets its ticket (as for a graph replay); a row's 1/rms
    is its own whichever rows share its programs."""
    cfg = CONFIGS[1]
    weight = seeded_randn(96, 128, seed=4)
    _, tickets = gemv.Workspace.rows(DEVICE, 96)
    for seed in (1, 2):
        x, residual = seeded_randn(3, 128, seed=seed), seeded_randn(3, 96, seed=seed + 10)
        out, rstd = gemv.gemv_splitk_residual(x, weight, None, None, residual, EPS, cfg)
        assert bool((tickets == 0).all())
        for row in range(3):  # each row alone
            alone, rstd_alone = gemv.gemv_splitk_residual(
                x[row : row + 1], weight, None, None, residual[row : row + 1], EPS, cfg
            )
            assert torch.equal(alone[0], out[row])
            torch.testing.assert_close(rstd_alone[0], rstd[row])


def test_each_layout_error_is_named():
    cfg, weight = CONFIGS[0], seeded_randn(96, 64, seed=1)
    x, rstd = seeded_randn(2, 64, seed=2), torch.ones(2, device=DEVICE)
    with pytest.raises(ValueError, match=r"residual must be \[2, 96\] contiguous"):
        gemv.gemv_splitk_residual(x, weight, None, None, seeded_randn(2, 64, seed=3), EPS, cfg)
    with pytest.raises(ValueError, match=r"residual is torch\.bfloat16"):
        gemv.gemv_splitk_residual(x, weight, None, None, seeded_randn(2, 96, seed=3, dtype=torch.bfloat16), EPS, cfg)
    with pytest.raises(ValueError, match=r"norm needs rstd \[2\] and a weight \[64\]"):
        gemv.gemv_splitk(x, weight, None, None, cfg, norm=(rstd, torch.ones(96, device=DEVICE)))
    narrow = gemv.GemvConfig(block_n=4, block_k=32, split_k=1, num_warps=1)
    with pytest.raises(ValueError, match="a residual needs block_n >= 8, got 4"):
        gemv.gemv_splitk_residual(x, weight, None, None, seeded_randn(2, 96, seed=3), EPS, narrow)
    with pytest.raises(ValueError, match="a norm on the input goes with neither gated"):
        gemv.gemv_splitk(seeded_randn(2, 128, seed=2), weight, None, None, cfg, gated=True, norm=(rstd, rstd))


@pytest.mark.gpu
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_on_the_gpu_a_captured_chain_replays_as_the_unfused_ops(fp8):
    """8B-shaped o_proj -> gate_up -> down in a CUDA graph (dependent launches on where the
    device has them), replayed with new inputs, against rmsnorm and the plain GEMVs."""
    hidden, inter, rows = 4096, 14336, 2

    def proj(out_f, in_f, seed):
        if fp8:
            return fp8_rows(out_f, in_f, seed)
        return (0.02 * seeded_randn(out_f, in_f, seed=seed)).to(torch.bfloat16), None

    o_proj, gate_up, down = proj(hidden, hidden, 1), proj(2 * inter, hidden, 2), proj(hidden, inter, 3)
    norm_w = (1.0 + 0.2 * seeded_randn(hidden, seed=4)).to(torch.bfloat16)
    cfg = gemv.CANDIDATES[1 if fp8 else 2][1]
    attn = seeded_randn(rows, hidden, seed=5, dtype=torch.bfloat16)
    residual = seeded_randn(rows, hidden, seed=6, dtype=torch.bfloat16)

    def chained():
        res, rstd = gemv.gemv_splitk_residual(attn, *o_proj, None, residual, EPS, cfg)
        gu = gemv.gemv_splitk(res, *gate_up, None, cfg, norm=(rstd, norm_w))
        return gemv.gemv_splitk_residual(gu, *down, None, res, EPS, cfg, gated=True)

    def unfused():
        normed, res = rmsnorm_ref(gemv.gemv_splitk(attn, *o_proj, None, cfg), norm_w, EPS, residual)
        gu = gemv.gemv_splitk(normed, *gate_up, None, cfg)
        return gemv.gemv_splitk(gu, *down, None, cfg, gated=True) + res

    replay = graphed(chained)
    for seed in (7, 8):
        attn.copy_(seeded_randn(rows, hidden, seed=seed, dtype=torch.bfloat16))
        out, rstd = replay()
        want = unfused()
        assert float((out.float() - want.float()).norm() / want.float().norm()) < 1e-2
        torch.testing.assert_close(rstd, torch.rsqrt(out.float().pow(2).mean(-1) + EPS), rtol=2e-2, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_on_the_gpu_the_timed_choice_runs_both_ways_and_keeps_the_faster(fp8):
    """The "auto" decision on 8B-shaped random weights: both forms captured, timed and
    compared; the chain is kept only if it was the faster one."""
    from radixmesh_kernels import gemv_chain
    from radixmesh_kernels.gemv_chain import ChainLayer, Projection

    def proj(out_f, in_f, seed):
        if fp8:
            return Projection(*fp8_rows(out_f, in_f, seed))
        return Projection((0.02 * seeded_randn(out_f, in_f, seed=seed)).to(torch.bfloat16))

    hidden, inter = 4096, 14336
    layer = ChainLayer(
        proj(6144, hidden, 1), proj(hidden, hidden, 2), proj(2 * inter, hidden, 3),
        proj(hidden, inter, 4), (1.0 + 0.2 * seeded_randn(hidden, seed=5)).to(torch.bfloat16),
        (1.0 + 0.2 * seeded_randn(hidden, seed=6)).to(torch.bfloat16),
    )  # fmt: skip
    decision = gemv_chain._decide(1, torch.bfloat16, layer, EPS)
    timings = dict(decision.timings_us)
    assert "unfused" in timings, decision.reason
    if decision.plan is not None:
        assert timings["chain"] <= timings["unfused"] * (1 - gemv_chain.MIN_GAIN)
    else:
        assert (
            timings.get("chain", float("inf")) > timings["unfused"] * (1 - gemv_chain.MIN_GAIN)
            or "disagrees" in decision.reason
        )


@pytest.mark.parametrize(
    ("chain_us", "kept", "reason"),
    [
        (600.0, True, "by 2% or more"),
        (627.0, False, "by less than 2%"),  # the H100's bf16 batch-1 timing: 627 against 630
        (630.0, False, "as fast or faster"),
        (700.0, False, "as fast or faster"),
    ],
)
def test_the_chain_is_kept_only_where_it_wins_by_more_than_the_noise(chain_us, kept, reason):
    from radixmesh_kernels import gemv_chain

    keep, why = gemv_chain.chain_pays({"unfused": 630.0, "chain": chain_us})
    assert keep is kept and reason in why
