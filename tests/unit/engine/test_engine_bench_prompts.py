"""bench/engine.py's `chat-words` workload: the prompts `radixmesh bench --workload random`
sends, tokenized as the gateway tokenizes a chat request, so the in-process reference
prefills what a run through the mesh prefills."""

from __future__ import annotations

import importlib
import itertools

from gateway.core.request import ChatMessage
from gateway.core.tokenizer import Tokenizer
from mesh.loadgen.runner import LoadConfig, _request
from mesh.loadgen.workloads import WorkloadConfig, iter_scripts
from mesh.tiny_model import ensure_default_model

engine_bench = importlib.import_module("bench.engine")


def _args(*argv: str):
    return engine_bench.parse_args(["--workload", "chat-words", *argv])


def test_chat_words_are_the_bench_requests_as_the_gateway_tokenizes_them():
    model = str(ensure_default_model())
    args = _args("--model", model, "--num-requests", "5", "--prompt-len", "24", "--seed", "3")
    prompts = engine_bench.make_prompts(args, vocab_size=0)

    tokenizer = Tokenizer.from_folder(model)
    config = WorkloadConfig(name="random", seed=3, input_len=24, output_len=args.output_len)
    scripts = list(itertools.islice(iter_scripts(config), 5))
    assert len(prompts) == 5
    for prompt, script in zip(prompts, scripts, strict=True):
        turn = script.turns[0]
        sent = _request(turn, ({"role": "user", "content": turn.user},), "", LoadConfig())
        # the messages the bench sends, through the gateway's chat path
        expected = tokenizer.encode_messages([ChatMessage(**m) for m in sent.messages])
        assert prompt == expected
        assert turn.user in tokenizer.decode(prompt)
        assert len(prompt) > 24  # the template's tokens around 24 words
    assert len({tuple(p) for p in prompts}) == 5


def test_chat_words_follow_the_seed_and_are_counted_in_the_report():
    model = str(ensure_default_model())
    base = ("--model", model, "--num-requests", "3", "--prompt-len", "16")
    first = engine_bench.make_prompts(_args(*base, "--seed", "0"), vocab_size=0)
    again = engine_bench.make_prompts(_args(*base, "--seed", "0"), vocab_size=0)
    other = engine_bench.make_prompts(_args(*base, "--seed", "1"), vocab_size=0)
    assert first == again
    assert first != other

    args = _args(*base)
    timings = [engine_bench.Timing(0.0, 0.1, 0.5, 4) for _ in first]
    report = engine_bench.summarize(args, "inprocess", first, timings, 1.0, 0)
    assert report.prompt_tokens == sum(len(p) for p in first)
    assert report.workload == "chat-words"


async def test_with_the_bench_s_warm_up_they_are_the_prompts_its_measured_run_sends():
    """The load loop's own requests, after a warm-up of 4 at the mesh step's concurrency,
    tokenized as the gateway does, are the reference's prompts with --bench-warmup 4."""
    import asyncio

    from mesh.loadgen.client import RequestResult
    from mesh.loadgen.runner import run_load

    class Recording:
        def __init__(self) -> None:
            self.measured: list[tuple[dict, ...]] = []
            self.measuring = False

        async def send(self, request):
            if self.measuring:
                self.measured.append(request.messages)
            await asyncio.sleep(0)
            result = RequestResult(start_s=0.0)
            result.ok = True
            return result

        async def close(self) -> None:
            pass

    client = Recording()

    async def measuring() -> None:
        client.measuring = True

    model = str(ensure_default_model())
    config = WorkloadConfig(name="random", seed=0, input_len=12, output_len=4)
    load = LoadConfig(concurrency=64, num_requests=6, warmup=4)
    await run_load(iter_scripts(config), client, load, on_measure_start=measuring)
    tokenizer = Tokenizer.from_folder(model)
    sent = [tokenizer.encode_messages([ChatMessage(**m) for m in ms]) for ms in client.measured]
    args = _args("--model", model, "--num-requests", "6", "--prompt-len", "12", "--output-len", "4",
                 "--bench-warmup", "4")  # fmt: skip
    assert sorted(engine_bench.make_prompts(args, vocab_size=0)) == sorted(sent)
