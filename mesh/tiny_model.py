"""The tiny default model: a seeded random-weight Hugging Face model with a local tokenizer.

`write_tiny_model(out_dir, arch, seed)` writes a folder that transformers loads as is:
config.json, model.safetensors, generation_config.json, tokenizer.json,
tokenizer_config.json and the chat template. The tokenizer is a byte-level BPE
trained on the English corpus shipped in `mesh/data/`, so any UTF-8 text
round-trips. Same arch and seed give byte-identical files.

`ensure_default_model()` builds `tiny-llama` once in the cache folder
(`RADIXMESH_CACHE_DIR`, else `~/.cache/radixmesh`) and returns its path.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from radixmesh.errors import FailedPrecondition, InvalidArgument

DEFAULT_MODEL_NAME = "tiny-llama"
CORPUS_FILE = "tiny_corpus.txt"
TOKENIZER_VOCAB_SIZE = 2000

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
SYSTEM, USER, ASSISTANT = "<|system|>", "<|user|>", "<|assistant|>"
SPECIAL_TOKENS = (BOS, EOS, PAD, SYSTEM, USER, ASSISTANT)
"""In id order: <|bos|> is 0, <|eos|> 1, <|pad|> 2, then the chat markers."""

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('chat role must be system, user or assistant, got ' + message['role']) }}"
    "{%- endif %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + eos_token + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
"""Each turn is `<|role|>\\n{content}<|eos|>\\n`; generation starts after `<|assistant|>\\n`.

Llama-style tokenizers put `{{ bos_token }}` in front (the template's text is
tokenized without special tokens, as transformers does)."""


@dataclass(frozen=True, slots=True)
class TinyArch:
    """Shape of one tiny architecture; the model sizes are shared by all archs."""

    config_class: str
    """Name of the transformers config class."""
    model_class: str
    """Name of the transformers causal-LM class (the `architectures` entry)."""
    rope_theta: float
    tokenizer: str
    """Key in TOKENIZER_BUILDERS: the tokenizer family transformers loads for this arch."""
    add_bos: bool
    """Whether encode prepends <|bos|> (Llama does; Qwen does not)."""
    extra: tuple[tuple[str, object], ...] = ()
    """Further config fields for this arch."""


_QWEN_EXTRA = (("use_sliding_window", False), ("max_window_layers", 4))

ARCHS: dict[str, TinyArch] = {
    "llama": TinyArch("LlamaConfig", "LlamaForCausalLM", 10000.0, "llama", add_bos=True),
    "qwen2": TinyArch("Qwen2Config", "Qwen2ForCausalLM", 1e6, "qwen2", False, _QWEN_EXTRA),
    "qwen3": TinyArch("Qwen3Config", "Qwen3ForCausalLM", 1e6, "qwen2", False, _QWEN_EXTRA),
}

MODEL_SIZES = {
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "intermediate_size": 512,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "initializer_range": 0.02,
    "tie_word_embeddings": True,
}


def corpus_text() -> str:
    """The tokenizer's training text, shipped with the package."""
    return resources.files("mesh").joinpath("data", CORPUS_FILE).read_text(encoding="utf-8")


def train_tokenizer(
    normalizer=None,
    pre_tokenizer=None,
    vocab_size: int = TOKENIZER_VOCAB_SIZE,
    corpus: Sequence[str] | None = None,
):
    """A byte-level BPE `tokenizers.Tokenizer` trained on `corpus` (lines of text), by
    default the shipped corpus.

    `pre_tokenizer` defaults to byte-level with the GPT-2 split regex; it must
    end in a byte-level step. Training is deterministic: the same arguments
    give the same tokenizer.json. No post-processor is set.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    if normalizer is not None:
        tokenizer.normalizer = normalizer
    tokenizer.pre_tokenizer = pre_tokenizer or pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = corpus_text().splitlines(keepends=True) if corpus is None else corpus
    tokenizer.train_from_iterator(lines, trainer=trainer)
    return tokenizer


def _hf_tokenizer_kwargs(add_bos: bool) -> dict:
    return {
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "extra_special_tokens": [SYSTEM, USER, ASSISTANT],
        "chat_template": ("{{ bos_token }}" if add_bos else "") + CHAT_TEMPLATE,
        "model_max_length": MODEL_SIZES["max_position_embeddings"],
    }


def _llama_tokenizer():
    """Byte-level BPE (GPT-2 split) whose encode prepends <|bos|>, as Llama's does."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    tokenizer = train_tokenizer()
    bos_id = tokenizer.token_to_id(BOS)
    tokenizer.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B:1", special_tokens=[(BOS, bos_id)]
            ),
        ]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, clean_up_tokenization_spaces=False, **_hf_tokenizer_kwargs(True)
    )


