"""The mesh across processes: a cache, a scheduler and two executors on a tiny model.

Concurrent greedy requests get the tokens each gets alone in the in-process
engine; a request sharing a long prefix goes to the executor that cached it;
an executor killed mid-stream hands its unstarted requests to the other one,
ends its streaming ones with UNAVAILABLE and leaves no lease behind.

The tests that leave the mesh whole share one mesh per module and each starts by
checking that it is whole and idle; the test that kills an executor gets a mesh of
its own, so the tests pass in any order.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from mesh.engine import Engine, EngineConfig
from radixmesh.errors import Unavailable
from radixmesh.sampling import SamplingParams
from radixmesh.updates import RequestUpdate
from services.cache.client import CacheClient
from services.common.config import free_port
from services.common.health import wait_for_serving
from services.scheduler.client import SchedulerClient
from tests.fixtures.tiny_llama import VOCAB, write_tiny_llama

REPO = Path(__file__).resolve().parents[2]
PAGE_SIZE = 4
NUM_PAGES = 256
MAX_NUM_SEQS = 3
EXECUTORS = ("exec-a", "exec-b")


def _spawn(module: str, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", module, *args], cwd=REPO, env=env)


@dataclass(slots=True)
class Mesh:
    scheduler: str
    cache: str
    model: Path
    executors: dict[str, subprocess.Popen]
    killed: set[str] = field(default_factory=set)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("mesh-model")
    write_tiny_llama(folder)
    return folder


@contextmanager
def running_mesh(model: Path) -> Iterator[Mesh]:
    """Cache, two executors and a scheduler as processes; at the end each exits 0, or
    -SIGKILL if the test killed it."""
    cache, scheduler = free_port(), free_port()
    procs = {"cache": _spawn("services.cache.main", "--port", str(cache))}
    executor_ports = []
    for executor_id in EXECUTORS:
        port = free_port()
        executor_ports.append(port)
        procs[executor_id] = _spawn(
            "services.executor.main",
            *("--model", str(model), "--port", str(port), "--executor-id", executor_id),
            *("--cache-address", f"127.0.0.1:{cache}", "--device", "cpu", "--no-grammar"),
            *("--page-size", str(PAGE_SIZE), "--num-pages", str(NUM_PAGES)),
            *("--max-num-seqs", str(MAX_NUM_SEQS)),
        )
    procs["scheduler"] = _spawn(
        "services.scheduler.main",
        *("--port", str(scheduler), "--cache-address", f"127.0.0.1:{cache}"),
        *(arg for port in executor_ports for arg in ("--executor", f"127.0.0.1:{port}")),
        *("--max-num-batched-tokens", "256"),
    )
    state = Mesh(
        f"127.0.0.1:{scheduler}",
        f"127.0.0.1:{cache}",
        model,
        {e: procs[e] for e in EXECUTORS},
    )
    try:
        asyncio.run(wait_for_serving(state.scheduler, timeout=90))
        yield state
    finally:
        for proc in reversed(procs.values()):
            if proc.poll() is None:
                proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=15)
            if proc.poll() is None:
                proc.kill()
    expected = {name: -signal.SIGKILL if name in state.killed else 0 for name in procs}
    assert {name: p.returncode for name, p in procs.items()} == expected


@pytest.fixture(scope="module")
def shared_mesh(model) -> Iterator[Mesh]:
    with running_mesh(model) as state:
        yield state


async def check_whole_and_idle(state: Mesh) -> None:
    """Both executors healthy, nothing running or waiting, no lease held."""
    async with SchedulerClient(state.scheduler) as client, CacheClient(state.cache) as cache:
        load = await client.get_load()
        pools = await cache.stats()
    assert [(e.executor_id, e.healthy, e.num_running, e.num_waiting) for e in load.executors] == [
        (executor_id, True, 0, 0) for executor_id in EXECUTORS
    ]
    assert {p.executor_id: p.num_leases for p in pools} == dict.fromkeys(EXECUTORS, 0)


@pytest.fixture
async def mesh(shared_mesh) -> Mesh:
    """The module's mesh, checked whole and idle before the test."""
    await check_whole_and_idle(shared_mesh)
    return shared_mesh


