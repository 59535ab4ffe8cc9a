"""Two cache shards as processes, one executor registered with each, one scheduler over
both (`--cache-address A,B`): requests run on both executors, each commit lands in the
shard of the executor that ran it, a repeated long prefix is routed to the executor whose
shard holds it, and no lease is left behind."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from services.cache.client import CacheClient
from services.common.config import free_port
from services.common.health import wait_for_serving
from services.scheduler.client import SchedulerClient
from tests.fixtures.tiny_llama import VOCAB, write_tiny_llama
from tests.integration.test_mesh_routing import PAGE_SIZE, _spawn, greedy

EXECUTORS = ("exec-a", "exec-b")


@contextmanager
def sharded_mesh(model: Path) -> Iterator[tuple[str, list[str]]]:
    """(scheduler address, the shards' addresses); every process exits 0 at the end."""
    shards = [free_port(), free_port()]
    procs = [_spawn("services.cache.main", "--port", str(p)) for p in shards]
    executor_ports = []
    for executor_id, shard in zip(EXECUTORS, shards, strict=True):
        port = free_port()
        executor_ports.append(port)
        procs.append(_spawn(
            "services.executor.main",
            *("--model", str(model), "--port", str(port), "--executor-id", executor_id),
            *("--cache-address", f"127.0.0.1:{shard}", "--device", "cpu", "--no-grammar"),
            *("--page-size", str(PAGE_SIZE), "--num-pages", "128", "--max-num-seqs", "4"),
        ))  # fmt: skip
    scheduler = free_port()
    procs.append(_spawn(
        "services.scheduler.main",
        *("--port", str(scheduler), "--cache-address", ",".join(f"127.0.0.1:{p}" for p in shards)),
        *(arg for port in executor_ports for arg in ("--executor", f"127.0.0.1:{port}")),
    ))  # fmt: skip
    try:
        asyncio.run(wait_for_serving(f"127.0.0.1:{scheduler}", timeout=120))
        yield f"127.0.0.1:{scheduler}", [f"127.0.0.1:{p}" for p in shards]
    finally:
        for proc in reversed(procs):
            proc.terminate()
            proc.wait(timeout=30)
    assert [p.returncode for p in procs] == [0] * len(procs)


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[str]]]:
    folder = tmp_path_factory.mktemp("shards-model")
    write_tiny_llama(folder)
    with sharded_mesh(folder) as state:
        yield state


async def test_requests_commit_to_their_executors_shard_and_a_prefix_finds_its_shard(mesh):
    scheduler, shards = mesh
    rng = random.Random(3)
    prompts = [[rng.randrange(3, VOCAB) for _ in range(24)] for _ in range(8)]
    async with SchedulerClient(scheduler) as client:
        async def run(i: int, prompt: list[int]) -> list[int]:
            updates = [u async for u in client.generate(f"s-{i}", prompt, greedy(4))]
            return [t for u in updates for t in u.token_ids]

        outputs = await asyncio.gather(*(run(i, p) for i, p in enumerate(prompts)))
        assert all(len(o) == 4 for o in outputs)
        caches = [CacheClient(a) for a in shards]
        try:
            pools = [{p.executor_id: p for p in await c.stats()} for c in caches]
            assert [set(p) for p in pools] == [{"exec-a"}, {"exec-b"}]
            assert all(p[e].num_cached_pages > 0 for p, e in zip(pools, EXECUTORS, strict=True))
            assert all(p[e].num_leases == 0 for p, e in zip(pools, EXECUTORS, strict=True))
            # the prompt a shard holds longest goes back to that shard's executor
            holder = {}
            for prompt in prompts:
                found = [await c.match(prompt) for c in caches]
                best = max((n, e) for f in found for e, n in f.items())
                holder[tuple(prompt)] = best[1]
            prompt = prompts[0]
            before = {e: p[e].num_cached_pages for p, e in zip(pools, EXECUTORS, strict=True)}
            longer = [*prompt, *(rng.randrange(3, VOCAB) for _ in range(12))]
            updates = [u async for u in client.generate("again", longer, greedy(2))]
            again = [t for u in updates for t in u.token_ids]
            assert len(again) == 2
            after = [{p.executor_id: p for p in await c.stats()} for c in caches]
            grown = [e for p, e in zip(after, EXECUTORS, strict=True) if p[e].num_cached_pages > before[e]]
            assert grown == [holder[tuple(prompt)]]  # routed to, and committed on, the holder
            assert all(p[e].num_leases == 0 for p, e in zip(after, EXECUTORS, strict=True))
        finally:
            for c in caches:
                await c.close()
