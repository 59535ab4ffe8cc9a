"""bench/spec_serve.py's BatchClient: a batch dealt to client processes comes back in the
prompts' order, with each stream's tokens, TPOT and speculation counts."""

from __future__ import annotations

import contextlib
import json
import time

import pytest
from aiohttp import web

from bench.spec_serve import BatchClient
from services.common.config import free_port
from tests.fixtures.loop_thread import on_loop_thread


async def _completions(request: web.Request) -> web.StreamResponse:
    """Streams each prompt id back as a text chunk of its own, then usage."""
    body = await request.json()
    if body["prompt"] == [0]:
        return web.json_response({"error": {"message": "prompt refused"}}, status=400)
    response = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await response.prepare(request)
    for token in body["prompt"]:
        chunk = {"choices": [{"index": 0, "text": f"{token} "}]}
        await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
    usage = {
        "completion_tokens": len(body["prompt"]),
        "speculation": {"num_drafts": 1, "num_draft_tokens": 4, "num_accepted_tokens": len(body["prompt"]) - 1},
    }
    await response.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n".encode())
    return response


@contextlib.asynccontextmanager
async def _server():
    app = web.Application()
    app.router.add_post("/v1/completions", _completions)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@pytest.fixture(scope="module")
def client():
    with on_loop_thread(_server) as url:
        batch_client = BatchClient(url, 3)
        try:
            yield batch_client
        finally:
            batch_client.close()


def test_a_batch_dealt_to_processes_comes_back_in_the_prompts_order(client):
    prompts = [[i, 100 + i, 200 + i][: 1 + i % 3] for i in range(1, 8)]
    started = time.perf_counter()
    texts, seconds, tpots, spec = client.run_batch(prompts, output_len=3)
    wall = time.perf_counter() - started
    assert texts == ["".join(f"{t} " for t in p) for p in prompts]
    assert 0 < seconds <= wall
    assert len(tpots) == sum(len(p) > 1 for p in prompts)  # one token has no inter-token time
    assert spec == {
        "num_drafts": len(prompts),
        "num_draft_tokens": 4 * len(prompts),
        "num_accepted_tokens": sum(len(p) - 1 for p in prompts),
        "num_tokens": sum(len(p) for p in prompts),
    }


def test_a_batch_smaller_than_the_processes_and_a_refused_request(client):
    texts, _, _, spec = client.run_batch([[5, 6]], output_len=2)
    assert texts == ["5 6 "] and spec["num_tokens"] == 2
    with pytest.raises(RuntimeError, match=r"HTTP 400.*prompt refused"):
        client.run_batch([[1], [0]], output_len=1)
