"""FP8 weights: the compressed-tensors loader, quantization at load, the reference product."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from radixmesh.errors import InvalidArgument
from radixmesh_kernels import get_ops
from services.executor.core.config import ExecutorConfig
from services.executor.core.forward_batch import BatchEntry, build_forward_batch
from services.executor.core.models.fp8 import (
    FP8,
    Fp8Weight,
    dequantize,
    linear,
    quantize_weight,
    read_checkpoint_quantization,
)
from tests.unit.executor.conftest import TinyModel, make_core, random_prompt

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def compressed_tensors_config(strategy: str, **weights_overrides) -> dict:
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {
                    "num_bits": 8, "type": "float", "symmetric": True, "strategy": strategy,
                    "dynamic": False, **weights_overrides,
                },
                "input_activations": {
                    "num_bits": 8, "type": "float", "symmetric": True, "strategy": "token",
                    "dynamic": True,
                },
            }
        },
        "ignore": ["lm_head"],
    }  # fmt: skip


def write_fp8_checkpoint(source: Path, dest: Path, strategy: str) -> dict[str, torch.Tensor]:
    """The model at `source` as a compressed-tensors FP8 checkpoint at `dest`.

    Returns the dequantized value of every quantized weight, by checkpoint name.
    """
    shutil.copytree(source, dest)
    (dest / "model.safetensors").unlink()
    tensors = load_file(str(source / "model.safetensors"))
    out: dict[str, torch.Tensor] = {}
    dequantized: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        if not name.endswith(".weight") or name.split(".")[-2] not in PROJECTIONS:
            out[name] = tensor
            continue
        w = tensor.float()
        if strategy == "tensor":
            scale = (w.abs().amax() / 448.0).reshape(1)
            q = (w / scale).to(FP8)
            dequantized[name] = q.float() * scale
        else:
            scale = w.abs().amax(dim=1, keepdim=True) / 448.0  # [out, 1]
            q = (w / scale).to(FP8)
            dequantized[name] = q.float() * scale
        out[name] = q
        out[name.removesuffix("weight") + "weight_scale"] = scale
        out[name.removesuffix("weight") + "input_scale"] = torch.ones(1)  # read, not used
    save_file(out, str(dest / "model.safetensors"))
    config = json.loads((dest / "config.json").read_text())
    config["quantization_config"] = compressed_tensors_config(strategy)
    (dest / "config.json").write_text(json.dumps(config))
    return dequantized


def write_dequantized_copy(source: Path, dest: Path, dequantized: dict[str, torch.Tensor]) -> None:
    """The model at `source` with its projections replaced by the given float32 values."""
    shutil.copytree(source, dest)
    tensors = load_file(str(source / "model.safetensors"))
    tensors.update({name: value.contiguous() for name, value in dequantized.items()})
    save_file(tensors, str(dest / "model.safetensors"))


def all_logits(path: Path, prompt: list[int], **config) -> torch.Tensor:
    core = make_core(TinyModel("m", None, path), **config)  # type: ignore[arg-type]
    batch = build_forward_batch([BatchEntry(0, prompt, list(range(12)), True)], 4, core.device)
    batch.logits_indices = torch.arange(batch.num_tokens)
    return core.model.forward(batch, core.kv_pool)


def test_quantize_weight_keeps_each_row_within_fp8_precision():
    torch.manual_seed(0)
    w = torch.randn(48, 80) * torch.logspace(-3, 1, 48)[:, None]  # rows of very different range
    q = quantize_weight(w)
    assert q.weight.dtype == FP8 and q.scale.shape == (48,)
    # each row's largest magnitude maps to the largest FP8 value
    torch.testing.assert_close(q.weight.float().abs().amax(dim=1), torch.full((48,), 448.0))
    err = (dequantize(q, torch.float32) - w).abs()
    # e4m3 keeps 3 mantissa bits: rounding error <= 2^-4 relative, or half the subnormal step
    bound = w.abs() * 2**-4 + q.scale[:, None] * 2**-10
    assert bool((err <= bound).all())


@pytest.mark.parametrize("strategy", ["tensor", "channel"])
def test_fp8_checkpoint_loads_as_fp8_and_computes_the_dequantized_model(
    llama_model: TinyModel, tmp_path: Path, strategy: str
):
    dequantized = write_fp8_checkpoint(llama_model.path, tmp_path / "fp8", strategy)
    write_dequantized_copy(llama_model.path, tmp_path / "ref", dequantized)

    core = make_core(TinyModel("fp8", None, tmp_path / "fp8"))  # type: ignore[arg-type]
    layer = core.model.weights.layers[1]
    assert isinstance(layer.qkv, Fp8Weight) and isinstance(layer.down, Fp8Weight)
    assert layer.qkv.weight.dtype == FP8
    # q, k and v keep their own scales inside the fused matrix
    q_rows = dequantized["model.layers.1.self_attn.q_proj.weight"].shape[0]
    v_rows = dequantized["model.layers.1.self_attn.v_proj.weight"].shape[0]
    torch.testing.assert_close(
        dequantize(layer.qkv, torch.float32)[:q_rows],
        dequantized["model.layers.1.self_attn.q_proj.weight"],
    )
    torch.testing.assert_close(
        dequantize(layer.qkv, torch.float32)[-v_rows:],
        dequantized["model.layers.1.self_attn.v_proj.weight"],
    )

    prompt = random_prompt(21, seed=3)
    torch.testing.assert_close(
        all_logits(tmp_path / "fp8", prompt), all_logits(tmp_path / "ref", prompt)
    )


def test_quantization_none_dequantizes_an_fp8_checkpoint(llama_model: TinyModel, tmp_path: Path):
    dequantized = write_fp8_checkpoint(llama_model.path, tmp_path / "fp8", "channel")
    model = TinyModel("fp8", None, tmp_path / "fp8")  # type: ignore[arg-type]
    core = make_core(model, quantization="none")
    down = core.model.weights.layers[0].down
    assert isinstance(down, torch.Tensor) and down.dtype == torch.float32
    torch.testing.assert_close(down, dequantized["model.layers.0.mlp.down_proj.weight"])


def test_quantization_fp8_quantizes_a_full_precision_checkpoint_per_row(
    llama_model: TinyModel, tmp_path: Path
):
    tensors = load_file(str(llama_model.path / "model.safetensors"))
    expected = {
        name: dequantize(quantize_weight(t), torch.float32)
        for name, t in tensors.items()
        if name.endswith(".weight") and name.split(".")[-2] in PROJECTIONS
    }
    # q/k/v and gate/up are quantized as fused matrices: each row keeps its own scale, so
    # the per-row result equals quantizing each part alone
    write_dequantized_copy(llama_model.path, tmp_path / "ref", expected)
    prompt = random_prompt(17, seed=4)
    quantized = all_logits(llama_model.path, prompt, quantization="fp8")
    torch.testing.assert_close(quantized, all_logits(tmp_path / "ref", prompt))
    assert not torch.allclose(quantized, all_logits(llama_model.path, prompt), atol=1e-5)


def test_fp8_reference_product_is_f_linear_over_the_dequantized_weight():
    torch.manual_seed(1)
    x, w, bias = torch.randn(5, 64), torch.randn(96, 64), torch.randn(96)
    q = quantize_weight(w)
    ops = get_ops("cpu")
    torch.testing.assert_close(
        linear(x, q, bias, ops), F.linear(x, dequantize(q, x.dtype), bias)
    )
    torch.testing.assert_close(linear(x, w, bias, ops), F.linear(x, w, bias))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"quant_method": "gptq"}, "quant_method 'gptq' is not supported"),
        ({"format": "pack-quantized"}, "format 'pack-quantized' is not supported"),
        ({"weights": {"num_bits": 4}}, "config_groups.group_0.weights.num_bits must be 8"),
        ({"weights": {"type": "int"}}, "config_groups.group_0.weights.type must be 'float'"),
        ({"weights": {"strategy": "group"}}, "weights.strategy 'group' is not supported"),
        ({"ignore": ["lm_head", "model.layers.0.mlp.down_proj"]}, "only lm_head may stay"),
    ],
)
def test_unsupported_quantization_configs_are_refused_naming_the_field(change, message):
    qc = compressed_tensors_config("tensor")
    if "weights" in change:
        qc["config_groups"]["group_0"]["weights"].update(change["weights"])
    else:
        qc.update(change)
    with pytest.raises(InvalidArgument, match=message.replace("(", r"\(")):
        read_checkpoint_quantization({"quantization_config": qc})


def test_a_scale_of_the_wrong_size_is_refused(llama_model: TinyModel, tmp_path: Path):
    write_fp8_checkpoint(llama_model.path, tmp_path / "fp8", "channel")
    tensors = load_file(str(tmp_path / "fp8" / "model.safetensors"))
    tensors["model.layers.0.mlp.down_proj.weight_scale"] = torch.ones(3, 1)
    save_file(tensors, str(tmp_path / "fp8" / "model.safetensors"))
    with pytest.raises(InvalidArgument, match=r"down_proj\.weight_scale' has 3 scales"):
        make_core(TinyModel("fp8", None, tmp_path / "fp8"))  # type: ignore[arg-type]


def test_unknown_quantization_is_refused():
    with pytest.raises(InvalidArgument, match=r"executor\.quantization must be one of"):
        ExecutorConfig(model_path="x", quantization="int4")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("rows", [1, 7, 16, 33])
@pytest.mark.parametrize(("in_features", "out_features"), [(256, 384), (4096, 1024)])
def test_fp8_tensor_core_product_matches_the_reference(rows, in_features, out_features):
    torch.manual_seed(rows)
    x = torch.randn(rows, in_features, device="cuda", dtype=torch.bfloat16)
    w = quantize_weight(torch.randn(out_features, in_features, device="cuda") * 0.05)
    bias = torch.randn(out_features, device="cuda", dtype=torch.bfloat16)
    ours = linear(x, w, bias, get_ops("cuda")).float()
    ref = F.linear(x.float(), dequantize(w, torch.float32), bias.float())
    # above GEMV_MAX_ROWS the activations are quantized per token too: about 2^-4 relative
    rel = (ours - ref).norm() / ref.norm()
    assert ours.shape == (rows, out_features)
    assert rel < 0.05
    cos = F.cosine_similarity(ours.flatten(), ref.flatten(), dim=0)
    assert cos > 0.998


def test_decode_read_bytes_counts_fp8_projections_at_one_byte_a_weight(llama_model: TinyModel):
    """A decode step's weight read, the batch-1 floor's numerator: the checkpoint's tensors
    less the embedding, with each projection at one byte a weight plus a float32 scale a row
    under FP8."""
    tensors = load_file(str(llama_model.path / "model.safetensors"))
    config = json.loads((llama_model.path / "config.json").read_text())
    projection = [
        t for name, t in tensors.items()
        if name.endswith(".weight") and name.split(".")[-2] in PROJECTIONS
    ]
    read = sum(t.numel() for name, t in tensors.items() if "embed_tokens" not in name)
    if config.get("tie_word_embeddings"):
        read += tensors["model.embed_tokens.weight"].numel()  # the head is the embedding
    projected, rows = sum(t.numel() for t in projection), sum(t.shape[0] for t in projection)
    full = make_core(llama_model)
    fp8 = make_core(llama_model, quantization="fp8")
    width = full.model.weights.norm.element_size()
    assert full.model.weights.decode_read_bytes() == read * width
    assert fp8.model.weights.decode_read_bytes() == (read - projected) * width + projected + 4 * rows
