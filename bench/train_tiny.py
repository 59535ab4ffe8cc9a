"""Train a small Llama on text every machine has (the Python standard library's source), for
benchmarks that need a model that has learned something (speculative decoding, structured
output, programs). It is a benchmark fixture, not the served default.

    python bench/train_tiny.py --out /tmp/tiny-trained                      # H200: minutes
    python bench/train_tiny.py --out /tmp/t --smoke --device cpu            # a few CPU steps

Writes a Hugging Face folder (config.json, bf16 safetensors on CUDA, a byte-level BPE
tokenizer trained on the same text, a chat template) that `radixmesh serve --model`
loads, and a JSON record: parameters, tokens seen, the loss curve, the held-out loss and a
greedy sample.

A share of the training documents (--edit-share, a fifth by default) are code edits in the
form bench/speculative.py's code_edit prompts take: a function, the line EDIT_HEADER, then
the same function with one name of its body changed throughout. A model that has only read
source does not know what the header asks and writes on from the first line as it likes;
one taught the task copies the function, as a code model asked for an edit does, so the
workload measures what it is meant to (drafts that are right). Those functions come only
from modules in the standard library's packages: the benchmark's come from its top-level
modules, which no edit document is made of.
"""

from __future__ import annotations

import argparse
import builtins
import json
import keyword
import math
import random
import re
import sys
import sysconfig
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mesh.tiny_model import BOS, CHAT_TEMPLATE, EOS, PAD, train_tokenizer

SAMPLE_PROMPT = "def __init__(self, "
EDIT_HEADER = "# The same function with one name changed:"
"""bench/speculative.py's code_edit prompts put this line between a function and its edit."""
FUNCTION = re.compile(r"\n(def [^\n]+\n(?:(?:    [^\n]*)?\n){4,40})")
"""A top-level function of 4-40 lines (the functions of bench/speculative.py's code_edit)."""
NAME = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]{2,}\b")
MAX_MISSES = 10_000
"""Draws of a function and a name that make no edit before edit_documents stops short."""
RESERVED = frozenset(keyword.kwlist) | frozenset(dir(builtins)) | {"self", "cls"}


