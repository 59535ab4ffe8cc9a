"""The tiny default model folder: loads with transformers, tokenizes, templates, reproduces."""

from __future__ import annotations

import filecmp
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer

from mesh import tiny_model
from mesh.cli import main as cli_main
from mesh.tiny_model import ARCHS, MODEL_SIZES, ensure_default_model, write_tiny_model
from radixmesh.errors import InvalidArgument

FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    return {arch: write_tiny_model(root / arch, arch=arch, seed=0) for arch in ARCHS}


def expected_num_params(vocab_size: int) -> int:
    hidden, inter = MODEL_SIZES["hidden_size"], MODEL_SIZES["intermediate_size"]
    q_dim = MODEL_SIZES["num_attention_heads"] * MODEL_SIZES["head_dim"]
    kv_dim = MODEL_SIZES["num_key_value_heads"] * MODEL_SIZES["head_dim"]
    attention = hidden * q_dim * 2 + hidden * kv_dim * 2
    per_layer = attention + 3 * hidden * inter + 2 * hidden
    return vocab_size * hidden + MODEL_SIZES["num_hidden_layers"] * per_layer + hidden


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_folder_loads_with_transformers(model_dirs, arch):
    path = model_dirs[arch]
    for name in FILES:
        assert (path / name).is_file(), name
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    assert type(model).__name__ == ARCHS[arch].model_class
    assert model.config.vocab_size == len(tokenizer)
    assert 1500 <= len(tokenizer) <= 2100
    assert model.config.tie_word_embeddings
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    num_params = sum(p.numel() for p in model.parameters())
    # Qwen2 adds q/k/v biases, Qwen3 adds per-head q/k norms; both are small.
    assert (
        expected_num_params(len(tokenizer))
        <= num_params
        <= 1.02 * expected_num_params(len(tokenizer))
    )
    assert 2_000_000 <= num_params <= 5_000_000
    ids = tokenizer("The lighthouse keeper", return_tensors="pt").input_ids
    logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], len(tokenizer))
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_special_tokens_and_bos(model_dirs, arch):
    tokenizer = AutoTokenizer.from_pretrained(model_dirs[arch])
    assert tokenizer.bos_token == "<|bos|>" and tokenizer.eos_token == "<|eos|>"
    assert tokenizer.pad_token == "<|pad|>"
    config = AutoModelForCausalLM.from_pretrained(model_dirs[arch]).config
    assert config.bos_token_id == tokenizer.bos_token_id
    assert config.eos_token_id == tokenizer.eos_token_id
    ids = tokenizer.encode("hello world")
    assert (ids[0] == tokenizer.bos_token_id) == ARCHS[arch].add_bos
    assert tokenizer.encode("hello world", add_special_tokens=False) == ids[ARCHS[arch].add_bos :]
    for marker in ("<|system|>", "<|user|>", "<|assistant|>"):
        assert len(tokenizer.encode(marker, add_special_tokens=False)) == 1


@pytest.mark.parametrize(
    "text",
    [
        "héllo 世界 🙂",
        'The quick brown fox, 3.14159 and {"a": [1, 2]}\n\tdef f(x): return x',
        "  leading spaces, trailing  ",
        "Ελληνικά кириллица العربية 🚀🌊 \u00a0zero\u200bwidth",
    ],
)
def test_tokenizer_round_trips_utf8(model_dirs, text):
    tokenizer = AutoTokenizer.from_pretrained(model_dirs["llama"])
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text
    with_bos = tokenizer.encode(text)
    assert tokenizer.decode(with_bos, skip_special_tokens=True) == text


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_tokenizer_json_alone_encodes_like_transformers(model_dirs, arch):
    """A service that loads tokenizer.json with `tokenizers` gets transformers' ids."""
    path = model_dirs[arch]
    raw = Tokenizer.from_file(str(path / "tokenizer.json"))
    loaded = AutoTokenizer.from_pretrained(path)
    text = 'User: héllo 世界 🙂, it\'s 17:45 and {"k": [1, 2.5]}\n  done'
    assert raw.encode(text).ids == loaded.encode(text)
    assert raw.encode(text, add_special_tokens=False).ids == loaded.encode(
        text, add_special_tokens=False
    )
    assert raw.get_vocab_size() == len(loaded)


