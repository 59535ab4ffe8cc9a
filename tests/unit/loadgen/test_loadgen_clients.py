"""Both clients: against the fake OpenAI server, and the real gateway over a FakeScheduler."""

from __future__ import annotations

import grpc
import pytest

from gateway.core.models import ModelRegistry
from gateway.core.tokenizer import Tokenizer
from gateway.openai_http import OpenAIHttpServer, start_http_server
from gateway.server import InferenceServicer
from mesh.loadgen.client import ChatRequest, GrpcClient, OpenAIClient
from mesh.loadgen.workloads import TICKET_SCHEMA
from radixmesh.v1 import inference_pb2_grpc
from services.common.config import free_port
from services.scheduler.client import SchedulerClient
from tests.fixtures.gateway_fakes import FAKE_REPLY, make_model_folder, running_fake_scheduler
from tests.fixtures.runtime import running_runtime

HELLO = ({"role": "user", "content": "the quick brown fox"},)


async def test_openai_client_times_chunks_and_reads_usage(make_fake):
    _, url = await make_fake(reply_words=5, token_delay_s=0.01)
    client = OpenAIClient(url, "fake-model")
    try:
        await client.send(ChatRequest(HELLO, max_tokens=5))
        result = await client.send(ChatRequest(HELLO, max_tokens=5))
    finally:
        await client.close()
    assert result.ok and result.status == "ok"
    assert result.text == "w0 w1 w2 w3 w4 "
    assert len(result.chunk_times_s) == 5
    assert 0.01 <= result.ttft_s == result.chunk_times_s[0] <= result.e2e_s
    assert result.chunk_times_s == sorted(result.chunk_times_s)
    assert result.e2e_s >= 0.05
    assert (result.prompt_tokens, result.completion_tokens, result.cached_tokens) == (4, 5, 4)
    assert result.finish_reason == "length"


async def test_openai_client_sends_the_extensions_it_is_given(make_fake):
    fake, url = await make_fake()
    client = OpenAIClient(url, "fake-model")
    request = ChatRequest(
        HELLO, 7, json_schema=TICKET_SCHEMA, priority="batch", session_id="s-1", temperature=0.0
    )
    try:
        await client.send(request)
        await client.send(ChatRequest(HELLO, 3, ignore_eos=True))
    finally:
        await client.close()
    constrained, plain = fake.bodies
    assert constrained["response_format"]["json_schema"]["schema"] == TICKET_SCHEMA
    assert (constrained["priority"], constrained["session_id"]) == ("batch", "s-1")
    assert constrained["temperature"] == 0.0 and constrained["stream"] is True
    assert plain["ignore_eos"] is True
    assert not {"priority", "session_id", "response_format", "temperature"} & set(plain)


async def test_openai_client_reports_an_http_error_as_a_failed_result(make_fake):
    _fake, url = await make_fake(fail_every=1)
    client = OpenAIClient(url, "fake-model")
    try:
        result = await client.send(ChatRequest(HELLO, 3))
    finally:
        await client.close()
    assert not result.ok and result.status == "http_429"
    assert "queue full" in result.error and result.ttft_s is None


async def test_openai_client_reports_a_refused_connection():
    client = OpenAIClient(f"http://127.0.0.1:{free_port()}", "m")
    try:
        result = await client.send(ChatRequest(HELLO, 3))
    finally:
        await client.close()
    assert (result.ok, result.status) == (False, "connection_error")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return Tokenizer.from_folder(make_model_folder(tmp_path_factory.mktemp("m"), max_model_len=512))


@pytest.fixture
async def gateway(tokenizer):
    """(HTTP base URL, gRPC host:port, FakeScheduler): the real gateway over a fake scheduler."""
    async with running_fake_scheduler(tokenizer) as (scheduler, scheduler_address):
        channel = grpc.aio.insecure_channel(scheduler_address)
        upstream = SchedulerClient(channel)
        models = ModelRegistry({"tiny": tokenizer})
        servicer = InferenceServicer(models, upstream)
        port = free_port()
        http = await start_http_server(
            OpenAIHttpServer(models, upstream).build_app(), "127.0.0.1", port
        )
        async with running_runtime(
            lambda s: inference_pb2_grpc.add_InferenceServicer_to_server(servicer, s),
            ["radixmesh.v1.Inference"],
        ) as runtime:
            yield f"http://127.0.0.1:{port}", runtime.address, scheduler
        await http.cleanup()
        await upstream.close()
        await channel.close()


@pytest.mark.parametrize("api", ["openai", "grpc"])
async def test_both_clients_read_the_real_gateway_the_same_way(gateway, api):
    http_url, grpc_address, scheduler = gateway
    client = OpenAIClient(http_url, "tiny") if api == "openai" else GrpcClient(grpc_address, "tiny")
    request = ChatRequest(HELLO, max_tokens=32, priority="batch", session_id="")
    try:
        result = await client.send(request)
    finally:
        await client.close()
    assert result.ok, result.error
    assert result.text == FAKE_REPLY
    assert result.completion_tokens == len(scheduler.reply_ids)
    assert (result.prompt_tokens, result.cached_tokens) == (5, 2)  # what FakeScheduler reports
    assert scheduler.submits[0].priority == 2  # PRIORITY_BATCH reached the scheduler
    assert result.ttft_s is not None and result.ttft_s <= result.e2e_s
    assert result.finish_reason == "length"


async def test_grpc_client_reports_the_status_code(gateway):
    _http, grpc_address, _scheduler = gateway
    client = GrpcClient(grpc_address, "no-such-model")
    try:
        result = await client.send(ChatRequest(HELLO, 4))
    finally:
        await client.close()
    assert (result.ok, result.status) == (False, "NOT_FOUND")
