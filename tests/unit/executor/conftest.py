"""Factories for executor tests: tiny Hugging Face models saved to temporary folders.

Every weight (norms and biases included) is drawn at random, so a wrong
mapping of any tensor shows up in the logits.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from radixmesh.sampling import Constraint, SamplingParams
from radixmesh.step import NewSequence, StepPlan
from services.executor.core.config import ExecutorConfig
from services.executor.core.executor import ExecutorCore
from services.executor.core.grammar import Grammar, TokenMatcher

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}
COMMON = {
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
# name -> (config class, model class, config overrides)
VARIANTS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama3-untied": ("LlamaConfig", "LlamaForCausalLM", {"rope_parameters": LLAMA3_ROPE}),
    "llama-tied": ("LlamaConfig", "LlamaForCausalLM", {"tie_word_embeddings": True}),
    "mistral-untied": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 128}),
    "qwen2-tied": ("Qwen2Config", "Qwen2ForCausalLM", {"tie_word_embeddings": True}),
    "qwen3-untied": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 32}),
}


@dataclass(slots=True)
class TinyModel:
    name: str
    hf: torch.nn.Module
    path: Path


def build_hf_model(name: str, seed: int = 0, **overrides: Any) -> torch.nn.Module:
    config_cls, model_cls, extra = VARIANTS[name]
    config = getattr(transformers, config_cls)(**{**COMMON, **extra, **overrides})
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config).eval()
    with torch.no_grad():
        for param_name, param in model.named_parameters():
            if param_name.endswith("norm.weight"):
                param.copy_(1.0 + 0.2 * torch.randn_like(param))
            elif param_name.endswith("bias"):
                param.copy_(0.2 * torch.randn_like(param))
            else:
                param.copy_(0.15 * torch.randn_like(param))
    return model


def save_tiny_model(path: Path, name: str, **overrides: Any) -> TinyModel:
    hf = build_hf_model(name, **overrides)
    hf.save_pretrained(path)
    return TinyModel(name, hf, path)


@pytest.fixture(scope="session", params=list(VARIANTS))
def tiny_model(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> TinyModel:
    return save_tiny_model(tmp_path_factory.mktemp(request.param), request.param)


MISTRAL_WINDOW = 8


@pytest.fixture(scope="session")
def windowed_mistral(tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    """A Mistral whose sliding window (MISTRAL_WINDOW) is shorter than the test prompts."""
    return save_tiny_model(
        tmp_path_factory.mktemp("mistral-w8"), "mistral-untied", sliding_window=MISTRAL_WINDOW
    )


@pytest.fixture(scope="session")
def llama_model(tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    return save_tiny_model(tmp_path_factory.mktemp("llama"), "llama3-untied")


class FactoryGrammar:
    """A grammar backend over a factory of test matchers: a step's tokens are accepted one
    matcher at a time."""

    def __init__(self, factory: Callable[[Constraint], TokenMatcher]) -> None:
        self._factory = factory

    def matcher_for(self, constraint: Constraint) -> TokenMatcher:
        return self._factory(constraint)

    def accept_batch(self, matchers: Sequence[TokenMatcher], token_ids: Sequence[int]) -> list[bool]:
        return [m.accept(t) for m, t in zip(matchers, token_ids, strict=True)]


def make_core(model: TinyModel, grammar: Grammar | None = None, **overrides: Any) -> ExecutorCore:
    fields: dict[str, Any] = {
        "model_path": str(model.path),
        "device": "cpu",
        "page_size": 4,
        "num_pages": 64,
    }
    fields.update(overrides)
    return ExecutorCore(ExecutorConfig(**fields), grammar)


def greedy(max_tokens: int | None = 32, **overrides: Any) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, **overrides)


STEP_IDS = itertools.count(1)
"""Step ids for plans driven straight into a core (it does not check them; the service
does): any increasing ones."""


def admit(core, req_id: str, prompt: list[int], page_ids: list[int], **sampling) -> int:
    """Prefill req_id greedily in a step of its own; its first token."""
    new = NewSequence(req_id, prompt, len(prompt), 0, len(prompt), page_ids, greedy(**sampling))
    (out,) = core.step(StepPlan(next(STEP_IDS), new_seqs=[new])).outputs
    assert out.token_id is not None
    return out.token_id


def hf_logits(hf: torch.nn.Module, token_ids: list[int]) -> torch.Tensor:
    """[len(token_ids), vocab] float32 logits of a whole sequence run alone."""
    with torch.no_grad():
        return hf(torch.tensor([token_ids])).logits[0].float()


def hf_greedy(
    hf: torch.nn.Module, token_ids: list[int], max_new_tokens: int, *, ignore_eos: bool = False
) -> list[int]:
    """transformers' greedy continuation; with ignore_eos exactly max_new_tokens tokens."""
    until_eos = {"eos_token_id": None, "min_new_tokens": max_new_tokens} if ignore_eos else {}
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([token_ids]),
            attention_mask=torch.ones(1, len(token_ids), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            **until_eos,
        )
    return out[0, len(token_ids) :].tolist()


def random_prompt(length: int, seed: int, vocab_size: int = 128) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab_size, (length,), generator=generator).tolist()
