"""`SchedulerClient`: the scheduler service from asyncio code, many requests on one stream.

    async with SchedulerClient("127.0.0.1:50051") as scheduler:
        async for update in scheduler.generate("r1", prompt_ids, SamplingParams(max_tokens=16)):
            print(update.token_ids)

Updates arrive as the core's `RequestUpdate` (an error as the core's
exception type). A broken stream ends every open request with Unavailable;
the next `generate` opens a new stream.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc

from radixmesh import wire
from radixmesh.errors import InvalidArgument, Unavailable
from radixmesh.sampling import Constraint, SamplingParams
from radixmesh.step import TokenLogprobs
from radixmesh.v1 import inference_pb2, scheduler_pb2, scheduler_pb2_grpc
from services.common.interceptor import error_from_status
from services.scheduler.core import Priority, RequestUpdate

_PRIORITY = {
    Priority.INTERACTIVE: inference_pb2.PRIORITY_INTERACTIVE,
    Priority.BATCH: inference_pb2.PRIORITY_BATCH,
    Priority.SHEDDABLE: inference_pb2.PRIORITY_SHEDDABLE,
}
_STATUS_BY_VALUE = {status.value[0]: status for status in grpc.StatusCode}


def update_from_proto(msg: scheduler_pb2.TokenUpdate) -> RequestUpdate:
    update = RequestUpdate(msg.req_id, token_ids=list(msg.token_ids))
    update.logprobs = [
        TokenLogprobs(
            p.sampled.token_id, p.sampled.logprob, [(t.token_id, t.logprob) for t in p.top]
        )
        for p in msg.logprobs
    ]
    update.finish_reason = msg.finish_reason or None
    if msg.HasField("matched_stop_token_id"):
        update.matched_stop_token_id = msg.matched_stop_token_id
    if msg.HasField("num_prompt_tokens"):
        update.num_prompt_tokens = msg.num_prompt_tokens
        update.num_cached_tokens = msg.num_cached_tokens
    if msg.error_code:
        code = _STATUS_BY_VALUE.get(msg.error_code, grpc.StatusCode.UNKNOWN)
        update.error = error_from_status(code, msg.error_message)
    return update


class SchedulerClient:
    def __init__(self, address: str) -> None:
        self.address = address
        self._channel = grpc.aio.insecure_channel(address)
        self._stub = scheduler_pb2_grpc.SchedulerStub(self._channel)
        self._outbox: asyncio.Queue[scheduler_pb2.StreamRequest | None] | None = None
        self._queues: dict[str, asyncio.Queue[RequestUpdate]] = {}
        self._reader: asyncio.Task[None] | None = None

    async def __aenter__(self) -> SchedulerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._outbox is not None:
            self._outbox.put_nowait(None)
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        await self._channel.close()

    async def generate(
        self,
        req_id: str,
        token_ids: list[int],
        sampling: SamplingParams | None = None,
        *,
        constraint: Constraint | None = None,
        model: str = "",
        priority: Priority = Priority.INTERACTIVE,
        deadline_unix_ms: int = 0,
    ) -> AsyncIterator[RequestUpdate]:
        """The request's updates; leaving the loop early aborts the request."""
        if req_id in self._queues:
            raise InvalidArgument(f"req_id {req_id!r} is already running on this client")
        submit = scheduler_pb2.SubmitRequest(
            req_id=req_id,
            model=model,
            token_ids=token_ids,
            sampling=wire.sampling_to_proto(sampling or SamplingParams()),
            priority=_PRIORITY[priority],
            deadline_unix_ms=deadline_unix_ms,
        )
        if constraint is not None:
            submit.constraint.CopyFrom(wire.constraint_to_proto(constraint))
        queue: asyncio.Queue[RequestUpdate] = asyncio.Queue()
        self._queues[req_id] = queue
        self._send(scheduler_pb2.StreamRequest(submit=submit))
        finished = False
        try:
            while not finished:
                update = await queue.get()
                finished = update.finished
                yield update
        finally:
            self._queues.pop(req_id, None)
            if not finished and self._outbox is not None:
                abort = scheduler_pb2.AbortRequest(req_id=req_id)
                self._outbox.put_nowait(scheduler_pb2.StreamRequest(abort=abort))

    async def get_load(self) -> scheduler_pb2.GetLoadResponse:
        return await self._stub.GetLoad(scheduler_pb2.GetLoadRequest())

    def _send(self, message: scheduler_pb2.StreamRequest) -> None:
        if self._outbox is None:
            outbox: asyncio.Queue[scheduler_pb2.StreamRequest | None] = asyncio.Queue()
            self._outbox = outbox
            call = self._stub.Stream(self._requests(outbox))
            self._reader = asyncio.create_task(self._read(call, outbox))
        self._outbox.put_nowait(message)

    @staticmethod
    async def _requests(outbox: asyncio.Queue) -> AsyncIterator[scheduler_pb2.StreamRequest]:
        while (message := await outbox.get()) is not None:
            yield message

    async def _read(self, call, outbox: asyncio.Queue) -> None:
        reason = "the scheduler ended the stream"
        try:
            async for response in call:
                for msg in response.updates:
                    queue = self._queues.get(msg.req_id)
                    if queue is not None:
                        queue.put_nowait(update_from_proto(msg))
        except grpc.aio.AioRpcError as exc:
            reason = f"scheduler stream failed: {exc.code().name} {exc.details()}"
        finally:
            if self._outbox is outbox:
                self._outbox = None
            for req_id, queue in list(self._queues.items()):
                queue.put_nowait(RequestUpdate(req_id, error=Unavailable(reason)))
