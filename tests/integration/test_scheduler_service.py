"""The scheduler service as a process, between a cache process and an executor process.

A gateway-like client multiplexes requests on one Scheduler.Stream; the
expected tokens come from Hugging Face transformers' greedy decoding of the
same tiny model folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import torch

from radixmesh.errors import InvalidArgument
from radixmesh.sampling import SamplingParams
from radixmesh.v1 import cache_pb2, cache_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc
from radixmesh.v1 import inference_pb2 as ipb
from services.common.config import free_port
from services.common.health import wait_for_serving
from services.scheduler.client import SchedulerClient, _Outbox
from tests.fixtures.tiny_llama import VOCAB, write_tiny_llama

REPO = Path(__file__).resolve().parents[2]
EXECUTOR_ID = "exec-sched-test"


def _greedy(model, prompt: list[int], n: int) -> list[int]:
    """Argmax decoding with EOS kept (the requests set ignore_eos)."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


def _spawn(module: str, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", module, *args], cwd=REPO, env=env)


@pytest.fixture(scope="module")
def mesh(tmp_path_factory):
    """(scheduler address, cache address, HF model, scheduler metrics port), processes running."""
    path = tmp_path_factory.mktemp("sched-mesh-model")
    model = write_tiny_llama(path)
    cache, executor, scheduler, metrics = free_port(), free_port(), free_port(), free_port()
    procs = [_spawn("services.cache.main", "--port", str(cache))]
    procs.append(
        _spawn(
            "services.executor.main",
            *("--model", str(path), "--port", str(executor), "--executor-id", EXECUTOR_ID),
            *("--cache-address", f"127.0.0.1:{cache}", "--device", "cpu", "--no-grammar"),
            *("--page-size", "4", "--num-pages", "256", "--max-num-seqs", "32"),
        )
    )
    procs.append(
        _spawn(
            "services.scheduler.main",
            *("--port", str(scheduler), "--cache-address", f"127.0.0.1:{cache}"),
            *("--executor", f"127.0.0.1:{executor}", "--max-num-batched-tokens", "128"),
            *("--metrics-port", str(metrics)),
        )
    )
    try:
        asyncio.run(wait_for_serving(f"127.0.0.1:{scheduler}", timeout=90))
        yield f"127.0.0.1:{scheduler}", f"127.0.0.1:{cache}", model, metrics
    finally:
        for proc in reversed(procs):
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=15)
            if proc.poll() is None:
                proc.kill()
    assert [p.returncode for p in procs] == [0, 0, 0]


