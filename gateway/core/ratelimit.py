"""Token-bucket rate limits per API key: in-process, or in Redis so gateway replicas share them.

A bucket holds at most `capacity` tokens and refills at `refill_per_s`; a
request takes `cost` tokens (1 by default) or is refused. Both limiters take
the same clock (seconds, `time.time` by default) so tests can drive time, and
both answer with a `RateDecision`. `check()` raises `ResourceExhausted` with
the wait before a retry can succeed.

The Redis limiter runs one Lua script per request: read the bucket, refill
it for the time passed, take the cost, write it back, all atomically, so
concurrent replicas never hand out more than the bucket holds. Keys expire
once a bucket would be full again, so idle keys cost no memory. When Redis
cannot be reached (refused, reset, timed out) the limiter raises `Unavailable`:
it fails closed, never letting requests through unlimited, and a client may
retry once Redis is back.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from radixmesh.errors import InvalidArgument, ResourceExhausted, Unavailable

Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class RateLimitConfig:
    capacity: float
    """Most tokens a bucket holds: the burst a key may send at once."""
    refill_per_s: float
    """Tokens added per second: the sustained request rate."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.capacity) and self.capacity >= 1):
            raise InvalidArgument(f"rate_limit.capacity must be >= 1, got {self.capacity}")
        if not (math.isfinite(self.refill_per_s) and self.refill_per_s > 0):
            raise InvalidArgument(f"rate_limit.refill_per_s must be > 0, got {self.refill_per_s}")


@dataclass(frozen=True, slots=True)
class RateDecision:
    allowed: bool
    remaining: float
    """Tokens left in the bucket after this decision."""
    retry_after_s: float
    """0 when allowed; else the wait until the bucket holds the cost."""


class RateLimiter(Protocol):
    async def acquire(self, key: str, cost: float = 1.0) -> RateDecision: ...


async def check(limiter: RateLimiter, key: str, cost: float = 1.0) -> RateDecision:
    """Take cost tokens for key, or raise ResourceExhausted saying when to retry."""
    decision = await limiter.acquire(key, cost)
    if not decision.allowed:
        raise ResourceExhausted(
            f"rate limit exceeded for this API key; retry after {decision.retry_after_s:.3f} s"
        )
    return decision


def _take(
    config: RateLimitConfig, tokens: float, last_s: float, now_s: float, cost: float
) -> tuple[float, RateDecision]:
    """The bucket arithmetic, shared by the in-process limiter and mirrored by the Lua script."""
    tokens = min(config.capacity, tokens + max(0.0, now_s - last_s) * config.refill_per_s)
    if tokens >= cost:
        return tokens - cost, RateDecision(True, tokens - cost, 0.0)
    return tokens, RateDecision(False, tokens, (cost - tokens) / config.refill_per_s)


def _check_cost(config: RateLimitConfig, cost: float) -> None:
    if not (0 < cost <= config.capacity):
        raise InvalidArgument(f"cost must be in (0, {config.capacity}], got {cost}")


class LocalRateLimiter:
    """Buckets in this process's memory (one gateway replica)."""

    def __init__(self, config: RateLimitConfig, clock: Clock = time.time) -> None:
        self.config = config
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, last refill time)

    async def acquire(self, key: str, cost: float = 1.0) -> RateDecision:
        _check_cost(self.config, cost)
        now = self._clock()
        tokens, last = self._buckets.get(key, (self.config.capacity, now))
        tokens, decision = _take(self.config, tokens, last, now, cost)
        self._buckets[key] = (tokens, max(now, last))
        if len(self._buckets) > 4096:
            self._drop_full_buckets(now)
        return decision

    def _drop_full_buckets(self, now: float) -> None:
        """Forget buckets that have refilled: they behave exactly like absent ones."""
        full_after = self.config.capacity / self.config.refill_per_s
        for key in [k for k, (_, last) in self._buckets.items() if now - last >= full_after]:
            del self._buckets[key]


# KEYS[1] bucket; ARGV: capacity, refill_per_s, now_s, cost.
# Returns {allowed (0/1), remaining (string), retry_after_s (string)}: strings keep the
# fractions, which Redis would truncate when converting Lua numbers to integers.
_TAKE_SCRIPT = """
local capacity = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
local state = redis.call('HMGET', KEYS[1], 'tokens', 'last')
local tokens = tonumber(state[1]) or capacity
local last = tonumber(state[2]) or now
if now > last then
  tokens = math.min(capacity, tokens + (now - last) * rate)
  last = now
end
local allowed = 0
local retry = 0
if tokens >= cost then
  tokens = tokens - cost
  allowed = 1
else
  retry = (cost - tokens) / rate
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'last', tostring(last))
redis.call('PEXPIRE', KEYS[1], math.ceil((capacity - tokens) / rate * 1000) + 1000)
return {allowed, tostring(tokens), tostring(retry)}
"""


class RedisRateLimiter:
    """Buckets in Redis, shared by every gateway replica that uses the same prefix."""

    def __init__(
        self,
        redis: Any,
        config: RateLimitConfig,
        clock: Clock = time.time,
        prefix: str = "radixmesh:ratelimit:",
    ) -> None:
        """redis: a `redis.asyncio.Redis` client."""
        self.config = config
        self._redis = redis
        self._clock = clock
        self._prefix = prefix
        self._script = redis.register_script(_TAKE_SCRIPT)

    def redis_key(self, key: str) -> str:
        """API keys are secrets: Redis sees only a digest of them."""
        return self._prefix + hashlib.sha256(key.encode()).hexdigest()[:32]

    async def acquire(self, key: str, cost: float = 1.0) -> RateDecision:
        _check_cost(self.config, cost)
        args = [
            repr(self.config.capacity),
            repr(self.config.refill_per_s),
            repr(self._clock()),
            repr(cost),
        ]
        try:
            allowed, remaining, retry = await self._script(keys=[self.redis_key(key)], args=args)
        except (RedisConnectionError, RedisTimeoutError) as exc:
            raise Unavailable(f"rate limiter: Redis is unreachable ({exc}); retry later") from exc
        return RateDecision(bool(allowed), float(remaining), float(retry))
