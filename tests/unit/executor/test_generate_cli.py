"""`radixmesh generate --json` against transformers' greedy generate on the same folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from mesh import cli
from tests.unit.executor.conftest import build_hf_model, hf_greedy

CORPUS = [
    "pages of the cache hold the keys and values of every token",
    "a scheduler plans each step under a budget of tokens",
    "requests that share a prefix share its pages",
]


def save_tokenizer(folder: Path) -> int:
    """A small BPE tokenizer that prepends <s> like Llama's; returns its vocabulary size."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=100, special_tokens=["<unk>", "<s>", "</s>"])
    tokenizer.train_from_iterator(CORPUS * 4, trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", 1)]
    )
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    wrapped.save_pretrained(folder)
    return tokenizer.get_vocab_size()


def test_generate_json_equals_transformers_greedy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    vocab_size = save_tokenizer(tmp_path)
    hf = build_hf_model("llama-tied", vocab_size=vocab_size)
    hf.save_pretrained(tmp_path)
    prompt = "requests share the pages of a prefix"
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    prompt_ids = tokenizer(prompt)["input_ids"]
    assert prompt_ids[0] == 1  # BOS added as the tokenizer does by default
    expected = hf_greedy(hf, prompt_ids, 16)

    argv = ["generate", "--model", str(tmp_path), "--max-tokens", "16", "--temperature", "0"]
    assert cli.main([*argv, "--device", "cpu", "--json", prompt]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["prompt_token_ids"] == prompt_ids
    assert record["token_ids"] == expected
    assert record["text"] == tokenizer.decode(expected, skip_special_tokens=True)
    assert record["finish_reason"] == ("length" if len(expected) == 16 else "stop")


def test_generate_reports_a_missing_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["generate", "--model", str(tmp_path / "none"), "hi"]) == 2
    assert str(tmp_path / "none") in capsys.readouterr().err
