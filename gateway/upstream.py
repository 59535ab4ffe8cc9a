"""The gateway's side of `Scheduler.Stream`: many requests multiplexed on one bidirectional stream.

`SchedulerUpstream` implements `gateway.core.generate.Upstream`. Submits and
aborts are written to one long-lived stream in order; each StreamResponse
(one per scheduler step, with every request's new tokens) is split by req_id
onto per-request queues. When the stream breaks, every request on it ends with
UNAVAILABLE (the scheduler aborts them too, since the stream closed) and the
next submit opens a new stream.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc

from gateway import convert
from gateway.core.generate import UpstreamUpdate
from gateway.core.prepare import PreparedRequest
from radixmesh.errors import InvalidArgument, Unavailable
from radixmesh.v1 import scheduler_pb2, scheduler_pb2_grpc
from services.common.logging import get_logger

log = get_logger(__name__)


class _Stream:
    """One open Stream call: an outbox feeding the request iterator, a reader task."""

    def __init__(self, stub: scheduler_pb2_grpc.SchedulerStub, on_lost) -> None:
        self.outbox: asyncio.Queue[scheduler_pb2.StreamRequest | None] = asyncio.Queue()
        self.queues: dict[str, asyncio.Queue[UpstreamUpdate]] = {}
        self.call = stub.Stream(self._requests())
        self.reader = asyncio.create_task(self._read(on_lost), name="scheduler-stream-reader")

    async def _requests(self) -> AsyncIterator[scheduler_pb2.StreamRequest]:
        while (message := await self.outbox.get()) is not None:
            yield message

    async def _read(self, on_lost) -> None:
        reason = "the scheduler closed the stream"
        try:
            async for response in self.call:
                for update in response.updates:
                    queue = self.queues.get(update.req_id)
                    if queue is not None:
                        queue.put_nowait(convert.update_from_proto(update))
        except grpc.aio.AioRpcError as exc:
            reason = f"scheduler stream failed: {exc.code().name} {exc.details()}"
        except asyncio.CancelledError:
            reason = "the gateway is shutting down"
        finally:
            on_lost(self)
            for queue in self.queues.values():
                queue.put_nowait(UpstreamUpdate(error=Unavailable(reason)))
            self.queues.clear()


class SchedulerUpstream:
    """Requests to the scheduler over `Scheduler.Stream` (see the module docstring)."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._stub = scheduler_pb2_grpc.SchedulerStub(channel)
        self._stream: _Stream | None = None

    def _current(self) -> _Stream:
        if self._stream is None:
            self._stream = _Stream(self._stub, self._lost)
        return self._stream

    def _lost(self, stream: _Stream) -> None:
        if self._stream is stream:
            self._stream = None

    async def submit(self, request: PreparedRequest) -> AsyncIterator[UpstreamUpdate]:
        stream = self._current()
        if request.req_id in stream.queues:
            raise InvalidArgument(f"request_id: {request.req_id!r} is already running")
        queue: asyncio.Queue[UpstreamUpdate] = asyncio.Queue()
        stream.queues[request.req_id] = queue
        try:
            stream.outbox.put_nowait(convert.submit_to_proto(request))
            while True:
                update = await queue.get()
                yield update
                if update.finish_reason or update.error is not None:
                    return
        finally:
            stream.queues.pop(request.req_id, None)

    async def abort(self, req_id: str) -> None:
        stream = self._stream
        if stream is not None:
            stream.outbox.put_nowait(convert.abort_to_proto(req_id))

    async def executors_per_model(self, timeout_s: float = 1.0) -> dict[str, int]:
        """Healthy executors per model, from the scheduler's GetLoad."""
        load = await self._stub.GetLoad(scheduler_pb2.GetLoadRequest(), timeout=timeout_s)
        counts: dict[str, int] = {}
        for executor in load.executors:
            if executor.healthy:
                counts[executor.model] = counts.get(executor.model, 0) + 1
        return counts

    async def close(self) -> None:
        """End the stream (the scheduler aborts what is still running on it)."""
        stream, self._stream = self._stream, None
        if stream is None:
            return
        stream.outbox.put_nowait(None)
        stream.call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await stream.reader
