"""The gateway's gRPC API and its scheduler client, against a fake scheduler on loopback."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from gateway.core.auth import Admission
from gateway.core.models import ModelRegistry
from gateway.server import InferenceServicer
from radixmesh import wire
from radixmesh.v1 import inference_pb2, inference_pb2_grpc
from services.scheduler.client import SchedulerClient
from tests.fixtures.runtime import running_runtime

REPLY = "the quick brown fox jumps 😀"  # what conftest's FakeScheduler answers


@pytest.fixture
async def mesh(request, tokenizer, fake_scheduler):
    """(Inference stub, FakeScheduler): the gateway servicer on a runtime, its upstream the fake."""
    scheduler, scheduler_address = fake_scheduler
    admission = getattr(request, "param", Admission())
    channel = grpc.aio.insecure_channel(scheduler_address)
    upstream = SchedulerClient(channel)
    servicer = InferenceServicer(ModelRegistry({"tiny": tokenizer}), upstream, admission)

    def register(server):
        inference_pb2_grpc.add_InferenceServicer_to_server(servicer, server)

    async with running_runtime(register, ["radixmesh.v1.Inference"]) as runtime:
        client_channel = grpc.aio.insecure_channel(runtime.address)
        yield inference_pb2_grpc.InferenceStub(client_channel), scheduler
        await client_channel.close()
    await upstream.close()
    await channel.close()


async def generate(stub, **fields):
    return [r async for r in stub.Generate(inference_pb2.GenerateRequest(**fields), timeout=20)]


async def test_generate_streams_text_and_completes_with_usage(mesh, tokenizer):
    stub, scheduler = mesh
    responses = await generate(stub, prompt="hello", request_id="req-1")
    assert all(r.request_id == "req-1" for r in responses)
    text = "".join(r.chunk.text for r in responses if r.HasField("chunk"))
    assert text == REPLY
    token_ids = [t for r in responses if r.HasField("chunk") for t in r.chunk.token_ids]
    assert token_ids == scheduler.reply_ids
    complete = responses[-1].complete
    assert complete.finish_reason == "length"
    assert (complete.usage.prompt_tokens, complete.usage.cached_tokens) == (5, 2)
    assert complete.usage.completion_tokens == len(scheduler.reply_ids)
    assert list(scheduler.submits[0].token_ids) == tokenizer.encode_prompt("hello")


async def test_choices_messages_and_deadline(mesh):
    stub, scheduler = mesh
    start_ms = time.time() * 1000
    responses = await generate(
        stub,
        messages=inference_pb2.ChatMessages(
            messages=[inference_pb2.ChatMessage(role="user", content="hi")]
        ),
        sampling=inference_pb2.SamplingParams(n=2, seed=7, temperature=0.9),
        priority=inference_pb2.PRIORITY_BATCH,
        regex="[a-z ]+",
    )
    completes = sorted(r.complete.index for r in responses if r.HasField("complete"))
    assert completes == [0, 1]
    for index in (0, 1):
        assert (
            "".join(
                r.chunk.text for r in responses if r.HasField("chunk") and r.chunk.index == index
            )
            == REPLY
        )
    submits = scheduler.submits
    assert [s.sampling.seed for s in submits] == [7, 8]
    sent = [wire.sampling_from_proto(s.sampling) for s in submits]  # unset fields: defaults
    assert all(p.n == 1 for p in sent)
    assert all(s.priority == inference_pb2.PRIORITY_BATCH for s in submits)
    assert all(s.constraint.regex == "[a-z ]+" for s in submits)
    assert submits[0].sampling.temperature == pytest.approx(0.9)
    assert start_ms + 15_000 < submits[0].deadline_unix_ms < start_ms + 21_000


async def test_stop_string_ends_choice_and_aborts_at_the_scheduler(mesh):
    stub, scheduler = mesh
    responses = await generate(
        stub, prompt="hello", sampling=inference_pb2.SamplingParams(stop=["fox"])
    )
    assert "".join(r.chunk.text for r in responses if r.HasField("chunk")) == "the quick brown "
    assert responses[-1].complete.matched_stop == "fox"
    assert await asyncio.wait_for(scheduler.aborts.get(), 5) == scheduler.submits[0].req_id


@pytest.mark.parametrize(
    ("fields", "code", "message"),
    [
        ({"prompt": "fail"}, grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full"),
        (
            {"prompt": "x", "sampling": inference_pb2.SamplingParams(temperature=3)},
            grpc.StatusCode.INVALID_ARGUMENT,
            "temperature",
        ),
        ({"prompt": "x", "model": "big"}, grpc.StatusCode.NOT_FOUND, "model"),
        ({"prompt": "x", "session_id": "s"}, grpc.StatusCode.FAILED_PRECONDITION, "session_id"),
        ({}, grpc.StatusCode.INVALID_ARGUMENT, "input"),
        (
            {"prompt": "x", "sampling": inference_pb2.SamplingParams(max_tokens=100)},
            grpc.StatusCode.INVALID_ARGUMENT,
            "max_tokens",
        ),
        (
            {"prompt": "x", "sampling": inference_pb2.SamplingParams(temperature=2.1)},
            grpc.StatusCode.INVALID_ARGUMENT,
            "temperature must be in [0, 2], got 2.1",  # as written, not as a float32
        ),
        ({"prompt": "x", "json_object": False}, grpc.StatusCode.INVALID_ARGUMENT, "json_object"),
        ({"prompt": "x", "priority": 7}, grpc.StatusCode.INVALID_ARGUMENT, "priority"),
        (
            {"prompt": "x", "sampling": inference_pb2.SamplingParams(max_tokens=2, top_logprobs=3)},
            grpc.StatusCode.INVALID_ARGUMENT,
            "sampling.top_logprobs (3) requires logprobs to be true",
        ),
        (
            {"prompt": "x", "regex": "a" * 3_000_000},
            grpc.StatusCode.INVALID_ARGUMENT,
            "constraint.regex: must be at most 65536 characters, got 3000000",
        ),
        (
            {"prompt": "x", "regex": "[0-9]+", "best_effort": True},
            grpc.StatusCode.INVALID_ARGUMENT,
            "constraint.best_effort: applies to json_schema only, not regex",
        ),
        (
            {"prompt": "x", "best_effort": True},
            grpc.StatusCode.INVALID_ARGUMENT,
            "constraint.best_effort: set without a json_schema",
        ),
    ],
)
async def test_errors_map_to_status_codes(mesh, fields, code, message):
    stub, _ = mesh
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await generate(stub, **fields)
    assert info.value.code() == code
    assert message in info.value.details()


async def test_lost_scheduler_stream_is_unavailable_then_reopened(mesh):
    stub, scheduler = mesh
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await generate(stub, prompt="crash")
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    responses = await generate(stub, prompt="hello")
    assert responses[-1].complete.finish_reason == "length"
    assert scheduler.num_streams == 2


async def test_tokenize_and_list_models(mesh, tokenizer):
    stub, _ = mesh
    reply = await stub.Tokenize(inference_pb2.TokenizeRequest(prompt="hello world"))
    assert list(reply.token_ids) == tokenizer.encode_prompt("hello world")
    assert reply.max_model_len == tokenizer.max_model_len
    models = await stub.ListModels(inference_pb2.ListModelsRequest())
    assert [(m.id, m.max_model_len) for m in models.models] == [("tiny", 64)]
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.Tokenize(inference_pb2.TokenizeRequest())
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize("mesh", [Admission(frozenset({"sk-1"}))], indirect=True)
async def test_api_key_is_required_when_configured(mesh):
    stub, _ = mesh
    request = inference_pb2.TokenizeRequest(prompt="hi")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.Tokenize(request, metadata=[("authorization", "Bearer sk-2")])
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    reply = await stub.Tokenize(request, metadata=[("authorization", "Bearer sk-1")])
    assert len(reply.token_ids) > 0


async def test_generate_over_the_published_headroom_is_refused_before_the_scheduler(
    tokenizer, fake_scheduler
):
    from gateway.core.capacity import CapacityGate
    from radixmesh.capacity import capacity_from_proto
    from radixmesh.v1 import scheduler_pb2

    scheduler, scheduler_address = fake_scheduler
    scheduler.capacity = [
        scheduler_pb2.ModelCapacity(model="tiny", requests_per_s=0.5, headroom={"interactive": 1})
    ]
    channel = grpc.aio.insecure_channel(scheduler_address)
    upstream = SchedulerClient(channel)
    gate = CapacityGate()
    servicer = InferenceServicer(
        ModelRegistry({"tiny": tokenizer}), upstream, Admission(), capacity=gate
    )

    def register(server):
        inference_pb2_grpc.add_InferenceServicer_to_server(servicer, server)

    async with (
        running_runtime(register, ["radixmesh.v1.Inference"]) as runtime,
        grpc.aio.insecure_channel(runtime.address) as client_channel,
    ):
        stub = inference_pb2_grpc.InferenceStub(client_channel)
        load = await upstream.get_load(timeout_s=5)  # what the gateway's watch reads
        gate.update(capacity_from_proto(c) for c in load.capacity)
        await generate(stub, prompt="the quick", sampling={"max_tokens": 2})
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await generate(stub, prompt="the quick", sampling={"max_tokens": 2})
    await upstream.close()
    await channel.close()
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "admits no more interactive requests" in info.value.details()
    assert "retry after 2 s" in info.value.details()  # one over, at 0.5 requests/s
    assert len(scheduler.submits) == 1  # the refused one never reached the scheduler


async def test_the_context_the_executors_serve_is_checked_and_listed(model_folder, fake_scheduler):
    """The scheduler publishes the least context the model's executors serve (24 tokens of
    the model's 64: a small KV pool); once the gateway's capacity watch has read it, a
    max_tokens that fits the model folder's context but not theirs is refused naming
    max_tokens before it reaches the scheduler, and ListModels and Tokenize report 24."""
    from gateway.capacity_watch import watch_capacity
    from gateway.core.capacity import CapacityGate
    from gateway.core.tokenizer import Tokenizer
    from radixmesh.v1 import scheduler_pb2

    scheduler, scheduler_address = fake_scheduler
    scheduler.capacity = [scheduler_pb2.ModelCapacity(model="tiny", max_model_len=24)]
    read = asyncio.Event()

    class Models(ModelRegistry):
        def serve_within(self, limits):
            super().serve_within(limits)
            read.set()

    tokenizer = Tokenizer.from_folder(model_folder)  # its own: the session's is shared
    models = Models({"tiny": tokenizer})
    channel = grpc.aio.insecure_channel(scheduler_address)
    upstream = SchedulerClient(channel)
    servicer = InferenceServicer(models, upstream, Admission())

    def register(server):
        inference_pb2_grpc.add_InferenceServicer_to_server(servicer, server)

    watch = asyncio.create_task(watch_capacity(upstream, CapacityGate(), models=models))
    try:
        async with (
            running_runtime(register, ["radixmesh.v1.Inference"]) as runtime,
            grpc.aio.insecure_channel(runtime.address) as client_channel,
        ):
            stub = inference_pb2_grpc.InferenceStub(client_channel)
            await asyncio.wait_for(read.wait(), 10)
            listed = await stub.ListModels(inference_pb2.ListModelsRequest())
            tokenized = await stub.Tokenize(inference_pb2.TokenizeRequest(prompt="hi"))
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await generate(stub, prompt="the quick", sampling={"max_tokens": 40})
            fits = await generate(stub, prompt="the quick", sampling={"max_tokens": 8})
    finally:
        watch.cancel()
        await upstream.close()
        await channel.close()
    assert [(m.id, m.max_model_len) for m in listed.models] == [("tiny", 24)]
    assert tokenized.max_model_len == 24
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "max_tokens: 40 plus" in info.value.details()
    assert "context of 24 tokens" in info.value.details()
    assert fits[-1].complete.finish_reason == "length"
    assert len(scheduler.submits) == 1  # the refused one never reached the scheduler
