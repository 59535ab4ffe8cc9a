"""The executor service: the Step stream over a real tiny model, in-process and as a process.

In-process tests serve a real `ExecutorCore` through `ServiceRuntime` on a
loopback port; the process tests run `python -m services.executor.main` against
a `python -m services.cache.main` process and check the lifecycle end to end. Expected
tokens come from Hugging Face transformers' forward pass on the same folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import torch

from mesh.tiny_model import write_tiny_model
from radixmesh.v1 import cache_pb2, cache_pb2_grpc, executor_pb2, executor_pb2_grpc
from radixmesh.v1 import inference_pb2 as ipb
from radixmesh.wire import result_from_proto, result_to_proto, results_from_proto
from services.common.config import ServerConfig, free_port
from services.common.health import wait_for_serving
from services.common.server import ServiceRuntime
from services.executor.core.config import ExecutorConfig
from services.executor.main import load
from services.executor.server import SERVICE_NAME, ExecutorServicer
from tests.fixtures.runtime import running_runtime

REPO = Path(__file__).resolve().parents[2]
PAGE_SIZE = 4
NUM_PAGES = 64
FIRST_PLAIN_TOKEN = 6  # ids 0-5 are the tiny tokenizer's special tokens


# -- the model and its reference ---------------------------------------------


@dataclass(slots=True)
class Reference:
    path: Path
    hf: torch.nn.Module
    vocab_size: int

    def greedy(self, prompt: list[int], num_tokens: int) -> tuple[list[int], list[torch.Tensor]]:
        """Greedy tokens (EOS ignored) and the log-softmax rows they were taken from."""
        ids, tokens, logprobs = list(prompt), [], []
        with torch.no_grad():
            for _ in range(num_tokens):
                row = torch.log_softmax(self.hf(torch.tensor([ids])).logits[0, -1].float(), -1)
                token = int(torch.argmax(row))
                tokens.append(token)
                logprobs.append(row)
                ids.append(token)
        return tokens, logprobs

    def prompt(self, length: int, seed: int) -> list[int]:
        generator = torch.Generator().manual_seed(seed)
        ids = torch.randint(FIRST_PLAIN_TOKEN, self.vocab_size, (length,), generator=generator)
        return ids.tolist()


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    from transformers import AutoModelForCausalLM

    path = write_tiny_model(tmp_path_factory.mktemp("tiny-llama"), "llama", seed=0)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return Reference(path, hf, hf.config.vocab_size)


def executor_config(path: Path, **overrides) -> ExecutorConfig:
    fields = {
        "model_path": str(path),
        "device": "cpu",
        "page_size": PAGE_SIZE,
        "num_pages": NUM_PAGES,
        "max_num_seqs": 8,
    }
    return ExecutorConfig(**{**fields, **overrides})


@dataclass(slots=True)
class Served:
    servicer: ExecutorServicer
    stub: executor_pb2_grpc.ExecutorStub
    runtime: ServiceRuntime


@contextlib.asynccontextmanager
async def serve(reference: Reference, *, grammar: bool = False, **servicer_args):
    """A real core behind the servicer on a loopback port."""
    loop = asyncio.get_running_loop()
    config = executor_config(reference.path)
    core, grammar_service = await loop.run_in_executor(None, load, config, grammar)
    servicer = ExecutorServicer(**servicer_args)
    servicer.attach(core, "executor-test", grammar_service)

    def register(server: grpc.aio.Server) -> None:
        executor_pb2_grpc.add_ExecutorServicer_to_server(servicer, server)

    try:
        async with (
            running_runtime(register, [SERVICE_NAME]) as runtime,
            grpc.aio.insecure_channel(runtime.address) as channel,
        ):
            yield Served(servicer, executor_pb2_grpc.ExecutorStub(channel), runtime)
    finally:
        await servicer.close()


# -- plan builders -------------------------------------------------------------


def pages_for(num_tokens: int, first_page: int) -> list[int]:
    return list(range(first_page, first_page + -(-num_tokens // PAGE_SIZE)))


def new_seq(
    req_id: str,
    token_ids: list[int],
    page_ids: list[int],
    *,
    num_scheduled_tokens: int | None = None,
    sampling: ipb.SamplingParams | None = None,
    constraint: ipb.Constraint | None = None,
) -> executor_pb2.NewSequence:
    return executor_pb2.NewSequence(
        req_id=req_id,
        token_ids=token_ids,
        num_prompt_tokens=len(token_ids),
        num_scheduled_tokens=num_scheduled_tokens or len(token_ids),
        page_ids=page_ids,
        sampling=sampling or ipb.SamplingParams(temperature=0.0, ignore_eos=True),
        constraint=constraint,
    )


def plan(
    step_id: int,
    new: Iterable[executor_pb2.NewSequence] = (),
    running: Iterable[tuple[str, int]] = (),
    finished: Iterable[str] = (),
) -> executor_pb2.StepPlan:
    return executor_pb2.StepPlan(
        step_id=step_id,
        new_seqs=list(new),
        running_seqs=[
            executor_pb2.RunningSequence(req_id=r, num_scheduled_tokens=n) for r, n in running
        ],
        finished_req_ids=list(finished),
    )


async def read_row_by_row(call) -> executor_pb2.StepResult:
    """The next result with every row a SequenceOutput (the stream sends plain rows
    columnar; `tests/unit/protos/test_wire_columnar.py` checks that layout)."""
    msg = await call.read()
    if msg is grpc.aio.EOF:
        return msg
    return result_to_proto(result_from_proto(msg), columnar=False)


async def read_all(call) -> list[executor_pb2.StepResult]:
    """Every result left on the stream (read() style, so it mixes with earlier reads), one
    per step (a message may carry the steps after it: next_results)."""
    results = []
    while (msg := await call.read()) is not grpc.aio.EOF:
        results += [result_to_proto(r, columnar=False) for r in results_from_proto(msg)]
    return results


def tokens_of(results: list[executor_pb2.StepResult], req_id: str) -> list[int]:
    return [o.token_id for r in results for o in r.outputs if o.req_id == req_id and o.HasField("token_id")]  # fmt: skip


# -- in-process: the Step stream -----------------------------------------------


async def test_pipelined_plans_give_the_greedy_tokens_of_transformers(reference: Reference):
    """Every plan is written before any result is read: the executor reads ahead, runs in order."""
    num_tokens = 6
    prompt_a, prompt_b = reference.prompt(9, seed=1), reference.prompt(11, seed=2)
    expected_a, rows_a = reference.greedy(prompt_a, num_tokens)
    expected_b, _ = reference.greedy(prompt_b, num_tokens)
    logprobs = ipb.SamplingParams(
        temperature=0.0, ignore_eos=True, max_tokens=num_tokens, logprobs=True, top_logprobs=3
    )
    plans = [
        plan(
            1,
            new=[
                new_seq("a", prompt_a, pages_for(9 + num_tokens, 0), sampling=logprobs),
                # Chunked prefill: 6 of 11 prompt tokens now, the rest in step 2.
                new_seq("b", prompt_b, pages_for(11 + num_tokens, 8), num_scheduled_tokens=6),
            ],
        ),
        plan(2, running=[("a", 1), ("b", 5)]),
        # "a" finishes at step 6; step 7 still lists it, as a scheduler one step late does.
        *(plan(step, running=[("a", 1), ("b", 1)]) for step in range(3, 8)),
        plan(8, finished=["a", "b"]),
    ]
    async with serve(reference, max_inflight_plans=2) as served:
        call = served.stub.Step()
        for message in plans:
            await call.write(message)
        await call.done_writing()
        results = await read_all(call)
        assert await call.code() == grpc.StatusCode.OK

    assert [r.step_id for r in results] == list(range(1, 9))
    assert tokens_of(results, "a") == expected_a
    assert tokens_of(results, "b") == expected_b
    first_b = next(o for o in results[0].outputs if o.req_id == "b")
    assert not first_b.HasField("token_id")  # a non-final prefill chunk samples nothing
    finished_a = [o for r in results for o in r.outputs if o.req_id == "a" and o.finish_reason]
    assert [(o.finish_reason, o.token_id) for o in finished_a] == [("length", expected_a[-1])]
    assert not [o for o in results[6].outputs if o.req_id == "a"]  # forgotten after finishing
    outputs_a = [o for r in results for o in r.outputs if o.req_id == "a"]
    for output, token, row in zip(outputs_a, expected_a, rows_a, strict=True):
        sampled = output.logprobs.sampled
        assert sampled.token_id == token
        assert sampled.logprob == pytest.approx(float(row[token]), abs=1e-4)
        top = row.topk(3)
        assert [t.token_id for t in output.logprobs.top] == top.indices.tolist()
        assert [t.logprob for t in output.logprobs.top] == pytest.approx(top.values.tolist(), abs=1e-4)  # fmt: skip
    assert all(r.step_seconds > 0 for r in results[:7])


async def test_a_multi_step_plan_answers_each_step_and_an_abort_plan_stops_a_row(
    reference: Reference,
):
    """Plan 2 asks for 8 decode steps; plan 3, read while they run, aborts "b"."""
    prompt_a, prompt_b = reference.prompt(7, seed=6), reference.prompt(5, seed=7)
    expected_a, _ = reference.greedy(prompt_a, 6)
    greedy = ipb.SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=6)
    decodes = plan(2, running=[("a", 1), ("b", 1)])
    decodes.num_steps = 8  # "a" ends at its 6th token, inside the plan
    plans = [
        plan(1, new=[new_seq("a", prompt_a, pages_for(13, 0), sampling=greedy),
                     new_seq("b", prompt_b, pages_for(13, 8))]),
        decodes,
        executor_pb2.StepPlan(step_id=3, abort_req_ids=["b"]),
    ]  # fmt: skip
    async with serve(reference, max_inflight_plans=2) as served:
        call = served.stub.Step()
        for message in plans:
            await call.write(message)
        await call.done_writing()
        results = await read_all(call)
        assert await call.code() == grpc.StatusCode.OK
        assert not served.servicer._core.has_seq("b")
    assert [(r.step_id, r.substep) for r in results] == [
        (1, 0), *((2, i) for i in range(8)), (3, 0)
    ]  # fmt: skip
    assert tokens_of(results, "a") == expected_a
    ends = [(o.req_id, o.finish_reason) for r in results for o in r.outputs if o.finish_reason]
    assert ends == [("a", "length")]
    assert not any(o.req_id == "a" for r in results[6:] for o in r.outputs)  # ended at step 2.4
    # "b" ran in the steps prepared before plan 3 arrived, then in none of the plan's others
    with_b = [i for i, r in enumerate(results[1:9]) if any(o.req_id == "b" for o in r.outputs)]
    assert with_b == list(range(len(with_b))) and len(with_b) < 8


async def test_a_gap_in_step_ids_fails_after_the_earlier_results(reference: Reference):
    prompt = reference.prompt(5, seed=3)
    async with serve(reference) as served:
        call = served.stub.Step()
        await call.write(plan(1, new=[new_seq("a", prompt, pages_for(8, 0))]))
        await call.write(plan(3, running=[("a", 1)]))
        first = await read_row_by_row(call)
        assert first.step_id == 1 and first.outputs[0].HasField("token_id")
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await call.read()
        assert failure.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "expected 2, got 3" in failure.value.details()
        await served.servicer.wait_no_stream()
        assert not served.servicer._core.has_seq("a")  # dropped with the stream


async def test_a_stream_must_start_at_step_one(reference: Reference):
    async with serve(reference) as served:
        call = served.stub.Step()
        await call.write(plan(2))
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await call.read()
        assert failure.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "expected 1, got 2" in failure.value.details()


async def test_a_second_concurrent_stream_is_refused(reference: Reference):
    async with serve(reference) as served:
        first = served.stub.Step()
        await first.write(plan(1))
        assert (await first.read()).step_id == 1  # the first stream is open
        second = served.stub.Step()
        await second.write(plan(1))
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await second.read()
        assert failure.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "already open" in failure.value.details()
        await first.done_writing()
        assert await read_all(first) == []
        third = served.stub.Step()  # once the first has ended, a new one is welcome
        await third.write(plan(1))
        await third.done_writing()
        assert [r.step_id for r in await read_all(third)] == [1]


async def test_a_stream_that_ends_drops_the_sequences_it_created(reference: Reference):
    prompt = reference.prompt(6, seed=4)
    async with serve(reference) as served:
        core = served.servicer._core
        call = served.stub.Step()
        await call.write(plan(1, new=[new_seq("a", prompt, pages_for(16, 0))]))
        await call.read()
        assert core.has_seq("a")
        # On the same stream "a" is still held: admitting it again is refused.
        await call.write(plan(2, new=[new_seq("a", prompt, pages_for(16, 0))]))
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await call.read()
        assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "already running" in failure.value.details()
        await served.servicer.wait_no_stream()
        assert not core.has_seq("a")

        cancelled = served.stub.Step()  # a scheduler that goes away without closing
        await cancelled.write(plan(1, new=[new_seq("b", prompt, pages_for(16, 0))]))
        await cancelled.read()
        assert core.has_seq("b")
        cancelled.cancel()
        await served.servicer.wait_no_stream()
        assert not core.has_seq("b") and core.num_seqs == 0


async def test_a_bad_plan_ends_the_stream_with_invalid_argument(reference: Reference):
    prompt = reference.prompt(6, seed=5)
    async with serve(reference) as served:
        call = served.stub.Step()
        bad = new_seq("a", prompt, [NUM_PAGES + 1, 0])
        await call.write(plan(1, new=[bad]))
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await call.read()
        assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "page_ids" in failure.value.details()
        call = served.stub.Step()
        await call.write(
            plan(1, new=[new_seq("a", prompt, [0, 1], sampling=ipb.SamplingParams(top_p=0.0))])
        )
        with pytest.raises(grpc.aio.AioRpcError) as failure:
            await call.read()
        assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert failure.value.details().startswith("new_seqs['a'].sampling.top_p")


async def test_a_choices_constraint_is_followed(reference: Reference):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(reference.path)
    choices = ["yes please", "no thanks"]
    constraint = ipb.Constraint(choices=ipb.Choices(choices=choices))
    prompt = reference.prompt(5, seed=6)
    async with serve(reference, grammar=True) as served:
        call = served.stub.Step()
        seq = new_seq("c", prompt, pages_for(40, 0), constraint=constraint,
                      sampling=ipb.SamplingParams(temperature=0.0, max_tokens=30))  # fmt: skip
        await call.write(plan(1, new=[seq]))
        results = [await read_row_by_row(call)]
        step = 1
        while not results[-1].outputs[0].finish_reason:
            step += 1
            await call.write(plan(step, running=[("c", 1)]))
            results.append(await read_row_by_row(call))
        await call.done_writing()
        assert await read_all(call) == []
    assert results[-1].outputs[0].finish_reason == "stop"
    text = tokenizer.decode(tokens_of(results, "c"), skip_special_tokens=True)
    assert text in choices


async def test_calls_before_the_model_is_attached_are_unavailable():
    servicer = ExecutorServicer()

    def register(server: grpc.aio.Server) -> None:
        executor_pb2_grpc.add_ExecutorServicer_to_server(servicer, server)

    try:
        async with (
            running_runtime(register, [SERVICE_NAME]) as runtime,
            grpc.aio.insecure_channel(runtime.address) as channel,
        ):
            stub = executor_pb2_grpc.ExecutorStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as failure:
                await stub.GetInfo(executor_pb2.GetInfoRequest())
            assert failure.value.code() == grpc.StatusCode.UNAVAILABLE
            # the stream is refused when it opens, before any plan is read: a client that
            # wrote first could see its write fail in its own gRPC core (INTERNAL) when the
            # refusal ended the call before the write went out
            call = stub.Step()
            with pytest.raises(grpc.aio.AioRpcError) as failure:
                await call.read()
            assert failure.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await servicer.close()


async def test_shutdown_ends_an_open_stream_unavailable_after_its_queued_plans(
    reference: Reference,
):
    loop = asyncio.get_running_loop()
    core, _ = await loop.run_in_executor(None, load, executor_config(reference.path), False)
    runtime = ServiceRuntime(ServerConfig(name="test", grace_seconds=5.0))
    servicer = ExecutorServicer(shutdown_requested=runtime.wait_shutdown_requested)
    servicer.attach(core, "executor-test")
    await runtime.start(
        lambda server: executor_pb2_grpc.add_ExecutorServicer_to_server(servicer, server),
        [SERVICE_NAME],
    )
    prompt = reference.prompt(5, seed=7)
    try:
        async with grpc.aio.insecure_channel(runtime.address) as channel:
            call = executor_pb2_grpc.ExecutorStub(channel).Step()
            await call.write(plan(1, new=[new_seq("a", prompt, pages_for(16, 0))]))
            await call.write(plan(2, running=[("a", 1)]))
            assert (await call.read()).step_id == 1
            started = loop.time()
            shutdown = asyncio.create_task(runtime.shutdown(servicer.close))
            step_ids = [r.step_id async for r in _until_error(call)]
            assert step_ids in ([], [2])  # plan 2 answers if it was read before the shutdown
            assert await call.code() == grpc.StatusCode.UNAVAILABLE
            assert "shutting down" in await call.details()
            await shutdown
            assert loop.time() - started < 4.0  # well inside the grace period
    finally:
        await runtime.shutdown(servicer.close)


async def _until_error(call) -> AsyncIterator[executor_pb2.StepResult]:
    with contextlib.suppress(grpc.aio.AioRpcError):
        while (result := await call.read()) is not grpc.aio.EOF:
            yield result


# -- the service as a process --------------------------------------------------


@contextlib.asynccontextmanager
async def cache_service() -> AsyncIterator[str]:
    """A cache service process on a free port; its address once SERVING."""
    port = free_port()
    async with process(sys.executable, "-m", "services.cache.main", "--port", str(port)) as proc:
        address = f"127.0.0.1:{port}"
        await wait_for_serving(address, "radixmesh.v1.Cache", timeout=60)
        yield address
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.communicate(), 30)


@contextlib.asynccontextmanager
async def process(*argv: str) -> AsyncIterator[asyncio.subprocess.Process]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=REPO, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def pool_stats(cache_address: str, executor_id: str) -> list[cache_pb2.PoolStats]:
    async with grpc.aio.insecure_channel(cache_address) as channel:
        response = await cache_pb2_grpc.CacheStub(channel).GetStats(cache_pb2.GetStatsRequest())
    return [p for p in response.pools if p.executor_id == executor_id]


async def http_get(port: int, path: str) -> str:
    import aiohttp

    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}{path}") as r,
    ):
        assert r.status == 200
        return await r.text()


def metric_value(text: str, sample: str) -> float:
    for line in text.splitlines():
        if line.startswith(sample + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{sample} not in /metrics")


@pytest.mark.slow
async def test_the_service_process_serves_registers_and_stops_gracefully(reference: Reference):
    port, metrics_port = free_port(), free_port()
    address = f"127.0.0.1:{port}"
    async with cache_service() as cache_address:
        argv = [
            sys.executable, "-m", "services.executor.main", "--model", str(reference.path),
            "--executor-id", "ex-proc", "--device", "cpu", "--page-size", str(PAGE_SIZE),
            "--num-pages", str(NUM_PAGES), "--max-num-seqs", "4",
            "--cache-address", cache_address, "--port", str(port),
            "--metrics-port", str(metrics_port),
        ]  # fmt: skip
        async with process(*argv) as proc:
            await asyncio.wait_for(wait_for_serving(address, SERVICE_NAME, timeout=90), 95)
            async with grpc.aio.insecure_channel(address) as channel:
                stub = executor_pb2_grpc.ExecutorStub(channel)
                info = await stub.GetInfo(executor_pb2.GetInfoRequest())
                assert (info.executor_id, info.model) == ("ex-proc", reference.path.name)
                assert (info.page_size, info.num_pages, info.max_num_seqs) == (PAGE_SIZE, NUM_PAGES, 4)  # fmt: skip
                assert info.vocab_size == reference.vocab_size and info.device == "cpu"
                assert list(info.eos_token_ids) == [reference.hf.config.eos_token_id]

                (pool,) = await pool_stats(cache_address, "ex-proc")
                assert (pool.model, pool.num_pages, pool.page_size) == (info.model, NUM_PAGES, PAGE_SIZE)  # fmt: skip

                prompt = reference.prompt(7, seed=8)
                expected, _ = reference.greedy(prompt, 4)
                call = stub.Step()
                await call.write(plan(1, new=[new_seq("p", prompt, pages_for(11, 0))]))
                first = await call.read()  # step 1 has ended: plan 2 finds the step thread idle
                for step in range(2, 5):
                    await call.write(plan(step, running=[("p", 1)]))
                await call.done_writing()
                results = [result_to_proto(r, columnar=False) for r in results_from_proto(first)]
                results += await read_all(call)
                assert tokens_of(results, "p") == expected

            text = await http_get(metrics_port, "/metrics")
            assert metric_value(text, "radixmesh_executor_step_seconds_count") == 4
            # plan 2 came after step 1 had ended (3 and 4 most likely while step 2 ran)
            assert 1 <= metric_value(text, "radixmesh_executor_idle_gap_seconds_count") <= 3
            assert metric_value(text, "radixmesh_executor_idle_gap_seconds_sum") > 0
            assert metric_value(text, 'radixmesh_executor_tokens_total{kind="prefill"}') == 7
            assert metric_value(text, 'radixmesh_executor_tokens_total{kind="decode"}') == 3

            proc.send_signal(signal.SIGTERM)
            _, stderr = await asyncio.wait_for(proc.communicate(), 30)
            assert proc.returncode == 0, stderr.decode()[-2000:]
            events = [json.loads(line)["event"] for line in stderr.decode().splitlines() if line.startswith("{")]  # fmt: skip
            assert "pool_unregistered" in events and "shutdown_finished" in events
        assert await pool_stats(cache_address, "ex-proc") == []


async def test_a_model_that_fails_to_load_exits_non_zero_naming_the_folder(tmp_path: Path):
    missing = tmp_path / "no-such-model"
    argv = [sys.executable, "-m", "services.executor.main", "--model", str(missing),
            "--device", "cpu", "--cache-address", "127.0.0.1:1"]  # fmt: skip
    async with process(*argv) as proc:
        _, stderr = await asyncio.wait_for(proc.communicate(), 90)
    assert proc.returncode == 1
    message = [line for line in stderr.decode().splitlines() if line.startswith("executor: ")]
    assert message and str(missing) in message[0] and "cannot load model" in message[0]


async def test_a_cache_that_cannot_be_reached_exits_non_zero_naming_it(reference: Reference):
    cache_address = f"127.0.0.1:{free_port()}"  # nothing listens there
    argv = [sys.executable, "-m", "services.executor.main", "--model", str(reference.path),
            "--device", "cpu", "--num-pages", "8", "--no-grammar",
            "--cache-address", cache_address, "--cache-timeout-seconds", "0.5"]  # fmt: skip
    async with process(*argv) as proc:
        _, stderr = await asyncio.wait_for(proc.communicate(), 90)
    assert proc.returncode == 1
    message = [line for line in stderr.decode().splitlines() if line.startswith("executor: ")]
    assert message and cache_address in message[0] and "DEADLINE_EXCEEDED" in message[0]
