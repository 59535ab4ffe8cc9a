"""Writes a random-weight model of the Llama-3.1-8B shape as a Hugging Face folder.

The folder holds what transformers and the executor load: config.json (llama3
rope scaling, bf16), sharded safetensors with model.safetensors.index.json
under Hugging Face tensor names, generation_config.json, and the tiny model's
tokenizer padded with plain added tokens (`<w1234>`) up to the embedding's
vocabulary, so every id the model samples decodes to text and every API path
(the OpenAI stream's text included) sees each token. Weights are N(0, 0.02) (norm weights 1), drawn on the GPU
when there is one, seeded per tensor, and written by parallel threads.

The folder is built beside its final path and renamed into place, so a reader
never sees half a model; an existing folder is kept unless --force.

    python bench/model_8b.py [--out /tmp/llama8b] [--shape 8b|1b|tiny] [--force] [--json info.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

INDEX_FILE = "model.safetensors.index.json"
WEIGHT_STD = 0.02
WRITE_CHUNK = 64 << 20
_TOKENIZER_SKIP = ("config.json", "generation_config.json")


@dataclass(frozen=True, slots=True)
class Shape:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    num_shards: int

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


LLAMA_8B = Shape(4096, 32, 32, 8, 14336, 128256, 131072, num_shards=8)
TINY = Shape(256, 4, 8, 2, 512, 4096, 131072, num_shards=3)
"""Same structure as LLAMA_8B, a few MB: a smoke run of this script on the CPU."""
LLAMA_1B = Shape(2048, 16, 32, 8, 8192, 128256, 131072, num_shards=2)
"""Llama-3.2-1B's shape (untied head here): the short-request rate benches."""
SHAPES = {"8b": LLAMA_8B, "1b": LLAMA_1B, "tiny": TINY}

ROPE_PARAMETERS = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    ones: bool = False
    """Norm weights are ones; everything else is N(0, WEIGHT_STD)."""

    @property
    def num_bytes(self) -> int:
        n = 2  # bf16
        for dim in self.shape:
            n *= dim
        return n


def tensor_specs(s: Shape) -> list[TensorSpec]:
    """Every tensor of the checkpoint, in Hugging Face names and file order."""
    q, kv = s.num_attention_heads * s.head_dim, s.num_key_value_heads * s.head_dim
    h, inter = s.hidden_size, s.intermediate_size
    specs = [TensorSpec("model.embed_tokens.weight", (s.vocab_size, h))]
    for i in range(s.num_hidden_layers):
        p = f"model.layers.{i}."
        specs += [
            TensorSpec(p + "input_layernorm.weight", (h,), ones=True),
            TensorSpec(p + "self_attn.q_proj.weight", (q, h)),
            TensorSpec(p + "self_attn.k_proj.weight", (kv, h)),
            TensorSpec(p + "self_attn.v_proj.weight", (kv, h)),
            TensorSpec(p + "self_attn.o_proj.weight", (h, q)),
            TensorSpec(p + "post_attention_layernorm.weight", (h,), ones=True),
            TensorSpec(p + "mlp.gate_proj.weight", (inter, h)),
            TensorSpec(p + "mlp.up_proj.weight", (inter, h)),
            TensorSpec(p + "mlp.down_proj.weight", (h, inter)),
        ]
    specs += [
        TensorSpec("model.norm.weight", (h,), ones=True),
        TensorSpec("lm_head.weight", (s.vocab_size, h)),
    ]
    return specs


def split_shards(specs: list[TensorSpec], num_shards: int) -> list[list[TensorSpec]]:
    """Consecutive groups of about equal bytes (at most num_shards, none empty)."""
    total = sum(t.num_bytes for t in specs)
    target = total / num_shards
    shards: list[list[TensorSpec]] = [[]]
    filled = 0
    for t in specs:
        if shards[-1] and filled + t.num_bytes / 2 > target * len(shards):
            shards.append([])
        shards[-1].append(t)
        filled += t.num_bytes
    return shards


