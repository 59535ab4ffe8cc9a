"""The host cost of a speculating executor where its drafts cannot pay, on the CPU.

On a host-bound model (a small one on a fast GPU) a step's time is mostly Python: the
scheduler's plan, the executor's prepare, the result's round trip. There a speculating
executor whose switch declines must run as fast as one with speculation off, and this
measures whether it does without a GPU: the in-process engine on the default tiny model,
its forward replaced by a cheap deterministic one (each next token a hash of the last
token and its position, so outputs have no repeats for a proposer to find, as on random
prompts), prepares overlapped as on CUDA, and the proposer's switch given a timing table
as the GPU's start-up would (every bucket's verify/decode ratio `--ratio`).

    python bench/spec_host.py                         # off, ngram, suffix at b1, 8, 32, 128
    python bench/spec_host.py --modes off ngram --batch-sizes 32 --repeats 5
    py-spy record --gil --format raw -o /tmp/ngram.raw -- python bench/spec_host.py --modes ngram
    python bench/spec_host.py --modes ngram --batch-sizes 1 --copy-share 1 --edits 4 \
        --ratio 2.0 --fixed-ratio                     # the switch's steps on copied text with edits

Rows: output tok/s per (mode, batch size), each the median of `--repeats` batches after
one untimed batch, and the speculating modes' ratio to off; the drafts each row verified,
its tokens kept, the steps per sequence (each emits 1 plus its kept draft tokens) and the
switch's state. With `--copy-share` some sequences copy their prompt (`--edits`: with a few
tokens of each copied period written otherwise); with `--fixed-ratio` the switch decides
as a GPU whose verification costs `--ratio` decode steps would, whatever this host's step
times are, so its steps per sequence are what such a GPU would run. Every mode's engine
is up at once and the repeats alternate between them, so the host's drift (large on a
shared VM) lands on each alike. Outputs are compared token for token with off.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from bench.speculative import run_batch
from mesh.engine import Engine, EngineConfig
from services.executor.core.spec import SpeculativeConfig
from services.executor.core.spec.switch import SpecSwitch
from services.scheduler.core import SchedulerConfig

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


def hashed_forward(vocab_size: int):
    """A forward whose logits row puts all its mass on hash(last token, position)."""

    def forward(batch, kv_pool) -> torch.Tensor:
        rows = batch.logits_indices
        ids = batch.input_ids[rows].long()
        positions = batch.positions[rows].long()
        nxt = (ids * 7919 + positions * 104_729 + 13) % (vocab_size - 10) + 10
        logits = torch.zeros(len(rows), vocab_size)
        logits[torch.arange(len(rows)), nxt] = 1.0
        return logits

    return forward


COPY_PERIOD = 61
"""`--copy-share`: a copying sequence's text repeats with this period (a prime, so no
shorter suffix recurs within it)."""


def copying_forward(vocab_size: int, edited: Sequence[int] = (), period: int = COPY_PERIOD):
    """`hashed_forward`, except that a sequence whose last token is in the lower half of the
    vocabulary continues a text that repeats every `period` tokens (`copy_text`), so the
    proposers find its continuation in its own prompt, as a model copying a document would;
    the hashed tokens stay in the upper half. At the `edited` offsets of the period it writes
    EDITED_TOKEN in place of the text's, as a model asked to rename something writes the
    new name where the prompt has the old one (`--edits`: `edited_offsets`)."""
    half = vocab_size // 2
    text = copy_text(vocab_size, period)
    for offset in edited:
        text[offset] = EDITED_TOKEN
    table = torch.tensor(text)

    def forward(batch, kv_pool) -> torch.Tensor:
        rows = batch.logits_indices
        ids = batch.input_ids[rows].long()
        positions = batch.positions[rows].long()
        hashed = (ids * 7919 + positions * 104_729 + 13) % (vocab_size - half) + half
        nxt = torch.where(ids < half, table[(positions + 1) % period], hashed)
        logits = torch.zeros(len(rows), vocab_size)
        logits[torch.arange(len(rows)), nxt] = 1.0
        return logits

    return forward


EDITED_TOKEN = 3
"""What `--edits` writes in place of the prompt's token (an id `copy_text` never draws)."""


