"""The decode chain's kernels as programmatic dependents (Hopper): the same results as plain
launches, in a captured graph replayed over new inputs, where a kernel reading before the
one ahead has written would show.

Each layer writes the new token's K/V into the cache (rotary_kv_store), and attention reads
it in the next kernel; the split-K GEMVs share their ticket counters and partials across
layers; every kernel's output is the next one's input. Two graphs, captured from the same
calls with dependent launches on and off, run the same inputs on their own copies of the
state and must agree bit for bit (same kernels, same configurations), and both must match
the torch references."""

from __future__ import annotations

import pytest
import torch
from kernel_factories import make_paged_batch

from radixmesh_kernels import _triton
from radixmesh_kernels._triton import dependent_launch
from radixmesh_kernels.fp8_linear import fp8_linear_ref
from radixmesh_kernels.gemv import GemvConfig, gemv_splitk
from radixmesh_kernels.paged_decode_attention import (
    paged_decode_attention_ref,
    paged_decode_attention_triton,
)
from radixmesh_kernels.rmsnorm import rmsnorm_ref, rmsnorm_triton
from radixmesh_kernels.rotary import rope_cos_sin_cache
from radixmesh_kernels.rotary_kv_store import rotary_kv_store_ref, rotary_kv_store_triton
from radixmesh_kernels.silu_and_mul import silu_and_mul_ref, silu_and_mul_triton

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, LAYERS, PAGE = 1024, 8, 2, 128, 2816, 3, 16
EPS = 1e-5


def test_no_dependent_launch_off_cuda_or_when_off(monkeypatch):
    """On by default; the CPU launches plainly even when on; "off" on any device."""
    monkeypatch.delenv("RADIXMESH_DEPENDENT_LAUNCH", raising=False)
    assert _triton._dependent_launch_setting() == "on"
    monkeypatch.setattr(_triton, "DEPENDENT_LAUNCH", "on")
    assert dependent_launch(torch.device("cpu")) == {}
    monkeypatch.setattr(_triton, "DEPENDENT_LAUNCH", "off")
    assert dependent_launch(torch.device("cuda", 0)) == {}
    monkeypatch.setenv("RADIXMESH_DEPENDENT_LAUNCH", "off")
    assert _triton._dependent_launch_setting() == "off"
    monkeypatch.setenv("RADIXMESH_DEPENDENT_LAUNCH", "sometimes")
    with pytest.raises(ValueError, match="RADIXMESH_DEPENDENT_LAUNCH"):
        _triton._dependent_launch_setting()


def _weight(out_features, in_features, fp8, gen):
    w = torch.randn(out_features, in_features, generator=gen) * in_features**-0.5
    if not fp8:
        return w.to(torch.bfloat16).cuda(), None
    scale = w.abs().amax(dim=1) / 448.0
    return (w / scale[:, None]).to(torch.float8_e4m3fn).cuda(), scale.float().cuda()


def _layer_weights(fp8, gen):
    return {
        "qkv": _weight((HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN, fp8, gen),
        "o": _weight(HIDDEN, HEADS * HEAD_DIM, fp8, gen),
        "gate_up": _weight(2 * INTER, HIDDEN, fp8, gen),
        "down": _weight(HIDDEN, INTER, fp8, gen),
        "norm1": (1 + 0.1 * torch.randn(HIDDEN, generator=gen)).to(torch.bfloat16).cuda(),
        "norm2": (1 + 0.1 * torch.randn(HIDDEN, generator=gen)).to(torch.bfloat16).cuda(),
    }


def _forward(state, layers, cos_sin, triton_ops: bool, splits: int = 1):
    """One decode token through LAYERS layers; the caches in `state` gain its K/V. `splits`:
    the decode attention's (1: one launch; more: the split and the merge kernels)."""
    x, residual = state["x"], None
    for i, layer in enumerate(layers):
        k_cache, v_cache = state["k"][i], state["v"][i]
        if triton_ops:
            cfg = GemvConfig(16, 512, 2, 4) if layer["qkv"][1] is not None else None
            split = GemvConfig(cfg.block_n, cfg.block_k, 4, 4) if cfg else GemvConfig(16, 256, 4, 4)
            normed, residual = rmsnorm_triton(x, layer["norm1"], EPS, residual)
            qkv = gemv_splitk(normed, *layer["qkv"], None, cfg)
        else:
            normed, residual = rmsnorm_ref(x, layer["norm1"], EPS, residual)
            qkv = _linear_ref(normed, layer["qkv"])
        q, k, v = qkv.split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], dim=-1)
        q, k, v = (t.reshape(1, -1, HEAD_DIM) for t in (q, k, v))
        rotate = rotary_kv_store_triton if triton_ops else rotary_kv_store_ref
        q = rotate(q, k, v, state["positions"], cos_sin, k_cache, v_cache, state["slots"])
        attend = paged_decode_attention_triton if triton_ops else paged_decode_attention_ref
        extra = {"num_splits": splits} if triton_ops else {}
        attn = attend(
            q, k_cache, v_cache, state["page_table"], state["seq_lens"], HEAD_DIM**-0.5, **extra
        ).reshape(1, -1)
        if triton_ops:
            hidden = gemv_splitk(attn, *layer["o"], None, split)
            normed, residual = rmsnorm_triton(hidden, layer["norm2"], EPS, residual)
            act = silu_and_mul_triton(gemv_splitk(normed, *layer["gate_up"], None, cfg))
            x = gemv_splitk(act, *layer["down"], None, split)
        else:
            hidden = _linear_ref(attn, layer["o"])
            normed, residual = rmsnorm_ref(hidden, layer["norm2"], EPS, residual)
            x = _linear_ref(silu_and_mul_ref(_linear_ref(normed, layer["gate_up"])), layer["down"])
    norm = rmsnorm_triton if triton_ops else rmsnorm_ref
    return norm(x, layers[0]["norm1"], EPS, residual)[0]


