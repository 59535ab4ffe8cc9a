"""The decoder's GEMV chain (radixmesh_kernels/gemv_chain.py): at decode batch sizes the
norms between a layer's projections are formed in the projections' reads, and the logits
are those of the unfused ops and of transformers."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest
import torch

from radixmesh_kernels import gemv_chain
from radixmesh_kernels._triton import interpreting
from radixmesh_kernels.gemv_chain import GemvChain
from radixmesh_kernels.silu_mul_linear import silu_mul_linear_triton
from services.executor.core.forward_batch import BatchEntry, build_forward_batch
from services.executor.core.models.decoder import Decoder
from tests.unit.executor.conftest import TinyModel, hf_logits, make_core, random_prompt

pytestmark = pytest.mark.skipif(
    not (interpreting() or torch.cuda.is_available()),
    reason="Triton needs a CUDA device or TRITON_INTERPRET=1",
)


@pytest.fixture(autouse=True)
def _fusion_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default ("auto") times the chain on a GPU only; these tests take it untimed."""
    monkeypatch.setattr(gemv_chain, "FUSION", "on")


def test_the_chain_is_timed_by_default_and_off_when_turned_off(monkeypatch, llama_model: TinyModel) -> None:
    env = {k: v for k, v in os.environ.items() if k != "RADIXMESH_GEMV_FUSION"}
    code = "from radixmesh_kernels import gemv_chain; print(gemv_chain.FUSION)"
    for setting, want in ((None, "auto"), ("on", "on"), ("off", "off")):
        if setting is not None:
            env["RADIXMESH_GEMV_FUSION"] = setting
        run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert run.stdout.strip() == want
    env["RADIXMESH_GEMV_FUSION"] = "yes"
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert run.returncode != 0 and "RADIXMESH_GEMV_FUSION must be one of auto, on, off, got 'yes'" in run.stderr
    core = make_core(llama_model)
    model, chain = _chained(core)
    tokens = random_prompt(4, seed=6)
    for mode in ("off", "auto"):  # "auto" times on a GPU only: off here
        monkeypatch.setattr(gemv_chain, "FUSION", mode)
        _logits(model, core, tokens, [(0, 3), (3, 4)])
        assert chain.launches == {"norm_linear": 0, "linear_residual": 0}
        assert chain.decisions() == []


class CountingChain(GemvChain):
    """The chain, counting its fused launches."""

    def __init__(self) -> None:
        super().__init__()
        self.launches = {"norm_linear": 0, "linear_residual": 0}

    def norm_linear(self, *args, **kwargs):  # type: ignore[override]
        self.launches["norm_linear"] += 1
        return super().norm_linear(*args, **kwargs)

    def linear_residual(self, *args, **kwargs):  # type: ignore[override]
        self.launches["linear_residual"] += 1
        return super().linear_residual(*args, **kwargs)


def _chained(core, chained: bool = True) -> tuple[Decoder, CountingChain]:
    """The core's model with the chain (or, chained False, the same ops without it)."""
    chain = CountingChain()
    ops = dataclasses.replace(
        core.model.ops, gemv_chain=chain if chained else None,
        silu_mul_linear=silu_mul_linear_triton,
    )  # fmt: skip
    return Decoder(core.model.spec, core.model.weights, ops, core.info.max_model_len), chain


def _logits(model: Decoder, core, tokens: list[int], spans) -> torch.Tensor:
    pages = list(range(8))
    rows = []
    for start, end in spans:
        batch = build_forward_batch(
            [BatchEntry(start, tokens[start:end], pages, True)], core.config.page_size, core.device
        )
        batch.logits_indices = torch.arange(batch.num_tokens)
        rows.append(model.forward(batch, core.kv_pool))
    return torch.cat(rows)


def test_chained_steps_match_transformers(tiny_model: TinyModel) -> None:
    """A 12-token prefill (past the chain's rows: unchained), a 3-token extend and two
    decodes (chained) of every architecture (q/k/v bias, per-head q/k norms, tied heads)."""
    core = make_core(tiny_model)
    model, chain = _chained(core)
    tokens = random_prompt(17, seed=3)
    logits = _logits(model, core, tokens, [(0, 12), (12, 15), (15, 16), (16, 17)])
    layers = core.model.spec.num_layers
    # per chained step: o_proj and down add the residual; gate_up, and qkv after layer 0,
    # read the norm
    assert chain.launches == {"norm_linear": 3 * (2 * layers - 1), "linear_residual": 3 * 2 * layers}
    torch.testing.assert_close(logits, hf_logits(tiny_model.hf, tokens), atol=1e-4, rtol=1e-4)


