"""`--speculative radix` over gRPC: the executor servicer looks each new sequence up in a
real cache service (GetContinuation through CacheClient) while it prefills, and a prompt
the tree holds an answer for decodes that answer in verified drafts, the tokens unchanged."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc
import torch

from mesh.tiny_model import write_tiny_model
from radixmesh import wire
from radixmesh.v1 import cache_pb2_grpc, executor_pb2, executor_pb2_grpc
from radixmesh.v1 import inference_pb2 as ipb
from services.cache.client import CacheClient
from services.cache.core import CacheCore
from services.cache.server import CacheServicer
from services.cache.store import InProcessStore, StoreConfig
from services.executor.core.config import ExecutorConfig
from services.executor.core.spec import SpeculativeConfig
from services.executor.main import load
from services.executor.server import SERVICE_NAME, ExecutorServicer
from services.executor.tree_drafts import start_tree_prefetch
from tests.fixtures.runtime import running_runtime

PAGE_SIZE = 4
EXECUTOR_ID = "exec-radix"


@contextlib.asynccontextmanager
async def cache_service() -> AsyncIterator[str]:
    servicer = CacheServicer(CacheCore(), InProcessStore(StoreConfig()))

    def register(server: grpc.aio.Server) -> None:
        cache_pb2_grpc.add_CacheServicer_to_server(servicer, server)

    async with running_runtime(register, ["radixmesh.v1.Cache"]) as runtime:
        yield runtime.address


def greedy_reference(path, prompt: list[int], num_tokens: int) -> list[int]:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([prompt]), max_new_tokens=num_tokens, min_new_tokens=num_tokens,
            do_sample=False,
        )  # fmt: skip
    return out[0, len(prompt) :].tolist()


async def decode(stub, prompt: list[int], num_tokens: int) -> tuple[list[int], int, int]:
    """The prompt prefilled, then one plan per result (drafts allowed): (tokens, draft
    tokens verified, draft tokens accepted)."""
    plans: asyncio.Queue = asyncio.Queue()

    async def requests():
        while (item := await plans.get()) is not None:
            yield item

    pages = list(range(-(-(len(prompt) + num_tokens + 8) // PAGE_SIZE)))
    sampling = ipb.SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=num_tokens)
    new = executor_pb2.NewSequence(
        req_id="b", token_ids=prompt, num_prompt_tokens=len(prompt),
        num_scheduled_tokens=len(prompt), page_ids=pages, sampling=sampling,
    )  # fmt: skip
    call = stub.Step(requests())
    await plans.put(executor_pb2.StepPlan(step_id=1, new_seqs=[new]))
    tokens: list[int] = []
    drafted = accepted = 0
    step = 1
    while True:
        result = wire.result_from_proto(await call.read())
        (out,) = result.outputs
        tokens += [*out.accepted_token_ids, out.token_id]
        drafted += out.num_draft_tokens
        accepted += len(out.accepted_token_ids)
        if out.finish_reason:
            break
        step += 1
        running = executor_pb2.RunningSequence(req_id="b", num_scheduled_tokens=1, num_draft_tokens=4)
        await plans.put(executor_pb2.StepPlan(step_id=step, running_seqs=[running]))
    await plans.put(None)  # the plans end: the stream ends after the last result
    assert await call.read() is grpc.aio.EOF
    return tokens, drafted, accepted


async def test_a_prompt_the_tree_answered_decodes_that_answer_in_drafts(tmp_path):
    path = write_tiny_model(tmp_path / "tiny", "llama", seed=0)
    prompt = [7 + (13 * i) % 200 for i in range(10)]
    answer = greedy_reference(path, prompt, 32)
    config = ExecutorConfig(
        model_path=str(path), device="cpu", page_size=PAGE_SIZE, num_pages=64, max_num_seqs=4,
        speculative=SpeculativeConfig(method="radix", max_batch_size=8),
    )  # fmt: skip
    loop = asyncio.get_running_loop()
    core, _ = await loop.run_in_executor(None, load, config, False)
    async with cache_service() as cache_address, CacheClient(cache_address) as cache:
        # An earlier request (on any executor) answered the prompt: its pages are in the tree.
        await cache.register_pool("exec-earlier", core.info.model, 64, PAGE_SIZE)
        lease = await cache.acquire("exec-earlier", prompt, len(prompt) + len(answer), "sched")
        await cache.commit(lease.lease_id, prompt + answer)
        servicer = ExecutorServicer()
        servicer.attach(core, EXECUTOR_ID)
        tree_client = start_tree_prefetch(servicer, core, cache_address)
        assert tree_client is not None

        def register(server: grpc.aio.Server) -> None:
            executor_pb2_grpc.add_ExecutorServicer_to_server(servicer, server)

        try:
            async with (
                running_runtime(register, [SERVICE_NAME]) as runtime,
                grpc.aio.insecure_channel(runtime.address) as channel,
            ):
                tokens, drafted, accepted = await decode(
                    executor_pb2_grpc.ExecutorStub(channel), prompt, len(answer)
                )
        finally:
            await servicer.close()
            await tree_client.close()
    assert tokens == answer
    assert core.proposer.num_tree_drafts > 0
    assert drafted > 0 and accepted >= len(answer) // 2