def corpus_files(max_bytes: int) -> list[Path]:
    """The standard library's .py files, sorted, up to max_bytes in all (tests skipped)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files, size = [], 0
    for path in sorted(root.rglob("*.py")):
        if "test" in path.parts or "site-packages" in path.parts:
            continue
        n = path.stat().st_size
        if size + n > max_bytes:
            break
        files.append(path)
        size += n
    return files


def is_top_level(path: Path) -> bool:
    """A module directly in the standard library's folder (bench/speculative.py's sources)."""
    return path.parent == Path(sysconfig.get_paths()["stdlib"])


def edit_documents(texts: list[str], share: float, rng: random.Random) -> list[str]:
    """Code-edit documents (see the module docstring) from the functions in `texts`, about
    `share` of the corpus's characters with the texts: a function, EDIT_HEADER, and the
    function with one name that is not in its first line renamed wherever it stands."""
    functions = [m.group(1) for text in texts for m in FUNCTION.finditer(text)]
    names = sorted({n for f in functions for n in NAME.findall(f)} - RESERVED)
    if not functions or not names or share <= 0:
        return []
    budget = share / (1 - share) * sum(map(len, texts))
    docs, size, misses = [], 0, 0
    while size < budget and misses < MAX_MISSES:
        function = rng.choice(functions)
        first, _, body = function.partition("\n")
        candidates = sorted(set(NAME.findall(body)) - set(NAME.findall(first)) - RESERVED)
        old, new = rng.choice(candidates or [""]), rng.choice(names)
        if not old or re.search(rf"\b{re.escape(new)}\b", function):
            misses += 1  # nothing to rename, or the new name is taken: draw again
            continue
        edited = first + "\n" + re.sub(rf"\b{re.escape(old)}\b", new, body)
        docs.append(f"{function}\n{EDIT_HEADER}\n{edited}")
        size += len(docs[-1])
    return docs


def read_texts(files: list[Path]) -> list[str]:
    texts = []
    for path in files:
        try:
            texts.append(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, OSError):
            continue
    return texts


def build_tokenizer(texts: list[str], vocab_size: int, out: Path):
    from transformers import PreTrainedTokenizerFast

    lines = [line for text in texts[: max(1, len(texts) // 4)] for line in text.splitlines(True)]
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=train_tokenizer(vocab_size=vocab_size, corpus=lines),
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.save_pretrained(out)
    return tokenizer


def encode(tokenizer, texts: list[str]) -> torch.Tensor:
    eos = tokenizer.convert_tokens_to_ids(EOS)
    ids: list[int] = []
    for text in texts:
        ids += tokenizer.encode(text, add_special_tokens=False)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.int64)


def make_model(args: argparse.Namespace, tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=max(2048, args.seq_len),
        rope_theta=10000.0,
        bos_token_id=tokenizer.convert_tokens_to_ids(BOS),
        eos_token_id=tokenizer.convert_tokens_to_ids(EOS),
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD),
        tie_word_embeddings=False,
    )
    torch.manual_seed(args.seed)
    return LlamaForCausalLM(config)


def batches(data: torch.Tensor, batch: int, seq_len: int, rng: random.Random):
    limit = data.numel() - seq_len - 1
    while True:
        starts = [rng.randrange(limit) for _ in range(batch)]
        yield torch.stack([data[s : s + seq_len + 1] for s in starts])


@torch.no_grad()
def held_out_loss(model, data: torch.Tensor, seq_len: int, device, max_windows: int = 32) -> float:
    model.eval()
    losses = []
    for start in range(0, min(data.numel() - seq_len - 1, max_windows * seq_len), seq_len):
        window = data[start : start + seq_len + 1].to(device)[None]
        with autocast(device):
            out = model(window[:, :-1], labels=window[:, :-1].clone())
        losses.append(float(out.loss))
    model.train()
    return sum(losses) / max(1, len(losses))


def autocast(device: torch.device):
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


def train(args: argparse.Namespace) -> dict:
    device = torch.device(
        args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    files = corpus_files(args.max_corpus_mb << 20)
    texts = read_texts(files)
    edits = edit_documents(
        read_texts([f for f in files if not is_top_level(f)]),
        args.edit_share,
        random.Random(args.seed + 1),
    )
    texts += edits
    random.Random(args.seed).shuffle(texts)
    tokenizer = build_tokenizer(texts, args.vocab_size, out)
    data = encode(tokenizer, texts)
    split = int(data.numel() * 0.98)
    train_data, eval_data = data[:split], data[split:]
    prep_s = time.perf_counter() - t0
    model = make_model(args, tokenizer).to(device)
    num_params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1, fused=device.type == "cuda"
    )
    warmup = max(1, args.steps // 20)

    def lr_at(step: int) -> float:
        if step < warmup:
            return args.lr * (step + 1) / warmup
        progress = (step - warmup) / max(1, args.steps - warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

    curve, rng, step, start = [], random.Random(args.seed), 0, time.perf_counter()
    for step, batch in enumerate(batches(train_data, args.batch_size, args.seq_len, rng)):
        if step >= args.steps or time.perf_counter() - start > args.max_train_s:
            break
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        batch = batch.to(device, non_blocking=True)
        with autocast(device):
            loss = model(batch[:, :-1], labels=batch[:, :-1].clone()).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % args.log_every == 0 or step == args.steps - 1:
            curve.append({"step": step, "loss": round(float(loss), 4), "s": round(time.perf_counter() - start, 1)})
            print(f"step {step:>6}  loss {float(loss):.4f}  {curve[-1]['s']:.1f}s", flush=True)
    train_s = time.perf_counter() - start
    eval_loss = held_out_loss(model, eval_data, args.seq_len, device)
    sample = greedy_sample(model, tokenizer, device, args.sample_tokens)
    model.to(torch.bfloat16 if device.type == "cuda" else torch.float32)
    model.save_pretrained(out)
    record = {
        "out": str(out),
        "device": str(device),
        "num_params": num_params,
        "corpus_tokens": int(data.numel()),
        "edit_documents": len(edits),
        "edit_share": args.edit_share,
        "vocab_size": len(tokenizer),
        "steps": step,
        "tokens_seen": step * args.batch_size * args.seq_len,
        "prepare_s": round(prep_s, 1),
        "train_s": round(train_s, 1),
        "final_loss": curve[-1]["loss"] if curve else None,
        "held_out_loss": round(eval_loss, 4),
        "loss_curve": curve,
        "sample_prompt": SAMPLE_PROMPT,
        "sample": sample,
        "config": {k: getattr(args, k) for k in ("hidden", "intermediate", "layers", "heads", "kv_heads", "seq_len", "batch_size", "lr")},
    }
    (out / "training.json").write_text(json.dumps(record, indent=1))
    return record


@torch.no_grad()
def greedy_sample(model, tokenizer, device, num_tokens: int) -> str:
    model.eval()
    ids = torch.tensor([tokenizer.encode(SAMPLE_PROMPT, add_special_tokens=False)], device=device)
    with autocast(device):
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=num_tokens, do_sample=False
        )
    return tokenizer.decode(out[0].tolist())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="the Hugging Face folder to write")
    p.add_argument("--device", default="auto")
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--intermediate", type=int, default=1536)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--max-train-s", type=float, default=300.0, help="stop training after this")
    p.add_argument("--max-corpus-mb", type=int, default=48)
    p.add_argument(
        "--edit-share",
        type=float,
        default=0.2,
        help="share of the corpus's characters in code-edit documents (0: source alone)",
    )
    p.add_argument("--log-every", type=int, default=100)
    p.add_argument("--sample-tokens", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="also write the record here")
    p.add_argument(
        "--smoke", action="store_true", help="tiny shapes, a few steps (checks the flow on a CPU)"
    )
    args = p.parse_args(argv)
    if not 0 <= args.edit_share < 1:
        p.error(f"--edit-share must be in [0, 1), got {args.edit_share}")
    if args.smoke:
        args.vocab_size, args.hidden, args.intermediate, args.layers = 512, 64, 128, 2
        args.heads, args.kv_heads, args.seq_len, args.batch_size = 4, 2, 64, 4
        args.steps, args.max_corpus_mb, args.log_every, args.sample_tokens = 5, 1, 1, 8
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    record = train(args)
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1))
    print(json.dumps({k: v for k, v in record.items() if k != "loss_curve"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
