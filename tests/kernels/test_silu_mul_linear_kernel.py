"""The gated down projection (silu_and_mul fused into the GEMV's activation read) against
the two ops it replaces and the torch reference, on random inputs."""

from __future__ import annotations

import pytest
import torch
from kernel_factories import fp8_rows, seeded_randn

from radixmesh_kernels import gemv, gemv_chain
from radixmesh_kernels.fp8_linear import fp8_linear_triton
from radixmesh_kernels.silu_and_mul import silu_and_mul_triton
from radixmesh_kernels.silu_mul_linear import silu_mul_linear_ref, silu_mul_linear_triton
from radixmesh_kernels.tuning import graphed

CONFIGS = [
    gemv.DEFAULT_CONFIG,
    gemv.GemvConfig(block_n=8, block_k=32, split_k=3, num_warps=2),
    gemv.GemvConfig(block_n=16, block_k=64, split_k=2, num_warps=4, prefetch=True),
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.describe())
@pytest.mark.parametrize("num_rows", [1, 2, 5])
@pytest.mark.parametrize(("out_features", "in_features"), [(40, 72), (64, 512), (16, 1030)])
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16-weight", "fp8-weight"])
def test_gated_gemv_matches_silu_and_mul_then_linear(cfg, num_rows, out_features, in_features, fp8):
    x = seeded_randn(num_rows, 2 * in_features, seed=num_rows + in_features)
    if fp8:
        weight, scale = fp8_rows(out_features, in_features, seed=out_features)
    else:
        weight, scale = seeded_randn(out_features, in_features, seed=out_features, dtype=torch.bfloat16).float(), None
    bias = seeded_randn(out_features, seed=3)
    ours = gemv.gemv_splitk(x, weight, scale, bias, cfg, gated=True)
    ref = silu_mul_linear_ref(x, weight, scale, bias)
    assert ours.shape == (num_rows, out_features)
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("cfg", CONFIGS[:2], ids=lambda c: c.describe())
def test_gated_gemv_in_bfloat16_sums_the_values_silu_and_mul_writes(cfg):
    """The activation is rounded as `silu_and_mul` rounds it, so the fused launch and the
    two launches (same configuration) give the same bits."""
    x = seeded_randn(3, 2 * 384, seed=5, dtype=torch.bfloat16)
    weight, scale = fp8_rows(48, 384, seed=6)
    fused = gemv.gemv_splitk(x, weight, scale, None, cfg, gated=True)
    two = gemv.gemv_splitk(silu_and_mul_triton(x), weight, scale, None, cfg)
    assert fused.dtype == torch.bfloat16 and torch.equal(fused, two)
    plain = seeded_randn(48, 384, seed=7, dtype=torch.bfloat16)
    fused = gemv.gemv_splitk(x, plain, None, None, cfg, gated=True)
    assert torch.equal(fused, gemv.gemv_splitk(silu_and_mul_triton(x), plain, None, None, cfg))


def test_gated_gemv_refuses_an_activation_of_the_wrong_width():
    weight, cfg = seeded_randn(16, 64, seed=1), gemv.DEFAULT_CONFIG
    with pytest.raises(ValueError, match="128 columns for a weight of 64"):
        gemv.gemv_splitk(seeded_randn(1, 128, seed=1), weight, None, None, cfg)
    with pytest.raises(ValueError, match=r"64 columns for a weight of 64 \(gated: 2 x in\)"):
        gemv.gemv_splitk(seeded_randn(1, 64, seed=1), weight, None, None, cfg, gated=True)


@pytest.mark.parametrize("num_rows", [1, 3, 12])
def test_op_matches_the_reference_for_plain_and_fp8_weights(num_rows):
    x = seeded_randn(num_rows, 2 * 96, seed=num_rows)
    weight = seeded_randn(32, 96, seed=2)
    torch.testing.assert_close(
        silu_mul_linear_triton(x, weight), silu_mul_linear_ref(x, weight), atol=1e-4, rtol=1e-4
    )
    fp8, scale = fp8_rows(32, 96, seed=3)
    bias = seeded_randn(32, seed=4)
    ours, ref = silu_mul_linear_triton(x, fp8, scale, bias), silu_mul_linear_ref(x, fp8, scale, bias)
    if num_rows <= gemv.MAX_ROWS:  # the GEMV reads the activations as they are
        torch.testing.assert_close(ours, ref, atol=1e-4, rtol=1e-4)
    else:  # the two ops: the tensor-core path, which quantizes the activations per row too
        two = fp8_linear_triton(silu_and_mul_triton(x), fp8, scale, bias)
        assert torch.equal(ours, two) and float((ours - ref).norm() / ref.norm()) < 0.1


def test_op_names_each_layout_error():
    x, weight = seeded_randn(2, 2 * 96, seed=1), seeded_randn(32, 96, seed=2)
    with pytest.raises(ValueError, match="2 x the weight's 96 expected"):
        silu_mul_linear_triton(x[:, :96], weight)
    fp8, scale = fp8_rows(32, 96, seed=3)
    with pytest.raises(ValueError, match="an FP8 weight takes its scale"):
        silu_mul_linear_triton(x, fp8)
    with pytest.raises(ValueError, match="an FP8 weight takes its scale"):
        silu_mul_linear_triton(x, weight, scale)
    with pytest.raises(ValueError, match="contiguous"):
        silu_mul_linear_triton(x.t(), weight)


@pytest.mark.gpu
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
@pytest.mark.parametrize("num_rows", [1, 2])
def test_on_the_gpu_the_fused_form_is_timed_against_the_two_ops_and_replays(
    fp8, num_rows, monkeypatch
):
    monkeypatch.setattr(gemv_chain, "FUSION", "on")  # off by default
    gemv.reset_plans()
    x = (0.5 * seeded_randn(num_rows, 2 * 14336, seed=8)).to(torch.bfloat16)
    if fp8:
        weight, scale = fp8_rows(4096, 14336, seed=9)
    else:
        weight, scale = (0.02 * seeded_randn(4096, 14336, seed=9)).to(torch.bfloat16), None
    out = silu_mul_linear_triton(x, weight, scale)
    gated = [p for p in gemv.chosen_plans() if p["gated"]]
    assert len(gated) == 1
    timings = gated[0]["timings_us"]
    assert timings[gated[0]["chosen"]] <= timings["silu_and_mul + linear"]
    assert any(name.startswith("splitk") for name in timings)  # the fused configs ran
    ref = silu_mul_linear_ref(x.float(), weight.float() if scale is None else weight, scale)
    assert float((out.float() - ref).norm() / ref.norm()) < 1e-2
    replay = graphed(lambda: silu_mul_linear_triton(x, weight, scale))
    for _ in range(3):
        captured = replay()
    torch.testing.assert_close(captured, out)
