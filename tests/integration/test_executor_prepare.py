"""PrepareConstraint: the executor service compiles a constraint into its grammar cache,
called directly and through the scheduler's RemoteExecutor port."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc
import pytest

from mesh.tiny_model import write_tiny_model
from radixmesh.errors import InvalidArgument
from radixmesh.sampling import Constraint, ConstraintKind
from radixmesh.v1 import executor_pb2, executor_pb2_grpc
from radixmesh.v1 import inference_pb2 as ipb
from services.executor.core.config import ExecutorConfig
from services.executor.main import load
from services.executor.server import SERVICE_NAME, ExecutorServicer
from services.scheduler.remote import RemoteExecutor
from tests.fixtures.runtime import running_runtime


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("tiny-prepare"), arch="llama", seed=0)


@contextlib.asynccontextmanager
async def serve(model_dir, *, grammar: bool) -> AsyncIterator[tuple[ExecutorServicer, str]]:
    config = ExecutorConfig(model_path=str(model_dir), device="cpu", page_size=4, num_pages=16)
    core, grammar_service = await asyncio.get_running_loop().run_in_executor(
        None, load, config, grammar
    )
    servicer = ExecutorServicer()
    servicer.attach(core, "executor-test", grammar_service)

    def register(server: grpc.aio.Server) -> None:
        executor_pb2_grpc.add_ExecutorServicer_to_server(servicer, server)

    try:
        async with running_runtime(register, [SERVICE_NAME]) as runtime:
            yield servicer, runtime.address
    finally:
        await servicer.close()


def request(**constraint) -> executor_pb2.PrepareConstraintRequest:
    return executor_pb2.PrepareConstraintRequest(constraint=ipb.Constraint(**constraint))


async def test_a_constraint_is_compiled_once_then_found_in_the_cache(model_dir):
    async with (
        serve(model_dir, grammar=True) as (servicer, address),
        grpc.aio.insecure_channel(address) as channel,
    ):
        stub = executor_pb2_grpc.ExecutorStub(channel)
        first = await stub.PrepareConstraint(request(regex="[a-z]{2,5}"))
        again = await stub.PrepareConstraint(request(regex="[a-z]{2,5}"))
        metrics = servicer._grammar.metrics
        assert (metrics.num_compiles, metrics.num_cache_misses, metrics.num_cache_hits) == (1, 1, 1)
        assert first.compile_seconds > 0
        assert again.compile_seconds < first.compile_seconds
        with pytest.raises(grpc.aio.AioRpcError) as bad:
            await stub.PrepareConstraint(request(regex="(ab"))
        assert bad.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert bad.value.details().startswith("constraint.regex: Regex parsing error")
        with pytest.raises(grpc.aio.AioRpcError) as empty:
            await stub.PrepareConstraint(executor_pb2.PrepareConstraintRequest())
        assert empty.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "constraint: must be set" in empty.value.details()


async def test_the_remote_port_raises_the_executors_reason(model_dir):
    async with serve(model_dir, grammar=True) as (servicer, address):
        port = RemoteExecutor(address)
        try:
            ok = Constraint(ConstraintKind.CHOICES, choices=("yes", "no"))
            assert await port.prepare_constraint(ok) > 0
            assert servicer._grammar.num_cached == 1
            bad = Constraint(ConstraintKind.EBNF, "root ::= ")
            with pytest.raises(InvalidArgument, match=r"constraint\.ebnf: EBNF parser error"):
                await port.prepare_constraint(bad)
        finally:
            await port.close()


async def test_an_executor_without_a_grammar_backend_refuses_constraints(model_dir):
    async with (
        serve(model_dir, grammar=False) as (_, address),
        grpc.aio.insecure_channel(address) as channel,
    ):
        stub = executor_pb2_grpc.ExecutorStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.PrepareConstraint(request(regex="a+"))
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "has no grammar backend" in refused.value.details()
