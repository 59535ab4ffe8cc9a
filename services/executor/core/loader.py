"""Loads a Hugging Face model folder: config.json, safetensors (single or sharded).

Weights are copied tensor by tensor into preallocated, fused tensors on the
target device (q/k/v and gate/up become one matrix each), converting dtype on
the way, so peak memory is the model plus one checkpoint tensor.

FP8 checkpoints (compressed-tensors, see `models/fp8.py`) are copied as they are,
scales included; `quantization="fp8"` quantizes a bf16 checkpoint's projections after
loading, and `"none"` dequantizes an FP8 checkpoint's.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from radixmesh.errors import InvalidArgument
from services.executor.core.models import ARCHITECTURES, ModelSpec, parse_spec
from services.executor.core.models.decoder import (
    DecoderWeights,
    LayerWeights,
    empty_weights,
    hf_weight_targets,
    quantize_projections,
)
from services.executor.core.models.fp8 import (
    Fp8Weight,
    dequantize,
    read_checkpoint_quantization,
    resolve_quantization,
)

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# Checkpoint tensors that carry no weights of ours (buffers some exporters save).
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
_MODEL_TYPES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True, slots=True)
class ModelFolder:
    path: Path
    config: dict[str, Any]
    spec: ModelSpec
    eos_token_ids: list[int]


def read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise FileNotFoundError(f"model folder: missing {path}")
    with path.open() as f:
        return json.load(f)


def read_model_folder(path: str | Path) -> ModelFolder:
    """Parses config.json (and generation_config.json) into a spec; loads no weights."""
    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"model folder: {folder} is not a directory")
    config = read_json(folder / "config.json")
    architecture = architecture_of(config)
    spec = parse_spec(config, architecture, ARCHITECTURES[architecture])
    return ModelFolder(folder, config, spec, read_eos_token_ids(folder, config))


def architecture_of(config: dict[str, Any]) -> str:
    names = list(config.get("architectures") or [])
    if not names and config.get("model_type") in _MODEL_TYPES:
        names = [_MODEL_TYPES[config["model_type"]]]
    for name in names:
        if name in ARCHITECTURES:
            return name
    raise InvalidArgument(
        f"config.json: architecture {names or config.get('model_type')!r} is not supported "
        f"(supported: {', '.join(ARCHITECTURES)})"
    )


def read_eos_token_ids(folder: Path, config: dict[str, Any]) -> list[int]:
    """EOS ids of generation_config.json, then config.json's, without duplicates."""
    sources = [config]
    if (folder / "generation_config.json").is_file():
        sources.insert(0, read_json(folder / "generation_config.json"))
    ids: list[int] = []
    for source in sources:
        value = source.get("eos_token_id")
        for token_id in value if isinstance(value, list) else [value]:
            if token_id is not None and int(token_id) not in ids:
                ids.append(int(token_id))
    return ids


def weight_files(folder: Path) -> list[Path]:
    if (folder / SINGLE_FILE).is_file():
        return [folder / SINGLE_FILE]
    if (folder / INDEX_FILE).is_file():
        index = read_json(folder / INDEX_FILE)
        names = sorted(set(index.get("weight_map", {}).values()))
        if not names:
            raise InvalidArgument(f"{folder / INDEX_FILE}: weight_map is empty")
        files = [folder / name for name in names]
        for file in files:
            if not file.is_file():
                raise FileNotFoundError(f"model folder: missing shard {file}")
        return files
    raise FileNotFoundError(
        f"model folder: neither {folder / SINGLE_FILE} nor {folder / INDEX_FILE}"
    )


def iter_checkpoint(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open handles are not iterable
                yield name, f.get_tensor(name)


def load_weights(
    model: ModelFolder, dtype: torch.dtype, device: torch.device, quantization: str = "auto"
) -> DecoderWeights:
    """Every weight of the model, on `device` in `dtype`; raises naming any missing tensor.

    `quantization`: "auto" keeps the checkpoint's format, "fp8" holds the projections in
    FP8, "none" in `dtype`.
    """
    stored = read_checkpoint_quantization(model.config)
    wanted = resolve_quantization(quantization, stored)
    fp8_checkpoint = stored.method == "fp8"
    weights = empty_weights(model.spec, dtype, device, fp8=fp8_checkpoint)
    targets = hf_weight_targets(model.spec, weights)
    missing = set(targets)
    for name, tensor in iter_checkpoint(weight_files(model.path)):
        target = targets.get(name)
        if target is None:
            if name.endswith(_IGNORED_SUFFIXES) or (
                name == "lm_head.weight" and model.spec.tie_word_embeddings
            ):
                continue
            if fp8_checkpoint and name.endswith(".input_scale"):
                continue  # activations are quantized per token at run time
            raise InvalidArgument(f"{model.path}: unexpected tensor {name!r} in the checkpoint")
        if name.endswith(".weight_scale"):
            tensor = _row_scales(model.path, name, tensor, target.shape[0])
        if tuple(tensor.shape) != tuple(target.shape):
            raise InvalidArgument(
                f"{model.path}: tensor {name!r} has shape {tuple(tensor.shape)}, "
                f"the config implies {tuple(target.shape)}"
            )
        target.copy_(tensor)
        missing.discard(name)
    if missing:
        raise InvalidArgument(f"{model.path}: checkpoint lacks {sorted(missing)[:8]}")
    if wanted == "fp8" and not fp8_checkpoint:
        quantize_projections(weights)
    elif wanted == "none" and fp8_checkpoint:
        _dequantize_projections(weights, dtype)
    return weights


def _row_scales(path: Path, name: str, scale: torch.Tensor, rows: int) -> torch.Tensor:
    """A checkpoint scale as one float32 value per output row (per-tensor: spread)."""
    flat = scale.reshape(-1).float()
    if flat.numel() == 1:
        return flat.expand(rows)
    if flat.numel() != rows:
        raise InvalidArgument(
            f"{path}: tensor {name!r} has {flat.numel()} scales; a per-tensor scale has 1 "
            f"and a per-channel one {rows}"
        )
    return flat


def _dequantize_projections(weights: DecoderWeights, dtype: torch.dtype) -> None:
    for layer in weights.layers:
        for field in LayerWeights.PROJECTIONS:
            weight = getattr(layer, field)
            if isinstance(weight, Fp8Weight):
                setattr(layer, field, dequantize(weight, dtype))
