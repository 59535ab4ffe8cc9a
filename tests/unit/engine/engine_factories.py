"""A tiny random-weight Llama in Hugging Face format, small enough for many CPU steps."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

VOCAB = 256


def write_tiny_llama(path: Path, seed: int = 0) -> Path:
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(seed)
    transformers.LlamaForCausalLM(config).eval().save_pretrained(path, safe_serialization=True)
    return path
