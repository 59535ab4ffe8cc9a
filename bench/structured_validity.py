"""Validity of strict JSON-schema outputs sampled at temperature 1 from the tiny random model.

The in-process Engine (scheduler, cache and executor cores, a real GrammarService), the
bounded order schema of tests/e2e/test_structured.py (tests/data/order_schema.json),
batches of 8 requests with seeds 1000 * batch + i, max_tokens 512 (more than the schema's
longest output). A small KV pool (`--num-pages`) makes the scheduler preempt and resume
constrained requests. Every output is decoded strictly as UTF-8, parsed and validated
with `jsonschema`; reported: outputs that finished "stop" and validate, invalid ones, and
those that ended otherwise (length, abort), each printed with its text.

    python -m bench.structured_validity --num-requests 96 --num-pages 96 --jump-forward on
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

import jsonschema

from mesh.engine import Engine, EngineConfig
from mesh.tiny_model import write_tiny_model
from radixmesh.sampling import Constraint, ConstraintKind, SamplingParams
from services.executor.core.grammar import GrammarConfig, GrammarService
from services.executor.core.spec import SpeculativeConfig
from services.executor.core.spec.config import JUMP_FORWARD_MODES

ORDER_SCHEMA_PATH = Path(__file__).resolve().parents[1] / "tests" / "data" / "order_schema.json"
ORDER_SCHEMA = json.loads(ORDER_SCHEMA_PATH.read_text())
"""The bounded order schema tests/e2e/test_structured.py checks the mesh with (read as data,
like the schema corpus bench/structured_compile.py reads)."""

PROMPT = "Describe one order as JSON."


def check(raw: bytes) -> str | None:
    """None when raw is valid UTF-8 JSON that validates, else why not."""
    try:
        jsonschema.validate(json.loads(raw.decode("utf-8")), ORDER_SCHEMA)
    except (UnicodeDecodeError, ValueError, jsonschema.ValidationError) as e:
        return str(e).splitlines()[0][:120]
    return None


async def run(args: argparse.Namespace, model_dir: str) -> dict:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    grammar = GrammarService.from_model_dir(model_dir, config=GrammarConfig(compile_timeout_s=60))
    config = EngineConfig.for_model(
        model_dir, device="cpu", page_size=4, num_pages=args.num_pages, max_num_seqs=16,
        speculative=SpeculativeConfig(jump_forward=JUMP_FORWARD_MODES[args.jump_forward]),
    )  # fmt: skip
    engine = Engine(config, grammar=grammar)
    await engine.start()
    constraint = Constraint(ConstraintKind.JSON_SCHEMA, json.dumps(ORDER_SCHEMA))
    prompt = tokenizer.encode(PROMPT)
    vocab = grammar.tokenizer_info.decoded_vocab  # each token's bytes
    stop_ids = frozenset(grammar.tokenizer_info.stop_token_ids)
    counts = {"valid": 0, "invalid": 0, "not_stop": 0}
    start = time.perf_counter()
    try:
        for batch in range((args.num_requests + 7) // 8):
            sampling = [
                SamplingParams(temperature=1.0, seed=1000 * batch + i, max_tokens=512)
                for i in range(8)
            ]
            streams = [await engine.generate(prompt, s, constraint=constraint) for s in sampling]
            for i, result in enumerate(await asyncio.gather(*(s.collect() for s in streams))):
                raw = b"".join(vocab[t] for t in result.token_ids if t not in stop_ids)
                why = check(raw)
                kind = "not_stop" if result.finish_reason != "stop" else "invalid" if why else "valid"
                counts[kind] += 1
                if kind != "valid":
                    print(f"seed {1000 * batch + i}: {result.finish_reason}: {raw[:160]!r} {why}")
    finally:
        await engine.stop()
        grammar.close(wait=True)
    counts["seconds"] = round(time.perf_counter() - start, 1)
    return counts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-requests", type=int, default=96)
    p.add_argument("--num-pages", type=int, default=96, help="KV pages (small: preemptions)")
    p.add_argument("--jump-forward", default="auto", choices=tuple(JUMP_FORWARD_MODES))
    p.add_argument("--model", default=None, help="a model folder (default: the tiny model)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model or str(write_tiny_model(Path(tmp) / "tiny", arch="llama", seed=0))
        counts = asyncio.run(run(args, model_dir))
    print(json.dumps({"num_requests": args.num_requests, "num_pages": args.num_pages,
                      "jump_forward": args.jump_forward, **counts}))  # fmt: skip


if __name__ == "__main__":
    main()