def test_tokenizer_compresses_english(model_dirs):
    tokenizer = AutoTokenizer.from_pretrained(model_dirs["llama"])
    text = "The weather report for tomorrow says the morning will be cloudy along the coast."
    assert len(tokenizer.encode(text, add_special_tokens=False)) < len(text) / 3


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_chat_template_renders(model_dirs, arch):
    tokenizer = AutoTokenizer.from_pretrained(model_dirs[arch])
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi there"},
    ]
    bos = "<|bos|>" if ARCHS[arch].add_bos else ""
    turns = "<|system|>\nBe brief.<|eos|>\n<|user|>\nHi there<|eos|>\n"
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == bos + turns + "<|assistant|>\n"
    plain = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    assert plain == bos + turns
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]
    assert ids == tokenizer.encode(rendered, add_special_tokens=False)
    assert ids.count(tokenizer.bos_token_id) == int(ARCHS[arch].add_bos)
    with pytest.raises(Exception, match="role"):
        tokenizer.apply_chat_template([{"role": "tool", "content": "x"}], tokenize=False)


def test_same_seed_writes_identical_files(model_dirs, tmp_path):
    again = write_tiny_model(tmp_path / "again", arch="llama", seed=0)
    match, mismatch, errors = filecmp.cmpfiles(model_dirs["llama"], again, FILES, shallow=False)
    assert sorted(match) == sorted(FILES), (mismatch, errors)
    assert filecmp.cmp(
        model_dirs["llama"] / "chat_template.jinja", again / "chat_template.jinja", shallow=False
    )


def test_other_seed_changes_only_weights(model_dirs, tmp_path):
    other = write_tiny_model(tmp_path / "other", arch="llama", seed=1)
    _, mismatch, _ = filecmp.cmpfiles(model_dirs["llama"], other, FILES, shallow=False)
    assert mismatch == ["model.safetensors"]


def test_bad_arch_and_seed_are_rejected(tmp_path):
    with pytest.raises(InvalidArgument, match="arch"):
        write_tiny_model(tmp_path / "m", arch="gpt2")
    with pytest.raises(InvalidArgument, match="seed"):
        write_tiny_model(tmp_path / "m", seed=-1)


def test_cli_writes_model(tmp_path, capsys):
    assert (
        cli_main(["make-tiny-model", str(tmp_path / "cli"), "--arch", "qwen3", "--seed", "2"]) == 0
    )
    assert capsys.readouterr().out.strip() == str(tmp_path / "cli")
    config = AutoModelForCausalLM.from_pretrained(tmp_path / "cli").config
    assert config.model_type == "qwen3"


def test_default_model_dir_follows_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("RADIXMESH_CACHE_DIR", str(tmp_path / "cache"))
    assert tiny_model.default_model_dir() == tmp_path / "cache"
    monkeypatch.delenv("RADIXMESH_CACHE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert tiny_model.default_model_dir() == tmp_path / "home" / ".cache" / "radixmesh"


def test_ensure_default_model_builds_once(monkeypatch, tmp_path, model_dirs):
    monkeypatch.setenv("RADIXMESH_CACHE_DIR", str(tmp_path))
    path = ensure_default_model()
    assert path == tmp_path / "tiny-llama"
    assert filecmp.cmp(path / "model.safetensors", model_dirs["llama"] / "model.safetensors", False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny-llama"]

    def must_not_build(*args, **kwargs):
        raise AssertionError("rebuilt an existing model")

    monkeypatch.setattr(tiny_model, "write_tiny_model", must_not_build)
    assert ensure_default_model() == path


def test_ensure_default_model_loses_race_cleanly(monkeypatch, tmp_path):
    """Another process renames its copy in first: ours is discarded, theirs returned."""
    monkeypatch.setenv("RADIXMESH_CACHE_DIR", str(tmp_path))
    winner = tmp_path / "tiny-llama"
    real_write = tiny_model.write_tiny_model

    def write_then_lose(out_dir, arch="llama", seed=0):
        real_write(out_dir, arch=arch, seed=seed)
        winner.mkdir()
        (winner / "config.json").write_text("{}")
        (winner / "marker").write_text("winner")
        return Path(out_dir)

    monkeypatch.setattr(tiny_model, "write_tiny_model", write_then_lose)
    assert ensure_default_model() == winner
    assert (winner / "marker").read_text() == "winner"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny-llama"]
