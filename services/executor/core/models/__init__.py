"""Model registry: Hugging Face architecture name -> how it departs from the plain decoder."""

from __future__ import annotations

from services.executor.core.models.spec import ArchOptions, ModelSpec, parse_spec

ARCHITECTURES: dict[str, ArchOptions] = {
    "LlamaForCausalLM": ArchOptions(),
    "MistralForCausalLM": ArchOptions(honours_sliding_window=True),
    "Qwen2ForCausalLM": ArchOptions(qkv_bias=True, o_bias=False),
    "Qwen3ForCausalLM": ArchOptions(qk_norm=True),
}

__all__ = ["ARCHITECTURES", "ArchOptions", "ModelSpec", "parse_spec"]
