"""The FP8 linear kernels against the dequantized torch reference, on random inputs."""

from __future__ import annotations

import pytest
import torch
from kernel_factories import DEVICE

from radixmesh_kernels import fp8_linear, gemv
from radixmesh_kernels.fp8_linear import (
    FP8,
    GEMV_MAX_ROWS,
    fp8_gemv_triton,
    fp8_linear_ref,
    fp8_linear_triton,
    quantize_rows_triton,
)
from radixmesh_kernels.tuning import graphed


def _fp8_weight(out_features: int, in_features: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(out_features, in_features, generator=gen)
    w *= torch.logspace(-2, 0, out_features)[:, None]  # rows of different ranges
    scale = w.abs().amax(dim=1) / 448.0
    return (w / scale[:, None]).to(FP8).to(DEVICE), scale.to(DEVICE)


def _randn(*shape: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen).to(dtype).to(DEVICE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("num_rows", [1, 3, 8])
@pytest.mark.parametrize(("out_features", "in_features"), [(40, 72), (100, 600), (16, 1030)])
def test_gemv_matches_the_dequantized_reference(
    num_rows, out_features, in_features, with_bias, dtype
):
    weight, scale = _fp8_weight(out_features, in_features, seed=out_features)
    x = _randn(num_rows, in_features, dtype=dtype, seed=num_rows)
    bias = _randn(out_features, dtype=dtype, seed=7) if with_bias else None
    ours = fp8_gemv_triton(x, weight, scale, bias)
    # fp32 accumulation of the same products; the reference rounds the weight to x's dtype
    ref = fp8_linear_ref(x.float(), weight, scale, None if bias is None else bias.float())
    assert ours.dtype == dtype and ours.shape == (num_rows, out_features)
    tol = {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 3e-2, "rtol": 2e-2}
    torch.testing.assert_close(ours.float(), ref, **tol)


def test_decode_sized_batches_take_the_gemv():
    weight, scale = _fp8_weight(40, 72, seed=9)
    x = _randn(GEMV_MAX_ROWS, 72, dtype=torch.float32, seed=9)
    torch.testing.assert_close(fp8_linear_triton(x, weight, scale), fp8_gemv_triton(x, weight, scale))


def test_gemv_rows_do_not_mix():
    """Each output row depends on its own input row only (a zero row gives the bias)."""
    weight, scale = _fp8_weight(48, 96, seed=3)
    x = _randn(5, 96, dtype=torch.float32, seed=5)
    x[2] = 0
    bias = _randn(48, dtype=torch.float32, seed=6)
    out = fp8_gemv_triton(x, weight, scale, bias)
    torch.testing.assert_close(out[2], bias)
    alone = fp8_gemv_triton(x[4:5].contiguous(), weight, scale, bias)
    torch.testing.assert_close(out[4:5], alone)


def _check_row_quantization(x: torch.Tensor, padded: int) -> None:
    num_rows = x.shape[0]
    q, scale = quantize_rows_triton(x, padded)
    assert q.dtype == FP8 and q.shape == (padded, x.shape[1]) and scale.shape == (padded, 1)
    expected_scale = x.abs().amax(dim=1, keepdim=True) / 448.0
    torch.testing.assert_close(scale[:num_rows], expected_scale)
    assert torch.equal(q[:num_rows].float(), (x / expected_scale).to(FP8).float())
    assert bool((q[num_rows:].float() == 0).all())


@pytest.mark.parametrize("in_features", [64, 1000, 5000])
@pytest.mark.parametrize(("num_rows", "padded"), [(1, 16), (17, 32), (32, 32)])
def test_row_quantization_maps_each_row_max_to_448_and_zeroes_padding(num_rows, padded, in_features):
    # rows made of FP8 values times a per-row power of two, so the expected result needs no
    # rounding
    # (Triton's interpreter rounds float -> e4m3 wrongly where the mantissa carries; the
    # GPU test below checks rounding on random rows)
    codes = _randn(num_rows, in_features, dtype=torch.float32, seed=in_features) * 100
    codes = codes.clamp(-440, 440).to(FP8).float()
    codes[:, 0] = 448.0
    powers = torch.arange(num_rows, device=DEVICE, dtype=torch.float32) - num_rows // 2
    x = codes * torch.exp2(powers)[:, None]
    _check_row_quantization(x, padded)


@pytest.mark.gpu
@pytest.mark.parametrize(("num_rows", "padded"), [(1, 16), (33, 48)])
def test_row_quantization_rounds_random_rows_to_nearest(num_rows, padded):
    x = _randn(num_rows, 4096, dtype=torch.bfloat16, seed=num_rows).float()
    _check_row_quantization(x, padded)


@pytest.mark.gpu
@pytest.mark.parametrize("num_rows", [GEMV_MAX_ROWS + 1, 16, 64, 300])
@pytest.mark.parametrize("with_bias", [False, True])
def test_tensor_core_path_matches_the_reference(num_rows, with_bias):
    weight, scale = _fp8_weight(1024, 4096, seed=num_rows)
    x = _randn(num_rows, 4096, dtype=torch.bfloat16, seed=1)
    bias = _randn(1024, dtype=torch.bfloat16, seed=2) if with_bias else None
    ours = fp8_linear_triton(x, weight, scale, bias).float()
    ref = fp8_linear_ref(x.float(), weight, scale, None if bias is None else bias.float())
    assert ours.shape == (num_rows, 1024)
    # the activations are rounded to FP8 per token: about 2^-4 relative per element
    assert float((ours - ref).norm() / ref.norm()) < 0.04


SPLITK_CONFIGS = [
    gemv.DEFAULT_CONFIG,
    gemv.GemvConfig(block_n=16, block_k=64, split_k=2, num_warps=4),
    gemv.GemvConfig(block_n=8, block_k=32, split_k=4, num_warps=2),
    gemv.GemvConfig(block_n=32, block_k=128, split_k=3, num_warps=4),
    gemv.GemvConfig(block_n=16, block_k=64, split_k=2, num_warps=4, prefetch=True),
    gemv.GemvConfig(block_n=8, block_k=32, split_k=1, num_warps=2, prefetch=True),
]


@pytest.mark.parametrize("cfg", SPLITK_CONFIGS, ids=lambda c: c.describe())
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("num_rows", [1, 2, 5])  # 5: three row pairs, the last one short
@pytest.mark.parametrize(
    ("out_features", "in_features"),
    [(40, 72), (96, 512), (64, 768), (16, 1030)],  # odd, even for some configs, ragged K
)
def test_splitk_gemv_matches_the_dequantized_reference(
    cfg, num_rows, with_bias, out_features, in_features
):
    weight, scale = _fp8_weight(out_features, in_features, seed=in_features)
    x = _randn(num_rows, in_features, dtype=torch.float32, seed=num_rows + 10)
    bias = _randn(out_features, dtype=torch.float32, seed=8) if with_bias else None
    ours = gemv.gemv_splitk(x, weight, scale, bias, cfg)
    ref = fp8_linear_ref(x, weight, scale, bias)
    assert ours.shape == (num_rows, out_features)
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=1e-4)


def test_splitk_gemv_counters_are_zero_after_each_call_so_calls_repeat():
    """The last program of a tile resets its ticket: a second call (as a graph replay
    would make) gives the same output, and the counters read zero between calls."""
    cfg = gemv.GemvConfig(block_n=8, block_k=32, split_k=4, num_warps=2)
    weight, scale = _fp8_weight(24, 256, seed=4)
    x = _randn(3, 256, dtype=torch.float32, seed=4)
    first = gemv.gemv_splitk(x, weight, scale, None, cfg)
    _, counters = gemv.Workspace.get(x.device, 24, cfg)
    assert counters.shape == (3 * gemv.MAX_ROWS // 2,) and bool((counters == 0).all())
    x2 = _randn(3, 256, dtype=torch.float32, seed=5)
    second = gemv.gemv_splitk(x2, weight, scale, None, cfg)
    torch.testing.assert_close(second, fp8_linear_ref(x2, weight, scale), atol=1e-4, rtol=1e-4)
    assert not torch.equal(first, second)
    assert bool((counters == 0).all())


def test_splitk_gemv_in_bfloat16_rounds_once():
    weight, scale = _fp8_weight(48, 1024, seed=11)
    x = _randn(2, 1024, dtype=torch.bfloat16, seed=12)
    cfg = gemv.GemvConfig(block_n=16, block_k=128, split_k=4, num_warps=4)
    ours = gemv.gemv_splitk(x, weight, scale, None, cfg)
    exact = fp8_linear_ref(x.float(), weight, scale)
    assert ours.dtype == torch.bfloat16
    # one rounding of the fp32 sum to bf16: within one bf16 ulp (2^-7 relative; the
    # interpreter's float -> bf16 cast may truncate where the device rounds to nearest)
    torch.testing.assert_close(ours.float(), exact, atol=1e-3, rtol=2**-7)


def test_splitk_gemv_refuses_more_rows_than_it_serves():
    weight, scale = _fp8_weight(16, 64, seed=1)
    rows = gemv.MAX_ROWS + 1
    with pytest.raises(ValueError, match=f"1 to {gemv.MAX_ROWS} rows"):
        gemv.gemv_splitk(_randn(rows, 64, dtype=torch.float32, seed=1), weight, scale, None)


def test_plan_off_the_gpu_is_the_default_config_and_legacy_mode_the_reference():
    weight, scale = _fp8_weight(40, 72, seed=9)
    x = _randn(1, 72, dtype=torch.float32, seed=9)
    fallbacks = fp8_linear.GEMV_FALLBACKS
    if not torch.cuda.is_available():
        plan = gemv.gemv_plan(x, weight, scale, None, fallbacks)
        assert plan.name == gemv.DEFAULT_CONFIG.describe()
    previous, gemv.MODE = gemv.MODE, "legacy"
    try:
        assert gemv.gemv_plan(x, weight, scale, None, fallbacks).name == "onepass"
    finally:
        gemv.MODE = previous


@pytest.mark.gpu
@pytest.mark.parametrize("num_rows", [1, 2, 5])
@pytest.mark.parametrize(("out_features", "in_features"), [(6144, 4096), (4096, 14336)])
def test_tuned_plan_on_the_gpu_agrees_and_is_no_slower_than_the_one_pass_kernel(
    num_rows, out_features, in_features
):
    gemv.reset_plans()
    weight, scale = _fp8_weight(out_features, in_features, seed=2)
    x = _randn(num_rows, in_features, dtype=torch.bfloat16, seed=3)
    out = fp8_linear_triton(x, weight, scale)
    (plan,) = gemv.chosen_plans()
    timings = plan["timings_us"]
    assert "onepass" in timings and timings[plan["chosen"]] <= timings["onepass"]
    ref = fp8_linear_ref(x.float(), weight, scale)
    assert float((out.float() - ref).norm() / ref.norm()) < 1e-2
    replay = graphed(lambda: fp8_linear_triton(x, weight, scale))
    for _ in range(3):
        captured = replay()
    torch.testing.assert_close(captured, out)


@pytest.mark.parametrize(
    "cfg",
    (*gemv.BF16_CANDIDATES[:1], gemv.GemvConfig(8, 64, 3, 2), gemv.GemvConfig(8, 32, 2, 2, True)),
    ids=str,
)
@pytest.mark.parametrize("num_rows", [1, 2, 3])
@pytest.mark.parametrize(("out_features", "in_features"), [(40, 72), (64, 768)])
def test_splitk_gemv_of_a_plain_weight_matches_f_linear(cfg, num_rows, out_features, in_features):
    """No scale: the kernel streams 2-byte weights in the activations' dtype."""
    gen = torch.Generator().manual_seed(out_features)
    weight = torch.randn(out_features, in_features, generator=gen).to(DEVICE)
    x = _randn(num_rows, in_features, dtype=torch.float32, seed=num_rows)
    bias = _randn(out_features, dtype=torch.float32, seed=2)
    ours = gemv.gemv_splitk(x, weight.to(torch.bfloat16).float(), None, bias, cfg)
    ref = torch.nn.functional.linear(x, weight.to(torch.bfloat16).float(), bias)
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=1e-4)
    x16, w16 = x.to(torch.bfloat16), weight.to(torch.bfloat16)
    ours16 = gemv.gemv_splitk(x16, w16, None, None, cfg)
    exact = torch.nn.functional.linear(x16.float(), w16.float())
    torch.testing.assert_close(ours16.float(), exact, atol=1e-3, rtol=2**-7)


def test_dense_linear_op_is_f_linear_off_the_gpu_and_for_wider_batches():
    weight = _randn(24, 32, dtype=torch.float32, seed=3)
    for rows in (1, 2, 5):
        x = _randn(rows, 32, dtype=torch.float32, seed=rows)
        torch.testing.assert_close(
            gemv.dense_linear_triton(x, weight), torch.nn.functional.linear(x, weight)
        )


@pytest.mark.gpu
@pytest.mark.parametrize("num_rows", [1, 2])
def test_dense_linear_op_on_the_gpu_is_tuned_and_agrees_with_cublas(num_rows):
    gemv.reset_plans()
    gen = torch.Generator().manual_seed(1)
    weight = (0.02 * torch.randn(6144, 4096, generator=gen)).to(DEVICE, torch.bfloat16)
    x = _randn(num_rows, 4096, dtype=torch.bfloat16, seed=4)
    out = gemv.dense_linear_triton(x, weight)
    (plan,) = gemv.chosen_plans()
    assert plan["weight"] == "bfloat16" and "cublas" in plan["timings_us"]
    assert plan["timings_us"][plan["chosen"]] <= plan["timings_us"]["cublas"]
    ref = torch.nn.functional.linear(x.float(), weight.float())
    assert float((out.float() - ref).norm() / ref.norm()) < 1e-2


def test_tuning_keeps_the_fastest_candidate_that_agrees(monkeypatch):
    """The choice logic, with made-up timings: a faster config whose output is wrong, or
    that raises, is never chosen; the reference wins when nothing agreeing beats it."""
    weight, scale = _fp8_weight(40, 72, seed=9)
    x = _randn(1, 72, dtype=torch.float32, seed=9)
    good, bad = gemv.GemvConfig(8, 32, 2, 2), gemv.GemvConfig(16, 32, 1, 4)
    monkeypatch.setitem(gemv.CANDIDATES, 1, (good, bad))

    def reference(x, w, s, b):
        return fp8_linear_ref(x, w, s, b)

    def broken(x, w, s, b):
        raise RuntimeError("out of resources")

    real_splitk = gemv._splitk_fn
    monkeypatch.setattr(
        gemv, "_splitk_fn",
        lambda cfg, gated=False: (
            (lambda *a: real_splitk(cfg)(*a) + 1.0) if cfg == bad else real_splitk(cfg)
        ),
    )  # fmt: skip

    def run(timings: dict[str, float]) -> gemv.GemvPlan:
        names = iter(timings)
        monkeypatch.setattr(gemv, "_time_us", lambda fn, flush: timings[next(names)])
        return gemv._tune(x, weight, scale, None, {"ref": reference, "broken": broken})

    # timed in order: ref, then the configs that ran and agree (broken and bad are not)
    plan = run({"ref": 10.0, good.describe(): 6.0})
    assert plan.name == good.describe()
    assert dict(plan.timings_us) == {"ref": 10.0, good.describe(): 6.0}
    torch.testing.assert_close(plan.fn(x, weight, scale, None), fp8_linear_ref(x, weight, scale))
    assert run({"ref": 5.0, good.describe(): 6.0}).name == "ref"
