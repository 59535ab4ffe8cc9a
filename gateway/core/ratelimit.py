"""Token-bucket rate limits per API key: in-process, or in Redis so gateway replicas share them.

A bucket holds at most `capacity` tokens and refills at `refill_per_s`; a
request takes `cost` tokens (1 by default) or is refused. Both limiters take
the same clock (seconds, `time.time` by default) so tests can drive time, and
both answer with a `RateDecision`. `check()` raises `ResourceExhausted` with
the wait before a retry can succeed.

With an `AdaptiveRate` the bucket's refill follows the scheduler's measured capacity
(`--rate-limit adaptive`): each key may sustain a share of the requests per second the
executors finish, never less than a floor, recomputed at most once per interval; the
bucket size is a few seconds of that rate. Both limiters read it on every request (the
Redis script takes the rate as an argument), so replicas that read the same capacity
refill the shared buckets alike.

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
class AdaptiveRateConfig:
    share: float = 0.25
    """Each key's refill: this share of the measured capacity in requests/s, in (0, 1]."""
    floor_per_s: float = 1.0
    """The least refill per key, also while the capacity is not measured."""
    burst_s: float = 2.0
    """Bucket size in seconds of the current refill (at least one request)."""
    burst: float | None = None
    """A fixed bucket size instead of burst_s of the rate."""
    interval_s: float = 1.0
    """The rate is recomputed at most this often."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.share) and 0 < self.share <= 1):
            raise InvalidArgument(f"rate_limit.share must be in (0, 1], got {self.share}")
        for name in ("floor_per_s", "burst_s", "interval_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise InvalidArgument(f"rate_limit.{name} must be > 0, got {value}")
        if self.burst is not None and not (math.isfinite(self.burst) and self.burst >= 1):
            raise InvalidArgument(f"rate_limit.burst must be >= 1, got {self.burst}")


class AdaptiveRate:
    """The bucket configuration that follows a measured capacity (requests/s, None while
    unknown), recomputed at most every `interval_s` of `clock`."""

    def __init__(
        self,
        config: AdaptiveRateConfig,
        measured: Callable[[], float | None],
        clock: Clock = time.time,
    ) -> None:
        self.config = config
        self._measured = measured
        self._clock = clock
        self._current = self._compute()
        self._at = clock()

    def current(self) -> RateLimitConfig:
        """The bucket configuration now (recomputed when the interval has passed)."""
        now = self._clock()
        if not 0 <= now - self._at < self.config.interval_s:
            self._current, self._at = self._compute(), now
        return self._current

    def _compute(self) -> RateLimitConfig:
        capacity_per_s = self._measured()
        refill = self.config.floor_per_s
        if capacity_per_s is not None and math.isfinite(capacity_per_s):
            refill = max(refill, self.config.share * capacity_per_s)
        size = self.config.burst or max(1.0, self.config.burst_s * refill)
        return RateLimitConfig(capacity=size, refill_per_s=refill)


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


def _current(source: RateLimitConfig | AdaptiveRate) -> RateLimitConfig:
    return source.current() if isinstance(source, AdaptiveRate) else source


def _check_cost(config: RateLimitConfig, cost: float) -> None:
    if not (0 < cost <= config.capacity):
        raise InvalidArgument(f"cost must be in (0, {config.capacity}], got {cost}")


class LocalRateLimiter:
    """Buckets in this process's memory (one gateway replica)."""

    def __init__(
        self,
        config: RateLimitConfig | AdaptiveRate,
        clock: Clock = time.time,
    ) -> None:
        """config: a fixed bucket, or an AdaptiveRate read on every request."""
        self._source = config
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, last refill time)

    @property
    def config(self) -> RateLimitConfig:
        """The bucket configuration now."""
        return _current(self._source)

    async def acquire(self, key: str, cost: float = 1.0) -> RateDecision:
        config = self.config
        _check_cost(config, cost)
        now = self._clock()
        tokens, last = self._buckets.get(key, (config.capacity, now))
        tokens, decision = _take(config, tokens, last, now, cost)
        self._buckets[key] = (tokens, max(now, last))
        if len(self._buckets) > 4096:
            self._drop_full_buckets(config, now)
        return decision

    def _drop_full_buckets(self, config: RateLimitConfig, now: float) -> None:
        """Forget buckets that have refilled: they behave exactly like absent ones."""
        full_after = config.capacity / config.refill_per_s
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
        config: RateLimitConfig | AdaptiveRate,
        clock: Clock = time.time,
        prefix: str = "radixmesh:ratelimit:",
    ) -> None:
        """redis: a `redis.asyncio.Redis` client; config: a fixed bucket, or an
        AdaptiveRate read on every request."""
        self._source = config
        self._redis = redis
        self._clock = clock
        self._prefix = prefix
        self._script = redis.register_script(_TAKE_SCRIPT)

    @property
    def config(self) -> RateLimitConfig:
        """The bucket configuration now."""
        return _current(self._source)

    def redis_key(self, key: str) -> str:
        """API keys are secrets: Redis sees only a digest of them."""
        return self._prefix + hashlib.sha256(key.encode()).hexdigest()[:32]

    async def acquire(self, key: str, cost: float = 1.0) -> RateDecision:
        config = self.config
        _check_cost(config, cost)
        args = [
            repr(config.capacity),
            repr(config.refill_per_s),
            repr(self._clock()),
            repr(cost),
        ]
        try:
            allowed, remaining, retry = await self._script(keys=[self.redis_key(key)], args=args)
        except (RedisConnectionError, RedisTimeoutError) as exc:
            raise Unavailable(f"rate limiter: Redis is unreachable ({exc}); retry later") from exc
        return RateDecision(bool(allowed), float(remaining), float(retry))
