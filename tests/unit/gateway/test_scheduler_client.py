"""`SchedulerClient`, the one client of `Scheduler.Stream`, against a fake scheduler on loopback."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from radixmesh.errors import InvalidArgument, ResourceExhausted, Unavailable
from radixmesh.sampling import Priority, SamplingParams
from radixmesh.v1 import scheduler_pb2_grpc
from services.scheduler.client import SHUTTING_DOWN, SchedulerClient
from tests.fixtures.runtime import running_runtime


@pytest.fixture
async def client(fake_scheduler):
    scheduler, address = fake_scheduler
    async with SchedulerClient(address) as client:
        yield client, scheduler


async def _all(updates):
    return [u async for u in updates]


async def test_a_request_streams_to_its_finish(client, tokenizer):
    client, scheduler = client
    prompt = tokenizer.encode_prompt("hello")
    updates = await _all(
        client.generate("r1", prompt, SamplingParams(max_tokens=9), priority=Priority.BATCH)
    )
    assert [t for u in updates for t in u.token_ids] == scheduler.reply_ids
    assert updates[-1].finish_reason == "length" and updates[-1].finished
    assert all(u.req_id == "r1" for u in updates)
    assert scheduler.submits[0].priority == Priority.BATCH == 2


async def test_leaving_early_aborts_once(client, tokenizer):
    client, scheduler = client
    updates = client.generate("early", tokenizer.encode_prompt("hello"))
    first = await anext(updates)
    assert first.token_ids and not first.finished
    await updates.aclose()
    assert await scheduler.aborts.get() == "early"
    await client.abort("early")  # over already: nothing is sent
    await _all(client.generate("after", tokenizer.encode_prompt("hello")))
    assert scheduler.aborts.empty()  # a second abort would have arrived before "after"


async def test_abort_of_a_running_request_reaches_the_scheduler(client, tokenizer):
    client, scheduler = client
    updates = client.generate("running", tokenizer.encode_prompt("hello"))
    await anext(updates)
    await client.abort("running")
    assert await scheduler.aborts.get() == "running"
    await updates.aclose()


async def test_an_error_update_is_the_core_exception(client, tokenizer):
    client, _ = client
    (update,) = await _all(client.generate("f", tokenizer.encode_prompt("fail")))
    assert isinstance(update.error, ResourceExhausted) and str(update.error) == "queue full"


async def test_a_req_id_runs_once_per_client(client, tokenizer):
    client, _ = client
    updates = client.generate("dup", tokenizer.encode_prompt("hello"))
    await anext(updates)
    with pytest.raises(InvalidArgument, match="req_id"):
        await anext(client.generate("dup", tokenizer.encode_prompt("hello")))
    await updates.aclose()


async def test_a_lost_stream_ends_its_requests_and_the_next_opens_another(client, tokenizer):
    client, scheduler = client
    (update,) = await _all(client.generate("c", tokenizer.encode_prompt("crash")))
    assert isinstance(update.error, Unavailable) and "UNAVAILABLE" in str(update.error)
    updates = await _all(client.generate("next", tokenizer.encode_prompt("hello")))
    assert updates[-1].finish_reason == "length"
    assert scheduler.num_streams == 2


async def test_a_given_channel_stays_open_after_close(fake_scheduler):
    _, address = fake_scheduler
    channel = grpc.aio.insecure_channel(address)
    try:
        first = SchedulerClient(channel)
        assert await first.executors_per_model() == {"tiny": 1}
        await first.close()
        assert await SchedulerClient(channel).executors_per_model() == {"tiny": 1}
    finally:
        await channel.close()


class SilentScheduler(scheduler_pb2_grpc.SchedulerServicer):
    """Takes submits and never answers them: every request stays running."""

    def __init__(self) -> None:
        self.submitted = asyncio.Event()

    async def Stream(self, request_iterator, context):
        async for message in request_iterator:
            if message.WhichOneof("op") in ("submit", "submit_batch"):
                self.submitted.set()
        return
        yield  # a stream method


@pytest.mark.parametrize(
    ("close_args", "message"),
    [((), "the client is closing"), ((SHUTTING_DOWN,), "the gateway is shutting down")],
    ids=["client-closes", "gateway-shuts-down"],
)
async def test_close_ends_the_running_requests_with_unavailable_and_its_reason(
    close_args, message
):
    scheduler = SilentScheduler()

    def register(server) -> None:
        scheduler_pb2_grpc.add_SchedulerServicer_to_server(scheduler, server)

    async with running_runtime(register, ["radixmesh.v1.Scheduler"]) as runtime:
        client = SchedulerClient(runtime.address)
        updates = client.generate("held", [1, 2, 3])
        first = asyncio.create_task(anext(updates))
        await asyncio.wait_for(scheduler.submitted.wait(), 10)
        await client.close(*close_args)
        update = await asyncio.wait_for(first, 10)
        assert type(update.error) is Unavailable and str(update.error) == message
        assert update.finished
        with pytest.raises(StopAsyncIteration):
            await anext(updates)