class Client:
    """One Scheduler.Stream, as a gateway holds it."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.outbox: asyncio.Queue[scheduler_pb2.StreamRequest | None] = asyncio.Queue()
        self.call = scheduler_pb2_grpc.SchedulerStub(channel).Stream(self._requests())
        self.responses: list[scheduler_pb2.StreamResponse] = []

    async def _requests(self) -> AsyncIterator[scheduler_pb2.StreamRequest]:
        while (message := await self.outbox.get()) is not None:
            yield message

    def submit(self, req_id: str, tokens: list[int], max_tokens: int, **kw) -> None:
        sampling = ipb.SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        submit = scheduler_pb2.SubmitRequest(
            req_id=req_id, token_ids=tokens, sampling=sampling, **kw
        )
        self.outbox.put_nowait(scheduler_pb2.StreamRequest(submit=submit))

    def abort(self, req_id: str) -> None:
        self.outbox.put_nowait(
            scheduler_pb2.StreamRequest(abort=scheduler_pb2.AbortRequest(req_id=req_id))
        )

    async def until_finished(self, *req_ids: str) -> dict[str, list[scheduler_pb2.TokenUpdate]]:
        left, updates = set(req_ids), {}
        async with asyncio.timeout(60):
            while left:
                response = await self.call.read()
                self.responses.append(response)
                for u in response.updates:
                    updates.setdefault(u.req_id, []).append(u)
                    if u.finish_reason or u.error_code:
                        left.discard(u.req_id)
        return updates


def _tokens(updates: list[scheduler_pb2.TokenUpdate]) -> list[int]:
    return [t for u in updates for t in u.token_ids]


async def test_a_stream_of_requests_gets_greedy_tokens_one_message_per_step(mesh):
    address, _, model, _ = mesh
    prompts = {f"r{i}": [10 + i] * (3 + 5 * i) + [40 + i] for i in range(6)}
    async with grpc.aio.insecure_channel(address) as channel:
        client = Client(channel)
        for req_id, prompt in prompts.items():
            client.submit(req_id, prompt, 6)
        updates = await client.until_finished(*prompts)
        client.outbox.put_nowait(None)
        assert await client.call.read() == grpc.aio.EOF  # ends once its requests are done
    for req_id, prompt in prompts.items():
        assert _tokens(updates[req_id]) == _greedy(model, prompt, 6), req_id
        assert updates[req_id][0].num_prompt_tokens == len(prompt)
        assert updates[req_id][-1].finish_reason == "length"
    assert max(len(r.updates) for r in client.responses) >= 4
    step_ids = [r.step_id for r in client.responses]
    assert step_ids == sorted(step_ids)


async def _run_batch(
    address: str,
    prompts: dict[str, list[int]],
    max_tokens: int,
    repeat: tuple[str, list[int]] | None = None,
) -> tuple[dict[str, list[scheduler_pb2.TokenUpdate]], int]:
    """The prompts sent as one SubmitBatch (then `repeat`, a submit reusing a running id);
    every update until each prompt finished, and the StreamResponses read."""
    sampling = ipb.SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    batch = scheduler_pb2.StreamRequest()
    for req_id, prompt in [*prompts.items(), *([repeat] if repeat else [])]:
        batch.submit_batch.submits.add(req_id=req_id, token_ids=prompt, sampling=sampling)
    async with grpc.aio.insecure_channel(address) as channel:
        client = Client(channel)
        client.outbox.put_nowait(batch)
        updates = await client.until_finished(*prompts)
        client.outbox.put_nowait(None)
        assert await client.call.read() == grpc.aio.EOF
    return updates, len(client.responses)


async def test_a_submit_batch_runs_each_submit_as_if_sent_alone(mesh):
    address, _, model, _ = mesh
    prompts = {f"b{i}": [20 + i] * (2 + 3 * i) + [50 + i] for i in range(4)}
    updates, _ = await _run_batch(address, prompts, 5, repeat=("b0", [1, 2]))
    for req_id, prompt in prompts.items():
        assert _tokens(updates[req_id]) == _greedy(model, prompt, 5), req_id
    refused = [u for u in updates["b0"] if u.error_code]
    assert len(refused) == 1 and "already running" in refused[0].error_message


async def test_the_client_sends_submits_issued_together_as_one_batch(mesh, monkeypatch):
    address, _, model, _ = mesh
    prompts = {f"g{i}": [30 + i] * (3 + i) + [60 + i] for i in range(4)}
    sampling = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    sent: list[scheduler_pb2.StreamRequest] = []
    messages = _Outbox.messages  # record what goes on the wire
    monkeypatch.setattr(_Outbox, "messages", lambda outbox: _recorded(messages(outbox), sent))
    async with SchedulerClient(address) as client:

        async def tokens(req_id: str, prompt: list[int]) -> list[int]:
            return [t async for u in client.generate(req_id, prompt, sampling) for t in u.token_ids]

        got = await asyncio.gather(*(tokens(r, p) for r, p in prompts.items()))
    assert got == [_greedy(model, p, 4) for p in prompts.values()]
    submits = [m for m in sent if m.WhichOneof("op") in ("submit", "submit_batch")]
    assert [m.WhichOneof("op") for m in submits] == ["submit_batch"]
    assert [s.req_id for s in submits[0].submit_batch.submits] == list(prompts)


async def _recorded(messages, sent: list):
    async for message in messages:
        sent.append(message)
        yield message


async def test_bad_submits_fail_alone_and_aborts_free_the_lease(mesh):
    address, cache_address, model, metrics_port = mesh
    async with grpc.aio.insecure_channel(address) as channel:
        client = Client(channel)
        client.submit("bad", [1, VOCAB + 5], 2)
        client.submit("late", [3, 4], 2, deadline_unix_ms=1)
        client.submit("long", [5, 6, 7], 400)
        client.submit("ok", [8, 9], 3)
        client.submit("constrained", [8, 9], 3, constraint=ipb.Constraint(regex="[ab]+"))
        updates = await client.until_finished("bad", "late", "ok", "constrained")
        assert updates["bad"][-1].error_code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        assert "vocabulary" in updates["bad"][-1].error_message
        assert updates["late"][-1].error_code == grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
        assert _tokens(updates["ok"]) == _greedy(model, [8, 9], 3)
        # refused by the executor's PrepareConstraint (it runs without a grammar backend)
        assert updates["constrained"][-1].error_code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        assert "no grammar backend" in updates["constrained"][-1].error_message
        client.abort("long")
        rest = await client.until_finished("long")
        assert rest["long"][-1].finish_reason == "abort"
        load = await scheduler_pb2_grpc.SchedulerStub(channel).GetLoad(
            scheduler_pb2.GetLoadRequest()
        )
        client.outbox.put_nowait(None)
    assert [(e.executor_id, e.healthy, e.num_running) for e in load.executors] == [
        (EXECUTOR_ID, True, 0)
    ]
    async with grpc.aio.insecure_channel(cache_address) as channel:
        stats = await cache_pb2_grpc.CacheStub(channel).GetStats(
            cache_pb2.GetStatsRequest(executor_id=EXECUTOR_ID)
        )
    assert stats.pools[0].num_leases == 0
    text = await _scrape(metrics_port)
    finished = (
        'radixmesh_scheduler_finished_requests_total{code="INVALID_ARGUMENT",finish_reason="error"}'
    )
    assert f"{finished} 1.0" in text  # the constraint; a bad prompt is refused at submit
    assert 'radixmesh_scheduler_time_to_first_token_seconds_count{priority="interactive"}' in text


async def test_the_scheduler_counts_the_messages_of_its_streams(mesh):
    address, _, model, metrics_port = mesh
    before = _messages(await _scrape(metrics_port))
    prompts = {f"m{i}": [40 + i, 41, 42 + i] for i in range(3)}
    updates, responses = await _run_batch(address, prompts, 3)
    assert {r: _tokens(u) for r, u in updates.items()} == {
        r: _greedy(model, p, 3) for r, p in prompts.items()
    }
    after = _messages(await _scrape(metrics_port))
    got = {key: after[key] - before.get(key, 0.0) for key in after}
    assert got["gateway", "received"] == 1  # the one SubmitBatch
    assert got["gateway", "sent"] == responses
    assert got["cache", "sent"] == got["cache", "received"] >= 2  # matches, leases, commits
    # a plan of several decode steps may be answered step by step
    assert got["executor", "sent"] >= 1 and got["executor", "received"] >= 1


def _messages(text: str) -> dict[tuple[str, str], float]:
    pattern = r'radixmesh_scheduler_stream_messages_total\{direction="(\w+)",peer="(\w+)"\} (\S+)'
    return {(peer, way): float(n) for way, peer, n in re.findall(pattern, text)}


async def _scrape(port: int) -> str:
    import aiohttp

    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/metrics") as response,
    ):
        return await response.text()


async def test_the_client_streams_updates_and_aborts_when_left_early(mesh):
    address, _, model, _ = mesh
    sampling = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    async with SchedulerClient(address) as client:
        updates = [u async for u in client.generate("c1", [20, 21, 22], sampling)]
        tokens = [t for u in updates for t in u.token_ids]
        assert tokens == _greedy(model, [20, 21, 22], 5)
        assert (updates[0].num_prompt_tokens, updates[-1].finish_reason) == (3, "length")
        endless = SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True)
        running = client.generate("c2", [23, 24], endless)
        async for update in running:
            assert update.token_ids
            break
        # leaving early aborts it upstream; closed here, not whenever the event loop
        # finalizes the abandoned generator (a turn later: after the next submit)
        await running.aclose()
        # a later request on the same stream finishes only after the loop applied the abort
        after = [u async for u in client.generate("c3", [25], sampling)]
        assert after[-1].finish_reason == "length"
        load = await client.get_load()
        assert load.executors[0].num_running == 0
        failed = [u async for u in client.generate("c4", [1, VOCAB], sampling)]
        assert isinstance(failed[-1].error, InvalidArgument)
