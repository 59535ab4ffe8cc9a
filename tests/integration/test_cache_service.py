"""The cache service as a real process, over a real gRPC channel, through CacheClient."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from radixmesh.cache_types import Lease, PageCopy
from radixmesh.errors import InvalidArgument, NotFound, ResourceExhausted, Unavailable
from services.cache.client import (
    AcquireOp,
    CacheClient,
    CommitOp,
    ExtendOp,
    HeartbeatOp,
    MatchOp,
    ReleaseOp,
)
from services.common.config import free_port
from services.common.health import wait_for_serving
from tests.fixtures.redis import redis_server  # noqa: F401

REPO_ROOT = Path(__file__).resolve().parents[2]
LEASE_TTL_S = 1.0
PS = 4


@dataclass
class CacheProcess:
    process: subprocess.Popen
    address: str
    metrics_port: int

    def stop(self) -> int:
        """SIGTERM, then the exit code (graceful shutdown)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=15)
        finally:
            if self.process.poll() is None:
                self.process.kill()


def start_cache(*extra: str) -> CacheProcess:
    """Starts the service and returns once its health says SERVING (its log goes to a file)."""
    port, metrics_port = free_port(), free_port()
    args = [sys.executable, "-m", "services.cache.main", "--port", str(port)]
    args += ["--metrics-port", str(metrics_port), "--lease-ttl", str(LEASE_TTL_S), *extra]
    log = tempfile.TemporaryFile()  # noqa: SIM115 - the child writes it for its whole life
    process = subprocess.Popen(args, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT)
    service = CacheProcess(process, f"127.0.0.1:{port}", metrics_port)
    try:
        asyncio.run(wait_for_serving(service.address, "radixmesh.v1.Cache", timeout=30))
    except BaseException:
        service.stop()
        log.seek(0)
        raise RuntimeError(f"cache service did not start: {log.read().decode()[-2000:]}") from None
    return service


@pytest.fixture(scope="module")
def cache_service() -> Iterator[CacheProcess]:
    service = start_cache()
    yield service
    assert service.stop() == 0


@pytest.fixture
async def client(cache_service, request) -> CacheClient:
    async with CacheClient(cache_service.address) as cache:
        # Every test gets its own pool: the executor id is the test's name.
        await cache.register_pool(request.node.name, "m", 16, PS)
        yield cache


