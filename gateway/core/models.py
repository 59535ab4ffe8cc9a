"""The models a gateway serves: model id -> Tokenizer, which one an empty name selects and
the context each is checked against (the executors' own, as the scheduler publishes it);
and how many executors serve each (`ExecutorCounts`, for ListModels)."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Mapping

from gateway.core.tokenizer import Tokenizer
from radixmesh.errors import InvalidArgument, NotFound
from services.common.logging import get_logger

log = get_logger(__name__)
Clock = Callable[[], float]


class ModelRegistry:
    def __init__(
        self, tokenizers: Mapping[str, Tokenizer], default_model: str | None = None
    ) -> None:
        if not tokenizers:
            raise InvalidArgument("model: at least one model is needed")
        self._tokenizers = dict(tokenizers)
        self.default_model = default_model or next(iter(self._tokenizers))
        if self.default_model not in self._tokenizers:
            raise InvalidArgument(f"model: default {self.default_model!r} is not among the models")

    @property
    def ids(self) -> list[str]:
        return list(self._tokenizers)

    def resolve(self, name: str) -> tuple[str, Tokenizer]:
        """(model id, tokenizer) for a requested name; empty selects the default."""
        model_id = name or self.default_model
        tokenizer = self._tokenizers.get(model_id)
        if tokenizer is None:
            raise NotFound(f"model: {model_id!r} is not served here; see the model list")
        return model_id, tokenizer

    def serve_within(self, limits: Mapping[str, int | None]) -> None:
        """Changes state: each served model's context becomes the least of its own and the
        longest sequence its executors serve (model id -> the scheduler's published limit;
        a model absent or None keeps the last one it was given)."""
        for model_id, limit in limits.items():
            tokenizer = self._tokenizers.get(model_id)
            if tokenizer is not None and limit is not None:
                tokenizer.serve_within(limit)


ExecutorCountsFetch = Callable[[], Awaitable[Mapping[str, int]]]


class ExecutorCounts:
    """Healthy executors per model as the scheduler reports them, fetched at most once per
    `ttl_s` however many callers ask (ListModels is cheap to call in a loop).

    A failed fetch is logged and reads as no executors until the next fetch.
    """

    def __init__(
        self, fetch: ExecutorCountsFetch, ttl_s: float = 1.0, clock: Clock = time.monotonic
    ) -> None:
        if not (math.isfinite(ttl_s) and ttl_s >= 0):
            raise InvalidArgument(f"executor_counts.ttl_s must be >= 0, got {ttl_s}")
        self._fetch = fetch
        self._ttl_s = ttl_s
        self._clock = clock
        self._counts: Mapping[str, int] = {}
        self._fetched_at: float | None = None
        self._lock = asyncio.Lock()

    async def get(self) -> Mapping[str, int]:
        """Model id -> number of healthy executors serving it (absent: none)."""
        async with self._lock:
            now = self._clock()
            if self._fetched_at is None or now - self._fetched_at >= self._ttl_s:
                try:
                    self._counts = dict(await self._fetch())
                except Exception as exc:
                    log.warning("executor_counts_failed", error=str(exc))
                    self._counts = {}
                self._fetched_at = self._clock()
            return self._counts
