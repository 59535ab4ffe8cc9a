"""The gateway's drain: requests in flight finish within the grace, the rest get an error event."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest

from gateway.core.models import ModelRegistry
from gateway.drain import drain
from gateway.openai_http import OpenAIHttpServer, start_http_server
from radixmesh.errors import Unavailable
from radixmesh.updates import RequestUpdate
from services.common.config import free_port


class HeldUpstream:
    """One token per request, then held until `release` (finish) or `close` (an error)."""

    def __init__(self) -> None:
        self.released = asyncio.Event()
        self.closed = asyncio.Event()
        self.started = asyncio.Event()
        self.reason = ""

    async def generate(self, req_id, token_ids, sampling, **options):
        yield RequestUpdate(req_id, token_ids=[5], num_prompt_tokens=len(token_ids))
        self.started.set()
        done = asyncio.ensure_future(self.released.wait())
        closed = asyncio.ensure_future(self.closed.wait())
        await asyncio.wait([done, closed], return_when=asyncio.FIRST_COMPLETED)
        done.cancel()
        closed.cancel()
        if self.closed.is_set():
            yield RequestUpdate(req_id, error=Unavailable(self.reason))
        else:
            yield RequestUpdate(req_id, token_ids=[6], finish_reason="length")

    async def abort(self, req_id):
        pass

    async def close(self, reason: str = "the client is closing") -> None:
        """SchedulerClient.close: what still runs ends with Unavailable(reason)."""
        self.reason = reason
        self.closed.set()


class Runtime:
    """What drain needs of a ServiceRuntime: the shutdown request and its gRPC calls."""

    def __init__(self) -> None:
        self.shutdown = asyncio.Event()
        self.num_active_calls = 0

    async def wait_shutdown_requested(self) -> None:
        await self.shutdown.wait()

    async def wait_calls_done(self) -> None:
        return None


@pytest.fixture
async def edge(tokenizer):
    upstream = HeldUpstream()
    http = OpenAIHttpServer(ModelRegistry({"tiny": tokenizer}), upstream)
    port = free_port()
    runner = await start_http_server(http.build_app(), "127.0.0.1", port)
    yield http, upstream, f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def stream_events(base: str) -> list[str]:
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 4, "stream": True}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{base}/v1/completions", json=body) as response,
    ):
        assert response.status == 200
        return [
            line.decode().strip()[5:].strip()
            async for line in response.content
            if line.startswith(b"data:")
        ]


async def test_a_stream_still_running_at_the_grace_deadline_ends_with_an_error_event(edge):
    http, upstream, base = edge
    runtime = Runtime()
    client = asyncio.create_task(stream_events(base))
    await asyncio.wait_for(upstream.started.wait(), 10)
    runtime.shutdown.set()
    start = time.monotonic()
    await asyncio.wait_for(drain(runtime, http, 1.5, upstream.close), 10)
    assert 0.4 <= time.monotonic() - start < 1.5  # the grace less its one-second margin
    events = await asyncio.wait_for(client, 10)
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert (error["code"], error["message"]) == ("unavailable", "the gateway is shutting down")
    assert http.num_in_flight == 0


async def test_a_drain_with_nothing_left_ends_at_once(edge):
    http, upstream, base = edge
    runtime = Runtime()
    client = asyncio.create_task(stream_events(base))
    await asyncio.wait_for(upstream.started.wait(), 10)
    runtime.shutdown.set()
    draining = asyncio.create_task(drain(runtime, http, 30.0, upstream.close))
    upstream.released.set()  # the request finishes well within the grace
    start = time.monotonic()
    await asyncio.wait_for(draining, 10)
    assert time.monotonic() - start < 5.0
    events = await client
    assert events[-1] == "[DONE]" and all("error" not in e for e in events[:-1])