def seq(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


async def test_unary_acquire_commit_match_and_stats(client, request):
    pool = request.node.name
    lease = await client.acquire(pool, seq(100, 10), 12, "sched")
    assert isinstance(lease, Lease) and len(lease.page_ids) == 3 and lease.num_cached_tokens == 0
    result = await client.commit(lease.lease_id, seq(100, 10))
    assert result.num_cached_tokens == 8 and result.num_locked_pages == 0
    # 8 tokens in place and the 2 of the kept partial page, as the acquire below reuses
    assert (await client.match(seq(100, 10), model="m"))[pool] == 10
    again = await client.acquire(pool, seq(100, 10), 16, "sched")
    assert again.num_cached_tokens == 8 and again.page_ids[:2] == lease.page_ids[:2]
    # the partial third page was kept: its 2 tokens come as a copy into the first new page
    assert again.page_copy == PageCopy(lease.page_ids[2], again.page_ids[2], 2)
    assert again.num_reused_tokens == 10
    stats = (await client.stats(pool))[0]
    assert (stats.num_cached_pages, stats.num_locked_pages, stats.num_leased_pages) == (3, 3, 2)
    assert (stats.num_free_pages, stats.num_leases, stats.num_prefix_queries) == (11, 1, 3)
    await client.release(again.lease_id)
    with pytest.raises(NotFound, match="lease_id"):
        await client.release(again.lease_id)
    with pytest.raises(InvalidArgument, match="num_tokens"):
        await client.acquire(pool, seq(0, 8), 4, "sched")


async def test_a_kept_lease_reports_its_locked_pages_over_the_wire(client, request):
    pool = request.node.name
    lease = await client.acquire(pool, [], 20, "sched")
    result = await client.commit(lease.lease_id, seq(700, 14), keep_locked=True)
    assert (result.num_cached_tokens, result.num_locked_pages) == (12, 4)  # 3 + the partial
    stats = (await client.stats(pool))[0]
    assert stats.num_locked_pages == 4
    (batched,) = await client.batch([MatchOp(seq(700, 14))])
    assert batched[pool] == 14
    await client.release(lease.lease_id)


async def test_batch_answers_every_op_in_order_with_errors_inline(client, request):
    pool = request.node.name
    first = await client.batch(
        [
            AcquireOp(pool, seq(100, 8), 8, "sched"),
            AcquireOp("no-such-pool", seq(100, 8), 8, "sched"),
            MatchOp(seq(100, 8)),
        ]
    )
    lease, missing, matches = first
    assert isinstance(lease, Lease) and len(lease.page_ids) == 2
    assert isinstance(missing, NotFound) and "no-such-pool" in str(missing)
    assert matches[pool] == 0
    second = await client.batch(
        [
            ExtendOp(lease.lease_id, 1),
            HeartbeatOp("sched"),
            CommitOp(lease.lease_id, seq(100, 12)),
            ReleaseOp(lease.lease_id),
            MatchOp(seq(100, 12)),
        ]
    )
    extended, num_leases, committed, released, matches = second
    assert len(extended) == 1 and num_leases == 1
    assert committed.num_cached_tokens == 12
    assert isinstance(released, NotFound)  # the commit ended the lease
    assert matches[pool] == 12
    # The stream stays open for more batches, including concurrent ones.
    results = await asyncio.gather(*(client.batch([MatchOp(seq(100, 12))]) for _ in range(8)))
    assert [r[0][pool] for r in results] == [12] * 8


async def test_ops_of_concurrent_calls_share_messages_and_keep_their_order(client, request):
    """Calls made together go out in one CacheOps message (and their results in one back),
    each op answered as alone, in order: a lease acquired, committed and matched by calls
    made in the same turn of the loop."""
    pool = request.node.name
    before = client.num_messages
    matches = [client.batch([MatchOp(seq(300 + i, 8))]) for i in range(12)]
    acquired = client.batch([AcquireOp(pool, seq(500, 8), 8, "sched")])
    results = await asyncio.gather(*matches, acquired)
    assert client.num_messages == before + 1  # 13 calls, one message
    assert [r[0][pool] for r in results[:12]] == [0] * 12
    (lease,) = results[12]
    assert isinstance(lease, Lease)
    committed, matched = await asyncio.gather(
        client.batch([CommitOp(lease.lease_id, seq(500, 8))]), client.batch([MatchOp(seq(500, 8))])
    )
    assert committed[0].num_cached_tokens == 8  # the commit ran before the match queued after it
    assert matched[0][pool] == 8
    assert client.num_messages == before + 2


async def test_a_message_is_counted_before_its_replies_resume_its_callers(client, request):
    """The writer may resume after the server has answered: a caller that sees its result
    sees its message counted (the scheduler reports these counts)."""
    stream = client._open_stream()
    write, written = stream.write, asyncio.Event()

    async def write_then_lag(message):
        await write(message)
        await written.wait()  # the writer resumes only once the test has looked

    stream.write = write_then_lag
    before = client.num_messages
    (matched,) = await client.batch([MatchOp(seq(900, 8))])
    assert matched[request.node.name] == 0
    assert client.num_messages == before + 1
    written.set()


async def test_full_pool_is_resource_exhausted_and_unchanged(client, request):
    pool = request.node.name
    lease = await client.acquire(pool, [], 12 * PS, "sched")
    before = await client.stats(pool)
    with pytest.raises(ResourceExhausted, match="pages needed"):
        await client.acquire(pool, [], 5 * PS, "sched")
    [refused] = await client.batch([ExtendOp(lease.lease_id, 5)])
    assert isinstance(refused, ResourceExhausted)
    assert await client.stats(pool) == before


async def test_silent_holder_loses_its_leases_and_pages(client, request):
    pool = request.node.name
    ghost = await client.acquire(pool, [], 8 * PS, "ghost")
    alive = await client.acquire(pool, [], 2 * PS, "alive")
    # The service expires on a timer: keep "alive" beating until the ghost's pages are back.
    for _ in range(50):
        assert await client.heartbeat("alive") == 1
        stats = (await client.stats(pool))[0]
        if stats.num_leases == 1:
            break
        await asyncio.sleep(LEASE_TTL_S / 5)
    assert (stats.num_leases, stats.num_leased_pages, stats.num_free_pages) == (1, 2, 14)
    with pytest.raises(NotFound):
        await client.extend(ghost.lease_id, 1)
    await client.release(alive.lease_id)


async def test_metrics_endpoint_serves_pool_gauges(client, request, cache_service):
    pool = request.node.name
    await client.acquire(pool, [], 3 * PS, "sched")
    url = f"http://127.0.0.1:{cache_service.metrics_port}/metrics"
    text = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read().decode())
    assert f'radixmesh_cache_leased_pages{{executor_id="{pool}"}} 3.0' in text
    assert f'radixmesh_cache_free_pages{{executor_id="{pool}"}} 13.0' in text
    for name in (
        "prefix_queries_total",
        "prefix_hit_tokens_total",
        "prefix_query_tokens_total",
        "evicted_pages_total",
        "locked_pages",
        "cached_pages",
        "used_pages",
        "leases",
    ):
        assert f"radixmesh_cache_{name}{{" in text


