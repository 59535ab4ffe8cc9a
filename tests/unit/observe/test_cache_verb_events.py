"""A traced request's cache verbs are timed events of its span, sent over the real Batch stream."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import grpc
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from radixmesh.cache_types import Lease
from radixmesh.errors import NotFound
from radixmesh.v1 import cache_pb2_grpc
from services.cache.client import AcquireOp, CacheClient, HeartbeatOp, MatchOp, ReleaseOp
from services.cache.core import CacheCore
from services.cache.server import CacheServicer
from services.cache.store import InProcessStore, StoreConfig
from services.common import tracing
from tests.fixtures.otlp import spans_in_memory
from tests.fixtures.runtime import running_runtime

SAMPLED = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
UNSAMPLED = SAMPLED[:-2] + "00"


class SeenServicer(CacheServicer):
    """The cache servicer, keeping the traceparent each op arrived with."""

    def __init__(self) -> None:
        core = CacheCore()
        core.register_pool("exec-0", "m", 16, 4)
        super().__init__(core, InProcessStore(StoreConfig()))
        self.traceparents: list[str] = []

    def run_op(self, op):
        self.traceparents.append(op.traceparent)
        return super().run_op(op)


@contextlib.asynccontextmanager
async def cache(servicer: CacheServicer) -> AsyncIterator[CacheClient]:
    def register(server: grpc.aio.Server) -> None:
        cache_pb2_grpc.add_CacheServicer_to_server(servicer, server)

    async with (
        running_runtime(register, ["radixmesh.v1.Cache"]) as runtime,
        CacheClient(runtime.address) as client,
    ):
        yield client


@pytest.fixture
def exported(monkeypatch) -> InMemorySpanExporter:
    exporter = spans_in_memory(monkeypatch, sample_rate=1.0)
    monkeypatch.setattr("services.common.server.shutdown_tracing", lambda: None)
    return exporter


async def test_a_traced_batch_adds_an_event_per_verb_and_the_cache_makes_no_span(exported):
    servicer = SeenServicer()
    t = tracing.tracer("t")
    async with cache(servicer) as client:
        span = t.start_span("scheduler.request", context=tracing.context_from_traceparent(SAMPLED))
        with trace.use_span(span, end_on_exit=True):
            lease, matches = await client.batch(
                [AcquireOp("exec-0", [1, 2, 3], 8, "s"), MatchOp([1, 2, 3])]
            )
            (missing,) = await client.batch([ReleaseOp("no-such-lease")])
        await client.batch([HeartbeatOp("s")])  # no span current: nothing to note
        unsampled = t.start_span("gateway", context=tracing.context_from_traceparent(UNSAMPLED))
        with trace.use_span(unsampled, end_on_exit=True):
            await client.batch([MatchOp([1, 2, 3])])
    assert isinstance(lease, Lease) and matches == {"exec-0": 0}
    assert isinstance(missing, NotFound)
    # one span in all: the caller's; the cache service made none, nor got a traceparent
    (finished,) = exported.get_finished_spans()
    assert finished.name == "scheduler.request"
    assert servicer.traceparents == ["", "", "", "", ""]
    events = [(e.name, dict(e.attributes)) for e in finished.events]
    assert [name for name, _ in events] == ["cache.acquire", "cache.match", "cache.release"]
    acquire, match, release = (attrs for _, attrs in events)
    assert acquire["radixmesh.duration_ms"] == match["radixmesh.duration_ms"] > 0
    assert "radixmesh.code" not in acquire and "radixmesh.code" not in match
    assert release["radixmesh.code"] == "NOT_FOUND"
    at = [e.timestamp for e in finished.events]
    assert finished.start_time <= at[0] == at[1] <= at[2] <= finished.end_time


async def test_with_tracing_off_a_batch_notes_nothing(monkeypatch):
    monkeypatch.setitem(tracing._STATE, "provider", None)
    servicer = SeenServicer()
    async with cache(servicer) as client:
        assert tracing.recording_span() is None
        (matches,) = await client.batch([MatchOp([1, 2])])
    assert matches == {"exec-0": 0} and servicer.traceparents == [""]
