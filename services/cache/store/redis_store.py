"""Redis backend (`redis.asyncio`): results and sessions shared by every replica.

Every call has a socket timeout and no retries, so a Redis that is gone turns into
`Unavailable` within about `redis_timeout_s`, never a hang.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import redis.asyncio as redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from radixmesh.errors import InvalidArgument, Unavailable
from services.cache.store.base import Store, StoreConfig

T = TypeVar("T")


def encode_token_ids(token_ids: Sequence[int]) -> bytes:
    try:
        return struct.pack(f"<{len(token_ids)}i", *token_ids)
    except struct.error as exc:
        raise InvalidArgument(f"token_ids must be int32 values: {exc}") from None


def _as_bytes(value: bytes | str) -> bytes:
    """Replies are bytes (the client never decodes); the type admits str."""
    return value if isinstance(value, bytes) else value.encode()


def decode_token_ids(data: bytes) -> list[int]:
    return list(struct.unpack(f"<{len(data) // 4}i", data))


class RedisStore(Store):
    def __init__(self, config: StoreConfig) -> None:
        super().__init__(config)
        if config.redis_url is None:
            raise InvalidArgument("redis_url must be set for the Redis store")
        timeout = config.redis_timeout_s
        self._redis = redis.Redis.from_url(
            config.redis_url,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0),
            retry_on_timeout=False,
        )
        self._prefix = config.key_prefix

    async def get_result(self, key: str) -> bytes | None:
        self.check_key(key)
        value = await self._call(lambda: self._redis.get(f"{self._prefix}result:{key}"))
        return None if value is None else _as_bytes(value)

    async def put_result(self, key: str, value: bytes) -> None:
        self.check_key(key)
        self.check_value(value)
        ttl_ms = max(1, int(self.config.result_ttl_s * 1000))
        await self._call(
            lambda: self._redis.set(f"{self._prefix}result:{key}", bytes(value), px=ttl_ms)
        )

    async def get_session(self, session_id: str) -> list[int] | None:
        self.check_session(session_id)
        data = await self._call(lambda: self._redis.get(f"{self._prefix}session:{session_id}"))
        return None if data is None else decode_token_ids(_as_bytes(data))

    async def put_session(self, session_id: str, token_ids: Sequence[int]) -> None:
        self.check_session(session_id, token_ids)
        data = encode_token_ids(token_ids)
        ttl_ms = max(1, int(self.config.session_ttl_s * 1000))
        await self._call(
            lambda: self._redis.set(f"{self._prefix}session:{session_id}", data, px=ttl_ms)
        )

    async def ping(self) -> None:
        """Read-only: raises Unavailable unless Redis answers."""
        await self._call(self._redis.ping)

    async def close(self) -> None:
        await self._redis.aclose()

    async def _call(self, command: Callable[[], Awaitable[T]]) -> T:
        # The outer timeout is a backstop for a connection stuck outside socket reads.
        try:
            return await asyncio.wait_for(command(), timeout=2 * self.config.redis_timeout_s + 1.0)
        except (RedisError, OSError, TimeoutError) as exc:
            raise Unavailable(
                f"redis at {self.config.redis_url} is unavailable: {exc or type(exc).__name__}"
            ) from exc
