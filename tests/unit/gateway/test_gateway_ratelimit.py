from __future__ import annotations

import asyncio
import uuid

import pytest
import redis.asyncio as aioredis

from gateway.core.ratelimit import (
    AdaptiveRate,
    AdaptiveRateConfig,
    LocalRateLimiter,
    RateLimitConfig,
    RedisRateLimiter,
    check,
)
from radixmesh.errors import InvalidArgument, ResourceExhausted


class FakeClock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def redis_client(redis_url):
    client = aioredis.from_url(redis_url)
    yield client
    await client.aclose()


@pytest.fixture(params=["local", "redis"])
async def make_limiter(request, redis_url):
    """Build limiters of one kind; Redis ones share a fresh key prefix (like replicas)."""
    clients = []
    prefix = f"test:{uuid.uuid4().hex}:"

    def make(config: RateLimitConfig, clock: FakeClock):
        if request.param == "local":
            return LocalRateLimiter(config, clock)
        client = aioredis.from_url(redis_url)
        clients.append(client)
        return RedisRateLimiter(client, config, clock, prefix=prefix)

    make.kind = request.param
    yield make
    for client in clients:
        await client.aclose()


async def test_burst_then_refusal_with_retry_after(make_limiter):
    clock = FakeClock()
    limiter = make_limiter(RateLimitConfig(capacity=3, refill_per_s=0.5), clock)
    decisions = [await limiter.acquire("key-a") for _ in range(4)]
    assert [d.allowed for d in decisions] == [True, True, True, False]
    assert [d.remaining for d in decisions[:3]] == [2, 1, 0]
    assert decisions[3].retry_after_s == pytest.approx(2.0)  # one token at 0.5/s
    with pytest.raises(ResourceExhausted, match=r"retry after 2\.000 s"):
        await check(limiter, "key-a")


async def test_refill_over_time_is_capped_at_capacity(make_limiter):
    clock = FakeClock()
    limiter = make_limiter(RateLimitConfig(capacity=2, refill_per_s=4), clock)
    assert (await limiter.acquire("k", cost=2)).allowed
    clock.now += 0.125  # half a token
    decision = await limiter.acquire("k")
    assert not decision.allowed and decision.remaining == pytest.approx(0.5)
    assert decision.retry_after_s == pytest.approx(0.125)
    clock.now += 0.125
    assert (await limiter.acquire("k")).allowed
    clock.now += 100  # long idle: full, not more
    assert (await limiter.acquire("k")).remaining == pytest.approx(1)


async def test_keys_have_separate_buckets(make_limiter):
    limiter = make_limiter(RateLimitConfig(capacity=1, refill_per_s=1), FakeClock())
    assert (await limiter.acquire("alice")).allowed
    assert not (await limiter.acquire("alice")).allowed
    assert (await limiter.acquire("bob")).allowed


async def test_clock_going_backwards_adds_nothing(make_limiter):
    clock = FakeClock()
    limiter = make_limiter(RateLimitConfig(capacity=1, refill_per_s=1), clock)
    assert (await limiter.acquire("k")).allowed
    clock.now -= 10
    assert not (await limiter.acquire("k")).allowed


async def test_replicas_share_one_bucket_under_concurrency(make_limiter):
    clock = FakeClock()
    config = RateLimitConfig(capacity=5, refill_per_s=0.001)
    replicas = (
        [make_limiter(config, clock) for _ in range(2)]
        if make_limiter.kind == "redis"
        else [make_limiter(config, clock)] * 2
    )
    results = await asyncio.gather(*(replicas[i % 2].acquire("shared") for i in range(20)))
    assert sum(d.allowed for d in results) == 5


async def test_bad_config_and_cost_name_the_field(make_limiter):
    with pytest.raises(InvalidArgument, match=r"rate_limit\.capacity"):
        RateLimitConfig(capacity=0, refill_per_s=1)
    with pytest.raises(InvalidArgument, match=r"rate_limit\.refill_per_s"):
        RateLimitConfig(capacity=1, refill_per_s=0)
    limiter = make_limiter(RateLimitConfig(capacity=2, refill_per_s=1), FakeClock())
    with pytest.raises(InvalidArgument, match="cost"):
        await limiter.acquire("k", cost=3)


async def test_redis_keys_hide_the_api_key_and_expire(redis_client):
    clock = FakeClock()
    limiter = RedisRateLimiter(redis_client, RateLimitConfig(capacity=4, refill_per_s=2), clock)
    await limiter.acquire("sk-secret-123", cost=3)
    key = limiter.redis_key("sk-secret-123")
    assert "sk-secret" not in key
    ttl_ms = await redis_client.pttl(key)
    # Empty by 3 tokens at 2/s: full again after 1.5 s, plus one second of slack.
    assert 2000 <= ttl_ms <= 2500


class Capacity:
    """The scheduler's measured requests/s, as the gateway's capacity gate reads it."""

    def __init__(self, value: float | None) -> None:
        self.value = value

    def __call__(self) -> float | None:
        return self.value


async def drain_bucket(limiter, key: str) -> int:
    taken = 0
    while (await limiter.acquire(key)).allowed:
        taken += 1
    return taken


async def test_an_adaptive_bucket_follows_the_measured_capacity(make_limiter):
    clock, capacity = FakeClock(), Capacity(None)
    config = AdaptiveRateConfig(share=0.25, floor_per_s=1.0, burst_s=2.0, interval_s=1.0)
    limiter = make_limiter(AdaptiveRate(config, capacity, clock), clock)
    assert await drain_bucket(limiter, "k") == 2  # unmeasured: the floor, 2 s of it
    capacity.value = 40.0  # the executors now finish 40 requests/s: 10/s for one key
    clock.now += 0.5  # within the interval: not recomputed yet (0.5 s at 1/s)
    assert await drain_bucket(limiter, "k") == 0
    clock.now += 0.5
    assert limiter.config == RateLimitConfig(capacity=20.0, refill_per_s=10.0)
    assert await drain_bucket(limiter, "k") == 5  # half a second at 10/s, half a token left
    clock.now += 1.0  # one second at 10/s
    assert await drain_bucket(limiter, "k") == 10
    capacity.value = 8.0  # capacity dropped: 2/s, yet never below the floor
    clock.now += 1.0
    assert await drain_bucket(limiter, "k") == 2
    capacity.value = 1.0
    clock.now += 1.0
    assert limiter.config.refill_per_s == 1.0
    assert await drain_bucket(limiter, "k") == 1


async def test_an_adaptive_bucket_can_keep_a_fixed_size(make_limiter):
    clock, capacity = FakeClock(), Capacity(100.0)
    config = AdaptiveRateConfig(share=0.5, floor_per_s=1.0, burst=3.0)
    limiter = make_limiter(AdaptiveRate(config, capacity, clock), clock)
    assert limiter.config == RateLimitConfig(capacity=3.0, refill_per_s=50.0)
    assert await drain_bucket(limiter, "k") == 3
    clock.now += 0.05  # two and a half requests at 50/s
    assert await drain_bucket(limiter, "k") == 2


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("share", {"share": 0.0}),
        ("share", {"share": 1.5}),
        ("floor_per_s", {"floor_per_s": 0.0}),
        ("burst_s", {"burst_s": float("inf")}),
        ("interval_s", {"interval_s": -1.0}),
        ("burst", {"burst": 0.5}),
    ],
)
def test_bad_adaptive_settings_name_the_field(field, kwargs):
    with pytest.raises(InvalidArgument, match=rf"rate_limit\.{field}"):
        AdaptiveRateConfig(**kwargs)
