"""`python -m services.executor.main --tensor-parallel-size 2` on CPU: two gloo ranks in
two processes serve as one executor (one pool registered, one Step stream) and give the
greedy tokens of transformers; SIGTERM stops both ranks."""

from __future__ import annotations

import asyncio
import json
import signal
import sys

import grpc
import pytest

from mesh.tiny_model import write_tiny_model
from radixmesh.v1 import executor_pb2, executor_pb2_grpc
from services.common.config import free_port
from services.common.health import wait_for_serving
from services.executor.server import SERVICE_NAME
from tests.integration.test_executor_service import (
    NUM_PAGES,
    PAGE_SIZE,
    Reference,
    cache_service,
    new_seq,
    pages_for,
    plan,
    pool_stats,
    process,
    read_all,
    tokens_of,
)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    """The tiny Llama (8 heads, 2 KV heads) and transformers' model of it."""
    import torch
    from transformers import AutoModelForCausalLM

    path = write_tiny_model(tmp_path_factory.mktemp("tiny-llama-tp"), "llama", seed=0)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return Reference(path, hf, hf.config.vocab_size)


def executor_argv(reference: Reference, cache_address: str, port: int, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "services.executor.main", "--model", str(reference.path),
        "--executor-id", "ex-tp", "--device", "cpu", "--page-size", str(PAGE_SIZE),
        "--num-pages", str(NUM_PAGES), "--max-num-seqs", "4", "--no-grammar",
        "--cache-address", cache_address, "--port", str(port), *extra,
    ]  # fmt: skip


@pytest.mark.slow
async def test_a_tp2_executor_serves_as_one_executor_with_the_greedy_tokens(
    tiny_llama: Reference,
) -> None:
    reference = tiny_llama
    port = free_port()
    address = f"127.0.0.1:{port}"
    async with cache_service() as cache_address:
        argv = executor_argv(reference, cache_address, port, "--tensor-parallel-size", "2")
        async with process(*argv) as proc:
            await asyncio.wait_for(wait_for_serving(address, SERVICE_NAME, timeout=180), 185)
            (pool,) = await pool_stats(cache_address, "ex-tp")
            assert (pool.num_pages, pool.page_size) == (NUM_PAGES, PAGE_SIZE)
            async with grpc.aio.insecure_channel(address) as channel:
                stub = executor_pb2_grpc.ExecutorStub(channel)
                info = await stub.GetInfo(executor_pb2.GetInfoRequest())
                assert info.vocab_size == reference.vocab_size and info.num_pages == NUM_PAGES
                prompts = {"a": reference.prompt(7, seed=8), "b": reference.prompt(13, seed=9)}
                expected = {r: reference.greedy(p, 5)[0] for r, p in prompts.items()}
                call = stub.Step()
                await call.write(plan(1, new=[
                    new_seq("a", prompts["a"], pages_for(12, 0)),
                    new_seq("b", prompts["b"], pages_for(18, 8)),
                ]))  # fmt: skip
                for step in range(2, 6):
                    await call.write(plan(step, running=[("a", 1), ("b", 1)]))
                await call.done_writing()
                results = await read_all(call)
                assert {r: tokens_of(results, r) for r in prompts} == expected

            proc.send_signal(signal.SIGTERM)
            _, stderr = await asyncio.wait_for(proc.communicate(), 60)
            assert proc.returncode == 0, stderr.decode()[-2000:]
            lines = [json.loads(x) for x in stderr.decode().splitlines() if x.startswith("{")]
            stopped = [x for x in lines if x["event"] == "follower_stopped"]
            # the follower ran the 5 plans (and the drop of the stream's sequences at its end)
            assert [x["rank"] for x in stopped] == [1] and stopped[0]["num_steps"] >= 5
        assert await pool_stats(cache_address, "ex-tp") == []


async def test_a_model_that_does_not_split_is_refused_naming_the_field(
    tiny_llama: Reference,
) -> None:
    """The tiny Llama has 8 heads: 3 ranks cannot share them; the executor exits 1."""
    reference = tiny_llama
    port = free_port()
    async with cache_service() as cache_address:
        argv = executor_argv(reference, cache_address, port, "--tensor-parallel-size", "3")
        async with process(*argv) as proc:
            _, stderr = await asyncio.wait_for(proc.communicate(), 180)
    assert proc.returncode == 1
    assert "tensor_parallel_size 3 must divide num_attention_heads (8)" in stderr.decode()
