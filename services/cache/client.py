"""`CacheClient`: the cache service from asyncio code, with the core's verbs and types.

Lives in `services/common/` so the scheduler and the gateway reach the cache through the
protos and this module only, never through the cache service's code.

    async with CacheClient("127.0.0.1:50052") as cache:
        lease = await cache.acquire("exec-0", tokens, len(tokens) + 16, holder="sched-0")
        results = await cache.batch([ExtendOp(lease.lease_id, 1), HeartbeatOp("sched-0")])

Unary methods raise the core's exceptions (`radixmesh.errors`) for a failed
call. `batch` sends several ops on one long-lived Batch stream and returns one
result per op, in order: the value, or the exception object for an op that failed
(other ops are unaffected). A batch sent while a recording span is current (a traced
request's, which the scheduler makes current around the verbs it causes) adds one
`cache.<verb>` event per op to that span.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import grpc

from radixmesh.cache_types import CommitResult, Continuation, Lease, PoolStats
from radixmesh.errors import RadixmeshError, Unavailable, error_for_code
from radixmesh.status import status_of_number
from radixmesh.v1 import cache_pb2 as pb
from radixmesh.v1 import cache_pb2_grpc
from radixmesh.wire import page_copy_from_proto
from services.common import tracing
from services.common.health import RECONNECT_OPTIONS
from services.common.interceptor import error_from_rpc_error
from services.common.trace_interceptor import trace_metadata

_STATS_FIELDS = tuple(PoolStats.__slots__)  # PoolStats and pb.PoolStats share field names


def lease_from_pb(executor_id: str, response: pb.AcquireResponse) -> Lease:
    return Lease(
        lease_id=response.lease_id,
        executor_id=executor_id,
        page_ids=list(response.page_ids),
        num_cached_tokens=response.num_cached_tokens,
        page_copy=(
            page_copy_from_proto(response.page_copy) if response.HasField("page_copy") else None
        ),
    )


def commit_from_pb(response: pb.CommitResponse) -> CommitResult:
    return CommitResult(
        num_cached_tokens=response.num_cached_tokens,
        num_locked_pages=response.num_locked_pages,
    )


def match_from_pb(response: pb.MatchResponse) -> dict[str, int]:
    return {m.executor_id: m.num_cached_tokens for m in response.matches}


def stats_from_pb(response: pb.GetStatsResponse) -> list[PoolStats]:
    return [PoolStats(**{f: getattr(p, f) for f in _STATS_FIELDS}) for p in response.pools]


@dataclass(frozen=True, slots=True)
class AcquireOp:
    executor_id: str
    token_ids: Sequence[int]
    num_tokens: int
    holder: str
    field: ClassVar[str] = "acquire"

    def request(self) -> pb.AcquireRequest:
        return pb.AcquireRequest(
            executor_id=self.executor_id,
            token_ids=self.token_ids,
            num_tokens=self.num_tokens,
            holder=self.holder,
        )

    def result(self, response: pb.AcquireResponse) -> Lease:
        return lease_from_pb(self.executor_id, response)


@dataclass(frozen=True, slots=True)
class ExtendOp:
    lease_id: str
    num_pages: int
    field: ClassVar[str] = "extend"

    def request(self) -> pb.ExtendRequest:
        return pb.ExtendRequest(lease_id=self.lease_id, num_pages=self.num_pages)

    def result(self, response: pb.ExtendResponse) -> list[int]:
        return list(response.page_ids)


@dataclass(frozen=True, slots=True)
class CommitOp:
    lease_id: str
    token_ids: Sequence[int]
    keep_locked: bool = False
    """Keep the lease as a lock on the committed path (a context hold)."""
    field: ClassVar[str] = "commit"

    def request(self) -> pb.CommitRequest:
        return pb.CommitRequest(
            lease_id=self.lease_id, token_ids=self.token_ids, keep_locked=self.keep_locked
        )

    def result(self, response: pb.CommitResponse) -> CommitResult:
        return commit_from_pb(response)


@dataclass(frozen=True, slots=True)
class ReleaseOp:
    lease_id: str
    field: ClassVar[str] = "release"

    def request(self) -> pb.ReleaseRequest:
        return pb.ReleaseRequest(lease_id=self.lease_id)

    def result(self, response: pb.ReleaseResponse) -> None:
        return None


@dataclass(frozen=True, slots=True)
class MatchOp:
    token_ids: Sequence[int]
    model: str | None = None
    field: ClassVar[str] = "match"

    def request(self) -> pb.MatchRequest:
        return pb.MatchRequest(token_ids=self.token_ids, model=self.model or "")

    def result(self, response: pb.MatchResponse) -> dict[str, int]:
        return match_from_pb(response)


@dataclass(frozen=True, slots=True)
class HeartbeatOp:
    holder: str
    field: ClassVar[str] = "heartbeat"

    def request(self) -> pb.HeartbeatRequest:
        return pb.HeartbeatRequest(holder=self.holder)

    def result(self, response: pb.HeartbeatResponse) -> int:
        return response.num_leases


CacheOp = AcquireOp | ExtendOp | CommitOp | ReleaseOp | MatchOp | HeartbeatOp
"""One verb for `CacheClient.batch`; `field` names its slot in the CacheOp oneof."""
BatchResult = Lease | list[int] | CommitResult | None | dict[str, int] | int | RadixmeshError


def _result_from_pb(op: CacheOp, result: pb.CacheOpResult) -> BatchResult:
    if result.error_code:
        return error_for_code(status_of_number(result.error_code).name, result.error_message)
    return op.result(getattr(result, op.field))


def _note_verbs(span: Any, ops: Sequence[CacheOp], results: Sequence[Any], start_s: float) -> None:
    """Each verb of a traced request's batch as a `cache.<verb>` event of the caller's span:
    at the batch's start, with its round trip in `radixmesh.duration_ms` and a failed verb's
    code in `radixmesh.code` (an event costs the SDK a few microseconds, a span of its own
    in the cache service a few hundred, created, encoded and exported)."""
    duration_ms = round((time.monotonic() - start_s) * 1e3, 3)
    # never before the span's own start: the span may carry the SDK's wall-clock reading,
    # from which the monotonic clock's conversion drifts as the wall clock is slewed
    at_ns = max(tracing.epoch_ns(start_s), getattr(span, "start_time", None) or 0)
    for op, result in zip(ops, results, strict=True):
        attrs: dict[str, Any] = {"radixmesh.duration_ms": duration_ms}
        if isinstance(result, BaseException):
            attrs["radixmesh.code"] = getattr(result, "code", "UNAVAILABLE")
        span.add_event(f"cache.{op.field}", attrs, timestamp=at_ns)


class CacheClient:
    def __init__(self, address: str, timeout_s: float = 10.0) -> None:
        self.address = address
        self._timeout = timeout_s
        # a restarted cache service is reached again within a second
        self._channel = grpc.aio.insecure_channel(address, options=RECONNECT_OPTIONS)
        self._stub = cache_pb2_grpc.CacheStub(self._channel)
        self._op_ids = itertools.count(1)
        self._stream: Any = None  # the open BatchMany call
        self._reader: asyncio.Task | None = None
        self._pending: dict[int, asyncio.Future] = {}
        self._outbox: list[pb.CacheOp] = []
        """Ops queued for the stream, in order: the writer sends all there are in one message."""
        self._writer: asyncio.Task | None = None
        self.num_messages = 0
        """CacheOps messages written so far (each carries every op queued when it was sent)."""
        self.num_received = 0
        """CacheResults messages read so far."""

    async def __aenter__(self) -> CacheClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Ends the Batch stream and the channel."""
        if self._writer is not None:
            self._writer.cancel()
        if self._stream is not None:
            self._stream.cancel()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)
        await self._channel.close()

    # ---- unary verbs (mirroring CacheCore) ----

    async def register_pool(
        self, executor_id: str, model: str, num_pages: int, page_size: int
    ) -> None:
        await self._call(
            self._stub.RegisterPool,
            pb.RegisterPoolRequest(
                executor_id=executor_id, model=model, num_pages=num_pages, page_size=page_size
            ),
        )

    async def unregister_pool(self, executor_id: str) -> int:
        response = await self._call(
            self._stub.UnregisterPool, pb.UnregisterPoolRequest(executor_id=executor_id)
        )
        return response.num_leases_dropped

    async def match(self, token_ids: Sequence[int], model: str | None = None) -> dict[str, int]:
        return await self._run(self._stub.Match, MatchOp(token_ids, model))

    async def acquire(
        self, executor_id: str, token_ids: Sequence[int], num_tokens: int, holder: str
    ) -> Lease:
        return await self._run(
            self._stub.Acquire, AcquireOp(executor_id, token_ids, num_tokens, holder)
        )

    async def extend(self, lease_id: str, num_pages: int) -> list[int]:
        return await self._run(self._stub.Extend, ExtendOp(lease_id, num_pages))

    async def commit(
        self, lease_id: str, token_ids: Sequence[int], keep_locked: bool = False
    ) -> CommitResult:
        return await self._run(self._stub.Commit, CommitOp(lease_id, token_ids, keep_locked))

    async def release(self, lease_id: str) -> None:
        await self._run(self._stub.Release, ReleaseOp(lease_id))

    async def heartbeat(self, holder: str) -> int:
        return await self._run(self._stub.Heartbeat, HeartbeatOp(holder))

    async def stats(self, executor_id: str | None = None) -> list[PoolStats]:
        response = await self._call(
            self._stub.GetStats, pb.GetStatsRequest(executor_id=executor_id or "")
        )
        return stats_from_pb(response)

    async def continuation(
        self, token_ids: Sequence[int], model: str | None, max_tokens: int
    ) -> Continuation:
        """Read-only: the cached tokens after the longest match of `token_ids` (see
        `CacheCore.continuation`)."""
        response = await self._call(
            self._stub.GetContinuation,
            pb.GetContinuationRequest(
                token_ids=token_ids, model=model or "", max_tokens=max_tokens
            ),
        )
        return Continuation(
            response.executor_id, response.num_matched_tokens, list(response.token_ids)
        )

    # ---- result cache and sessions ----

    async def get_result(self, key: str) -> bytes | None:
        response = await self._call(self._stub.GetResult, pb.GetResultRequest(key=key))
        return response.value if response.found else None

    async def put_result(self, key: str, value: bytes) -> None:
        await self._call(self._stub.PutResult, pb.PutResultRequest(key=key, value=value))

    async def get_session(self, session_id: str) -> list[int] | None:
        response = await self._call(
            self._stub.GetSession, pb.GetSessionRequest(session_id=session_id)
        )
        return list(response.token_ids) if response.found else None

    async def put_session(self, session_id: str, token_ids: Sequence[int]) -> None:
        await self._call(
            self._stub.PutSession, pb.PutSessionRequest(session_id=session_id, token_ids=token_ids)
        )

    # ---- the Batch stream ----

    async def batch(self, ops: Sequence[CacheOp]) -> list[BatchResult]:
        """Runs `ops` in order on the BatchMany stream; one result per op (an exception object
        for a failed op). Raises Unavailable if the stream itself breaks. Ops of calls made
        while a message is being written go out together in the next one (`_write`)."""
        if not ops:
            return []
        loop = asyncio.get_running_loop()
        waits = []
        span = tracing.recording_span()  # a traced request's: the verbs become its events
        start = time.monotonic() if span is not None else 0.0
        for op in ops:
            op_id = next(self._op_ids)
            future = loop.create_future()
            self._pending[op_id] = future
            waits.append(future)
            self._outbox.append(pb.CacheOp(op_id=op_id, **{op.field: op.request()}))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write())
        replies = await asyncio.gather(*waits, return_exceptions=True)
        for reply in replies:
            if isinstance(reply, BaseException):
                if span is not None:
                    _note_verbs(span, ops, [reply] * len(ops), start)
                raise reply
        results = [_result_from_pb(op, reply) for op, reply in zip(ops, replies, strict=True)]  # type: ignore[arg-type]
        if span is not None:
            _note_verbs(span, ops, results, start)
        return results

    async def _write(self) -> None:
        """Sends the queued ops, all of them in one CacheOps message a write, until none are
        left: the ops queued while a write is in flight go out together in the next (the
        scheduler's requests that end or are admitted in one step share a message)."""
        while self._outbox:
            ops, self._outbox = self._outbox, []
            # Counted before the write returns: the replies to a message can arrive, and its
            # callers resume, before this task does.
            self.num_messages += 1
            try:
                await self._open_stream().write(pb.CacheOps(ops=ops))
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as exc:
                self.num_messages -= 1
                self._outbox = []  # not sent: their callers get the error below
                self._fail_pending(
                    Unavailable(f"cache Batch stream to {self.address} broke: {exc}")
                )
                return

    def _open_stream(self) -> Any:
        if self._stream is None or self._stream.done():
            self._stream = self._stub.BatchMany()
            self._reader = asyncio.create_task(self._read(self._stream))
        return self._stream

    async def _read(self, stream: Any) -> None:
        error: RadixmeshError = Unavailable(f"cache Batch stream to {self.address} ended")
        try:
            while True:
                message = await stream.read()
                if message is grpc.aio.EOF:
                    break
                self.num_received += 1
                for result in message.results:
                    future = self._pending.pop(result.op_id, None)
                    if future is not None and not future.done():
                        future.set_result(result)
        except grpc.aio.AioRpcError as exc:
            error = Unavailable(
                f"cache Batch stream to {self.address} broke: {error_from_rpc_error(exc)}"
            )
        except asyncio.CancelledError:
            error = Unavailable("cache client closed")
        finally:
            self._fail_pending(error)

    def _fail_pending(self, error: RadixmeshError) -> None:
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(error)

    async def _run(self, method: Any, op: CacheOp) -> Any:
        return op.result(await self._call(method, op.request()))  # type: ignore[arg-type]

    async def _call(self, method: Any, request: Any) -> Any:
        try:
            return await method(request, timeout=self._timeout, metadata=trace_metadata())
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc_error(exc) from None
