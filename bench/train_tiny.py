"""Train a small Llama on text every machine has (the Python standard library's source), for
benchmarks that need a model that has learned something (speculative decoding, structured
output, programs). It is a benchmark fixture, not the served default.

    python bench/train_tiny.py --out /tmp/tiny-trained                      # H100: minutes
    python bench/train_tiny.py --out /tmp/t --smoke --device cpu            # a few CPU steps

Writes a Hugging Face folder (config.json, bf16 safetensors on CUDA, a byte-level BPE
tokenizer trained on the same text, a chat template) that `radixmesh serve --model`
loads, and a JSON record: parameters, tokens seen, the loss curve (source rows and edit
rows apart), the held-out losses, the held-out copy scores and a greedy sample.

Code edits. A share of every batch's rows (--edit-share, half by default) starts at a
code-edit document: the prompt of bench/speculative.py's code_edit (`edit_prompt`: a
function, the line EDIT_HEADER, the function's first line), then the rest of the function
with one name of its body renamed wherever it stands. A model that has only read source
does not know what the header asks; one taught the task copies the function, as a code
model asked for an edit does, so the workload measures what it is meant to (drafts that
are right). The documents are made of every function and method of 4-40 lines in the
library's packages (dedented), --edits-per-function times each, every time disguised anew
(about half its names renamed throughout, in the function too) and another name renamed in
the edit, all to names drawn from every function's: a document's text cannot be learned by
heart, only copied from the prompt, and the edit's new name from where the copy first wrote
it. (Functions that were only ever edited as they stand were learned by heart: a GPU run
trained on those copied 10% of held-out functions' bodies.) The benchmark's functions are
the top-level ones of the library's top-level modules, of which no document is made; on
some of those the record's "copy" scores the model's greedy edits and "held_out_copy_loss"
its loss on edited bodies.
"""

from __future__ import annotations

import argparse
import builtins
import json
import keyword
import math
import random
import re
import shutil
import sys
import sysconfig
import time
from copy import deepcopy
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.copy_metrics import common_prefix, is_edit, lookup_steps
from mesh.tiny_model import BOS, CHAT_TEMPLATE, EOS, PAD, train_tokenizer

SAMPLE_PROMPT = "def __init__(self, "
EDIT_HEADER = "# The same function with one name changed:"
"""bench/speculative.py's code_edit prompts put this line between a function and its edit."""
FUNCTION = re.compile(r"^( *)(def [^\n]+\n(?:(?:\1    [^\n]*)?\n){4,40})", re.M)
"""A function or method of 4-40 lines at any depth (a longer one: its first 41 lines)."""
NAME = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]{2,}\b")
RESERVED = frozenset(keyword.kwlist) | frozenset(dir(builtins)) | {"self", "cls"}
MAX_NAME_DRAWS = 8
"""Draws of each new name (one the function does not use) before a document is given up."""
DISGUISE_SHARE = 0.5
"""The share of a function's names an edit document renames in the function itself too:
its text is new every time, so only a model that copies can write the edit."""
ENCODE_CHUNK = 2048
"""Texts tokenized at a time (the tokenizer's batches run on every core)."""


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


def read_texts(files: list[Path]) -> list[str]:
    texts = []
    for path in files:
        try:
            texts.append(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, OSError):
            continue
    return texts


def functions_in(texts: list[str], top_level: bool = False) -> list[str]:
    """FUNCTION's functions in `texts`, dedented to depth 0, each ending with its last line
    that is not blank; with top_level only those at depth 0 (bench/speculative.py's)."""
    found = []
    for text in texts:
        for m in FUNCTION.finditer(text):
            depth = len(m.group(1))
            if top_level and depth:
                continue
            first, _, body = m.group(2).rstrip("\n").partition("\n")
            found.append("\n".join([first, *(line[depth:] for line in body.split("\n"))]) + "\n")
    return found


def edit_prompt(function: str) -> str:
    """bench/speculative.py's code_edit prompt, every edit document's beginning: the
    function, a blank line, EDIT_HEADER, the function's first line."""
    first = function.partition("\n")[0]
    return f"{function}\n{EDIT_HEADER}\n{first}\n"