def _linear_ref(x, weight_scale):
    weight, scale = weight_scale
    return (
        torch.nn.functional.linear(x, weight) if scale is None else fp8_linear_ref(x, weight, scale)
    )


def _new_state(context: int, seed: int):
    """A token's inputs and, per layer, a cache holding one sequence's random context (the
    same pages in every layer)."""
    batch = make_paged_batch(
        [1], [context + 64], num_kv_heads=KV_HEADS, group=HEADS // KV_HEADS, head_dim=HEAD_DIM,
        page_size=PAGE, dtype=torch.bfloat16, seed=seed,
    )  # fmt: skip
    return {
        "x": torch.empty(1, HIDDEN, dtype=torch.bfloat16, device="cuda"),
        "positions": torch.zeros(1, dtype=torch.int64, device="cuda"),
        "slots": torch.zeros(1, dtype=torch.int64, device="cuda"),
        "seq_lens": torch.zeros(1, dtype=torch.int32, device="cuda"),
        "page_table": batch.page_table,
        "k": [batch.k_cache.clone() for _ in range(LAYERS)],
        "v": [batch.v_cache.clone() for _ in range(LAYERS)],
    }


def _set_token(state, x, position):
    page = state["page_table"][0, position // PAGE].long()
    state["x"].copy_(x)
    state["positions"].fill_(position)
    state["slots"].copy_(page * PAGE + position % PAGE)
    state["seq_lens"].fill_(position + 1)


def _capture(state, layers, cos_sin, splits):
    _forward(state, layers, cos_sin, True, splits)  # compiles (and tunes) outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = _forward(state, layers, cos_sin, True, splits)
    return graph, out


@pytest.mark.gpu
@pytest.mark.parametrize("splits", [1, 4], ids=["one-launch", "split"])
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_dependent_launch_chain_replays_as_plain_launches(fp8, splits, monkeypatch):
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs sm_90 or later")
    monkeypatch.setattr(_triton, "DEPENDENT_LAUNCH", "on")
    assert dependent_launch(torch.device("cuda")), "not a dependent launch: nothing tested"
    gen = torch.Generator().manual_seed(7 + fp8)
    layers = [_layer_weights(fp8, gen) for _ in range(LAYERS)]
    cos_sin = rope_cos_sin_cache(HEAD_DIM, 4096, 10000.0).cuda()
    context = 200
    dependent, plain, ref = (_new_state(context, 11) for _ in range(3))
    for state in (dependent, plain, ref):
        _set_token(state, torch.zeros(1, HIDDEN, dtype=torch.bfloat16), context)
    graph_dependent, out_dependent = _capture(dependent, layers, cos_sin, splits)
    monkeypatch.setattr(_triton, "DEPENDENT_LAUNCH", "off")
    graph_plain, out_plain = _capture(plain, layers, cos_sin, splits)
    for step in range(24):
        position = context + step
        x = torch.randn(1, HIDDEN, generator=gen).to(torch.bfloat16)
        for state in (dependent, plain, ref):
            _set_token(state, x.cuda(), position)
        graph_dependent.replay()
        graph_plain.replay()
        expected = _forward(ref, layers, cos_sin, False)
        torch.cuda.synchronize()
        assert torch.equal(out_dependent, out_plain), f"step {step}"
        for i in range(LAYERS):  # bit for bit: the caches' unused slots hold NaN
            for name in ("k", "v"):
                got, want = dependent[name][i].view(torch.int16), plain[name][i].view(torch.int16)
                assert torch.equal(got, want), f"step {step} layer {i} {name}"
        torch.testing.assert_close(out_dependent.float(), expected.float(), atol=0.1, rtol=0.05)
