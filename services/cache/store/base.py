"""The result cache and session store: one async interface, two backends."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from radixmesh.errors import InvalidArgument

MAX_KEY_CHARS = 512


@dataclass(frozen=True, slots=True)
class StoreConfig:
    result_ttl_s: float = 600.0
    """Seconds a stored result stays readable."""
    session_ttl_s: float = 3600.0
    """Seconds a session lives after its last put."""
    max_result_bytes: int = 64 << 20
    """In-process backend: total bytes of stored results; least recently used go first."""
    max_value_bytes: int = 8 << 20
    """Largest single result value accepted (both backends)."""
    max_sessions: int = 100_000
    """In-process backend: sessions kept; least recently used go first."""
    max_session_tokens: int = 1 << 20
    """Largest session accepted, in token ids."""
    redis_url: str | None = None
    """redis://host:port/db to share results and sessions across replicas; None is in-process."""
    redis_timeout_s: float = 1.0
    """Connect and socket timeout of every Redis call; a dead Redis fails fast with Unavailable."""
    key_prefix: str = "radixmesh:"
    """Prefix of every Redis key."""

    def __post_init__(self) -> None:
        for name in ("result_ttl_s", "session_ttl_s", "redis_timeout_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise InvalidArgument(f"{name} must be a positive number, got {value}")
        for name in ("max_result_bytes", "max_value_bytes", "max_sessions", "max_session_tokens"):
            if getattr(self, name) < 1:
                raise InvalidArgument(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_value_bytes > self.max_result_bytes:
            raise InvalidArgument("max_value_bytes must not exceed max_result_bytes")
        if self.redis_url is not None and not self.redis_url.startswith(
            ("redis://", "rediss://", "unix://")
        ):
            raise InvalidArgument(
                f"redis_url must start with redis://, rediss:// or unix://, got {self.redis_url!r}"
            )


class Store(ABC):
    """Results by key (bytes, with a TTL) and sessions by id (token ids, with a TTL).

    Backends raise `Unavailable` when their storage cannot be reached and
    `InvalidArgument` for a bad key, id or oversized value.
    """

    def __init__(self, config: StoreConfig) -> None:
        self.config = config

    @abstractmethod
    async def get_result(self, key: str) -> bytes | None:
        """Read-only: the value stored under `key`, None if absent or expired."""

    @abstractmethod
    async def put_result(self, key: str, value: bytes) -> None:
        """Changes state: stores `value` under `key` for `result_ttl_s`."""

    @abstractmethod
    async def get_session(self, session_id: str) -> list[int] | None:
        """Read-only: the session's token ids, None if absent or expired."""

    @abstractmethod
    async def put_session(self, session_id: str, token_ids: Sequence[int]) -> None:
        """Changes state: replaces the session's token ids and renews its TTL."""

    async def close(self) -> None:  # noqa: B027 - nothing to release by default
        """Changes state: releases connections; the store is unusable afterwards."""

    # ---- shared validation ----

    def check_key(self, key: str) -> None:
        if not key or len(key) > MAX_KEY_CHARS:
            raise InvalidArgument(f"key must be 1 to {MAX_KEY_CHARS} characters, got {len(key)}")

    def check_value(self, value: bytes) -> None:
        if len(value) > self.config.max_value_bytes:
            raise InvalidArgument(
                f"value is {len(value)} bytes, more than max_value_bytes ({self.config.max_value_bytes})"
            )

    def check_session(self, session_id: str, token_ids: Sequence[int] | None = None) -> None:
        if not session_id or len(session_id) > MAX_KEY_CHARS:
            raise InvalidArgument(
                f"session_id must be 1 to {MAX_KEY_CHARS} characters, got {len(session_id)}"
            )
        if token_ids is not None and len(token_ids) > self.config.max_session_tokens:
            raise InvalidArgument(
                f"token_ids has {len(token_ids)} ids, more than max_session_tokens ({self.config.max_session_tokens})"
            )
