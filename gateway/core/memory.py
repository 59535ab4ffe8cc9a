"""What the gateway remembers between requests: the result cache and conversation sessions.

Both live in the cache service (in-process there, or Redis), reached through a
`ResultStore` (the cache service's client fits it as is). `GatewayMemory`:

- `history(session_id)`: the session's token ids so far (empty for a new one);
  the request's own input is appended to them when it is prepared.
- `generate(...)`: `gateway.core.generate.generate` plus both stores. A
  deterministic request (greedy, or seeded) without logprobs is answered from
  the result cache when the same model, prompt tokens, sampling and constraint
  were answered before (when the result cache is on); a finished one is stored.
  A session's request that finishes ("stop" or "length") stores the prompt it
  ran plus its completion tokens as the session's new history.

The stores are best effort for results (an unreachable store serves the request
uncached) and strict for sessions (an unreachable store fails the request:
a silently forgotten turn would change the conversation). Two requests of one
session at once: the last to finish wins.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Protocol

from gateway.core.generate import ChoiceEvent, Upstream, generate
from gateway.core.openai_responses import Usage
from gateway.core.output import ChoiceDelta
from gateway.core.prepare import PreparedRequest
from gateway.core.tokenizer import Tokenizer
from radixmesh.errors import FailedPrecondition, InvalidArgument, RadixmeshError
from services.common.logging import get_logger

log = get_logger(__name__)

MAX_SESSION_ID_CHARS = 256
_FINISHED = frozenset({"stop", "length"})


class ResultStore(Protocol):
    """The cache service's result cache and session store (CacheClient implements it)."""

    async def get_result(self, key: str) -> bytes | None: ...

    async def put_result(self, key: str, value: bytes) -> None: ...

    async def get_session(self, session_id: str) -> list[int] | None: ...

    async def put_session(self, session_id: str, token_ids: Sequence[int]) -> None: ...


ResultKey = Callable[[PreparedRequest], str]
"""A stable key of (model, prompt token ids, sampling, constraint)."""


def check_session_id(session_id: str) -> str:
    if len(session_id) > MAX_SESSION_ID_CHARS or not session_id.isprintable():
        raise InvalidArgument(
            f"session_id: 1-{MAX_SESSION_ID_CHARS} printable characters, got {session_id[:40]!r}"
        )
    return session_id


def cacheable(prepared: PreparedRequest) -> bool:
    """Same request, same answer: deterministic sampling, and no logprobs to reproduce."""
    return prepared.sampling.deterministic and not prepared.sampling.logprobs


def encode_result(events: Sequence[ChoiceEvent]) -> bytes:
    """One merged event per choice (see `generate.collect`) -> bytes for the result cache."""
    choices = []
    for event in events:
        d, usage = event.delta, event.usage or Usage(0, 0)
        choices.append(
            {
                "index": d.index,
                "text": d.text,
                "token_ids": d.token_ids,
                "finish_reason": d.finish_reason,
                "matched_stop": d.matched_stop,
                "usage": [usage.prompt_tokens, usage.completion_tokens],
            }
        )
    return json.dumps({"choices": choices}, separators=(",", ":")).encode()


def decode_result(value: bytes) -> list[ChoiceEvent]:
    """The stored choices as events; every prompt token counts as cached (nothing ran)."""
    events = []
    for c in json.loads(value)["choices"]:
        prompt_tokens, completion_tokens = c["usage"]
        delta = ChoiceDelta(
            c["index"],
            text=c["text"],
            token_ids=list(c["token_ids"]),
            finish_reason=c["finish_reason"],
            matched_stop=c["matched_stop"],
        )
        events.append(ChoiceEvent(delta, Usage(prompt_tokens, completion_tokens, prompt_tokens)))
    return events


class GatewayMemory:
    """See the module docstring. Without a store, sessions are refused and nothing is cached."""

    def __init__(
        self,
        store: ResultStore | None = None,
        result_key: ResultKey | None = None,
        cache_results: bool = False,
    ) -> None:
        if cache_results and (store is None or result_key is None):
            raise InvalidArgument("cache_results: needs a store and a result key")
        self._store = store
        self._result_key = result_key
        self.cache_results = cache_results

    async def history(self, session_id: str) -> tuple[int, ...]:
        """The session's token ids so far; () for no session or a new one."""
        if not session_id:
            return ()
        check_session_id(session_id)
        if self._store is None:
            raise FailedPrecondition(
                "session_id: sessions need the cache service (gateway --cache-address)"
            )
        return tuple(await self._store.get_session(session_id) or ())

    async def generate(
        self,
        prepared: PreparedRequest,
        tokenizer: Tokenizer,
        upstream: Upstream,
        session_id: str = "",
    ) -> AsyncGenerator[ChoiceEvent, None]:
        """The request's events, from the result cache or the scheduler; stores what finished."""
        if session_id and prepared.sampling.n != 1:
            raise InvalidArgument("n: must be 1 when session_id is set")
        key = self._key(prepared)
        if key is not None:
            cached = await self._get_result(key)
            if cached is not None:
                for event in cached:
                    yield event
                if session_id:
                    await self._append_session(session_id, prepared, cached)
                return
        finals: list[ChoiceEvent] = []
        events = generate(prepared, tokenizer, upstream)
        if key is None and not session_id:  # nothing to store: the events as they come
            async with contextlib.aclosing(events):
                async for event in events:
                    yield event
            return
        try:
            merged: dict[int, ChoiceDelta] = {}
            async for event in events:
                d = event.delta
                whole = merged.setdefault(d.index, ChoiceDelta(d.index))
                whole.text += d.text
                whole.token_ids += d.token_ids
                if d.finish_reason is not None:
                    whole.finish_reason, whole.matched_stop = d.finish_reason, d.matched_stop
                    finals.append(ChoiceEvent(whole, event.usage))
                yield event
        finally:
            await events.aclose()
        if len(finals) != prepared.sampling.n:
            return
        if key is not None and all(e.delta.finish_reason in _FINISHED for e in finals):
            await self._put_result(key, finals)
        if session_id:
            await self._append_session(session_id, prepared, finals)

    def _key(self, prepared: PreparedRequest) -> str | None:
        if not self.cache_results or self._result_key is None or not cacheable(prepared):
            return None
        return self._result_key(prepared)

    async def _get_result(self, key: str) -> list[ChoiceEvent] | None:
        assert self._store is not None
        try:
            value = await self._store.get_result(key)
            return None if value is None else decode_result(value)
        except (RadixmeshError, ValueError, KeyError, TypeError) as exc:
            log.warning("result_cache_get_failed", error=str(exc))
            return None

    async def _put_result(self, key: str, finals: list[ChoiceEvent]) -> None:
        assert self._store is not None
        try:
            await self._store.put_result(key, encode_result(finals))
        except RadixmeshError as exc:
            log.warning("result_cache_put_failed", error=str(exc))

    async def _append_session(
        self, session_id: str, prepared: PreparedRequest, finals: Sequence[ChoiceEvent]
    ) -> None:
        final = finals[0]
        if final.delta.finish_reason not in _FINISHED or self._store is None:
            return
        tokens = [*prepared.prompt_token_ids, *final.delta.token_ids]
        await self._store.put_session(session_id, tokens)