def edit_document(function: str, names: list[str], rng: random.Random, disguise: float = DISGUISE_SHARE) -> str | None:
    """An edit document of the function disguised: each of its names renamed throughout, with
    probability `disguise`, to one of `names` that it does not use; then the disguised
    function's edit_prompt and its body with one more name, one not in its first line,
    renamed throughout. None: no name to rename, or no new name found."""
    first, _, body = function.partition("\n")
    candidates = sorted(set(NAME.findall(body)) - set(NAME.findall(first)) - RESERVED)
    if not candidates:
        return None
    own = sorted(set(NAME.findall(function)) - RESERVED)
    old, hidden = rng.choice(candidates), [n for n in own if rng.random() < disguise]
    new = fresh_names(len(hidden) + 1, set(own), names, rng)
    if new is None:
        return None
    mapping = dict(zip(hidden, new[:-1], strict=True))
    disguised, old = rename(function, mapping), mapping.get(old, old)
    return edit_prompt(disguised) + rename(disguised.partition("\n")[2], {old: new[-1]})


def fresh_names(k: int, taken: set[str], names: list[str], rng: random.Random) -> list[str] | None:
    """k names drawn from `names`, none in `taken`, no two alike (None: k x MAX_NAME_DRAWS
    draws did not find them)."""
    chosen: list[str] = []
    for _ in range(k * MAX_NAME_DRAWS):
        name = rng.choice(names)
        if name not in taken and name not in chosen:
            chosen.append(name)
        if len(chosen) == k:
            return chosen
    return None


def rename(text: str, mapping: dict[str, str]) -> str:
    """The text with every name of `mapping` replaced by its value, wherever it stands."""
    if not mapping:
        return text
    pattern = re.compile(r"\b(?:" + "|".join(map(re.escape, mapping)) + r")\b")
    return pattern.sub(lambda m: mapping[m.group()], text)


def names_of(functions: list[str]) -> list[str]:
    """The functions' names (NAME's, none RESERVED), sorted: the new names of edits."""
    return sorted({n for f in functions for n in NAME.findall(f)} - RESERVED)


def edit_documents(functions: list[str], per_function: int, rng: random.Random) -> list[str]:
    """per_function edit documents of each function, each disguised and edited anew with
    names drawn from every name of `functions` (shuffled; those that make none left out)."""
    names = names_of(functions)
    docs = [edit_document(f, names, rng) for f in functions for _ in range(per_function)]
    docs = [d for d in docs if d is not None]
    rng.shuffle(docs)
    return docs


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


def encode(tokenizer, texts: list[str], max_len: int | None = None) -> tuple[torch.Tensor, list[int]]:
    """The texts' tokens, each text's followed by EOS, in one tensor, and where each text
    begins; a text of more than max_len tokens (its EOS counted) is left out."""
    eos = tokenizer.convert_tokens_to_ids(EOS)
    parts, starts, size = [], [], 0
    for at in range(0, len(texts), ENCODE_CHUNK):
        for ids in tokenizer(texts[at : at + ENCODE_CHUNK], add_special_tokens=False)["input_ids"]:
            if max_len is not None and len(ids) + 1 > max_len:
                continue
            parts.append(np.array([*ids, eos], dtype=np.int64))
            starts.append(size)
            size += len(ids) + 1
    data = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return torch.from_numpy(data), starts


@dataclass(frozen=True, slots=True)
class Corpus:
    """The token streams training reads (prepare() fills them)."""

    source: torch.Tensor
    """The source files' tokens (shuffled files, each followed by EOS), less the held-out tail."""
    held_out: torch.Tensor
    """The last 2% of the source files' tokens."""
    edits: torch.Tensor
    """The edit documents' tokens, each followed by EOS (only those that fit a row)."""
    edit_starts: list[int]
    """Where each edit document begins in `edits`."""
    held_out_functions: list[str]
    """bench/speculative.py's code_edit functions: the top-level modules' top-level ones."""
    names: list[str]
    """Every name of the edit documents' functions: the new names of held-out edits."""


def prepare(args: argparse.Namespace, out: Path) -> tuple[Corpus, object]:
    """The corpus and the tokenizer (saved in `out`)."""
    files = corpus_files(args.max_corpus_mb << 20)
    packages = read_texts([f for f in files if not is_top_level(f)])
    top = read_texts([f for f in files if is_top_level(f)])
    texts = packages + top
    random.Random(args.seed).shuffle(texts)
    tokenizer = build_tokenizer(texts, args.vocab_size, out)
    source, _ = encode(tokenizer, texts)
    split = int(source.numel() * 0.98)
    functions = functions_in(packages)
    rng = random.Random(args.seed + 1)
    docs = edit_documents(functions, args.edits_per_function, rng) if args.edit_share else []
    edits, starts = encode(tokenizer, docs, max_len=args.seq_len + 1)
    corpus = Corpus(
        source=source[:split],
        held_out=source[split:],
        edits=edits,
        edit_starts=starts,
        held_out_functions=functions_in(top, top_level=True),
        names=names_of(functions),
    )
    return corpus, tokenizer


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