def safetensors_header(specs: list[TensorSpec]) -> bytes:
    """The length-prefixed JSON header of a safetensors file (padded to 8 bytes)."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for t in specs:
        header[t.name] = {
            "dtype": "BF16",
            "shape": list(t.shape),
            "data_offsets": [offset, offset + t.num_bytes],
        }
        offset += t.num_bytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    return struct.pack("<Q", len(blob)) + blob


def draw(spec: TensorSpec, seed: int, device: torch.device) -> torch.Tensor:
    if spec.ones:
        return torch.ones(spec.shape, dtype=torch.bfloat16)
    gen = torch.Generator(device=device).manual_seed(seed)
    t = torch.randn(spec.shape, generator=gen, device=device, dtype=torch.bfloat16)
    return t.mul_(WEIGHT_STD).cpu()


def write_shard(
    path: Path, specs: list[TensorSpec], seeds: list[int], device: torch.device
) -> None:
    """One safetensors file, tensor by tensor: draw, copy to the host, write."""
    with path.open("wb") as f:
        f.write(safetensors_header(specs))
        for spec, seed in zip(specs, seeds, strict=True):
            data = draw(spec, seed, device).reshape(-1).view(torch.uint8).numpy().data
            for start in range(0, len(data), WRITE_CHUNK):  # much faster than one huge write
                f.write(data[start : start + WRITE_CHUNK])


def llama_config(s: Shape, token_ids: dict[str, int]) -> dict[str, object]:
    """config.json as the installed transformers writes it (hand-built if it cannot)."""
    fields: dict[str, object] = {
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": s.vocab_size,
        "hidden_size": s.hidden_size,
        "intermediate_size": s.intermediate_size,
        "num_hidden_layers": s.num_hidden_layers,
        "num_attention_heads": s.num_attention_heads,
        "num_key_value_heads": s.num_key_value_heads,
        "head_dim": s.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": s.max_position_embeddings,
        "rms_norm_eps": 1e-5,
        "rope_parameters": dict(ROPE_PARAMETERS),
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "dtype": "bfloat16",
        **token_ids,
    }
    try:
        import transformers

        return transformers.LlamaConfig(**fields).to_diff_dict()
    except Exception as exc:  # an older transformers: write the 5.x fields as they are
        print(f"transformers could not build the config ({exc}); writing it by hand")
        return {"model_type": "llama", **fields}


def copy_tokenizer(dst: Path, vocab_size: int | None = None) -> dict[str, int]:
    """The tiny model's tokenizer files into dst, padded to vocab_size ids (see
    pad_tokenizer); returns its bos/eos/pad ids."""
    from mesh.tiny_model import write_tiny_model

    with tempfile.TemporaryDirectory(prefix="tiny-tokenizer-") as tmp:
        tiny = write_tiny_model(tmp)
        for src in tiny.iterdir():
            if src.name not in _TOKENIZER_SKIP and not src.name.startswith("model"):
                shutil.copy2(src, dst / src.name)
        config = json.loads((tiny / "config.json").read_text())
    if vocab_size is not None:
        pad_tokenizer(dst / "tokenizer.json", vocab_size)
    return {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")}


def pad_tokenizer(path: Path, vocab_size: int) -> int:
    """Add plain tokens `<wN>` to the tokenizer.json at path until it has vocab_size ids;
    returns how many were added. A random model samples every id of its embedding, and
    each of these decodes to text of its own (none is special, so none is skipped)."""
    from tokenizers import AddedToken, Tokenizer

    tokenizer = Tokenizer.from_file(str(path))
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    if size > vocab_size:
        raise ValueError(f"the tokenizer has {size} ids, more than the model's {vocab_size}")
    tokenizer.add_tokens(
        [AddedToken(f"<w{i}>", normalized=False) for i in range(size, vocab_size)]
    )
    tokenizer.save(str(path))
    return vocab_size - size


@dataclass(slots=True)
class Info:
    path: str
    num_params: int
    weight_bytes: int
    num_shards: int
    seconds: float
    created: bool


def write_model(out: Path, shape: Shape, device: torch.device, seed: int, workers: int) -> Info:
    start = time.perf_counter()
    specs = tensor_specs(shape)
    shards = split_shards(specs, shape.num_shards)
    out.parent.mkdir(parents=True, exist_ok=True)
    for stale in out.parent.glob(f".{out.name}-*"):  # left by a killed run; 16 GB each
        shutil.rmtree(stale, ignore_errors=True)
    weight_bytes = sum(t.num_bytes for t in specs)
    free = shutil.disk_usage(out.parent).free
    if free < weight_bytes * 1.05:
        raise OSError(
            f"{out.parent}: {free / 1e9:.1f} GB free, the model needs {weight_bytes / 1e9:.1f}"
        )
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        token_ids = copy_tokenizer(tmp, shape.vocab_size)
        names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
        seeds = {t.name: seed * 1_000_003 + i for i, t in enumerate(specs)}
        with ThreadPoolExecutor(max_workers=workers) as pool:
            jobs = [
                pool.submit(write_shard, tmp / name, group, [seeds[t.name] for t in group], device)
                for name, group in zip(names, shards, strict=True)
            ]
            for job in jobs:
                job.result()
        index = {
            "metadata": {"total_size": weight_bytes},
            "weight_map": {
                t.name: n for n, group in zip(names, shards, strict=True) for t in group
            },
        }
        (tmp / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
        config = llama_config(shape, token_ids)
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        generation = {**token_ids, "do_sample": False}
        (tmp / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
        tmp.chmod(0o755)
        if out.exists():
            shutil.rmtree(out)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Info(
        path=str(out),
        num_params=weight_bytes // 2,
        weight_bytes=weight_bytes,
        num_shards=len(shards),
        seconds=round(time.perf_counter() - start, 2),
        created=True,
    )


def existing(out: Path) -> Info | None:
    """The Info of a complete folder at out, None when there is none."""
    index_path, config_path = out / INDEX_FILE, out / "config.json"
    if not (index_path.is_file() and config_path.is_file()):
        return None
    index = json.loads(index_path.read_text())
    files = set(index["weight_map"].values())
    if not all((out / name).is_file() for name in files):
        return None
    weight_bytes = int(index["metadata"]["total_size"])
    return Info(str(out), weight_bytes // 2, weight_bytes, len(files), 0.0, created=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/llama8b"), help="model folder")
    parser.add_argument("--shape", choices=tuple(SHAPES), default="8b", help="model shape")
    parser.add_argument("--tiny-shape", action="store_true", help="--shape tiny (a few MB)")
    parser.add_argument("--force", action="store_true", help="rewrite an existing folder")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--device", default=None, help="where weights are drawn (default: cuda if present)"
    )
    parser.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1))
    parser.add_argument("--json", type=Path, help="also write the result as JSON here")
    args = parser.parse_args(argv)
    if args.seed < 0:
        parser.error("--seed must be >= 0")
    if args.workers < 1:
        parser.error("--workers must be >= 1")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    shape = TINY if args.tiny_shape else SHAPES[args.shape]
    info = None if args.force else existing(args.out)
    if info is None:
        info = write_model(args.out, shape, device, args.seed, args.workers)
        print(
            f"wrote {info.path}: {info.num_params / 1e9:.3f} B params, "
            f"{info.weight_bytes / 1e9:.2f} GB in {info.num_shards} shards, {info.seconds} s"
        )
    else:
        print(f"kept existing {info.path} ({info.weight_bytes / 1e9:.2f} GB); --force rewrites it")
    text = json.dumps(asdict(info))
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
