"""Generate a continuation of one prompt in-process: the tokenizer and the in-process engine
(`mesh.engine`: the scheduler, cache and executor cores without gRPC)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import TYPE_CHECKING

from radixmesh.errors import RadixmeshError
from radixmesh.sampling import SamplingParams

if TYPE_CHECKING:  # the engine imports torch; loading waits for run()
    from mesh.engine import Engine
    from mesh.engine.engine import Completion


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompt", help="raw prompt text (no chat template is applied)")
    parser.add_argument("--model", required=True, help="Hugging Face model folder")
    parser.add_argument("--max-tokens", type=int, default=128, help="most tokens to generate")
    parser.add_argument("--temperature", type=float, default=1.0, help="0 is greedy")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=-1, help="-1 is off")
    parser.add_argument("--seed", type=int, default=None, help="seed of the request's sampler")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--dtype", default="auto", help="auto, float32, float16 or bfloat16")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    from transformers import AutoTokenizer

    from mesh.engine import Engine, EngineConfig
    from services.executor.core.config import ExecutorConfig
    from services.executor.core.loader import read_model_folder

    try:
        sampling = SamplingParams(
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            seed=args.seed,
        )
        executor = ExecutorConfig(
            model_path=args.model,
            device=args.device,
            dtype=args.dtype,
            seed=args.seed or 0,
            max_num_seqs=1,
        )
        read_model_folder(args.model)  # checks the folder before the tokenizer reads it
        tokenizer = AutoTokenizer.from_pretrained(args.model)
        prompt_ids = list(tokenizer(args.prompt)["input_ids"])
        output = asyncio.run(_complete(Engine(EngineConfig((executor,))), prompt_ids, sampling))
    except (RadixmeshError, FileNotFoundError) as exc:
        print(f"radixmesh generate: {exc}", file=sys.stderr)
        return 2
    text = tokenizer.decode(output.token_ids, skip_special_tokens=True)
    if args.json:
        record = {
            "text": text,
            "token_ids": output.token_ids,
            "prompt_token_ids": prompt_ids,
            "finish_reason": output.finish_reason,
        }
        print(json.dumps(record))
    else:
        print(text)
    return 0


async def _complete(engine: Engine, prompt_ids: list[int], sampling: SamplingParams) -> Completion:
    async with engine:
        return await engine.complete(prompt_ids, sampling)
