"""In-process backend: dicts in LRU order with lazy TTL checks (the default)."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

from services.cache.store.base import Store, StoreConfig


class InProcessStore(Store):
    def __init__(self, config: StoreConfig, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(config)
        self._clock = clock
        self._results: OrderedDict[str, tuple[float, bytes]] = OrderedDict()
        self._result_bytes = 0
        self._sessions: OrderedDict[str, tuple[float, list[int]]] = OrderedDict()

    @property
    def num_result_bytes(self) -> int:
        """Read-only: bytes of results held now (expired ones count until touched)."""
        return self._result_bytes

    async def get_result(self, key: str) -> bytes | None:
        self.check_key(key)
        entry = self._results.get(key)
        if entry is None:
            return None
        if entry[0] <= self._clock():
            self._drop_result(key)
            return None
        self._results.move_to_end(key)
        return entry[1]

    async def put_result(self, key: str, value: bytes) -> None:
        self.check_key(key)
        self.check_value(value)
        if key in self._results:
            self._drop_result(key)
        self._results[key] = (self._clock() + self.config.result_ttl_s, bytes(value))
        self._result_bytes += len(value)
        while self._result_bytes > self.config.max_result_bytes:
            self._drop_result(next(iter(self._results)))

    async def get_session(self, session_id: str) -> list[int] | None:
        self.check_session(session_id)
        entry = self._sessions.get(session_id)
        if entry is None:
            return None
        if entry[0] <= self._clock():
            del self._sessions[session_id]
            return None
        self._sessions.move_to_end(session_id)
        return list(entry[1])

    async def put_session(self, session_id: str, token_ids: Sequence[int]) -> None:
        self.check_session(session_id, token_ids)
        self._sessions.pop(session_id, None)
        self._sessions[session_id] = (self._clock() + self.config.session_ttl_s, list(token_ids))
        while len(self._sessions) > self.config.max_sessions:
            self._sessions.popitem(last=False)

    def _drop_result(self, key: str) -> None:
        _, value = self._results.pop(key)
        self._result_bytes -= len(value)
