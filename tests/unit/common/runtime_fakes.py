"""Fake servicers on a real loopback server, for the service runtime's tests.

`FakeCache` (Match: unary-unary, Batch: stream-stream), `FakeInference`
(Generate: unary-stream) and `RawService` (Sum: stream-unary over raw bytes,
Write: unary-stream written with `context.write`) each answer `num_ok`
messages, then raise `error` when one is set.
"""

from __future__ import annotations

import asyncio

import grpc

from radixmesh.v1 import cache_pb2, cache_pb2_grpc, inference_pb2, inference_pb2_grpc
from services.common.config import ServerConfig
from services.common.logging import get_logger
from services.common.server import ServiceRuntime

CACHE = "radixmesh.v1.Cache"
INFERENCE = "radixmesh.v1.Inference"
RAW = "radixmesh.test.Raw"

log = get_logger("tests.common.fakes")


class Failing:
    """Shared knobs: answer `num_ok` messages, then raise `error` (if set)."""

    def __init__(self) -> None:
        self.error: BaseException | None = None
        self.num_ok = 2
        self.abort_with: tuple[grpc.StatusCode, str] | None = None
        self.block = False  # after num_ok messages, wait until cancelled
        self.closed = asyncio.Event()  # set when a streaming handler's body exits
        self.cancelled = asyncio.Event()

    async def after_ok(self, context: grpc.aio.ServicerContext) -> None:
        if self.abort_with is not None:
            await context.abort(*self.abort_with)
        if self.error is not None:
            raise self.error
        if self.block:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled.set()
                raise


class FakeCache(cache_pb2_grpc.CacheServicer, Failing):
    async def Match(self, request, context):
        log.info("match_handled", num_tokens=len(request.token_ids))
        await self.after_ok(context)
        match = cache_pb2.PoolMatch(executor_id="e0", num_cached_tokens=len(request.token_ids))
        return cache_pb2.MatchResponse(matches=[match])

    async def Batch(self, request_iterator, context):
        num_sent = 0
        try:
            async for op in request_iterator:
                if num_sent == self.num_ok:
                    await self.after_ok(context)
                yield cache_pb2.CacheOpResult(op_id=op.op_id)
                num_sent += 1
        finally:
            self.closed.set()


class FakeInference(inference_pb2_grpc.InferenceServicer, Failing):
    async def Generate(self, request, context):
        try:
            for i in range(self.num_ok):
                yield inference_pb2.GenerateResponse(request_id=f"{request.request_id}-{i}")
            await self.after_ok(context)
        finally:
            self.closed.set()


class RawService(Failing):
    """A stream-unary and a write-style unary-stream method on raw bytes (no proto)."""

    async def sum(self, request_iterator, context) -> bytes:
        total = 0
        num_read = 0
        async for chunk in request_iterator:
            total += int(chunk)
            num_read += 1
            if num_read == self.num_ok:
                await self.after_ok(context)
        return str(total).encode()

    async def write(self, request: bytes, context) -> None:
        for i in range(self.num_ok):
            await context.write(b"%d" % i)
        await self.after_ok(context)

    def register(self, server: grpc.aio.Server) -> None:
        handlers = {
            "Sum": grpc.stream_unary_rpc_method_handler(self.sum),
            "Write": grpc.unary_stream_rpc_method_handler(self.write),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(RAW, handlers),))


class Mesh:
    """A started runtime serving the three fakes, plus a channel to it."""

    def __init__(self, runtime: ServiceRuntime) -> None:
        self.runtime = runtime
        self.cache = FakeCache()
        self.inference = FakeInference()
        self.raw = RawService()
        self.channel: grpc.aio.Channel | None = None

    def register(self, server: grpc.aio.Server) -> None:
        cache_pb2_grpc.add_CacheServicer_to_server(self.cache, server)
        inference_pb2_grpc.add_InferenceServicer_to_server(self.inference, server)
        self.raw.register(server)

    async def start(self) -> Mesh:
        await self.runtime.start(self.register, [CACHE, INFERENCE])
        self.channel = grpc.aio.insecure_channel(self.runtime.address)
        return self

    @property
    def cache_stub(self) -> cache_pb2_grpc.CacheStub:
        return cache_pb2_grpc.CacheStub(self.channel)

    @property
    def inference_stub(self) -> inference_pb2_grpc.InferenceStub:
        return inference_pb2_grpc.InferenceStub(self.channel)

    def raw_sum(self):
        return self.channel.stream_unary(f"/{RAW}/Sum")

    def raw_write(self):
        return self.channel.unary_stream(f"/{RAW}/Write")


async def start_mesh(**config) -> Mesh:
    """A mesh on a free loopback port; `config` overrides ServerConfig fields."""
    fields = {"name": "common_test", "grace_seconds": 1.0, **config}
    return await Mesh(ServiceRuntime(ServerConfig(**fields))).start()
