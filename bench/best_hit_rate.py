"""The best KV hit rate a run of `radixmesh bench` could have: each request's longest prompt
prefix, in tokens, that an earlier request of the run already had, over all prompt tokens.

    python bench/best_hit_rate.py --model M --workload shared-prefix --groups 8 \\
        --prompts-per-group 32 --system-prompt-len 1024 --num-requests 256

The prompts are the bench's own (its generator and --seed), as the gateway tokenizes a chat
request of each, in the order the bench sends them; with --warmup N (the run's own), its
first N scripts are the warm-up's, sent first and cached but not counted. The cache can
serve no more than this (a prompt's prefix must be computed once), so the run's `kv_cache_hit_rate` over this is how much of the shared work it reused.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway.core.request import ChatMessage
from gateway.core.tokenizer import Tokenizer
from mesh.loadgen.runner import opening_messages
from mesh.loadgen.workloads import WorkloadConfig, iter_scripts


def best_hit_rate(prompts: Sequence[list[int]], cached: Sequence[list[int]] = ()) -> float:
    """Sum over prompts of the longest prefix an earlier one (or one of `cached`, sent
    before them and not counted) shares, over all their tokens."""
    root: dict[int, dict] = {}
    hit = total = 0
    for i, prompt in enumerate([*cached, *prompts]):
        node, shared = root, 0
        for token in prompt:
            if token not in node:
                break
            node, shared = node[token], shared + 1
        for token in prompt[shared:]:
            node = node.setdefault(token, {})
        if i >= len(cached):
            # a prompt that is all cached still computes its last token (its logits)
            hit += min(shared, len(prompt) - 1)
            total += len(prompt)
    return hit / total if total else 0.0


def bench_prompts(
    tokenizer: Tokenizer, config: WorkloadConfig, num: int, skip: int = 0
) -> list[list[int]]:
    """The prompts (first turns) of `num` requests after the first `skip` (a run's
    --warmup), as the gateway tokenizes them."""
    return [
        tokenizer.encode_messages([ChatMessage(**m) for m in opening_messages(script)])
        for script in itertools.islice(iter_scripts(config), skip, skip + num)
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--workload", default="shared-prefix")
    p.add_argument("--num-requests", type=int, default=256)
    p.add_argument("--groups", type=int, default=4)
    p.add_argument("--prompts-per-group", type=int, default=8)
    p.add_argument("--system-prompt-len", type=int, default=256)
    p.add_argument("--question-len", type=int, default=32)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", type=int, default=0, help="the run's --warmup (scripts skipped)")
    args = p.parse_args(argv)
    if args.warmup < 0:
        p.error("--warmup must be >= 0")
    config = WorkloadConfig(
        name=args.workload,
        seed=args.seed,
        input_len=args.input_len,
        groups=args.groups,
        prompts_per_group=args.prompts_per_group,
        system_prompt_len=args.system_prompt_len,
        question_len=args.question_len,
    )
    tokenizer = Tokenizer.from_folder(args.model)
    warm = bench_prompts(tokenizer, config, args.warmup)
    prompts = bench_prompts(tokenizer, config, args.num_requests, skip=args.warmup)
    rate = best_hit_rate(prompts, cached=warm)
    print(json.dumps({"best_hit_rate": round(rate, 4), "num_prompts": len(prompts),
                      "prompt_tokens": sum(map(len, prompts))}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
