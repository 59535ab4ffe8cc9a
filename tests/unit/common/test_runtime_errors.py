"""Core exceptions reach clients as precise status codes, on every handler shape."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from radixmesh import errors
from radixmesh.v1 import cache_pb2, inference_pb2
from services.common.interceptor import error_from_rpc_error, error_from_status, status_code_of

ERROR_CLASSES = errors.RadixmeshError.__subclasses__()


def expected_code(cls: type[errors.RadixmeshError]) -> grpc.StatusCode:
    return grpc.StatusCode[cls.code]


def test_every_error_class_names_a_real_status_code():
    assert len(ERROR_CLASSES) >= 8
    for cls in ERROR_CLASSES:
        assert status_code_of(cls("x")) is expected_code(cls)
        assert status_code_of(cls("x")) is not grpc.StatusCode.INTERNAL


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda cls: cls.__name__)
def test_error_from_status_inverts_status_code_of(cls):
    error = error_from_status(expected_code(cls), "lease 7 is unknown")
    assert type(error) is cls
    assert str(error) == "lease 7 is unknown"
    assert error_from_status(expected_code(cls).name, "m").__class__ is cls


def test_status_without_a_class_keeps_its_code():
    error = error_from_status(grpc.StatusCode.PERMISSION_DENIED, "no")
    assert type(error) is errors.RadixmeshError
    assert status_code_of(error) is grpc.StatusCode.PERMISSION_DENIED


def test_plain_exceptions_map_to_their_meaning():
    assert status_code_of(ValueError("x")) is grpc.StatusCode.INTERNAL
    assert status_code_of(errors.RadixmeshError("x")) is grpc.StatusCode.INTERNAL
    assert status_code_of(NotImplementedError()) is grpc.StatusCode.UNIMPLEMENTED
    assert status_code_of(TimeoutError()) is grpc.StatusCode.DEADLINE_EXCEEDED
    assert status_code_of(asyncio.CancelledError()) is grpc.StatusCode.CANCELLED


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda cls: cls.__name__)
async def test_unary_unary_error_maps_to_code_and_message(mesh, cls):
    mesh.cache.error = cls("pool e0 is full")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await mesh.cache_stub.Match(cache_pb2.MatchRequest(token_ids=[1, 2]))
    assert caught.value.code() is expected_code(cls)
    assert caught.value.details() == "pool e0 is full"
    remote = error_from_rpc_error(caught.value)
    assert type(remote) is cls and str(remote) == "pool e0 is full"


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda cls: cls.__name__)
async def test_unary_stream_error_mid_stream(mesh, cls):
    mesh.inference.error = cls("request r1 gone")
    call = mesh.inference_stub.Generate(inference_pb2.GenerateRequest(request_id="r1"))
    received = []
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        async for response in call:
            received.append(response.request_id)
    assert received == ["r1-0", "r1-1"]
    assert caught.value.code() is expected_code(cls)
    assert caught.value.details() == "request r1 gone"


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda cls: cls.__name__)
async def test_stream_stream_error_mid_stream(mesh, cls):
    mesh.cache.error = cls("op 3 refused")
    ops = [cache_pb2.CacheOp(op_id=i) for i in range(1, 5)]
    call = mesh.cache_stub.Batch(iter(ops))
    received = []
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        async for result in call:
            received.append(result.op_id)
    assert received == [1, 2]
    assert caught.value.code() is expected_code(cls)
    assert caught.value.details() == "op 3 refused"


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda cls: cls.__name__)
async def test_stream_unary_error_after_some_requests(mesh, cls):
    mesh.raw.error = cls("third chunk not read")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await mesh.raw_sum()(iter([b"1", b"2", b"3"]))
    assert caught.value.code() is expected_code(cls)
    assert caught.value.details() == "third chunk not read"


async def test_stream_unary_without_error_returns_the_sum(mesh):
    mesh.raw.num_ok = 10
    assert await mesh.raw_sum()(iter([b"1", b"2", b"39"])) == b"42"


@pytest.mark.parametrize("cls", [errors.NotFound, errors.ResourceExhausted])
async def test_write_style_stream_error_after_writes(mesh, cls):
    mesh.raw.error = cls("writer stopped")
    call = mesh.raw_write()(b"go")
    received = []
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        async for message in call:
            received.append(message)
    assert received == [b"0", b"1"]
    assert caught.value.code() is expected_code(cls)


async def test_unexpected_exception_is_internal_without_its_text(mesh):
    mesh.cache.error = ValueError("secret internals")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await mesh.cache_stub.Match(cache_pb2.MatchRequest())
    assert caught.value.code() is grpc.StatusCode.INTERNAL
    assert "ValueError" in caught.value.details()
    assert "secret internals" not in caught.value.details()


async def test_unexpected_exception_mid_stream_is_internal(mesh):
    mesh.inference.error = KeyError("k")
    call = mesh.inference_stub.Generate(inference_pb2.GenerateRequest(request_id="r"))
    received = []
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        async for response in call:
            received.append(response.request_id)
    assert received == ["r-0", "r-1"]
    assert caught.value.code() is grpc.StatusCode.INTERNAL


async def test_handler_abort_passes_through_unchanged(mesh):
    mesh.cache.abort_with = (grpc.StatusCode.PERMISSION_DENIED, "key k1 may not match")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await mesh.cache_stub.Match(cache_pb2.MatchRequest())
    assert caught.value.code() is grpc.StatusCode.PERMISSION_DENIED
    assert caught.value.details() == "key k1 may not match"


async def test_unimplemented_method_is_unimplemented(mesh):
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await mesh.cache_stub.GetStats(cache_pb2.GetStatsRequest())
    assert caught.value.code() is grpc.StatusCode.UNIMPLEMENTED


async def test_client_cancel_reaches_the_handler_and_closes_its_generator(mesh):
    mesh.inference.block = True
    call = mesh.inference_stub.Generate(inference_pb2.GenerateRequest(request_id="c"))
    assert (await call.read()).request_id == "c-0"
    assert (await call.read()).request_id == "c-1"
    call.cancel()
    # The handler would block forever: its body exits only because the cancel reached it.
    await asyncio.wait_for(mesh.inference.closed.wait(), timeout=5)
    assert call.cancelled()


async def test_successful_calls_pass_values_through(mesh):
    response = await mesh.cache_stub.Match(cache_pb2.MatchRequest(token_ids=[5, 6, 7]))
    assert [(m.executor_id, m.num_cached_tokens) for m in response.matches] == [("e0", 3)]
    mesh.cache.num_ok = 100
    ops = [cache_pb2.CacheOp(op_id=i) for i in range(1, 6)]
    assert [r.op_id async for r in mesh.cache_stub.Batch(iter(ops))] == [1, 2, 3, 4, 5]
