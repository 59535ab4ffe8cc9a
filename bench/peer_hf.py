"""The peer: Hugging Face transformers on the same model folder, bf16.

(a) batch-1 decode: greedy `generate` of --decode-output-len tokens after a
    short random prompt; a streamer stamps every token as it leaves the loop,
    and the time per output token counts the decode steps only (first token,
    which comes out of the prefill, to the last).
(b) continuous batching: `generate_batch` on --num-requests random prompts of
    --prompt-len tokens, --output-len new tokens each, greedy: output tokens/s
    over the requests' own window (first request created to last finished,
    after the manager's warm-up), and over the whole call.

A failure of one part is reported in the JSON (its "error") and the other
still runs. Random weights rarely pick EOS; the tokens actually generated are
counted, not assumed.

    python bench/peer_hf.py --model /tmp/llama8b [--json peer.json]
    python bench/peer_hf.py --model /tmp/tiny --device cpu --num-requests 4 \\
        --prompt-len 16 --output-len 8 --decode-output-len 8   # smoke run
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import random
import sys
import time
import traceback
from pathlib import Path
from typing import Any

# Import nothing of this repository: the peer runs on transformers alone.
_REPO = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() not in (_REPO, _REPO / "bench")]

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, GenerationConfig  # noqa: E402
from transformers.generation.streamers import BaseStreamer  # noqa: E402


class StepClock(BaseStreamer):
    """Stamps each `put`: the prompt first, then every generated token."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def put(self, value: Any) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def random_prompts(num: int, length: int, vocab_size: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    low = min(10, vocab_size // 2)  # clear of the special ids at the start
    return [[rng.randrange(low, vocab_size) for _ in range(length)] for _ in range(num)]


def load(model_dir: str, device: torch.device) -> Any:
    """`from_pretrained` straight onto the device; where that needs `accelerate` and it
    is missing, the same model class built on the device and filled from the shards."""
    try:
        model = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.bfloat16, device_map=str(device)
        )
    except (ImportError, ValueError, RuntimeError) as exc:
        print(f"from_pretrained with device_map failed ({exc}); filling the model from the shards")
        model = load_from_shards(model_dir, device)
    return model.eval()


