"""The `radixmesh.v1.Scheduler` servicer: a thin shell over `SchedulerCore`.

`Stream` multiplexes one gateway's requests on one bidirectional stream. The
core delivers every request's updates of a step in one batch; the servicer
splits a batch by stream and sends one StreamResponse per stream per step.
A submit the core refuses (bad input, full queue, no executor) is answered
with an error update for that req_id; the stream goes on. Submits are
queued concurrently (each waits on the cache's prefix match), so requests sent
together start in the same step; an abort or ReleaseHold applies after the
submits before it. When the gateway
half-closes, the stream ends after its last request finishes; when the
stream breaks or is cancelled, its requests still running are aborted.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from radixmesh import wire
from radixmesh.capacity import capacity_to_proto
from radixmesh.errors import InvalidArgument, RadixmeshError, Unavailable
from radixmesh.updates import RequestUpdate
from radixmesh.v1 import scheduler_pb2, scheduler_pb2_grpc
from services.common import tracing
from services.common.logging import get_logger
from services.scheduler import convert, messages
from services.scheduler.core import SchedulerCore, StepUpdates
from services.scheduler.tracing import RequestTrace

SERVICE_NAME = scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"].full_name

log = get_logger(__name__)


_LOAD_FIELDS = frozenset(scheduler_pb2.ExecutorLoad.DESCRIPTOR.fields_by_name)


@dataclass(slots=True)
class _Stream:
    stream_id: int
    outbox: asyncio.Queue[scheduler_pb2.StreamResponse | None] = field(
        default_factory=asyncio.Queue
    )
    req_ids: set[str] = field(default_factory=set)
    """The gateway's ids of requests still running."""
    hold_ids: set[str] = field(default_factory=set)
    """The gateway's names of context holds its submits asked for (released on close)."""
    submitting: set[asyncio.Task[None]] = field(default_factory=set)
    """Submits still being queued by the core (waiting on the cache's prefix match)."""
    half_closed: bool = False

    def core_id(self, req_id: str) -> str:
        return f"{self.stream_id}/{req_id}"

    def end_if_done(self) -> None:
        if self.half_closed and not self.req_ids:
            self.outbox.put_nowait(None)


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(self) -> None:
        self._core: SchedulerCore | None = None
        self._streams: dict[int, _Stream] = {}
        self._stream_ids = itertools.count(1)
        self._cleanups: set[asyncio.Task[None]] = set()
        """Hold releases of closed streams, still running."""

    def attach(self, core: SchedulerCore) -> None:
        """Serve `core`; it must deliver its updates to `self.deliver`."""
        self._core = core

    def deliver(self, batch: StepUpdates) -> None:
        """The core's sink: one StreamResponse per stream with updates in this batch."""
        responses: dict[int, scheduler_pb2.StreamResponse] = {}
        last_no, stream, add = "", None, None  # a step's updates come mostly from one stream
        for update in batch.updates:
            stream_no, _, req_id = update.req_id.partition("/")
            if stream_no != last_no:
                last_no, stream = stream_no, self._streams.get(int(stream_no))
                if stream is not None:
                    response = responses.get(stream.stream_id)
                    if response is None:
                        response = responses[stream.stream_id] = scheduler_pb2.StreamResponse(
                            step_id=batch.step_id
                        )
                    add = response.updates.add
            if stream is None or req_id not in stream.req_ids:
                continue
            assert add is not None
            if _is_plain(update):  # tokens only: the same message, fewer checks
                msg = add()
                msg.req_id = req_id
                msg.token_ids.extend(update.token_ids)
                continue
            wire.update_to_proto(update, req_id, add())
            if update.finished:
                stream.req_ids.discard(req_id)
        for stream_id, response in list(responses.items()):
            if not response.updates:  # its updates were all of requests it no longer has
                del responses[stream_id]
        messages.note("gateway", "sent", len(responses))
        for stream_id, response in responses.items():
            stream = self._streams[stream_id]
            stream.outbox.put_nowait(response)
            stream.end_if_done()

    async def Stream(
        self, request_iterator: AsyncIterator[scheduler_pb2.StreamRequest], context: Any
    ) -> AsyncIterator[scheduler_pb2.StreamResponse]:
        core = self._require_core()
        stream = _Stream(next(self._stream_ids))
        self._streams[stream.stream_id] = stream
        reader = asyncio.create_task(self._read(core, stream, request_iterator))
        try:
            while (response := await stream.outbox.get()) is not None:
                yield response
        finally:
            reader.cancel()
            for task in stream.submitting:  # a submit cancelled in its match changes nothing
                task.cancel()
            for req_id in list(stream.req_ids):
                core.abort(stream.core_id(req_id))
            del self._streams[stream.stream_id]
            if stream.hold_ids:  # a closed stream ends every hold it made
                holds = [stream.core_id(h) for h in stream.hold_ids]
                task = asyncio.create_task(_release_holds(core, holds), name="release-holds")
                self._cleanups.add(task)
                task.add_done_callback(self._cleanups.discard)

    async def GetLoad(self, request: scheduler_pb2.GetLoadRequest, context: Any):
        core = self._require_core()
        response = scheduler_pb2.GetLoadResponse()
        for load in core.executor_loads():
            fields = dataclasses.asdict(load)
            # a request preparing its constraint counts as waiting for the executor
            fields["num_waiting"] += fields.pop("num_preparing")
            response.executors.add(**{k: v for k, v in fields.items() if k in _LOAD_FIELDS})
        for priority, count in core.num_waiting().items():
            response.num_waiting[priority.name.lower()] = count
        for capacity in core.capacity():
            capacity_to_proto(capacity, response.capacity.add())
        return response

    async def _read(
        self,
        core: SchedulerCore,
        stream: _Stream,
        request_iterator: AsyncIterator[scheduler_pb2.StreamRequest],
    ) -> None:
        try:
            async for message in request_iterator:
                messages.note("gateway", "received")
                op = message.WhichOneof("op")
                if op in ("submit", "submit_batch"):  # a batch's in order, as if each came alone
                    for submit in wire.submits_of(message):  # concurrently: start in one step
                        self._start_submit(core, stream, submit)
                    continue
                if stream.submitting:  # an abort or release applies after earlier submits
                    await asyncio.gather(*stream.submitting, return_exceptions=True)
                if op == "abort" and message.abort.req_id in stream.req_ids:
                    core.abort(stream.core_id(message.abort.req_id))
                elif op == "release_hold":
                    await self._release_hold(core, stream, message.release_hold.hold_id)
                elif op == "release_holds":  # together: their cache verbs share a message
                    await asyncio.gather(
                        *(self._release_hold(core, stream, h) for h in message.release_holds.hold_ids)
                    )
        except asyncio.CancelledError:
            return
        except Exception as exc:  # the stream broke: Stream's finally aborts what is left
            log.warning("scheduler_stream_read_failed", error=str(exc))
            stream.outbox.put_nowait(None)
            return
        if stream.submitting:
            await asyncio.gather(*stream.submitting, return_exceptions=True)
        stream.half_closed = True
        stream.end_if_done()

    @staticmethod
    async def _release_hold(core: SchedulerCore, stream: _Stream, hold_id: str) -> None:
        stream.hold_ids.discard(hold_id)
        await core.release_hold(stream.core_id(hold_id))

    def _start_submit(
        self, core: SchedulerCore, stream: _Stream, msg: scheduler_pb2.SubmitRequest
    ) -> None:
        """The submit runs in a task of its own (its prefix match awaits the cache), so the
        submits read together queue their matches together and start in one step."""
        task = asyncio.create_task(self._submit(core, stream, msg))
        stream.submitting.add(task)
        task.add_done_callback(stream.submitting.discard)

    async def _submit(
        self, core: SchedulerCore, stream: _Stream, msg: scheduler_pb2.SubmitRequest
    ) -> None:
        try:
            if msg.req_id in stream.req_ids:
                raise InvalidArgument(f"submit.req_id {msg.req_id!r} is already running")
            sub = convert.submission_from_proto(msg)
            stream.req_ids.add(sub.req_id)
            if sub.hold_id:
                stream.hold_ids.add(sub.hold_id)
            # traced from before the submit, so the prefix match it does is a child too
            trace = None
            if msg.traceparent and tracing.enabled():
                trace = RequestTrace.start(msg.traceparent, time.monotonic())
            try:
                with trace.active() if trace is not None else contextlib.nullcontext():
                    req = await core.submit(
                        stream.core_id(sub.req_id),
                        sub.token_ids,
                        sub.sampling,
                        constraint=sub.constraint,
                        model=sub.model,
                        priority=sub.priority,
                        deadline=sub.deadline,
                        hold_id=stream.core_id(sub.hold_id) if sub.hold_id else "",
                        group_id=stream.core_id(sub.group_id) if sub.group_id else "",
                        group_size=sub.group_size,
                    )
                if trace is not None:
                    trace.arrived(req.arrival_time)
                    req.trace = trace
            except RadixmeshError as exc:
                stream.req_ids.discard(sub.req_id)
                if trace is not None:
                    trace.refused(exc)
                raise
        except RadixmeshError as exc:
            response = scheduler_pb2.StreamResponse()
            wire.update_to_proto(RequestUpdate(msg.req_id, error=exc), out=response.updates.add())
            messages.note("gateway", "sent")
            stream.outbox.put_nowait(response)

    def _require_core(self) -> SchedulerCore:
        if self._core is None:
            raise Unavailable("the scheduler is starting: no executors connected yet")
        return self._core


def _is_plain(update: RequestUpdate) -> bool:
    """The update carries token ids only (what `wire.update_to_proto` would write is
    req_id and token_ids)."""
    return (
        update.finish_reason is None
        and update.error is None
        and update.num_prompt_tokens is None
        and update.matched_stop_token_id is None
        and update.speculation is None
        and not update.logprobs
        and not update.prompt_logprobs
    )


async def _release_holds(core: SchedulerCore, hold_ids: list[str]) -> None:
    for hold_id in hold_ids:
        try:
            await core.release_hold(hold_id)
        except Exception as exc:  # the cache expires what it could not end
            log.warning("release_hold_failed", hold_id=hold_id, error=str(exc))
