"""The start-up makes every prefill attention choice a step can need; serving steps time
and compile nothing for it."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from structlog.testing import capture_logs

from radixmesh_kernels import prefill_attention
from radixmesh_kernels._triton import interpreting
from radixmesh_kernels.dense_prefill_attention import DenseConfig
from radixmesh_kernels.paged_attention import PACKED_BLOCK_MS, packed_launch
from services.executor.core import warmup
from services.executor.core.forward_batch import BatchEntry, build_forward_batch
from services.executor.core.models.decoder import Decoder
from services.executor.core.warmup import decide_prefill_attention
from tests.unit.executor.conftest import TinyModel, hf_logits, make_core, random_prompt

SMALL = DenseConfig(block_m=32, block_n=16)


@pytest.fixture
def counted(monkeypatch):
    """The chooser on this machine's kernels (the interpreter here) with one small dense
    candidate; every call of its timing function recorded (the paged kernel slower)."""
    prefill_attention.reset_plans()
    monkeypatch.setattr(prefill_attention, "DENSE_CANDIDATES", (SMALL,))
    monkeypatch.setattr(prefill_attention, "_timed_device", lambda q: True)
    timed: list[object] = []

    def counting_time(fn):
        timed.append(fn)
        return 2.0 if len(timed) % 2 else 1.0  # the paged kernel is timed first

    monkeypatch.setattr(prefill_attention, "_time_us", counting_time)
    yield timed
    prefill_attention.reset_plans()


def test_startup_decides_every_bucket_and_a_serving_step_of_a_new_one_times_nothing(
    llama_model: TinyModel, counted: list[object]
) -> None:
    if not (interpreting() or torch.cuda.is_available()):
        pytest.skip("Triton needs a CUDA device or TRITON_INTERPRET=1")
    core = make_core(llama_model)
    spec = core.model.spec
    ops = dataclasses.replace(core.model.ops, paged_attention=prefill_attention.prefill_attention_triton)
    model = Decoder(spec, core.model.weights, ops, core.info.max_model_len)
    with capture_logs() as logs:
        choice = decide_prefill_attention(model, core.kv_pool, 128)
    assert choice.buckets == (128,) and choice.chosen == {128: SMALL.describe()}
    assert len(counted) == 2  # the paged kernel and the candidate, once each
    (event,) = [e for e in logs if e["event"] == "prefill_attention_choice"]
    assert event["buckets"] == [128] and event["chosen"] == {"128": SMALL.describe()}
    assert event["seconds"] >= 0 and event["mode"] == "auto"
    (plan,) = prefill_attention.chosen_plans()
    assert (plan["heads"], plan["kv_heads"], plan["head_dim"], plan["page_size"]) == (
        spec.num_heads, spec.num_kv_heads, spec.head_dim, core.config.page_size,
    )  # fmt: skip
    counted.clear()

    # a 140-token prompt: bucket 256, which the start-up did not time
    tokens = random_prompt(140, seed=3)
    entries = [BatchEntry(0, tokens, list(range(-(-140 // core.config.page_size))), True)]
    batch = build_forward_batch(entries, core.config.page_size, core.device)
    batch.logits_indices = torch.arange(batch.num_tokens)
    logits = model.forward(batch, core.kv_pool)
    assert counted == [] and len(prefill_attention.chosen_plans()) == 1
    torch.testing.assert_close(logits, hf_logits(llama_model.hf, tokens), atol=1e-4, rtol=1e-4)


def test_nothing_is_decided_where_the_model_does_not_run_the_dense_kernel(
    llama_model: TinyModel, counted: list[object]
) -> None:
    core = make_core(llama_model)
    triton = dataclasses.replace(
        core.model.ops, paged_attention=prefill_attention.prefill_attention_triton
    )
    windowed = dataclasses.replace(core.model.spec, sliding_window=64)
    models = [
        core.model,  # the torch ops
        Decoder(windowed, core.model.weights, triton, core.info.max_model_len),
    ]
    for model in models:
        choice = decide_prefill_attention(model, core.kv_pool, 4096)
        assert choice.buckets == () and choice.chosen == {}
    assert counted == [] and prefill_attention.chosen_plans() == []


def test_the_warm_up_launches_both_paged_forms_in_every_tile_height_and_width_class(
    llama_model: TinyModel, monkeypatch
) -> None:
    """Steps pick the packed kernel's tile by their rows and the compiler specializes the
    page table's width: each combination a step can reach is launched before serving, the
    unpacked form first (its tiles are tuned on its first call)."""
    if not (interpreting() or torch.cuda.is_available()):
        pytest.skip("Triton needs a CUDA device or TRITON_INTERPRET=1")
    core = make_core(llama_model)
    spec = core.model.spec
    group = spec.num_heads // spec.num_kv_heads
    triton = dataclasses.replace(core.model.ops, paged_attention=prefill_attention.prefill_attention_triton)
    model = Decoder(spec, core.model.weights, triton, core.info.max_model_len)
    launched = []
    real = warmup.paged_attention_triton

    def recording(q, *args, pack_gqa=None):
        launched.append((q.shape[0], pack_gqa, args[2].shape[1], args[-1]))
        return real(q, *args, pack_gqa=pack_gqa)

    monkeypatch.setattr(warmup, "paged_attention_triton", recording)
    done = warmup.warm_paged_attention(model, core.kv_pool, page_id=0)
    assert [(q, packed, width) for q, packed, width, _ in launched] == done
    assert done[0][:2] == (1, False)
    heights = {packed_launch(q * group)["BLOCK_M"] for q, packed, _ in done if packed}
    assert heights == set(PACKED_BLOCK_MS)
    page_size = core.kv_pool.page_size
    for q_len, packed in {(q, p) for q, p, _ in done}:
        widths = [w for q, p, w in done if (q, p) == (q_len, packed)]
        classes = {"one" if w == 1 else "x16" if w % 16 == 0 else "other" for w in widths}
        fits_a_page = q_len <= page_size
        assert classes == {"other", "x16"} | ({"one"} if fits_a_page else set()), widths
        assert all(w * page_size >= q_len for w in widths)
    # the torch ops: nothing to launch
    assert warmup.warm_paged_attention(core.model, core.kv_pool, page_id=0) == []


@pytest.mark.parametrize("pages", [1, 2, 15, 16, 17, 32])
def test_width_classes_hold_the_pages_one_of_each_class(pages):
    widths = warmup.width_classes(pages)
    assert all(w >= pages for w in widths)
    assert [w == 1 for w in widths].count(True) == (pages == 1)
    assert sum(w % 16 == 0 for w in widths) == 1
    assert sum(w != 1 and w % 16 != 0 for w in widths) == 1
