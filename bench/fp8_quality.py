"""FP8 against bf16: next-token agreement and KL divergence on a fixed prompt set.

Loads the model twice (projections in the checkpoint's dtype, and quantized to FP8 at
load), runs the same prompts through both in one prefill each, and compares the
next-token distributions at every position: top-1 agreement, mean and p99 of
KL(reference || fp8), and the mean absolute logit difference; once with FP8 weights and
FP8 activations (a prefill's path), once with the FP8 weights alone (a decode step's).

    python bench/fp8_quality.py --model /tmp/llama8b --json fp8_quality.json

Random weights exercise the mechanics (scales, fused parts, the FP8 product) but not a
trained model's sensitivity: a trained model's outliers (a few large activations per
token, large weight rows) are what per-token and per-row scales exist for, and its
figures should be measured on its own checkpoint and an evaluation set.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from services.executor.core.config import ExecutorConfig
from services.executor.core.executor import ExecutorCore
from services.executor.core.forward_batch import BatchEntry, build_forward_batch
from services.executor.core.models.decoder import LayerWeights
from services.executor.core.models.fp8 import Fp8Weight, dequantize


def all_logits(core: ExecutorCore, prompt: list[int]) -> torch.Tensor:
    page_size = core.config.page_size
    pages = list(range(-(-len(prompt) // page_size)))
    batch = build_forward_batch([BatchEntry(0, prompt, pages, True)], page_size, core.device)
    batch.logits_indices = torch.arange(batch.num_tokens, device=core.device)
    return core.model.forward(batch, core.kv_pool)


def load(args: argparse.Namespace, quantization: str) -> ExecutorCore:
    return ExecutorCore(
        ExecutorConfig(
            model_path=args.model,
            device=args.device,
            quantization=quantization,
            num_pages=-(-args.prompt_len // 16) + 1,
            max_num_batched_tokens=max(8192, args.prompt_len),
            cuda_graphs=False,
        )
    )


def compare(refs: list[torch.Tensor], ours: list[torch.Tensor]) -> dict[str, float]:
    kls: list[float] = []
    agree = total = 0
    abs_diff = []
    for ref, out in zip(refs, ours, strict=True):
        ref_logp, our_logp = ref.log_softmax(-1), out.log_softmax(-1)
        kls += (ref_logp.exp() * (ref_logp - our_logp)).sum(-1).tolist()
        agree += int((ref.argmax(-1) == out.argmax(-1)).sum())
        total += ref.shape[0]
        abs_diff.append(float((ref - out).abs().mean()))
    kls.sort()
    return {
        "positions": total,
        "top1_agreement": round(agree / total, 4),
        "kl_mean": round(statistics.fmean(kls), 5),
        "kl_p99": round(kls[int(0.99 * (len(kls) - 1))], 5),
        "logit_abs_diff_mean": round(statistics.fmean(abs_diff), 4),
        "reference_logit_std": round(statistics.fmean(float(r.std()) for r in refs), 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the result here")
    args = parser.parse_args()

    start = time.perf_counter()
    reference = load(args, "none")
    vocab = reference.info.vocab_size
    gen = torch.Generator().manual_seed(args.seed)
    prompts = [
        torch.randint(0, vocab, (args.prompt_len,), generator=gen).tolist()
        for _ in range(args.num_prompts)
    ]
    ref_logits = [all_logits(reference, p).cpu() for p in prompts]
    reference.shutdown()
    del reference
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    quantized = load(args, "fp8")
    # a prefill has more than GEMV_MAX_ROWS rows: FP8 weights and per-token FP8 activations
    fp8_logits = [all_logits(quantized, p).cpu() for p in prompts]
    # the same FP8 weights widened back to the model's dtype: the weight rounding alone,
    # which is what a decode step's weight-only GEMV computes
    dtype = quantized.model.weights.embed.dtype
    for layer in quantized.model.weights.layers:
        for name in LayerWeights.PROJECTIONS:
            weight = getattr(layer, name)
            if isinstance(weight, Fp8Weight):
                setattr(layer, name, dequantize(weight, dtype))
    weight_only_logits = [all_logits(quantized, p).cpu() for p in prompts]
    quantized.shutdown()
    report = {
        "model": args.model,
        "w8a8": compare(ref_logits, fp8_logits),
        "weight_only": compare(ref_logits, weight_only_logits),
        "seconds": round(time.perf_counter() - start, 1),
    }
    report.update(report["w8a8"])
    print(json.dumps(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
