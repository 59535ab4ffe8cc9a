"""Run one request's choices against the scheduler and merge their outputs into one event stream.

The scheduler side is an `Upstream`, the shape of `SchedulerClient`
(`services/scheduler/client.py`, which the gateway server uses; tests use a
fake): `generate(req_id, token_ids, sampling, ...)` yields the request's
`RequestUpdate`s until its finish; `abort(req_id)` stops it.

`generate(...)` submits every choice, feeds each choice's updates through its
`ChoiceStream` (detokenizer, stop strings, logprobs) and yields `ChoiceEvent`s
in arrival order. A stop string aborts that choice upstream; an error in one
choice aborts the others and is raised; a caller that stops iterating (a
client went away) aborts every choice still running.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from gateway.core.openai_responses import Usage, sum_speculation
from gateway.core.output import ChoiceDelta, ChoiceStream
from gateway.core.prepare import PreparedRequest, split_choices
from gateway.core.structured import SchemaOutcome, SchemaWatch, observe
from gateway.core.tokenizer import Tokenizer
from radixmesh.sampling import Constraint, Priority, SamplingParams
from radixmesh.updates import RequestUpdate


class Upstream(Protocol):
    def generate(
        self,
        req_id: str,
        token_ids: tuple[int, ...],
        sampling: SamplingParams | None = None,
        *,
        constraint: Constraint | None = None,
        model: str = "",
        priority: Priority = Priority.INTERACTIVE,
        deadline_unix_ms: int = 0,
    ) -> AsyncIterator[RequestUpdate]:
        """The request's updates until its finish or error; leaving early aborts it."""

    async def abort(self, req_id: str) -> None:
        """Abort a request still running (a finished or unknown one: nothing)."""


@dataclass(slots=True)
class ChoiceEvent:
    delta: ChoiceDelta
    usage: Usage | None = None
    """Set with the choice's last delta."""
    schema: SchemaOutcome | None = None
    """JSON-schema requests: the finished output checked against the schema (last delta)."""


async def generate(
    prepared: PreparedRequest, tokenizer: Tokenizer, upstream: Upstream
) -> AsyncGenerator[ChoiceEvent, None]:
    """Submit all choices of a prepared request; yield their events as they arrive."""
    choices = split_choices(prepared)
    if len(choices) == 1:  # one choice: its events as it makes them, no task or queue between
        events = _choice_events(0, choices[0], tokenizer, upstream)
        async with contextlib.aclosing(events):
            async for event in events:
                yield event
        return
    queue: asyncio.Queue[ChoiceEvent | BaseException | None] = asyncio.Queue()
    tasks = [
        asyncio.create_task(
            _run_choice(index, choice, tokenizer, upstream, queue), name=choice.req_id
        )
        for index, choice in enumerate(choices)
    ]
    running = len(tasks)
    try:
        while running:
            item = await queue.get()
            if item is None:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _run_choice(
    index: int,
    choice: PreparedRequest,
    tokenizer: Tokenizer,
    upstream: Upstream,
    queue: asyncio.Queue[ChoiceEvent | BaseException | None],
) -> None:
    """One of several choices: its events, then its error if any, then None, onto queue."""
    events = _choice_events(index, choice, tokenizer, upstream)
    try:
        async with contextlib.aclosing(events):
            async for event in events:
                await queue.put(event)
    except asyncio.CancelledError:
        raise
    except BaseException as exc:  # handed to the consumer, which raises it
        await queue.put(exc)
    await queue.put(None)


async def _choice_events(
    index: int, choice: PreparedRequest, tokenizer: Tokenizer, upstream: Upstream
) -> AsyncGenerator[ChoiceEvent, None]:
    """One choice's events until its finish; an error raises; leaving early (or a stop
    string) aborts it upstream."""
    stream = ChoiceStream(
        index,
        tokenizer,
        stop=choice.sampling.stop,
        prompt_token_ids=choice.prompt_token_ids,
        logprobs=choice.sampling.logprobs,
        min_tokens=choice.sampling.min_tokens,
    )
    num_prompt_tokens, num_cached_tokens = len(choice.prompt_token_ids), 0
    speculation = None
    finished_upstream = False
    watch = SchemaWatch(choice.schema, choice.req_id) if choice.schema is not None else None
    updates = upstream.generate(
        choice.req_id,
        choice.prompt_token_ids,
        choice.sampling,
        constraint=choice.constraint,
        model=choice.model,
        priority=choice.priority,
        deadline_unix_ms=choice.deadline_unix_ms,
    )
    try:
        async for update in updates:
            if update.error is not None:
                finished_upstream = True
                raise update.error
            if update.num_prompt_tokens is not None:
                num_prompt_tokens = update.num_prompt_tokens
            if update.num_cached_tokens is not None:
                num_cached_tokens = update.num_cached_tokens
            if update.speculation is not None:
                speculation = update.speculation
            finished_upstream = bool(update.finish_reason)
            delta = stream.on_update(
                update.token_ids,
                update.logprobs,
                update.finish_reason or "",
                update.matched_stop_token_id,
                update.prompt_logprobs,
            )
            if (
                delta.finish_reason is None
                and not delta.text
                and not delta.token_ids
                and not delta.prompt_logprobs
            ):
                continue
            usage = (
                stream.usage(num_prompt_tokens, num_cached_tokens, speculation)
                if delta.finish_reason
                else None
            )
            outcome = observe(watch, delta.text, delta.finish_reason)
            yield ChoiceEvent(delta, usage, outcome)
            if stream.finished:
                break
        if not stream.finished:  # the upstream ended without a finish: report it as aborted
            delta = stream.on_update([], finish_reason="abort")
            usage = stream.usage(num_prompt_tokens, num_cached_tokens)
            yield ChoiceEvent(delta, usage, observe(watch, delta.text, "abort"))
    finally:
        aclose = getattr(updates, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(Exception):
                await aclose()
        if not finished_upstream:
            with contextlib.suppress(Exception):
                await asyncio.shield(upstream.abort(choice.req_id))


async def collect(events: AsyncIterator[ChoiceEvent], n: int) -> list[ChoiceEvent]:
    """Non-streaming use: one merged event per choice (all text, logprobs, finish and usage)."""
    merged = [ChoiceEvent(ChoiceDelta(i, logprobs=None)) for i in range(n)]
    for event in [e async for e in events]:
        target = merged[event.delta.index]
        target.delta.text += event.delta.text
        target.delta.token_ids += event.delta.token_ids
        if event.delta.logprobs is not None:
            target.delta.logprobs = [*(target.delta.logprobs or []), *event.delta.logprobs]
        if event.delta.prompt_logprobs is not None:
            target.delta.prompt_logprobs = event.delta.prompt_logprobs
        if event.delta.finish_reason is not None:
            target.delta.finish_reason = event.delta.finish_reason
            target.delta.matched_stop = event.delta.matched_stop
            target.schema = event.schema
            target.usage = event.usage
    return merged


def total_usage(events: Sequence[ChoiceEvent]) -> Usage:
    """The request's usage: the prompt once, completion tokens of every choice."""
    usages = [e.usage for e in events if e.usage is not None]
    if not usages:
        return Usage(0, 0, 0)
    return Usage(
        usages[0].prompt_tokens,
        sum(u.completion_tokens for u in usages),
        usages[0].cached_tokens,
        sum_speculation([u.speculation for u in usages]),
    )