def test_two_sequences_decode_chained_as_each_alone(llama_model: TinyModel) -> None:
    """Rows of a two-sequence decode do not mix through the row statistics."""
    core = make_core(llama_model)
    model, chain = _chained(core)
    a, b = random_prompt(6, seed=1), random_prompt(9, seed=2)
    entries = [BatchEntry(0, a, [0, 1, 2, 3], True), BatchEntry(0, b, [4, 5, 6, 7], True)]
    batch = build_forward_batch(entries, core.config.page_size, core.device)
    batch.logits_indices = torch.tensor([5, 14])
    model.forward(batch, core.kv_pool)  # 15 rows: unchained
    step = build_forward_batch(
        [BatchEntry(6, [7], [0, 1, 2, 3], True), BatchEntry(9, [11], [4, 5, 6, 7], True)],
        core.config.page_size, core.device,
    )  # fmt: skip
    step.logits_indices = torch.arange(2)
    got = model.forward(step, core.kv_pool)
    assert chain.launches["linear_residual"] == 2 * core.model.spec.num_layers
    want = torch.stack([hf_logits(llama_model.hf, [*a, 7])[-1], hf_logits(llama_model.hf, [*b, 11])[-1]])
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_fp8_weights_chain_as_the_unfused_fp8_ops(llama_model: TinyModel) -> None:
    core = make_core(llama_model, quantization="fp8")
    model, chain = _chained(core)
    tokens = random_prompt(11, seed=5)
    spans = [(0, 9), (9, 10), (10, 11)]
    chained = _logits(model, core, tokens, spans)
    assert chain.launches["linear_residual"] == 2 * 2 * core.model.spec.num_layers
    unfused = _logits(_chained(core, chained=False)[0], core, tokens, spans)
    torch.testing.assert_close(chained, unfused, atol=1e-4, rtol=1e-4)


def test_the_chain_is_off_where_a_plan_is_not_a_split_k_configuration(monkeypatch, llama_model: TinyModel) -> None:
    from radixmesh_kernels import gemv

    core = make_core(llama_model)
    model, chain = _chained(core)
    monkeypatch.setattr(gemv, "MODE", "legacy")  # every plan is its reference (cuBLAS, ...)
    tokens = random_prompt(4, seed=6)
    _logits(model, core, tokens, [(0, 3), (3, 4)])
    assert chain.launches == {"norm_linear": 0, "linear_residual": 0}


def _decided(monkeypatch, model: Decoder, times: dict[str, float]):
    """`gemv_chain._decide` on the model's first layer with made-up timings (by variant);
    the variants run for real (the interpreter), only their graphs and timer are replaced."""
    monkeypatch.setattr(gemv_chain, "graphed", lambda fn: fn)
    monkeypatch.setattr(gemv_chain, "cuda_time_us", lambda fn, **_: times[fn.__name__])
    layer = model._chain_layers[0]
    return gemv_chain._decide(2, layer.qkv.weight.dtype, layer, model.spec.rms_norm_eps)


def test_the_timed_choice_takes_the_chain_only_where_it_is_faster_and_agrees(
    monkeypatch, llama_model: TinyModel
) -> None:
    core = make_core(llama_model)
    model, _ = _chained(core)
    faster = _decided(monkeypatch, model, {"unfused": 10.0, "chained": 8.0})
    assert faster.plan is not None and dict(faster.timings_us) == {"unfused": 10.0, "chain": 8.0}
    slower = _decided(monkeypatch, model, {"unfused": 10.0, "chained": 11.0})
    assert slower.plan is None and "as fast or faster" in slower.reason
    real = GemvChain.linear_residual
    monkeypatch.setattr(
        GemvChain, "linear_residual",
        staticmethod(lambda *a, **k: (lambda out: (out[0] + 1.0, out[1]))(real(*a, **k))),
    )  # fmt: skip
    wrong = _decided(monkeypatch, model, {"unfused": 10.0, "chained": 1.0})
    assert wrong.plan is None and wrong.reason == "disagrees with unfused"
    assert dict(wrong.timings_us) == {"unfused": 10.0}


def test_a_timing_that_fails_keeps_the_unfused_ops_and_says_why(monkeypatch, llama_model: TinyModel) -> None:
    core = make_core(llama_model)
    model, _ = _chained(core)

    def no_graphs(fn):
        raise RuntimeError("CUDA graphs need a GPU")

    monkeypatch.setattr(gemv_chain, "graphed", no_graphs)
    layer = model._chain_layers[0]
    decision = gemv_chain._decide(1, layer.qkv.weight.dtype, layer, model.spec.rms_norm_eps)
    assert decision.plan is None
    assert decision.reason == "timing failed: RuntimeError: CUDA graphs need a GPU"