def load_from_shards(model_dir: str, device: torch.device) -> Any:
    from safetensors.torch import load_file

    folder = Path(model_dir)
    config = transformers.AutoConfig.from_pretrained(model_dir)
    with device:
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.generation_config = GenerationConfig.from_pretrained(model_dir)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    expected = set(model.state_dict())
    loaded: set[str] = set()
    for name in files:
        shard = load_file(str(folder / name), device=str(device))
        result = model.load_state_dict(shard, strict=False, assign=False)
        if result.unexpected_keys:
            raise RuntimeError(f"{name}: unexpected tensors {result.unexpected_keys[:4]}")
        loaded |= set(shard)
        del shard
    if config.tie_word_embeddings:
        loaded.add("lm_head.weight")
    if expected - loaded:
        raise RuntimeError(f"checkpoint lacks {sorted(expected - loaded)[:4]}")
    return model


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def decode_batch1(model: Any, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    vocab = model.config.vocab_size
    prompt = random_prompts(1, args.decode_prompt_len, vocab, args.seed)[0]
    input_ids = torch.tensor([prompt], device=device)
    config = GenerationConfig(do_sample=False, max_new_tokens=args.decode_output_len)
    with torch.no_grad():
        model.generate(
            input_ids, generation_config=GenerationConfig(do_sample=False, max_new_tokens=8)
        )
        sync(device)
        clock = StepClock()
        start = time.perf_counter()
        out = model.generate(input_ids, generation_config=config, streamer=clock)
        sync(device)
        seconds = time.perf_counter() - start
    num_out = int(out.shape[1]) - len(prompt)
    token_times = clock.times[1:]  # the first put is the prompt
    if len(token_times) < 2:
        raise RuntimeError(f"only {len(token_times)} tokens generated; cannot time decode steps")
    tpot_ms = (token_times[-1] - token_times[0]) * 1e3 / (len(token_times) - 1)
    return {
        "prompt_len": len(prompt),
        "num_output_tokens": num_out,
        "tpot_ms": round(tpot_ms, 3),
        "ttft_ms": round((token_times[0] - start) * 1e3, 3),
        "seconds": round(seconds, 3),
    }


def continuous_batching_config(args: argparse.Namespace) -> Any | None:
    """The ContinuousBatchingConfig of the installed transformers with the given fields
    (those it accepts), or None when it has none or none are given."""
    wanted = {
        "num_blocks": args.num_blocks,
        "max_batch_tokens": args.max_batch_tokens,
        "max_memory_percent": args.max_memory_percent,
    }
    wanted = {k: v for k, v in wanted.items() if v is not None}
    cls = getattr(transformers, "ContinuousBatchingConfig", None)
    if cls is None:
        from transformers import generation

        cls = getattr(generation, "ContinuousBatchingConfig", None)
    if not wanted or cls is None:
        return None
    if dataclasses.is_dataclass(cls):
        accepted = {f.name for f in dataclasses.fields(cls)}
    else:
        accepted = set(inspect.signature(cls).parameters)
    dropped = sorted(set(wanted) - accepted)
    if dropped:
        print(f"ContinuousBatchingConfig lacks {dropped}; left out")
    return cls(**{k: v for k, v in wanted.items() if k in accepted})


def batch_generate(model: Any, args: argparse.Namespace) -> dict[str, Any]:
    vocab = model.config.vocab_size
    prompts = random_prompts(args.num_requests, args.prompt_len, vocab, args.seed + 1)
    config = GenerationConfig(do_sample=False, max_new_tokens=args.output_len)
    kwargs: dict[str, Any] = {"generation_config": config}
    cb_config = continuous_batching_config(args)
    params = inspect.signature(model.generate_batch).parameters
    if cb_config is not None and "continuous_batching_config" in params:
        kwargs["continuous_batching_config"] = cb_config
    if "progress_bar" in params:
        kwargs["progress_bar"] = False
    with torch.no_grad():  # generate_batch updates its tensors from a thread of its own
        start = time.perf_counter()
        results = model.generate_batch(inputs=prompts, **kwargs)
        seconds = time.perf_counter() - start
    outputs = list(results.values())
    errors = [o.error for o in outputs if getattr(o, "error", None)]
    num_out = sum(len(o.generated_tokens) for o in outputs)
    report: dict[str, Any] = {
        "num_requests": args.num_requests,
        "num_finished": len(outputs),
        "num_failed": len(errors),
        "prompt_len": args.prompt_len,
        "output_len": args.output_len,
        "num_output_tokens": num_out,
        "seconds_call": round(seconds, 3),
        "output_tokens_per_s_call": round(num_out / seconds, 1),
    }
    window = request_window(outputs)
    if window is not None and 0 < window <= seconds:
        report["seconds_window"] = round(window, 3)
        report["output_tokens_per_s_window"] = round(num_out / window, 1)
    report["output_tokens_per_s"] = report.get(
        "output_tokens_per_s_window", report["output_tokens_per_s_call"]
    )
    if errors:
        report["first_error"] = str(errors[0])[:500]
    return report


def request_window(outputs: list[Any]) -> float | None:
    """First request created to last request finished (perf_counter stamps), if recorded."""
    try:
        created = min(o.created_time for o in outputs)
        finished = max(o.lifespan[1] for o in outputs)
    except (AttributeError, TypeError, IndexError, ValueError):
        return None
    return finished - created if finished > 0 else None


def guarded(name: str, fn: Any, *fn_args: Any) -> dict[str, Any]:
    try:
        return fn(*fn_args)
    except Exception as exc:
        traceback.print_exc()
        print(f"{name} failed: {type(exc).__name__}: {exc}")
        return {"error": f"{type(exc).__name__}: {exc}"[:1000]}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="Hugging Face model folder")
    p.add_argument("--device", default="cuda")
    p.add_argument("--num-requests", type=int, default=256)
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--decode-prompt-len", type=int, default=32)
    p.add_argument("--decode-output-len", type=int, default=128)
    p.add_argument("--num-blocks", type=int, default=None, help="generate_batch KV blocks")
    p.add_argument("--max-batch-tokens", type=int, default=None, help="generate_batch step tokens")
    p.add_argument("--max-memory-percent", type=float, default=None)
    p.add_argument("--skip-decode", action="store_true", help="skip (a)")
    p.add_argument("--skip-batch", action="store_true", help="skip (b)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, help="also write the JSON object here")
    args = p.parse_args(argv)
    for name in ("num_requests", "prompt_len", "output_len", "decode_prompt_len"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.decode_output_len < 2:
        p.error("--decode-output-len must be >= 2 (decode steps are timed)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    result: dict[str, Any] = {
        "peer": "transformers",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "model": args.model,
    }
    start = time.perf_counter()
    model = load(args.model, device)
    result["load_seconds"] = round(time.perf_counter() - start, 2)
    result["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
    if not args.skip_decode:
        result["decode_batch1"] = guarded("batch-1 decode", decode_batch1, model, args, device)
        print(json.dumps({"decode_batch1": result["decode_batch1"]}))
    if not args.skip_batch:
        if device.type == "cuda":
            torch.cuda.empty_cache()  # generate_batch sizes its KV cache from free memory
        result["generate_batch"] = guarded("generate_batch", batch_generate, model, args)
        print(json.dumps({"generate_batch": result["generate_batch"]}))
    text = json.dumps(result)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
