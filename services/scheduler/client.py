"""`SchedulerClient`: the scheduler service from asyncio code, many requests on one stream.

    async with SchedulerClient("127.0.0.1:50051") as scheduler:
        async for update in scheduler.generate("r1", prompt_ids, SamplingParams(max_tokens=16)):
            print(update.token_ids)

The one client of `Scheduler.Stream`: the gateway, the load generator, the
benchmarks and the tests all use it. Submits and aborts are written to one
long-lived stream in order (submits queued one after another go out as one
`SubmitBatch` message: a fork's branches, a select's choices, a burst; hold releases
as one `ReleaseHolds`); each StreamResponse (one per scheduler step, with
every request's new tokens) is split by req_id onto per-request queues, as
`radixmesh.updates.RequestUpdate`s (an error as the core's exception type).
When the stream breaks, every request on it ends with Unavailable (the
scheduler aborts them too, since the stream closed) and the next `generate`
opens a new stream.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator, Callable

import grpc

from radixmesh import wire
from radixmesh.errors import InvalidArgument, Unavailable
from radixmesh.sampling import Constraint, Priority, SamplingParams
from radixmesh.updates import RequestUpdate
from radixmesh.v1 import scheduler_pb2, scheduler_pb2_grpc
from services.common import tracing

CLIENT_CLOSING = "the client is closing"
"""Why requests still running end when their SchedulerClient is closed (a load generator,
a benchmark, a test done with it): the default reason of `close`."""
SHUTTING_DOWN = "the gateway is shutting down"
"""Why they end when the gateway closes its client at the end of a drain."""


class _Inbox:
    """One request's updates, in order: an asyncio.Queue's put_nowait and get for one
    reader, without its bookkeeping (a step's response wakes every running request)."""

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: collections.deque[RequestUpdate] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None

    def put_nowait(self, update: RequestUpdate) -> None:
        self._items.append(update)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> RequestUpdate:
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._items.popleft()


_Outgoing = (
    scheduler_pb2.StreamRequest | scheduler_pb2.SubmitRequest | scheduler_pb2.ReleaseHold | None
)


class _Outbox:
    """What the stream sends, in order; None ends it. Submits queued one after another
    go out as one message (`SubmitBatch`), and so do hold releases (`ReleaseHolds`):
    those issued while a write is in flight, or in one turn of the event loop (a fork's
    branches, a select's choices, the holds a join ends), reach the scheduler together
    and cost it one read."""

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: collections.deque[_Outgoing] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None

    def put_nowait(self, item: _Outgoing) -> None:
        """A StreamRequest, a SubmitRequest or ReleaseHold (sent as such, together with
        the ones queued right after it), or None (the end)."""
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def messages(self) -> AsyncIterator[scheduler_pb2.StreamRequest]:
        items = self._items
        while True:
            while not items:
                self._waiter = asyncio.get_running_loop().create_future()
                try:
                    await self._waiter
                finally:
                    self._waiter = None
            item = items.popleft()
            if item is None:
                return
            if isinstance(item, scheduler_pb2.StreamRequest):
                yield item
                continue
            run = [item]
            while items and type(items[0]) is type(item):
                run.append(items.popleft())  # type: ignore[arg-type]
            yield _message_of(run)


def _message_of(run: list) -> scheduler_pb2.StreamRequest:
    """One message for consecutive submits (or hold releases): alone, or as a batch."""
    first = run[0]
    if isinstance(first, scheduler_pb2.SubmitRequest):
        if len(run) == 1:
            return scheduler_pb2.StreamRequest(submit=first)
        return scheduler_pb2.StreamRequest(submit_batch=scheduler_pb2.SubmitBatch(submits=run))
    if len(run) == 1:
        return scheduler_pb2.StreamRequest(release_hold=first)
    holds = scheduler_pb2.ReleaseHolds(hold_ids=[r.hold_id for r in run])
    return scheduler_pb2.StreamRequest(release_holds=holds)


class _Stream:
    """One open Stream call: an outbox feeding the request iterator, a reader task."""

    def __init__(
        self, stub: scheduler_pb2_grpc.SchedulerStub, on_lost: Callable[[_Stream], None]
    ) -> None:
        self.outbox = _Outbox()
        self.queues: dict[str, _Inbox] = {}
        self.close_reason = CLIENT_CLOSING
        """What the requests still running get (Unavailable) when this client ends the stream."""
        self.call = stub.Stream(self.outbox.messages())
        self.reader = asyncio.create_task(self._read(on_lost), name="scheduler-stream-reader")

    async def _read(self, on_lost: Callable[[_Stream], None]) -> None:
        reason = "the scheduler closed the stream"
        try:
            async for response in self.call:
                for msg in response.updates:
                    queue = self.queues.get(msg.req_id)
                    if queue is not None:
                        queue.put_nowait(wire.update_from_proto(msg))
        except grpc.aio.AioRpcError as exc:
            reason = f"scheduler stream failed: {exc.code().name} {exc.details()}"
        except asyncio.CancelledError:  # close() cancelled the call (or the task was cancelled)
            reason = self.close_reason
        finally:
            on_lost(self)
            for req_id, queue in self.queues.items():
                queue.put_nowait(RequestUpdate(req_id, error=Unavailable(reason)))
            self.queues.clear()

    def abort(self, req_id: str) -> None:
        abort = scheduler_pb2.AbortRequest(req_id=req_id)
        self.outbox.put_nowait(scheduler_pb2.StreamRequest(abort=abort))


class SchedulerClient:
    """Requests to the scheduler over `Scheduler.Stream` (see the module docstring).

    `target` is an address (the client opens and closes its channel) or an open
    channel (its owner closes it).
    """

    def __init__(self, target: str | grpc.aio.Channel) -> None:
        self._owns_channel = isinstance(target, str)
        self._channel = grpc.aio.insecure_channel(target) if isinstance(target, str) else target
        self._stub = scheduler_pb2_grpc.SchedulerStub(self._channel)
        self._stream: _Stream | None = None

    async def __aenter__(self) -> SchedulerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def generate(
        self,
        req_id: str,
        token_ids: list[int] | tuple[int, ...],
        sampling: SamplingParams | None = None,
        *,
        constraint: Constraint | None = None,
        model: str = "",
        priority: Priority = Priority.INTERACTIVE,
        deadline_unix_ms: int = 0,
        hold_id: str = "",
        group_id: str = "",
        group_size: int = 0,
    ) -> AsyncIterator[RequestUpdate]:
        """The request's updates until its finish or error; leaving early aborts it.

        With `hold_id`, a normal finish keeps the request's context (prompt + output)
        locked in the prefix cache under that name (replacing a hold of the same name)
        until `release_hold`, or until this client's stream closes. Requests with one
        `group_id` (a select's choices, a fork's branches) are scheduled as one group;
        `group_size`, the group's requests in all when known (0: not said), lets an idle
        executor wait until every one of them is in."""
        stream = self._current()
        if req_id in stream.queues:
            raise InvalidArgument(f"req_id: {req_id!r} is already running on this client")
        submit = scheduler_pb2.SubmitRequest(
            req_id=req_id,
            model=model,
            token_ids=token_ids,
            sampling=wire.sampling_to_proto(sampling or SamplingParams()),
            priority=wire.priority_to_proto(priority),
            deadline_unix_ms=deadline_unix_ms,
            hold_id=hold_id,
            group_id=group_id,
            group_size=group_size,
            traceparent=tracing.current_traceparent(),
        )
        if constraint is not None:
            submit.constraint.CopyFrom(wire.constraint_to_proto(constraint))
        queue = stream.queues[req_id] = _Inbox()
        stream.outbox.put_nowait(submit)
        finished = False
        try:
            while not finished:
                update = await queue.get()
                finished = update.finished
                yield update
        finally:
            if stream.queues.pop(req_id, None) is not None and not finished:
                stream.abort(req_id)

    async def abort(self, req_id: str) -> None:
        """Abort a request still running on this client (a finished or unknown one: nothing)."""
        stream = self._stream
        if stream is not None and req_id in stream.queues:
            stream.abort(req_id)

    async def release_hold(self, hold_id: str) -> None:
        """End a context hold made on this client's stream (an unknown name: nothing). When
        the update that finished a held request has arrived, its hold is in place."""
        stream = self._stream
        if stream is not None:
            stream.outbox.put_nowait(scheduler_pb2.ReleaseHold(hold_id=hold_id))

    async def get_load(self, timeout_s: float | None = None) -> scheduler_pb2.GetLoadResponse:
        return await self._stub.GetLoad(scheduler_pb2.GetLoadRequest(), timeout=timeout_s)

    async def executors_per_model(self, timeout_s: float = 1.0) -> dict[str, int]:
        """Healthy executors per model, from the scheduler's GetLoad."""
        load = await self.get_load(timeout_s)
        counts: dict[str, int] = {}
        for executor in load.executors:
            if executor.healthy:
                counts[executor.model] = counts.get(executor.model, 0) + 1
        return counts

    async def close(self, reason: str = CLIENT_CLOSING) -> None:
        """End the stream (the scheduler aborts what is still running on it); each request
        still running on it ends with Unavailable(reason). A gateway shutting down passes
        SHUTTING_DOWN (gateway/drain.py), so its callers learn why and may retry elsewhere."""
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.close_reason = reason
            stream.outbox.put_nowait(None)
            stream.call.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await stream.reader
        if self._owns_channel:
            await self._channel.close()

    def _current(self) -> _Stream:
        if self._stream is None:
            self._stream = _Stream(self._stub, self._lost)
        return self._stream

    def _lost(self, stream: _Stream) -> None:
        if self._stream is stream:
            self._stream = None
