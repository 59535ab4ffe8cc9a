"""Tools a program may Call: a registry of server-side callables, and their result cache.

Tools are registered on the server only, never sent as code: Python callables named by
the `radixmesh.tools` entry-point group or by a config file (`module:attr`), and HTTP
tools declared by URL (POST of the JSON arguments, JSON reply). A tool's result is cached
on exact tool + arguments for its `cache_ttl_s` in a `ResultStore` (in-process, or the
cache service's result store, Redis-backed when configured).
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from radixmesh.errors import DeadlineExceeded, FailedPrecondition, InvalidArgument

ToolFn = Callable[..., Any]
"""Called with keyword arguments; returns a JSON value, or an awaitable of one."""


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    fn: ToolFn
    timeout_s: float = 10.0
    """Default timeout of one call (a Call's timeout_ms overrides it)."""
    cache_ttl_s: float = 0.0
    """Results are cached this long on exact arguments; 0: not cached."""
    description: str = ""

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("_", "a").replace(".", "a").isalnum():
            raise InvalidArgument(f"tool name {self.name!r}: letters, digits, _ and . only")
        if not self.timeout_s > 0:
            raise InvalidArgument(f"tool {self.name}: timeout_s must be > 0")
        if self.cache_ttl_s < 0:
            raise InvalidArgument(f"tool {self.name}: cache_ttl_s must be >= 0")


class ResultStore(Protocol):
    async def get_result(self, key: str) -> bytes | None: ...

    async def put_result(self, key: str, value: bytes) -> None: ...


class MemoryResultStore:
    """A ResultStore in a dict (one gateway process)."""

    def __init__(self) -> None:
        self._values: dict[str, bytes] = {}

    async def get_result(self, key: str) -> bytes | None:
        return self._values.get(key)

    async def put_result(self, key: str, value: bytes) -> None:
        self._values[key] = value


def tool_cache_key(tool: str, args: Mapping[str, Any]) -> str:
    canonical = json.dumps([tool, args], sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return "tool:" + hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    value: Any
    cached: bool


class ToolRegistry:
    def __init__(
        self,
        tools: Mapping[str, Tool] | None = None,
        store: ResultStore | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._tools = dict(tools or {})
        self.store = store or MemoryResultStore()
        self._clock = clock

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self._tools)

    def register(self, tool: Tool) -> None:
        if tool.name in self._tools:
            raise InvalidArgument(f"tool {tool.name!r} is registered twice")
        self._tools[tool.name] = tool

    def get(self, name: str) -> Tool:
        tool = self._tools.get(name)
        if tool is None:
            raise InvalidArgument(f"tool: unknown tool {name!r}")
        return tool

    async def call(self, name: str, args: Mapping[str, Any], timeout_s: float | None) -> ToolOutcome:
        """Run a tool (or answer from the cache); errors are FailedPrecondition/DeadlineExceeded."""
        tool = self.get(name)
        key = tool_cache_key(name, args)
        if tool.cache_ttl_s > 0:
            raw = await self.store.get_result(key)
            if raw is not None:
                entry = json.loads(raw)
                if entry["expires_at"] > self._clock():
                    return ToolOutcome(entry["value"], cached=True)
        limit = timeout_s or tool.timeout_s
        try:
            async with asyncio.timeout(limit):
                value = await _invoke(tool.fn, dict(args))
        except TimeoutError:
            raise DeadlineExceeded(f"tool {name!r} timed out after {limit:g} s") from None
        except Exception as exc:  # the tool's own failure: the Call's on_error policy applies
            raise FailedPrecondition(f"tool {name!r} failed: {type(exc).__name__}: {exc}") from None
        try:
            encoded = json.dumps({"expires_at": self._clock() + tool.cache_ttl_s, "value": value})
        except (TypeError, ValueError):
            raise FailedPrecondition(f"tool {name!r} returned a value that is not JSON") from None
        if tool.cache_ttl_s > 0:
            await self.store.put_result(key, encoded.encode())
        return ToolOutcome(json.loads(encoded)["value"], cached=False)


async def _invoke(fn: ToolFn, args: dict[str, Any]) -> Any:
    if inspect.iscoroutinefunction(fn):
        return await fn(**args)
    result = await asyncio.to_thread(fn, **args)
    if isinstance(result, Awaitable):
        return await result
    return result
