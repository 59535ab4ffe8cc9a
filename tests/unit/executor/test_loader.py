"""Loading Hugging Face folders: sharded weights, dtype, config forms, clear errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from radixmesh.errors import InvalidArgument
from services.executor.core.loader import load_weights, read_model_folder
from services.executor.core.models.spec import read_rope
from tests.fixtures.executor_driver import generate
from tests.unit.executor.conftest import (
    LLAMA3_ROPE,
    TinyModel,
    build_hf_model,
    greedy,
    hf_greedy,
    make_core,
    random_prompt,
)


def test_sharded_checkpoint_loads_the_same_model(tmp_path: Path) -> None:
    hf = build_hf_model("qwen2-tied")
    hf.save_pretrained(tmp_path, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 1
    core = make_core(TinyModel("qwen2-tied", hf, tmp_path))
    prompt = random_prompt(10, seed=60)
    (output,) = generate(core, [prompt], greedy(8))
    assert output.token_ids == hf_greedy(hf, prompt, 8)


def test_bfloat16_load_converts_every_weight(llama_model: TinyModel) -> None:
    core = make_core(llama_model, dtype="bfloat16")
    assert core.info.dtype == "bfloat16"
    layer = core.model.weights.layers[0]
    assert {t.dtype for t in (layer.qkv, layer.gate_up, core.model.weights.lm_head)} == {
        torch.bfloat16
    }
    assert core.kv_pool.k_caches[0].dtype == torch.bfloat16
    q_proj = llama_model.hf.model.layers[0].self_attn.q_proj.weight
    assert torch.equal(layer.qkv[: q_proj.shape[0]], q_proj.to(torch.bfloat16))


def test_tied_embeddings_share_one_tensor(tmp_path: Path) -> None:
    hf = build_hf_model("llama-tied")
    hf.save_pretrained(tmp_path)
    assert "lm_head.weight" not in load_file(tmp_path / "model.safetensors")
    weights = load_weights(read_model_folder(tmp_path), torch.float32, torch.device("cpu"))
    assert weights.lm_head is weights.embed


def copy_config(src: Path, dst: Path, **changes: object) -> Path:
    dst.mkdir()
    config = json.loads((src / "config.json").read_text())
    config.update(changes)
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def test_missing_files_name_the_path(llama_model: TinyModel, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "config.json"))):
        read_model_folder(tmp_path)
    folder = copy_config(llama_model.path, tmp_path / "noweights")
    with pytest.raises(FileNotFoundError, match=r"model\.safetensors"):
        load_weights(read_model_folder(folder), torch.float32, torch.device("cpu"))
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"model.norm.weight": "model-00001-of-00002.safetensors"}})
    )
    with pytest.raises(FileNotFoundError, match=r"model-00001-of-00002\.safetensors"):
        load_weights(read_model_folder(folder), torch.float32, torch.device("cpu"))


def test_unknown_architecture_is_refused(llama_model: TinyModel, tmp_path: Path) -> None:
    folder = copy_config(
        llama_model.path, tmp_path / "gpt2", architectures=["GPT2LMHeadModel"], model_type="gpt2"
    )
    with pytest.raises(InvalidArgument, match=r"GPT2LMHeadModel.*LlamaForCausalLM"):
        read_model_folder(folder)


def test_missing_or_misshapen_tensors_are_named(llama_model: TinyModel, tmp_path: Path) -> None:
    tensors = load_file(llama_model.path / "model.safetensors")
    folder = copy_config(llama_model.path, tmp_path / "broken")
    partial = {k: v for k, v in tensors.items() if k != "model.layers.1.mlp.up_proj.weight"}
    save_file(partial, folder / "model.safetensors")
    with pytest.raises(InvalidArgument, match=r"model\.layers\.1\.mlp\.up_proj\.weight"):
        load_weights(read_model_folder(folder), torch.float32, torch.device("cpu"))
    partial["model.layers.1.mlp.up_proj.weight"] = torch.zeros(3, 3)
    save_file(partial, folder / "model.safetensors")
    with pytest.raises(InvalidArgument, match=r"up_proj\.weight' has shape \(3, 3\)"):
        load_weights(read_model_folder(folder), torch.float32, torch.device("cpu"))


def test_legacy_rope_fields_read_like_rope_parameters() -> None:
    legacy_scaling = {k: v for k, v in LLAMA3_ROPE.items() if k != "rope_theta"}
    legacy = {"rope_theta": LLAMA3_ROPE["rope_theta"], "rope_scaling": legacy_scaling}
    assert read_rope(legacy) == read_rope({"rope_parameters": LLAMA3_ROPE})
    assert read_rope({"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}) == (
        1e6,
        None,
    )
    assert read_rope({}) == (10000.0, None)
    with pytest.raises(InvalidArgument, match="yarn"):
        read_rope({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}})
