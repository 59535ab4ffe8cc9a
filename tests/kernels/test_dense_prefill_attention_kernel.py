"""Prefill attention with dense new-token K/V (plain loads and TMA descriptors) against
the torch reference, and the per-shape choice between it and the paged kernel."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from kernel_factories import DEVICE, make_paged_batch, tolerance

from radixmesh_kernels.dense_prefill_attention import (
    HAS_TMA_DESCRIPTORS,
    DenseConfig,
    dense_prefill_attention,
    dense_supported,
    tma_supported,
)
from radixmesh_kernels.paged_attention import gather_kv, paged_attention_ref

# (new tokens, cached prefix) per sequence: a fresh prompt, an extend over a prefix that
# ends inside a page, one token over a long prefix, a prompt across several tiles
SEQS = [(37, 0), (20, 13), (1, 40), (70, 16)]
PLAIN = DenseConfig(block_m=32, block_n=16)
TMA = DenseConfig(block_m=32, block_n=16, tma=True)


def _batch(seqs, *, group=4, head_dim=64, page_size=16, dtype=torch.float32, seed=0, kv_heads=2):
    batch = make_paged_batch(
        [q for q, _ in seqs], [q + p for q, p in seqs], num_kv_heads=kv_heads, group=group,
        head_dim=head_dim, page_size=page_size, dtype=dtype, seed=seed,
    )  # fmt: skip
    k_new, v_new = [], []
    for b, (q_len, prefix) in enumerate(seqs):
        k_new.append(gather_kv(batch.k_cache, batch.page_table[b], prefix + q_len)[prefix:])
        v_new.append(gather_kv(batch.v_cache, batch.page_table[b], prefix + q_len)[prefix:])
    return batch, torch.cat(k_new), torch.cat(v_new)


def _args(batch):
    return (
        batch.q, batch.k_cache, batch.v_cache, batch.page_table, batch.cu_seqlens_q,
        batch.seq_lens, batch.scale,
    )  # fmt: skip


def _dense(batch, k_new, v_new, seqs, config):
    return dense_prefill_attention(
        *_args(batch), k_new, v_new, max(q for q, _ in seqs), config
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("config", [PLAIN, TMA], ids=["plain", "tma"])
def test_dense_prefill_matches_reference(config, dtype):
    if config.tma and not HAS_TMA_DESCRIPTORS:
        pytest.skip("this triton has no tensor descriptors")
    batch, k_new, v_new = _batch(SEQS, dtype=dtype, seed=1)
    if config.tma:  # the descriptors are used, not the plain-load fallback
        assert tma_supported(batch.q, k_new, v_new) and batch.q.shape[0] >= config.block_m
    out = _dense(batch, k_new, v_new, SEQS, config)
    assert not out.isnan().any()
    torch.testing.assert_close(out, paged_attention_ref(*_args(batch)), **tolerance(dtype))


@pytest.mark.parametrize("group", [1, 8])
def test_dense_prefill_across_groups_and_tile_shapes(group):
    seqs = [(48, 0), (33, 5)]
    batch, k_new, v_new = _batch(seqs, group=group, head_dim=32, page_size=1, seed=2)
    config = DenseConfig(block_m=16, block_n=16)
    out = _dense(batch, k_new, v_new, seqs, config)
    torch.testing.assert_close(out, paged_attention_ref(*_args(batch)), **tolerance(torch.float32))


def test_new_kv_with_row_strides_of_a_fused_projection():
    """k_new / v_new as views into one [tokens, q + k + v] projection output."""
    seqs = [(30, 0), (9, 20)]
    batch, k_new, v_new = _batch(seqs, seed=3)
    fused = torch.cat([batch.q.flatten(1), k_new.flatten(1), v_new.flatten(1)], dim=1)
    q_size, kv_size = batch.q[0].numel(), k_new[0].numel()
    k_view = fused[:, q_size : q_size + kv_size].view(-1, 2, 64)
    v_view = fused[:, q_size + kv_size :].view(-1, 2, 64)
    out = _dense(batch, k_view, v_view, seqs, PLAIN)
    torch.testing.assert_close(out, paged_attention_ref(*_args(batch)), **tolerance(torch.float32))


def test_dense_support_refuses_what_the_kernel_cannot_serve():
    batch, k_new, v_new = _batch([(4, 0)], seed=4)
    assert dense_supported(batch.q, k_new, v_new, 2, None)
    assert not dense_supported(batch.q, k_new, v_new, 2, 8)  # a window
    assert not dense_supported(batch.q, k_new[:3], v_new, 2, None)  # rows
    assert not dense_supported(batch.q, k_new, v_new, 1, None)  # heads
    heads_apart = k_new.transpose(0, 1).contiguous().transpose(0, 1)
    assert not dense_supported(batch.q, heads_apart, v_new, 2, None)
    odd, k_odd, v_odd = _batch([(4, 0)], head_dim=80, seed=5)
    assert not dense_supported(odd.q, k_odd, v_odd, 2, None)


def test_dense_prefill_rejects_mismatched_new_kv():
    batch, k_new, v_new = _batch([(4, 0)], seed=6)
    with pytest.raises(ValueError, match="k_new"):
        _dense(batch, k_new[:, :1], v_new, [(4, 0)], PLAIN)


def _spy_paged(monkeypatch):
    from radixmesh_kernels import prefill_attention

    calls = []
    real = prefill_attention.paged_attention_triton

    def spy(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(prefill_attention, "paged_attention_triton", spy)
    return calls


def test_op_takes_the_dense_kernel_when_given_new_kv(monkeypatch):
    from radixmesh_kernels import prefill_attention
    from radixmesh_kernels.prefill_attention import prefill_attention_triton

    # on a GPU "auto" times both kernels per shape and may keep the paged one (the choice
    # has its own tests below): "dense" asks for the dense kernel wherever it applies
    monkeypatch.setattr(prefill_attention, "MODE", "dense")
    paged_calls = _spy_paged(monkeypatch)
    batch, k_new, v_new = _batch(SEQS, seed=7)
    out = prefill_attention_triton(*_args(batch), k_new=k_new, v_new=v_new)
    torch.testing.assert_close(out, paged_attention_ref(*_args(batch)), **tolerance(torch.float32))
    assert paged_calls == []


@pytest.mark.parametrize("case", ["no new kv", "window", "paged mode", "new kv of another dtype"])
def test_op_keeps_the_paged_kernel_where_dense_does_not_apply(monkeypatch, case):
    from radixmesh_kernels import prefill_attention

    paged_calls = _spy_paged(monkeypatch)
    batch, k_new, v_new = _batch(SEQS[:2], seed=8)
    args, kwargs = _args(batch), {"k_new": k_new, "v_new": v_new}
    window = None
    if case == "no new kv":
        kwargs = {}
    elif case == "window":
        window = 5
    elif case == "paged mode":
        monkeypatch.setattr(prefill_attention, "MODE", "paged")
    else:  # the new K/V in another dtype than the cache's
        kwargs = {"k_new": k_new.double(), "v_new": v_new.double()}
    out = prefill_attention.prefill_attention_triton(*args, window, **kwargs)
    torch.testing.assert_close(out, paged_attention_ref(*args, window), **tolerance(torch.float32))
    assert len(paged_calls) == 1


def test_op_refuses_only_one_of_the_new_kv():
    from radixmesh_kernels.prefill_attention import prefill_attention_triton

    batch, k_new, _ = _batch([(4, 0)], seed=9)
    with pytest.raises(ValueError, match="both k_new and v_new"):
        prefill_attention_triton(*_args(batch), k_new=k_new)


GPU_SEQS = [(1024, 0), (300, 77), (1, 500), (700, 0)]


@pytest.mark.gpu
@pytest.mark.parametrize(
    "config",
    [
        DenseConfig(128, 64, num_warps=8, num_stages=3, tma=True),
        DenseConfig(128, 128, num_warps=8, num_stages=3, tma=True),
        DenseConfig(64, 64, num_warps=4, num_stages=3),
    ],
    ids=lambda c: c.describe(),
)
def test_dense_prefill_on_gpu_bench_heads(config):
    """32 query / 8 KV heads, head_dim 128, bf16: prompts and extends over paged prefixes."""
    batch = make_paged_batch(
        [q for q, _ in GPU_SEQS], [q + p for q, p in GPU_SEQS], num_kv_heads=8, group=4,
        head_dim=128, page_size=16, dtype=torch.bfloat16, seed=10,
    )  # fmt: skip
    k_new = torch.cat(
        [gather_kv(batch.k_cache, batch.page_table[b], q + p)[p:] for b, (q, p) in enumerate(GPU_SEQS)]
    )
    v_new = torch.cat(
        [gather_kv(batch.v_cache, batch.page_table[b], q + p)[p:] for b, (q, p) in enumerate(GPU_SEQS)]
    )
    out = dense_prefill_attention(*_args(batch), k_new, v_new, 1024, config)
    torch.testing.assert_close(out, paged_attention_ref(*_args(batch)), **tolerance(torch.bfloat16))


@pytest.mark.gpu
def test_per_shape_choice_on_gpu_agrees_and_records_its_timings():
    from radixmesh_kernels import prefill_attention

    prefill_attention.reset_plans()
    batch, k_new, v_new = _batch(
        [(512, 0), (200, 40)], group=4, head_dim=128, dtype=torch.bfloat16, seed=11
    )
    out = prefill_attention.prefill_attention_triton(
        *_args(batch), max_q_len=512, k_new=k_new, v_new=v_new
    )
    torch.testing.assert_close(out, paged_attention_ref(*_args(batch)), **tolerance(torch.bfloat16))
    (plan,) = prefill_attention.chosen_plans()
    assert plan["max_q_len_bucket"] == 512 and "paged" in plan["timings_us"]
    assert plan["chosen"] in plan["timings_us"]


def test_a_bad_mode_in_the_environment_names_the_variable():
    code = "import radixmesh_kernels.prefill_attention"
    env = {**os.environ, "RADIXMESH_PREFILL_ATTENTION": "fast"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode != 0
    assert "RADIXMESH_PREFILL_ATTENTION must be one of auto, paged, dense" in proc.stderr


class _StubCase:
    """A case whose kernels return set outputs and report set times (the choice's logic)."""

    def __init__(self, outputs, times):
        self.outputs, self.times, self.last = outputs, times, None

    def paged(self):
        self.last = "paged"
        return self.outputs["paged"]

    def dense(self, cfg):
        self.last = cfg.describe()
        result = self.outputs[self.last]
        if isinstance(result, Exception):
            raise result
        return result


def _choose(monkeypatch, outputs, times):
    from radixmesh_kernels import prefill_attention

    configs = [DenseConfig(32, 16), DenseConfig(64, 16), DenseConfig(16, 16)]
    monkeypatch.setattr(prefill_attention, "DENSE_CANDIDATES", tuple(configs))
    names = ["paged", *(c.describe() for c in configs)]
    case = _StubCase(dict(zip(names, outputs, strict=True)), times)

    def fake_time(fn):
        fn()
        return case.times[case.last]

    monkeypatch.setattr(prefill_attention, "_time_us", fake_time)
    return prefill_attention._tune(case), configs


def test_choice_keeps_the_fastest_agreeing_kernel_and_drops_failures(monkeypatch):
    ref = torch.ones(4, 2)
    outputs = [ref, ref + 0.001, ref + 1.0, RuntimeError("out of resources")]
    times = {"paged": 10.0, "dense 32x16 w4 s2": 5.0, "dense 64x16 w4 s2": 1.0}
    plan, configs = _choose(monkeypatch, outputs, times)
    assert plan.config == configs[0]  # the faster 64x16 disagrees, 16x16 failed
    assert [name for name, _ in plan.timings_us] == ["paged", "dense 32x16 w4 s2"]


def test_choice_keeps_the_paged_kernel_when_no_dense_one_is_faster(monkeypatch):
    ref = torch.ones(4, 2)
    times = {"paged": 3.0, "dense 32x16 w4 s2": 5.0, "dense 64x16 w4 s2": 4.0, "dense 16x16 w4 s2": 9.0}
    plan, _ = _choose(monkeypatch, [ref, ref, ref, ref], times)
    assert plan.config is None and plan.name == "paged"
    assert len(plan.timings_us) == 4


def test_timing_case_holds_its_dense_kv_in_its_pages_and_both_kernels_agree():
    from radixmesh_kernels.prefill_attention import INTERPRETER_CONFIG, _Case

    like = torch.empty(1, 8, 32, device=DEVICE)
    cache = torch.empty(1, 16, 2, 32, device=DEVICE)
    case = _Case.like(like, cache, 40)
    q, k_cache, v_cache, page_table, cu, lens, _ = case.args
    assert q.shape == (40, 8, 32) and lens.tolist() == [40] and cu.tolist() == [0, 40]
    assert torch.equal(gather_kv(k_cache, page_table[0], 40), case.k_new)
    assert torch.equal(gather_kv(v_cache, page_table[0], 40), case.v_new)
    ref = paged_attention_ref(*case.args)
    torch.testing.assert_close(case.paged(), ref, **tolerance(torch.float32))
    torch.testing.assert_close(case.dense(INTERPRETER_CONFIG), ref, **tolerance(torch.float32))


def test_warp_specialized_configurations_are_timed_only_when_asked_for():
    code = (
        "from radixmesh_kernels import prefill_attention as p; "
        "print(sum(c.warp_specialize for c in p.DENSE_CANDIDATES))"
    )
    counts = {}
    for value in ("", "1"):
        env = {**os.environ, "RADIXMESH_PREFILL_WARP_SPECIALIZE": value}
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        counts[value] = int(proc.stdout)
    assert counts == {"": 0, "1": 2}
    env = {**os.environ, "RADIXMESH_PREFILL_WARP_SPECIALIZE": "yes"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode != 0
    assert "RADIXMESH_PREFILL_WARP_SPECIALIZE must be 0 or 1" in proc.stderr


def test_startup_buckets_cover_every_dense_step_up_to_the_limit_and_stay_bounded():
    from radixmesh_kernels.prefill_attention import (
        MAX_STARTUP_BUCKETS,
        q_len_bucket,
        startup_buckets,
    )

    assert startup_buckets(127) == ()
    assert startup_buckets(128) == (128,)
    assert startup_buckets(129) == (128, 256)
    assert startup_buckets(8192) == (128, 256, 512, 1024, 2048, 4096, 8192)
    assert all(q_len_bucket(n) in startup_buckets(8192) for n in (128, 129, 1000, 4097, 8192))
    huge = startup_buckets(1 << 20)
    assert len(huge) == MAX_STARTUP_BUCKETS and huge[0] == 128 and huge[-1] == 128 << 7


@pytest.fixture
def startup_choice(monkeypatch):
    """The choice as the executor's start-up makes it, on this machine's kernels (the
    interpreter here): one small dense candidate, timings counted (paged slower)."""
    from radixmesh_kernels import prefill_attention

    prefill_attention.reset_plans()
    monkeypatch.setattr(prefill_attention, "DENSE_CANDIDATES", (PLAIN,))
    monkeypatch.setattr(prefill_attention, "_timed_device", lambda q: True)
    timed = []

    def counting_time(fn):
        timed.append(fn)
        return 2.0 if len(timed) % 2 else 1.0  # _tune times the paged kernel first

    monkeypatch.setattr(prefill_attention, "_time_us", counting_time)
    yield prefill_attention, timed
    prefill_attention.reset_plans()


def test_after_the_startup_choice_a_new_bucket_or_shape_times_and_compiles_nothing(
    startup_choice, monkeypatch
):
    prefill_attention, timed = startup_choice
    batch, k_new, v_new = _batch([(100, 0)], group=2, head_dim=16, seed=5)
    shape = prefill_attention.ShapeClass(
        batch.q.device, torch.float32, 4, 2, 16, batch.k_cache.shape[1]
    )
    plans = prefill_attention.decide_plans(shape, (64, 128))
    assert sorted(plans) == [64, 128] and all(p.config == PLAIN for p in plans.values())
    assert len(timed) == 4  # the paged kernel and the candidate, per bucket
    assert {p["max_q_len_bucket"] for p in prefill_attention.chosen_plans()} == {64, 128}
    timed.clear()

    ran = []
    real_dense, real_paged = prefill_attention.dense_prefill_attention, prefill_attention.paged_attention_triton
    monkeypatch.setattr(
        prefill_attention, "dense_prefill_attention",
        lambda *a: ran.append(a[-1]) or real_dense(*a),
    )  # fmt: skip
    monkeypatch.setattr(
        prefill_attention, "paged_attention_triton",
        lambda *a, **k: ran.append("paged") or real_paged(*a, **k),
    )  # fmt: skip
    # a decided bucket, then one never decided (150 new tokens: bucket 256) takes 128's plan
    for seqs in ([(100, 0)], [(150, 20)]):
        batch, k_new, v_new = _batch(seqs, group=2, head_dim=16, seed=len(seqs) + seqs[0][0])
        out = prefill_attention.prefill_attention_triton(
            *_args(batch), max_q_len=seqs[0][0], k_new=k_new, v_new=v_new
        )
        torch.testing.assert_close(out, paged_attention_ref(*_args(batch)), **tolerance(torch.float32))
    assert ran == [PLAIN, PLAIN]
    # a shape class the start-up did not decide: the paged kernel
    batch, k_new, v_new = _batch([(40, 0)], group=2, head_dim=32, seed=9)
    out = prefill_attention.prefill_attention_triton(
        *_args(batch), max_q_len=40, k_new=k_new, v_new=v_new
    )
    torch.testing.assert_close(out, paged_attention_ref(*_args(batch)), **tolerance(torch.float32))
    assert ran[2:] == ["paged"] and timed == []
    assert len(prefill_attention.chosen_plans()) == 2  # nothing decided at a call


@pytest.mark.gpu
def test_on_gpu_after_the_startup_choice_serving_calls_time_and_compile_nothing(monkeypatch):
    """The 8B shape's buckets up to 1,024 decided; then calls of decided and undecided
    buckets (odd lengths, a cached prefix, two sequences, page-table widths of both
    classes) run without a timing and without a new compiled kernel."""
    from radixmesh_kernels import dense_prefill_attention as dense_module
    from radixmesh_kernels import paged_attention, prefill_attention

    prefill_attention.reset_plans()
    device = torch.device("cuda", torch.cuda.current_device())
    shape = prefill_attention.ShapeClass(device, torch.bfloat16, 32, 8, 128, 16)
    plans = prefill_attention.decide_plans(shape, prefill_attention.startup_buckets(1024))
    assert sorted(plans) == [128, 256, 512, 1024]
    timed = []
    monkeypatch.setattr(prefill_attention, "_time_us", lambda fn: timed.append(fn) or 1.0)

    def compiled() -> int:
        kernels = (dense_module._dense_prefill_kernel, paged_attention._paged_prefill_kernel)
        return sum(len(cache[0]) for k in kernels for cache in k.device_caches.values())

    before = compiled()
    for seqs in ([(300, 37)], [(1500, 0), (700, 300)], [(129, 0)], [(230, 0)]):
        batch, k_new, v_new = _batch(
            seqs, group=4, head_dim=128, dtype=torch.bfloat16, seed=3, kv_heads=8
        )
        out = prefill_attention.prefill_attention_triton(
            *_args(batch), max_q_len=max(q for q, _ in seqs), k_new=k_new, v_new=v_new
        )
        torch.testing.assert_close(out, paged_attention_ref(*_args(batch)), **tolerance(torch.bfloat16))
    assert timed == [] and compiled() == before
    prefill_attention.reset_plans()