def edited_offsets(edits: int) -> list[int]:
    """`--edits`: that many offsets of COPY_PERIOD, spread over it."""
    return [(i * COPY_PERIOD) // edits for i in range(edits)] if edits else []


def copy_text(vocab_size: int, length: int) -> list[int]:
    """A copying sequence's token at each position modulo COPY_PERIOD: distinct ids in
    [10, vocab_size // 2)."""
    return random.Random(1).sample(range(10, vocab_size // 2), length)


class FixedRatioSwitch(SpecSwitch):
    """A switch that weighs drafts against its start-up ratios alone: this host's step
    times (a CPU's) never replace them, so it decides as a GPU of that ratio would (its
    plain probes still run, as there)."""

    def _wall_ratio(self, bucket: int) -> float | None:
        return None


def stand_in_switch(
    max_batch: int, ratio: float, max_draft_tokens: int, fixed: bool = False
) -> SpecSwitch:
    """The proposer's switch as a GPU's start-up would set it: every bucket up to
    `max_batch` timed at a verify/decode ratio of `ratio`, backing off as graph_setup's
    measured switch does (`fixed`: a FixedRatioSwitch, which keeps that ratio)."""
    switch = (FixedRatioSwitch if fixed else SpecSwitch)(
        max_batch, {b: ratio for b in BUCKETS if b <= max_batch}, max_gain=max_draft_tokens + 1
    )
    switch.backs_off = True
    return switch


def engine_config(args, mode: str) -> EngineConfig:
    max_batch = max(args.batch_sizes)
    return EngineConfig.for_model(
        args.model,
        scheduler=SchedulerConfig(max_num_seqs=max_batch, max_queue_len=4096),
        device="cpu",
        max_num_seqs=max_batch,
        overlap_prepare=True,
        speculative=SpeculativeConfig(
            method=mode, max_draft_tokens=args.num_speculative_tokens, max_batch_size=max_batch
        ),
    )


async def bench(args, modes: list[str]) -> dict[str, dict[int, dict]]:
    """Every mode's engine runs at once (idle but for its own batches), and each batch size's
    repeats alternate between the modes, so the host's drifts land on every mode alike."""
    max_batch = max(args.batch_sizes)
    rows: dict[str, dict[int, dict]] = {mode: {} for mode in modes}
    async with contextlib.AsyncExitStack() as stack:
        engines = {mode: await stack.enter_async_context(Engine(engine_config(args, mode))) for mode in modes}
        for mode, engine in engines.items():
            core = engine.executors[0]
            vocab_size = core.info.vocab_size
            core.model.forward = (
                copying_forward(vocab_size, edited_offsets(args.edits))
                if args.copy_share
                else hashed_forward(vocab_size)
            )
            if mode != "off":  # as a GPU's start-up timing would set it
                core.spec_switch = stand_in_switch(
                    max_batch, args.ratio, args.num_speculative_tokens, args.fixed_ratio
                )
        vocab = engines[modes[0]].executors[0].info.vocab_size
        rng = random.Random(args.seed)
        for batch in args.batch_sizes:
            seconds: dict[str, list[float]] = {mode: [] for mode in modes}
            cpu: dict[str, list[float]] = {mode: [] for mode in modes}
            outputs: dict[str, list[list[int]]] = {mode: [] for mode in modes}
            drafts = {mode: 0 for mode in modes}
            accepted = {mode: 0 for mode in modes}
            for repeat in range(args.repeats + 1):  # the first warms the shape, untimed
                prompts = [prompt(args, vocab, rng, i < args.copy_share * batch) for i in range(batch)]
                for mode, engine in engines.items():
                    stats = engine.executors[0].spec_stats
                    before = stats.snapshot()
                    cpu_start = time.process_time()
                    out, took, _ = await run_batch(engine, prompts, args.output_len)
                    if repeat:
                        seconds[mode].append(took)
                        cpu[mode].append(time.process_time() - cpu_start)
                        outputs[mode].extend(out)
                        after = stats.snapshot()
                        drafts[mode] += after.num_drafts - before.num_drafts
                        accepted[mode] += after.num_accepted_tokens - before.num_accepted_tokens
            for mode, engine in engines.items():
                median = statistics.median(seconds[mode])
                rows[mode][batch] = {
                    "output_tok_s": batch * args.output_len / median,
                    "seconds": seconds[mode],
                    "cpu_seconds": cpu[mode],
                    "num_drafts": drafts[mode],
                    "num_accepted_tokens": accepted[mode],
                    "steps_per_sequence": args.output_len - accepted[mode] / (batch * args.repeats),
                    "outputs": outputs[mode],
                    "switch": engine.executors[0].spec_switch.describe(),
                }
                print(f"{mode:<7} b{batch:<4} {rows[mode][batch]['output_tok_s']:9.0f} tok/s  "
                      f"cpu {statistics.median(cpu[mode]):.3f} s a batch  drafts {drafts[mode]}  "
                      f"accepted {accepted[mode]}  steps/seq {rows[mode][batch]['steps_per_sequence']:.1f}",
                      flush=True)
    return rows


def prompt(args, vocab_size: int, rng: random.Random, copying: bool) -> list[int]:
    if copying:  # the repeating text from position 0, as `copying_forward` continues it
        text = copy_text(vocab_size, COPY_PERIOD)
        return [text[p % COPY_PERIOD] for p in range(args.prompt_len)]
    low = vocab_size // 2 if args.copy_share else 10  # a copying forward's hashed half
    return [rng.randrange(low, vocab_size) for _ in range(args.prompt_len)]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="model folder (default: the tiny model)")
    p.add_argument("--modes", nargs="+", default=["off", "ngram", "suffix"])
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 128])
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--num-speculative-tokens", type=int, default=4)
    p.add_argument("--ratio", type=float, default=1.5,
                   help="every bucket's verify/decode time ratio in the switch's start-up table")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--copy-share", type=float, default=0.0,
                   help="share of each batch's sequences whose model copies their prompt (0: none)")
    p.add_argument("--fixed-ratio", action="store_true",
                   help="the switch weighs drafts against --ratio alone, not this host's step times")
    p.add_argument("--edits", type=int, default=0,
                   help="tokens of a copied period (61) the model writes differently from its prompt")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.model is None:
        from mesh.tiny_model import ensure_default_model

        args.model = str(ensure_default_model())
    modes = args.modes if "off" in args.modes else ["off", *args.modes]
    results = asyncio.run(bench(args, modes))
    identical = True
    for mode in modes[1:]:
        for batch, row in results[mode].items():
            off = results["off"][batch]
            same = row["outputs"] == off["outputs"]
            identical = identical and same
            print(f"{mode:<7} b{batch:<4} x{row['output_tok_s'] / off['output_tok_s']:.2f} of off  "
                  f"identical {same}  switch {row['switch']}")
    if args.json:
        strip = {m: {b: {k: v for k, v in r.items() if k != "outputs"} for b, r in rows.items()}
                 for m, rows in results.items()}
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": strip}, indent=1))
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