@pytest.fixture
def mesh_to_break(model) -> Iterator[Mesh]:
    """A mesh of the test's own, for a test that kills part of it."""
    with running_mesh(model) as state:
        yield state


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


async def alone(model: Path, cases: list[tuple[list[int], int]]) -> list[list[int]]:
    """Each request on its own, one after the other, in the in-process engine."""
    config = EngineConfig.for_model(
        str(model), device="cpu", page_size=PAGE_SIZE, num_pages=NUM_PAGES, max_num_seqs=4
    )
    async with Engine(config) as engine:
        return [(await engine.complete(p, greedy(n))).token_ids for p, n in cases]


def draw(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, VOCAB) for _ in range(n)]


async def owner(cache: CacheClient, tokens: list[int]) -> str:
    """The one executor holding `tokens` in its tree: every whole page of them (Match also
    counts the tokens of a kept partial page past them)."""
    matches = await cache.match(tokens)
    holders = [e for e, n in matches.items() if n >= len(tokens) // PAGE_SIZE * PAGE_SIZE]
    assert len(holders) == 1, matches
    return holders[0]


@dataclass(slots=True)
class Run:
    """One request's updates as they arrive."""

    updates: list[RequestUpdate] = field(default_factory=list)

    @property
    def token_ids(self) -> list[int]:
        return [t for u in self.updates for t in u.token_ids]

    @property
    def last(self) -> RequestUpdate:
        return self.updates[-1]


async def consume(
    client: SchedulerClient, req_id: str, prompt: list[int], max_tokens: int, run: Run, news
) -> None:
    async for update in client.generate(req_id, prompt, greedy(max_tokens)):
        run.updates.append(update)
        news.set()


async def until_full_and_streaming(
    client: SchedulerClient, runs: list[Run], news: asyncio.Event, victim: str
) -> None:
    """Wait, on stream messages, until both executors run a full batch of requests that
    have all streamed tokens, and `victim` has requests waiting."""
    while True:
        news.clear()
        load = {e.executor_id: e for e in (await client.get_load()).executors}
        num_streaming = sum(1 for r in runs if r.token_ids and not r.last.finished)
        num_running = sum(e.num_running for e in load.values())
        if load[victim].num_waiting and num_running == num_streaming == 2 * MAX_NUM_SEQS:
            return
        await news.wait()


async def test_concurrent_requests_over_two_executors_equal_each_alone(mesh):
    rng = random.Random(1)
    shared = draw(rng, 20)
    cases = [
        ((shared if i % 4 == 0 else []) + draw(rng, rng.randint(1, 40)), rng.randint(4, 16))
        for i in range(16)
    ]
    expected = await alone(mesh.model, cases)
    async with SchedulerClient(mesh.scheduler) as client:
        runs = [Run() for _ in cases]
        news = asyncio.Event()
        async with asyncio.timeout(30):
            await asyncio.gather(
                *(
                    consume(client, f"mix-{i}", p, n, runs[i], news)
                    for i, (p, n) in enumerate(cases)
                )
            )
    assert [r.token_ids for r in runs] == expected
    assert [r.last.finish_reason for r in runs] == ["length"] * len(cases)
    async with CacheClient(mesh.cache) as cache:
        # each finished sequence was committed on the executor that ran it
        ran_on = [
            await owner(cache, prompt + run.token_ids[:-1])
            for (prompt, _), run in zip(cases, runs, strict=True)
            if len(prompt) + len(run.token_ids) - 1 >= PAGE_SIZE
        ]
    assert set(ran_on) == set(EXECUTORS)


async def test_a_shared_long_prefix_goes_to_the_executor_that_cached_it(mesh):
    rng = random.Random(2)
    prefixes = [draw(rng, 64) for _ in range(6)]
    async with SchedulerClient(mesh.scheduler) as client, CacheClient(mesh.cache) as cache:
        news = asyncio.Event()
        # seeded together, so load spreads them over both executors
        async with asyncio.timeout(20):
            await asyncio.gather(
                *(
                    consume(client, f"seed-{i}", [*p, 7], 2, Run(), news)
                    for i, p in enumerate(prefixes)
                )
            )
        owners = [await owner(cache, p) for p in prefixes]
        assert set(owners) == set(EXECUTORS), owners
        for round_ in range(3):
            for i, prefix in enumerate(prefixes):
                prompt = prefix + draw(rng, 3)
                run = Run()
                await consume(client, f"follow-{round_}-{i}", prompt, 2, run, news)
                # only the owner holds the prefix, so 64 cached tokens means it ran there
                assert run.updates[0].num_cached_tokens == len(prefix), (round_, i, owners[i])
                assert run.last.finish_reason == "length"
                assert await owner(cache, prompt + run.token_ids[:-1]) == owners[i]


async def test_killing_an_executor_mid_stream(mesh_to_break):
    mesh = mesh_to_break
    await check_whole_and_idle(mesh)
    victim, survivor = EXECUTORS[1], EXECUTORS[0]
    rng = random.Random(3)
    # one prompt length, so routing by load splits them evenly: each executor gets a queue
    cases = [(draw(rng, 16), 100) for _ in range(12)]
    expected = await alone(mesh.model, cases)
    runs = [Run() for _ in cases]
    news = asyncio.Event()
    async with SchedulerClient(mesh.scheduler) as client, CacheClient(mesh.cache) as cache:
        tasks = [
            asyncio.create_task(consume(client, f"kill-{i}", p, n, runs[i], news))
            for i, (p, n) in enumerate(cases)
        ]
        async with asyncio.timeout(20):
            await until_full_and_streaming(client, runs, news, victim)
        streamed = [len(r.token_ids) for r in runs]
        mesh.executors[victim].send_signal(signal.SIGKILL)
        mesh.killed.add(victim)
        await asyncio.to_thread(mesh.executors[victim].wait, 10)
        async with asyncio.timeout(40):
            await asyncio.gather(*tasks)
        after = await client.get_load()
        pools = {s.executor_id: s for s in await cache.stats()}
        requeued_on = [
            await owner(cache, p + r.token_ids[:-1])
            for (p, _), r, n in zip(cases, runs, streamed, strict=True)
            if n == 0
        ]
    unavailable = [i for i, r in enumerate(runs) if r.last.error is not None]
    assert len(unavailable) == MAX_NUM_SEQS  # the victim's running batch
    for i in unavailable:
        assert streamed[i] > 0
        assert isinstance(runs[i].last.error, Unavailable)
        assert f"executor {victim} failed" in str(runs[i].last.error)
        assert runs[i].token_ids == expected[i][: len(runs[i].token_ids)]
    for i, run in enumerate(runs):
        if i not in unavailable:
            assert (run.token_ids, run.last.finish_reason) == (expected[i], "length"), i
    # the unstarted requests, the victim's queue among them, all finished on the survivor
    assert len(requeued_on) == len(cases) - 2 * MAX_NUM_SEQS
    assert set(requeued_on) == {survivor}
    assert [(e.executor_id, e.healthy, e.num_running, e.num_waiting) for e in after.executors] == [
        (survivor, True, 0, 0),
        (victim, False, 0, 0),
    ]
    # the scheduler released the dead executor's leases and unregistered its pool (its KV
    # died with it: no prefix of it may be matched again); the survivor's pool is idle again
    assert victim not in pools
    idle = pools[survivor]
    assert (idle.num_leases, idle.num_leased_pages, idle.num_locked_pages) == (0, 0, 0)
    assert idle.num_free_pages + idle.num_cached_pages == idle.num_pages