async def test_result_and_session_store_in_process(client):
    assert await client.get_result("k") is None
    await client.put_result("k", b"\x00payload")
    assert await client.get_result("k") == b"\x00payload"
    await client.put_session("s", [3, 2, 1])
    assert await client.get_session("s") == [3, 2, 1]
    with pytest.raises(InvalidArgument, match="key"):
        await client.put_result("", b"x")


async def test_redis_backed_service_shares_store_and_stops_gracefully(redis_server):  # noqa: F811
    services = [
        await asyncio.to_thread(start_cache, "--redis-url", redis_server.url) for _ in range(2)
    ]
    try:
        async with CacheClient(services[0].address) as one, CacheClient(services[1].address) as two:
            await one.put_result("shared-key", b"value")
            await one.put_session("shared-session", [9, 8])
            assert await two.get_result("shared-key") == b"value"
            assert await two.get_session("shared-session") == [9, 8]
    finally:
        codes = [service.stop() for service in services]
    assert codes == [0, 0]


async def test_batch_stream_to_a_dead_service_raises_unavailable():
    service = await asyncio.to_thread(start_cache)
    try:
        async with CacheClient(service.address, timeout_s=5.0) as cache:
            await cache.register_pool("exec-0", "m", 8, PS)
            assert await cache.batch([MatchOp(seq(0, 8))]) == [{"exec-0": 0}]
            service.process.kill()
            await asyncio.to_thread(service.process.wait)
            with pytest.raises(Unavailable):
                await asyncio.wait_for(cache.batch([MatchOp(seq(0, 8))]), timeout=10)
    finally:
        service.stop()


async def test_continuation_over_the_wire(client, request):
    pool = request.node.name
    earlier = seq(300, 14)
    lease = await client.acquire(pool, earlier, len(earlier), "sched")
    await client.commit(lease.lease_id, earlier)
    found = await client.continuation(earlier[:5], "m", 4)
    assert (found.executor_id, found.num_matched_tokens, found.token_ids) == (
        pool,
        5,
        earlier[5:9],
    )
    missing = await client.continuation(seq(900, 6), "m", 4)
    assert (missing.executor_id, missing.token_ids) == ("", [])
    with pytest.raises(InvalidArgument, match="max_tokens"):
        await client.continuation(earlier, "m", 0)