def _qwen2_tokenizer():
    """Qwen2's pipeline (NFC, Qwen split regex, byte level), no BOS on encode.

    transformers loads Qwen2 models' tokenizers through `Qwen2Tokenizer`,
    which rebuilds that pipeline from the vocab and merges; training with the
    same pipeline keeps tokenizer.json and the loaded tokenizer in agreement.
    """
    from transformers import Qwen2Tokenizer

    reference = Qwen2Tokenizer().backend_tokenizer
    trained = json.loads(train_tokenizer(reference.normalizer, reference.pre_tokenizer).to_str())
    return Qwen2Tokenizer(
        vocab=trained["model"]["vocab"],
        merges=[tuple(merge) for merge in trained["model"]["merges"]],
        unk_token=None,
        **_hf_tokenizer_kwargs(False),
    )


TOKENIZER_BUILDERS: dict[str, Callable] = {"llama": _llama_tokenizer, "qwen2": _qwen2_tokenizer}


def _build_hf_model(arch: TinyArch, vocab_size: int, seed: int, token_ids: dict[str, int]):
    import torch
    import transformers

    config_class: Callable = getattr(transformers, arch.config_class)
    config = config_class(
        vocab_size=vocab_size,
        rope_parameters={"rope_type": "default", "rope_theta": arch.rope_theta},
        bos_token_id=token_ids[BOS],
        eos_token_id=token_ids[EOS],
        pad_token_id=token_ids[PAD],
        architectures=[arch.model_class],
        dtype="float32",
        **MODEL_SIZES,
        **dict(arch.extra),
    )
    model_class = getattr(transformers, arch.model_class)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config)
    model.generation_config = transformers.GenerationConfig(
        bos_token_id=token_ids[BOS],
        eos_token_id=token_ids[EOS],
        pad_token_id=token_ids[PAD],
        do_sample=False,
    )
    return model.eval()


def write_tiny_model(out_dir: str | os.PathLike, arch: str = "llama", seed: int = 0) -> Path:
    """Writes the tiny model of `arch` with weights seeded by `seed` into `out_dir`."""
    spec = ARCHS.get(arch)
    if spec is None:
        raise InvalidArgument(f"arch must be one of {sorted(ARCHS)}, got {arch!r}")
    if not 0 <= seed < 2**63:
        raise InvalidArgument(f"seed must be in [0, 2**63), got {seed}")
    out = Path(out_dir)
    make_folder(out)
    tokenizer = TOKENIZER_BUILDERS[spec.tokenizer]()
    token_ids = {tok: tokenizer.convert_tokens_to_ids(tok) for tok in (BOS, EOS, PAD)}
    model = _build_hf_model(spec, len(tokenizer), seed, token_ids)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def make_folder(out: Path) -> None:
    """Creates the folder `out` (and its parents). A path that cannot be a folder (a file is
    there, or above it) raises InvalidArgument; another failure (no permission, a read-only
    file system) raises FailedPrecondition; both name the folder and the reason."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise InvalidArgument(
            f"{out}: cannot be a folder: {'it is a file' if out.exists() else 'a file is on its path'}"
        ) from None
    except OSError as exc:
        raise FailedPrecondition(
            f"{out}: cannot create the folder: {exc.strerror or exc}"
        ) from None


def default_model_dir() -> Path:
    """The cache folder for default models: $RADIXMESH_CACHE_DIR, else ~/.cache/radixmesh."""
    env = os.environ.get("RADIXMESH_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "radixmesh"


def ensure_default_model() -> Path:
    """Returns the `tiny-llama` folder in the cache, building it on first use.

    Built in a temporary sibling folder and renamed into place, so a reader
    never sees a half-written model and concurrent callers are safe: the
    first rename wins and the others discard their copy.
    """
    root = default_model_dir()
    final = root / DEFAULT_MODEL_NAME
    if (final / "config.json").is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{DEFAULT_MODEL_NAME}-", dir=root))
    try:
        write_tiny_model(tmp, arch="llama", seed=0)
        tmp.chmod(0o755)  # mkdtemp makes it private
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "config.json").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final
