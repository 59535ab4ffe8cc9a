"""How many steps speculation takes at batch 1 against the fewest prompt lookup could
take, on a model folder, on the CPU: the policy's cost in steps, apart from any step's time.

For each prompt of a workload (bench/speculative.py's), the greedy output with
speculation off; from it, the steps prompt lookup would take drafting at every match
(`lookup_steps`: each step emits 1 plus the draft's prefix that the output has), and the
steps the engine took with the proposer and its switch fixed at `--ratio` (a verification
costing that many decode steps, as a GPU's start-up timing would say; this host's own step
times never replace it). A row also counts its time in plain steps: each drafted step
costs `--ratio`, each other one 1.

    python bench/spec_steps.py --model /tmp/tiny-trained --ratio 1.7 --ks 8 4
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.spec_host import FixedRatioSwitch
from bench.speculative import make_prompts, run_batch
from mesh.engine import Engine, EngineConfig
from services.executor.core.spec import SpeculativeConfig
from services.executor.core.spec.adaptive import DraftLength
from services.executor.core.spec.proposers import NgramIndex
from services.scheduler.core import SchedulerConfig


def lookup_steps(
    prompt: Sequence[int], output: Sequence[int], k: int, min_match: int = 2, max_match: int = 5
) -> tuple[int, int]:
    """(steps, drafted steps) of prompt lookup drafting at every match: the draft is what
    followed the latest earlier occurrence of the context's longest suffix (min_match to
    max_match tokens), as long as the ngram proposer's with every draft kept so far (at
    most k tokens and twice the match: `DraftLength.limit`)."""
    index, length = NgramIndex(min_match, max_match), DraftLength(k)
    done = steps = drafted = 0
    while done < len(output):
        draft = index.lookup([*prompt, *output[:done]], k)
        steps += 1
        kept = 0
        if draft.match_len:
            drafted += 1
            guess = draft.token_ids[: length.limit(draft.match_len)]
            while kept < len(guess) and done + kept < len(output) and guess[kept] == output[done + kept]:
                kept += 1
        done += kept + 1
    return steps, drafted


async def engine_outputs(args, method: str, k: int, prompts: list[list[int]]):
    """Each prompt alone through the in-process engine on the CPU: its outputs, and the
    steps (output tokens less accepted draft tokens) and drafted steps per prompt."""
    config = EngineConfig.for_model(
        args.model, scheduler=SchedulerConfig(max_num_seqs=1), device="cpu", max_num_seqs=1,
        overlap_prepare=True,
        speculative=SpeculativeConfig(method=method, max_draft_tokens=k, max_batch_size=1),
    )  # fmt: skip
    async with Engine(config) as engine:
        core = engine.executors[0]
        if method != "off":
            core.spec_switch = FixedRatioSwitch(1, {1: args.ratio}, max_gain=k + 1)
        outputs = []
        for prompt in prompts:
            out, _, _ = await run_batch(engine, [prompt], args.output_len)
            outputs.append(out[0])
        usage = core.spec_stats.snapshot()
    n = len(prompts)
    return outputs, args.output_len - usage.num_accepted_tokens / n, usage.num_drafts / n


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="model folder (default: the tiny model)")
    p.add_argument("--workload", default="code_edit")
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--ks", type=int, nargs="+", default=[8, 4])
    p.add_argument("--ratio", type=float, default=1.7, help="a verification's cost in decode steps")
    p.add_argument("--method", default="ngram", choices=("ngram", "suffix"))
    args = p.parse_args(argv)
    if args.model is None:
        from mesh.tiny_model import ensure_default_model

        args.model = str(ensure_default_model())
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    prompts = make_prompts(
        args.workload, args.num_prompts, tokenizer, len(tokenizer), 0, args.prompt_len, args.output_len
    )
    off, _, _ = asyncio.run(engine_outputs(args, "off", 1, prompts))
    n = len(prompts)
    for k in args.ks:
        bound = [lookup_steps(p, o, k) for p, o in zip(prompts, off, strict=True)]
        steps, drafted = sum(b[0] for b in bound) / n, sum(b[1] for b in bound) / n
        outputs, took, drafts = asyncio.run(engine_outputs(args, args.method, k, prompts))
        print(f"k={k}: lookup at every match {steps:.1f} steps ({drafted:.1f} drafted), time "
              f"{steps + (args.ratio - 1) * drafted:.1f}; {args.method} at ratio {args.ratio}: "
              f"{took:.1f} steps ({drafts:.1f} drafted), time {took + (args.ratio - 1) * drafts:.1f}; "
              f"outputs identical to off: {outputs == off}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
