"""The Cache gRPC servicer: convert, call the core or the store, convert.

Errors are the core's exceptions; the shared interceptor maps them to status codes
on unary calls. On the Batch stream each op is answered with a `CacheOpResult` that
carries the error's code and message instead, so one bad op never ends the stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from opentelemetry import trace
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from radixmesh.errors import InvalidArgument
from radixmesh.v1 import cache_pb2 as pb
from radixmesh.v1 import cache_pb2_grpc
from services.cache import convert
from services.cache.core import CacheCore
from services.cache.store import Store
from services.common import tracing
from services.common.interceptor import status_code_of
from services.common.logging import get_logger
from services.common.metrics import counter

SERVICE_NAME = "radixmesh.v1.Cache"

log = get_logger(__name__)

EXPIRED_LEASES = counter(
    "cache", "expired_leases_total", "Leases freed because their holder went silent."
)


class CacheServicer(cache_pb2_grpc.CacheServicer):
    def __init__(self, core: CacheCore, store: Store) -> None:
        self._core = core
        self._store = store
        # Batch op name -> (handler, CacheOpResult field); the same handlers serve unary calls.
        self._ops: dict[str, Callable] = {
            "acquire": self._acquire,
            "extend": self._extend,
            "commit": self._commit,
            "release": self._release,
            "match": self._match,
            "heartbeat": self._heartbeat,
        }

    # ---- verbs on the core (each a plain function of one request message) ----

    def _run_verb(self, name: str, request: Any, traceparent: str = "") -> Any:
        """One verb, under a `cache.<verb>` span when a sampled traced request caused it: a
        child of the span that `traceparent` names. A verb nothing traced caused (a
        heartbeat, an untraced or unsampled request's verb) makes no span; a unary call
        with a traceparent in its metadata is the RPC's server span (trace_interceptor)."""
        if not tracing.sampled(traceparent) or not tracing.enabled():
            return self._ops[name](request)
        attributes = {"radixmesh.verb": name}
        for field_name in ("executor_id", "lease_id", "holder"):
            value = getattr(request, field_name, None)
            if value:
                attributes[f"radixmesh.{field_name}"] = value
        span = tracing.tracer("radixmesh.cache").start_span(  # not made current: the
            f"cache.{name}",  # verb starts nothing that would need it as a parent
            context=tracing.context_from_traceparent(traceparent),
            attributes=attributes,
        )
        try:
            return self._ops[name](request)
        except Exception as exc:
            span.record_exception(exc)
            span.set_status(trace.Status(trace.StatusCode.ERROR, str(exc)))
            raise
        finally:
            span.end()

    def _acquire(self, request: pb.AcquireRequest) -> pb.AcquireResponse:
        lease = self._core.acquire(
            request.executor_id, list(request.token_ids), request.num_tokens, request.holder
        )
        return convert.lease_to_pb(lease)

    def _extend(self, request: pb.ExtendRequest) -> pb.ExtendResponse:
        return pb.ExtendResponse(page_ids=self._core.extend(request.lease_id, request.num_pages))

    def _commit(self, request: pb.CommitRequest) -> pb.CommitResponse:
        return convert.commit_to_pb(
            self._core.commit(request.lease_id, list(request.token_ids), request.keep_locked)
        )

    def _release(self, request: pb.ReleaseRequest) -> pb.ReleaseResponse:
        self._core.release(request.lease_id)
        return pb.ReleaseResponse()

    def _match(self, request: pb.MatchRequest) -> pb.MatchResponse:
        return convert.match_to_pb(self._core.match(list(request.token_ids), request.model or None))

    def _heartbeat(self, request: pb.HeartbeatRequest) -> pb.HeartbeatResponse:
        return pb.HeartbeatResponse(num_leases=self._core.heartbeat(request.holder))

    # ---- unary RPCs ----

    async def RegisterPool(self, request, context) -> pb.RegisterPoolResponse:
        self._core.register_pool(
            request.executor_id, request.model, request.num_pages, request.page_size
        )
        log.info(
            "pool_registered",
            executor_id=request.executor_id,
            model=request.model,
            num_pages=request.num_pages,
            page_size=request.page_size,
        )
        return pb.RegisterPoolResponse()

    async def UnregisterPool(self, request, context) -> pb.UnregisterPoolResponse:
        num = self._core.unregister_pool(request.executor_id)
        log.info("pool_unregistered", executor_id=request.executor_id, num_leases_dropped=num)
        return pb.UnregisterPoolResponse(num_leases_dropped=num)

    async def Match(self, request, context) -> pb.MatchResponse:
        return self._match(request)

    async def Acquire(self, request, context) -> pb.AcquireResponse:
        return self._acquire(request)

    async def Extend(self, request, context) -> pb.ExtendResponse:
        return self._extend(request)

    async def Commit(self, request, context) -> pb.CommitResponse:
        return self._commit(request)

    async def Release(self, request, context) -> pb.ReleaseResponse:
        return self._release(request)

    async def Heartbeat(self, request, context) -> pb.HeartbeatResponse:
        return self._heartbeat(request)

    async def GetStats(self, request, context) -> pb.GetStatsResponse:
        return convert.stats_to_pb(self._core.stats(request.executor_id or None))

    async def GetContinuation(self, request, context) -> pb.GetContinuationResponse:
        found = self._core.continuation(
            list(request.token_ids), request.model or None, request.max_tokens
        )
        return pb.GetContinuationResponse(
            executor_id=found.executor_id,
            num_matched_tokens=found.num_matched_tokens,
            token_ids=found.token_ids,
        )

    async def GetResult(self, request, context) -> pb.GetResultResponse:
        value = await self._store.get_result(request.key)
        return pb.GetResultResponse(found=value is not None, value=value or b"")

    async def PutResult(self, request, context) -> pb.PutResultResponse:
        await self._store.put_result(request.key, request.value)
        return pb.PutResultResponse()

    async def GetSession(self, request, context) -> pb.GetSessionResponse:
        token_ids = await self._store.get_session(request.session_id)
        return pb.GetSessionResponse(found=token_ids is not None, token_ids=token_ids or [])

    async def PutSession(self, request, context) -> pb.PutSessionResponse:
        await self._store.put_session(request.session_id, list(request.token_ids))
        return pb.PutSessionResponse()

    # ---- the Batch stream ----

    async def Batch(self, request_iterator, context) -> AsyncIterator[pb.CacheOpResult]:
        async for op in request_iterator:
            yield self.run_op(op)

    async def BatchMany(self, request_iterator, context) -> AsyncIterator[pb.CacheOpResults]:
        async for message in request_iterator:
            yield pb.CacheOpResults(results=[self.run_op(op) for op in message.ops])

    def run_op(self, op: pb.CacheOp) -> pb.CacheOpResult:
        """One batched op -> its result; a failure becomes error_code/error_message."""
        name = op.WhichOneof("op")
        try:
            if name is None:
                raise InvalidArgument(
                    "op must be one of acquire, extend, commit, release, match, heartbeat"
                )
            response = self._run_verb(name, getattr(op, name), op.traceparent)
        except Exception as exc:
            code = status_code_of(exc)
            if code.name == "INTERNAL":
                log.exception("batch_op_failed", op=name, op_id=op.op_id)
            return pb.CacheOpResult(
                op_id=op.op_id, error_code=code.value[0], error_message=str(exc)
            )
        return pb.CacheOpResult(op_id=op.op_id, **{name: response})


async def run_lease_expiry(core: CacheCore, interval_s: float) -> None:
    """Every `interval_s`, free the leases of holders whose TTL ran out (until cancelled)."""
    while True:
        await asyncio.sleep(interval_s)
        expired = core.expire()
        if expired:
            EXPIRED_LEASES.inc(len(expired))
            log.warning("leases_expired", num_leases=len(expired), lease_ids=expired[:16])


class CacheMetricsCollector(Collector):
    """`radixmesh_cache_*` read from the core's counters at scrape time (no hot-path cost)."""

    GAUGES = (
        ("free_pages", "Free pages in the pool.", lambda s: s.num_free_pages),
        ("used_pages", "Pages leased or cached.", lambda s: s.num_pages - s.num_free_pages),
        ("leased_pages", "Pages held by leases and not in the tree.", lambda s: s.num_leased_pages),
        ("cached_pages", "Pages in the radix tree.", lambda s: s.num_cached_pages),
        ("locked_pages", "Cached pages locked by a lease.", lambda s: s.num_locked_pages),
        ("leases", "Live leases.", lambda s: s.num_leases),
    )
    COUNTERS = (
        ("prefix_queries", "Prefix lookups (match and acquire).", lambda s: s.num_prefix_queries),
        ("prefix_query_tokens", "Tokens looked up.", lambda s: s.num_query_tokens),
        ("prefix_hit_tokens", "Tokens found cached.", lambda s: s.num_prefix_hit_tokens),
        ("evicted_pages", "Pages evicted from the tree.", lambda s: s.num_evicted_pages),
    )

    def __init__(self, core: CacheCore) -> None:
        self._core = core

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        stats = self._core.stats()
        for name, doc, read in self.GAUGES:
            family = GaugeMetricFamily(f"radixmesh_cache_{name}", doc, labels=["executor_id"])
            for s in stats:
                family.add_metric([s.executor_id], read(s))
            yield family
        for name, doc, read in self.COUNTERS:
            total = CounterMetricFamily(f"radixmesh_cache_{name}", doc, labels=["executor_id"])
            for s in stats:
                total.add_metric([s.executor_id], read(s))
            yield total
