"""Result cache and session store: one suite over both backends, plus each one's specifics."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from radixmesh.errors import InvalidArgument, Unavailable
from radixmesh.result_key import result_key
from radixmesh.sampling import Constraint, ConstraintKind, SamplingParams
from services.cache.store import InProcessStore, RedisStore, Store, StoreConfig

REPO_ROOT = Path(__file__).resolve().parents[3]
TTL = 0.3  # short, so the Redis backend's real TTL passes quickly


@dataclass
class StoreEnv:
    store: Store
    advance: Callable[[float], Awaitable[None]]
    """Lets `seconds` pass for the store's TTLs (a fake clock, or real time for Redis)."""


@pytest.fixture(params=["memory", "redis"])
async def env(request, clock):
    if request.param == "memory":
        store: Store = InProcessStore(StoreConfig(result_ttl_s=TTL, session_ttl_s=TTL), clock=clock)

        async def advance(seconds: float) -> None:
            clock.advance(seconds)

    else:
        server = request.getfixturevalue("redis_server")
        config = StoreConfig(
            result_ttl_s=TTL, session_ttl_s=TTL, redis_url=server.url, key_prefix=f"{uuid.uuid4()}:"
        )
        store = RedisStore(config)
        advance = asyncio.sleep
    yield StoreEnv(store, advance)
    await store.close()


async def test_result_round_trip_and_overwrite(env):
    value = bytes(range(256)) * 3
    assert await env.store.get_result("k1") is None
    await env.store.put_result("k1", value)
    assert await env.store.get_result("k1") == value
    await env.store.put_result("k1", b"second")
    assert await env.store.get_result("k1") == b"second"
    assert await env.store.get_result("k2") is None


async def test_result_expires_after_ttl(env):
    await env.store.put_result("k", b"v")
    await env.advance(TTL / 2)
    assert await env.store.get_result("k") == b"v"
    await env.advance(TTL / 2 + 0.1)
    assert await env.store.get_result("k") is None


async def test_session_round_trip_replace_and_ttl_renewal(env):
    assert await env.store.get_session("s") is None
    await env.store.put_session("s", [1, 2, 3, 2**31 - 1])
    assert await env.store.get_session("s") == [1, 2, 3, 2**31 - 1]
    await env.advance(TTL * 0.6)
    await env.store.put_session("s", [4, 5])  # replaces and renews
    await env.advance(TTL * 0.6)
    assert await env.store.get_session("s") == [4, 5]
    await env.advance(TTL * 0.6)
    assert await env.store.get_session("s") is None


async def test_bad_keys_and_values_name_the_field(env):
    with pytest.raises(InvalidArgument, match="key"):
        await env.store.put_result("", b"v")
    with pytest.raises(InvalidArgument, match="max_value_bytes"):
        await env.store.put_result("k", b"x" * (env.store.config.max_value_bytes + 1))
    with pytest.raises(InvalidArgument, match="session_id"):
        await env.store.get_session("")


async def test_in_process_results_are_capped_least_recently_used_first(clock):
    store = InProcessStore(StoreConfig(max_result_bytes=100, max_value_bytes=40), clock=clock)
    for key in ("a", "b", "c"):
        await store.put_result(key, key.encode() * 30)
    assert await store.get_result("a") == b"a" * 30  # a is now more recent than b
    await store.put_result("d", b"d" * 30)  # 120 bytes > 100: the least recent (b) goes
    assert await store.get_result("b") is None
    assert [await store.get_result(k) is not None for k in "acd"] == [True, True, True]
    assert store.num_result_bytes == 90


async def test_in_process_sessions_are_capped(clock):
    store = InProcessStore(StoreConfig(max_sessions=2), clock=clock)
    await store.put_session("s1", [1])
    await store.put_session("s2", [2])
    await store.get_session("s1")
    await store.put_session("s3", [3])
    assert await store.get_session("s2") is None
    assert await store.get_session("s1") == [1]


async def test_redis_replicas_share_results(redis_server):
    config = StoreConfig(redis_url=redis_server.url, key_prefix=f"{uuid.uuid4()}:")
    one, two = RedisStore(config), RedisStore(config)
    await one.put_result("k", b"shared")
    await one.put_session("s", [7, 8])
    assert await two.get_result("k") == b"shared"
    assert await two.get_session("s") == [7, 8]
    await one.close()
    await two.close()


async def test_redis_that_goes_away_gives_unavailable_quickly(redis_server_factory):
    server = redis_server_factory()
    store = RedisStore(StoreConfig(redis_url=server.url, redis_timeout_s=0.5))
    await store.put_result("k", b"v")
    server.kill()
    for call in (store.get_result("k"), store.put_result("k", b"v"), store.get_session("s")):
        start = time.monotonic()
        with pytest.raises(Unavailable, match=re.escape(f"redis at {server.url}")):
            await call
        assert time.monotonic() - start < 3.0
    await store.close()


def test_store_config_validation():
    with pytest.raises(InvalidArgument, match="result_ttl_s"):
        StoreConfig(result_ttl_s=0)
    with pytest.raises(InvalidArgument, match="redis_url"):
        StoreConfig(redis_url="http://x")


# ---- result_key ----

SAMPLING = SamplingParams(temperature=0.0, max_tokens=16)


def test_result_key_changes_with_every_input():
    base = result_key("m", [1, 2, 3], SAMPLING)
    variants = [
        result_key("m2", [1, 2, 3], SAMPLING),
        result_key("m", [1, 2, 4], SAMPLING),
        result_key("m", [1, 2, 3], SamplingParams(temperature=0.0, max_tokens=17)),
        result_key("m", [1, 2, 3], SamplingParams(temperature=0.0, max_tokens=16, stop=("x",))),
        result_key("m", [1, 2, 3], SAMPLING, Constraint(ConstraintKind.REGEX, "a+")),
        result_key("m", [1, 2, 3], SAMPLING, Constraint(ConstraintKind.REGEX, "b+")),
        result_key("m", [1, 2, 3], SAMPLING, Constraint(ConstraintKind.CHOICES, choices=("a",))),
    ]
    assert len({base, *variants}) == len(variants) + 1
    assert result_key("m", (1, 2, 3), SamplingParams(temperature=0.0, max_tokens=16)) == base


def test_result_key_is_stable_across_processes():
    code = (
        "from radixmesh.result_key import result_key;"
        "from radixmesh.sampling import SamplingParams, Constraint, ConstraintKind;"
        "print(result_key('m', [5, 6], SamplingParams(temperature=0.0, seed=3),"
        " Constraint(ConstraintKind.JSON_OBJECT)))"
    )
    here = result_key(
        "m", [5, 6], SamplingParams(temperature=0.0, seed=3), Constraint(ConstraintKind.JSON_OBJECT)
    )
    for hash_seed in ("1", "2"):
        out = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(REPO_ROOT)},
        )
        assert out.stdout.strip() == here
