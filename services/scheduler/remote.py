"""gRPC ports: the scheduler core's CachePort and ExecutorPort over long-lived streams.

The cache verbs go over the cache client's Batch stream (one stream message
each way per verb, no unary call on the hot path). Each executor gets one
Step stream: a plan is queued on it at once (at most two in flight), and
results are read in order (a message carrying several steps' results gives them one
at a time).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import grpc

from radixmesh import wire
from radixmesh.cache_types import CommitResult, Lease
from radixmesh.errors import RadixmeshError, Unavailable
from radixmesh.executor_info import ExecutorInfo
from radixmesh.sampling import Constraint
from radixmesh.step import StepPlan, StepResult
from radixmesh.v1 import executor_pb2, executor_pb2_grpc
from services.cache.client import (
    AcquireOp,
    CacheClient,
    CommitOp,
    ExtendOp,
    HeartbeatOp,
    MatchOp,
    ReleaseOp,
)
from services.common.health import wait_for_serving
from services.common.interceptor import error_from_rpc_error
from services.scheduler import messages


class RemoteCache:
    """CachePort over the cache service's Batch stream."""

    def __init__(self, client: CacheClient) -> None:
        self.client = client

    async def _one(self, op: Any) -> Any:
        (result,) = await self.client.batch([op])
        if isinstance(result, RadixmeshError):
            raise result
        return result

    async def match(self, token_ids: list[int], model: str | None = None) -> dict[str, int]:
        return await self._one(MatchOp(token_ids, model or ""))

    async def acquire(
        self, executor_id: str, token_ids: list[int], num_tokens: int, holder: str
    ) -> Lease:
        return await self._one(AcquireOp(executor_id, token_ids, num_tokens, holder))

    async def extend(self, lease_id: str, num_pages: int) -> list[int]:
        return await self._one(ExtendOp(lease_id, num_pages))

    async def commit(
        self, lease_id: str, token_ids: list[int], keep_locked: bool = False
    ) -> CommitResult:
        return await self._one(CommitOp(lease_id, token_ids, keep_locked))

    async def release(self, lease_id: str) -> None:
        await self._one(ReleaseOp(lease_id))

    async def heartbeat(self, holder: str) -> int:
        return await self._one(HeartbeatOp(holder))


class RemoteExecutor:
    """ExecutorPort over one executor's Step stream. `await connect()` before use."""

    def __init__(self, address: str, timeout_s: float = 30.0) -> None:
        self.address = address
        self._timeout = timeout_s
        self._channel = grpc.aio.insecure_channel(address)
        self._stub = executor_pb2_grpc.ExecutorStub(self._channel)
        self._outbox: asyncio.Queue[executor_pb2.StepPlan | None] = asyncio.Queue()
        self._call: Any = None
        self._info: ExecutorInfo | None = None
        self._ready: deque[StepResult] = deque()
        """Results a message carried after its own (`StepResult.next_results`), in order."""

    @property
    def info(self) -> ExecutorInfo:
        if self._info is None:
            raise Unavailable(f"executor {self.address} is not connected")
        return self._info

    async def connect(self) -> None:
        """Wait for the executor to serve (model loaded), GetInfo, open the Step stream."""
        try:
            await wait_for_serving(self.address, timeout=self._timeout)
        except (TimeoutError, ConnectionError) as exc:
            raise Unavailable(f"executor {self.address}: {exc}") from None
        try:
            reply = await self._stub.GetInfo(
                executor_pb2.GetInfoRequest(), timeout=self._timeout, wait_for_ready=True
            )
        except grpc.aio.AioRpcError as exc:
            raise Unavailable(f"executor {self.address}: {error_from_rpc_error(exc)}") from None
        self._info = wire.info_from_proto(reply)
        self._call = self._stub.Step(self._plans())

    async def _plans(self) -> AsyncIterator[executor_pb2.StepPlan]:
        while (plan := await self._outbox.get()) is not None:
            yield plan

    def submit(self, plan: StepPlan) -> None:
        if self._call is None or self._call.done():
            raise Unavailable(f"executor {self.address}: the Step stream is closed")
        self._outbox.put_nowait(wire.plan_to_proto(plan))
        messages.note("executor", "sent")

    async def next_result(self) -> StepResult:
        if self._ready:
            return self._ready.popleft()
        try:
            msg = await self._call.read()
        except grpc.aio.AioRpcError as exc:
            raise Unavailable(f"executor {self.address}: {error_from_rpc_error(exc)}") from None
        if msg is grpc.aio.EOF:
            raise Unavailable(f"executor {self.address} ended the Step stream")
        messages.note("executor", "received")
        if not msg.next_results:
            return wire.result_from_proto(msg, columnar=True)
        first, *more = wire.results_from_proto(msg, columnar=True)
        self._ready.extend(more)
        return first

    async def prepare_constraint(self, constraint: Constraint) -> float:
        """PrepareConstraint: the executor compiles it into its grammar cache (unary call,
        beside the Step stream). A compile has its own limit on the executor."""
        request = executor_pb2.PrepareConstraintRequest(
            constraint=wire.constraint_to_proto(constraint)
        )
        try:
            reply = await self._stub.PrepareConstraint(request, timeout=self._timeout)
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc_error(exc) from None
        return reply.compile_seconds

    async def close(self) -> None:
        self._outbox.put_nowait(None)
        if self._call is not None:
            self._call.cancel()
        await self._channel.close()