def num_edit_rows(corpus: Corpus, args: argparse.Namespace) -> int:
    """A batch's rows that start at an edit document (none when no document fits a row)."""
    usable = any(s + args.seq_len + 1 <= corpus.edits.numel() for s in corpus.edit_starts)
    return round(args.batch_size * args.edit_share) if usable else 0


def batches(corpus: Corpus, args: argparse.Namespace, num_edits: int, rng: random.Random):
    """Rows of seq_len + 1 tokens: the first num_edits each from an edit document's start
    (the document whole, then the next ones), the rest from anywhere in the source."""
    span = args.seq_len + 1
    starts = [s for s in corpus.edit_starts if s + span <= corpus.edits.numel()]
    limit = corpus.source.numel() - span
    while True:
        rows = [corpus.edits[s : s + span] for s in (rng.choice(starts) for _ in range(num_edits))]
        rows += [corpus.source[s : s + span] for s in (rng.randrange(limit) for _ in range(args.batch_size - num_edits))]
        yield torch.stack(rows)


def row_losses(model, rows: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Each row's next-token losses (rows: token ids, a row's last one only a target)."""
    with autocast(device):
        logits = model(rows[:, :-1]).logits
    losses = F.cross_entropy(logits.float().flatten(0, 1), rows[:, 1:].flatten(), reduction="none")
    return losses.view(rows.shape[0], -1)


def autocast(device: torch.device):
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


def fit(
    model, corpus: Corpus, cases: list[CopyCase], args: argparse.Namespace, device: torch.device
) -> tuple[list[dict], int]:
    """Train for args.steps or args.max_train_s; (the loss curve, the steps taken). The
    curve's points have the held-out copy loss on `cases` too."""
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1, fused=device.type == "cuda"
    )
    warmup = max(1, args.steps // 20)

    def lr_at(step: int) -> float:
        if step < warmup:
            return args.lr * (step + 1) / warmup
        progress = (step - warmup) / max(1, args.steps - warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

    num_edits = num_edit_rows(corpus, args)
    curve, step, start = [], 0, time.perf_counter()
    for step, rows in enumerate(batches(corpus, args, num_edits, random.Random(args.seed))):
        if step >= args.steps or time.perf_counter() - start > args.max_train_s:
            break
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        losses = row_losses(model, rows.to(device, non_blocking=True), device).mean(dim=1)
        losses.mean().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % args.log_every == 0 or step == args.steps - 1:
            point = curve_point(step, losses, num_edits, time.perf_counter() - start)
            curve.append({**point, "held_out_copy_loss": copy_loss(model, cases, device)})
            print(f"step {step:>6}  loss {point['loss']:.4f}  edit rows {point['edit_loss']}  source rows "
                  f"{point['source_loss']}  held-out copy {curve[-1]['held_out_copy_loss']}  {point['s']:.1f}s",
                  flush=True)
    return curve, step


def curve_point(step: int, losses: torch.Tensor, num_edits: int, seconds: float) -> dict:
    """A step's mean loss, and its edit rows' and source rows' apart (None: no such row)."""
    losses = losses.detach().float().cpu()

    def mean(part: torch.Tensor) -> float | None:
        return round(float(part.mean()), 4) if part.numel() else None

    return {"step": step, "loss": mean(losses), "edit_loss": mean(losses[:num_edits]),
            "source_loss": mean(losses[num_edits:]), "s": round(seconds, 1)}


@torch.no_grad()
def held_out_loss(model, data: torch.Tensor, seq_len: int, device, max_windows: int = 32) -> float:
    model.eval()
    losses = []
    for start in range(0, min(data.numel() - seq_len - 1, max_windows * seq_len), seq_len):
        window = data[start : start + seq_len + 1].to(device)[None]
        losses.append(float(row_losses(model, window, device).mean()))
    model.train()
    return sum(losses) / max(1, len(losses))


@dataclass(frozen=True, slots=True)
class CopyCase:
    """A held-out function's code_edit prompt and what may follow it (token ids)."""

    prompt: list[int]
    body: list[int]
    """The function's body as it stands: a verbatim copy."""
    edited: list[int]
    """An edit document's body (one name renamed), then EOS."""


def copy_cases(corpus: Corpus, tokenizer, args: argparse.Namespace, rng: random.Random) -> tuple[list[CopyCase], int]:
    """args.copy_eval_prompts held-out functions drawn by rng whose edit document fits a row,
    and how many of those drawn were left out because their prompt's tokens did not begin
    their document's (a tokenization boundary the benchmark's prompt would not share)."""
    functions = list(corpus.held_out_functions)
    rng.shuffle(functions)
    cases, mismatches = [], 0
    for function in functions:
        if len(cases) == args.copy_eval_prompts:
            break
        doc = edit_document(function, corpus.names, rng, disguise=0.0)
        if doc is None:
            continue
        prompt, whole, edited = (tokenizer.encode(t, add_special_tokens=False) for t in
                                 (edit_prompt(function), edit_prompt(function) + function.partition("\n")[2], doc))
        if len(edited) + 1 > args.seq_len + 1:
            continue
        if whole[: len(prompt)] != prompt or edited[: len(prompt)] != prompt:
            mismatches += 1
            continue
        eos = tokenizer.convert_tokens_to_ids(EOS)
        cases.append(CopyCase(prompt, whole[len(prompt) :], [*edited[len(prompt) :], eos]))
    return cases, mismatches


@torch.no_grad()
def copy_scores(model, tokenizer, cases: list[CopyCase], device: torch.device) -> dict:
    """How the model edits held-out functions, greedy, up to its EOS or 16 tokens past the
    body's length: the share of the body it repeats before its first difference (its
    rename, or a slip), the share of outputs that are the body with at most one name
    renamed throughout and then EOS, the output's tokens per step if every step verified a
    prompt-lookup draft (what ngram speculation can gain at batch 1), and the mean loss on
    an edit document's body and EOS after the prompt."""
    model.eval()
    eos = tokenizer.convert_tokens_to_ids(EOS)
    prefix = exact = num_tokens = num_steps = 0.0
    samples = []
    for case in cases:
        ids = torch.tensor([case.prompt], device=device)
        with autocast(device):
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=len(case.body) + 16,
                                 do_sample=False, eos_token_id=eos, pad_token_id=eos)
        output = out[0, len(case.prompt) :].tolist()
        ended = eos in output
        output = output[: output.index(eos)] if ended else output
        prefix += common_prefix(output, case.body) / len(case.body)
        exact += ended and is_edit(tokenizer.decode(output), tokenizer.decode(case.body))
        num_tokens, num_steps = num_tokens + len(output), num_steps + lookup_steps(case.prompt, output)
        if len(samples) < 2:
            samples.append(tokenizer.decode(output))
    model.train()
    n = max(1, len(cases))
    return {"prompts": len(cases), "prefix_share": round(prefix / n, 4), "exact_edit_share": round(exact / n, 4),
            "lookup_tokens_per_step": round(num_tokens / max(1, num_steps), 3),
            "held_out_copy_loss": copy_loss(model, cases, device), "samples": samples}


@torch.no_grad()
def copy_loss(model, cases: list[CopyCase], device: torch.device) -> float | None:
    """The mean loss on the cases' edited bodies and EOS, after their prompts (None: no case)."""
    if not cases:
        return None
    was_training, loss = model.training, 0.0
    model.eval()
    for case in cases:
        rows = torch.tensor([case.prompt + case.edited], device=device)
        loss += float(row_losses(model, rows, device)[0, len(case.prompt) - 1 :].mean())
    model.train(was_training)
    return round(loss / len(cases), 4)


def train(args: argparse.Namespace) -> dict:
    device = torch.device(
        args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    corpus, tokenizer = prepare(args, out)
    prep_s = time.perf_counter() - t0
    model = make_model(args, tokenizer).to(device)
    num_params = sum(p.numel() for p in model.parameters())
    if args.init_out:  # written aside, then renamed: whoever waits for it sees it whole
        init_out = Path(args.init_out)
        partial = init_out.with_name(init_out.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        save_model(model, tokenizer, partial, device)
        shutil.rmtree(init_out, ignore_errors=True)
        partial.rename(init_out)
    cases, mismatches = copy_cases(corpus, tokenizer, args, random.Random(args.seed + 2))
    start = time.perf_counter()
    curve, steps = fit(model, corpus, cases, args, device)
    train_s = time.perf_counter() - start
    eval_loss = held_out_loss(model, corpus.held_out, args.seq_len, device)
    copy = {**copy_scores(model, tokenizer, cases, device), "prompts_not_a_document_prefix": mismatches}
    sample = greedy_sample(model, tokenizer, device, args.sample_tokens)
    save_model(model, tokenizer, out, device)
    num_edits = num_edit_rows(corpus, args)
    record = {
        "out": str(out),
        "device": str(device),
        "num_params": num_params,
        "corpus_tokens": corpus.source.numel() + corpus.held_out.numel(),
        "edit_documents": len(corpus.edit_starts),
        "edit_tokens": corpus.edits.numel(),
        "edit_share": args.edit_share,
        "edit_rows_per_batch": num_edits,
        "vocab_size": len(tokenizer),
        "steps": steps,
        "tokens_seen": steps * args.batch_size * args.seq_len,
        "source_epochs": round(steps * (args.batch_size - num_edits) * args.seq_len / corpus.source.numel(), 2),
        "edit_epochs": round(steps * num_edits * args.seq_len / max(1, corpus.edits.numel()), 2),
        "prepare_s": round(prep_s, 1),
        "train_s": round(train_s, 1),
        "final_loss": curve[-1]["loss"] if curve else None,
        "held_out_loss": round(eval_loss, 4),
        "copy": copy,
        "loss_curve": curve,
        "sample_prompt": SAMPLE_PROMPT,
        "sample": sample,
        "config": {k: getattr(args, k) for k in ("hidden", "intermediate", "layers", "heads", "kv_heads", "seq_len",
                                                 "batch_size", "lr", "edits_per_function")},
    }
    (out / "training.json").write_text(json.dumps(record, indent=1))
    return record


def save_model(model, tokenizer, out: Path, device: torch.device) -> None:
    """The model as a Hugging Face folder with its tokenizer, bf16 on CUDA (what the trained
    folder holds); the model itself is left in its dtype (a copy is saved)."""
    out.mkdir(parents=True, exist_ok=True)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    deepcopy(model).to(dtype).save_pretrained(out)
    tokenizer.save_pretrained(out)


@torch.no_grad()
def greedy_sample(model, tokenizer, device, num_tokens: int) -> str:
    model.eval()
    ids = torch.tensor([tokenizer.encode(SAMPLE_PROMPT, add_special_tokens=False)], device=device)
    eos = tokenizer.convert_tokens_to_ids(EOS)
    with autocast(device):
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=num_tokens,
                             do_sample=False, pad_token_id=eos)
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
    p.add_argument("--seq-len", type=int, default=1024,
                   help="tokens a row (a code_edit prompt of 512 tokens and its 128-token output fit one)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--max-train-s", type=float, default=300.0, help="stop training after this")
    p.add_argument("--max-corpus-mb", type=int, default=48)
    p.add_argument("--edit-share", type=float, default=0.5,
                   help="share of each batch's rows that start at a code-edit document (0: source alone)")
    p.add_argument("--edits-per-function", type=int, default=8,
                   help="code-edit documents made of each function, each renaming another name")
    p.add_argument("--copy-eval-prompts", type=int, default=16,
                   help="held-out code_edit prompts the record's copy scores are measured on")
    p.add_argument("--log-every", type=int, default=100)
    p.add_argument("--sample-tokens", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="also write the record here")
    p.add_argument("--init-out", default=None,
                   help="also write the model as initialised, before its first step (same config and "
                        "tokenizer): a stand-in of the trained shape while it trains, e.g. to compile "
                        "the serving kernels beside the training, and an untrained control")
    p.add_argument(
        "--smoke", action="store_true", help="tiny shapes, a few steps (checks the flow on a CPU)"
    )
    args = p.parse_args(argv)
    if not 0 <= args.edit_share <= 1:
        p.error(f"--edit-share must be in [0, 1], got {args.edit_share}")
    if args.smoke:
        args.vocab_size, args.hidden, args.intermediate, args.layers = 512, 64, 128, 2
        args.heads, args.kv_heads, args.seq_len, args.batch_size = 4, 2, 128, 4
        args.steps, args.max_corpus_mb, args.log_every, args.sample_tokens = 5, 1, 1, 8
        args.edits_per_function, args.copy_eval_prompts = 1, 2
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
