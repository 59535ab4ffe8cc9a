"""The Step handler's two worker threads, driven without a network.

Plan N + 1 is prepared while step N executes and no further ahead; a failed
prepare or execute surfaces after the results before it and later plans do not
run; a handler cancelled while its stream's drop waits leaves the drop to
finish before the stream is released. The core is a real tiny model, probed.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from radixmesh.errors import InvalidArgument
from radixmesh.v1 import executor_pb2
from radixmesh.v1 import inference_pb2 as ipb
from radixmesh.wire import plan_from_proto, result_from_proto, result_to_proto
from services.executor.core.executor import ExecutorCore
from services.executor.core.step_types import PreparedStep
from services.executor.server import ExecutorServicer
from tests.unit.executor.conftest import TinyModel, make_core, random_prompt

PAGE_SIZE = 4
WAIT_S = 10.0


class ProbedCore:
    """A real core whose prepare and execute record where and after what they ran.

    `before_execute[step_id]` runs on the execute thread before that step's execute.
    """

    def __init__(self, core: ExecutorCore, num_plans: int) -> None:
        self.core = core
        self.calls: list[tuple[str, int, int, str]] = []
        """(verb, step_id, steps executed when it started, thread name)."""
        self.num_executed = 0
        self.prepared = {i: threading.Event() for i in range(1, num_plans + 1)}
        """Set once the step's prepare returned or raised."""
        self.before_execute: dict[int, Callable[[], None]] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.core, name)

    def _record(self, verb: str, step_id: int) -> None:
        self.calls.append((verb, step_id, self.num_executed, threading.current_thread().name))

    def prepare(self, plan: Any, drafting: Any = None) -> PreparedStep:
        self._record("prepare", plan.step_id)
        try:
            return self.core.prepare(plan, drafting)
        finally:
            self.prepared[plan.step_id].set()

    def execute(self, prepared: PreparedStep) -> Any:
        if (hook := self.before_execute.get(prepared.step_id)) is not None:
            hook()
        self._record("execute", prepared.step_id)
        result = self.core.execute(prepared)
        self.num_executed += 1
        return result

    def ran(self, verb: str) -> list[int]:
        return [step_id for v, step_id, _, _ in self.calls if v == verb]


# -- factories -------------------------------------------------------------------


def rows(msg: executor_pb2.StepResult) -> list:
    """Every row of a result message (plain rows come columnar), in order."""
    return result_from_proto(msg).outputs


def new_seq(req_id: str, prompt: list[int], max_tokens: int) -> executor_pb2.NewSequence:
    num_pages = -(-(len(prompt) + max_tokens) // PAGE_SIZE)
    first_page = 16 * (ord(req_id[0]) % 4)
    return executor_pb2.NewSequence(
        req_id=req_id,
        token_ids=prompt,
        num_prompt_tokens=len(prompt),
        num_scheduled_tokens=len(prompt),
        page_ids=list(range(first_page, first_page + num_pages)),
        sampling=ipb.SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=max_tokens),
    )


def decode_plans(req_id: str, prompt: list[int], num_plans: int) -> list[executor_pb2.StepPlan]:
    """Plan 1 prefills `req_id`, plans 2.. decode it, one token each."""
    first = executor_pb2.StepPlan(step_id=1, new_seqs=[new_seq(req_id, prompt, num_plans + 1)])
    return [first] + [
        executor_pb2.StepPlan(
            step_id=step_id,
            running_seqs=[executor_pb2.RunningSequence(req_id=req_id, num_scheduled_tokens=1)],
        )
        for step_id in range(2, num_plans + 1)
    ]


async def send(
    plans: list[executor_pb2.StepPlan], end: asyncio.Event | None = None
) -> AsyncIterator[executor_pb2.StepPlan]:
    """The scheduler's side: every plan at once, then close (once `end` is set)."""
    for message in plans:
        yield message
    if end is not None:
        await end.wait()


async def run_stream(
    servicer: ExecutorServicer, plans: list[executor_pb2.StepPlan]
) -> tuple[list[executor_pb2.StepResult], Exception | None]:
    results: list[executor_pb2.StepResult] = []
    try:
        async for message in servicer.Step(send(plans), None):  # the steps it carries
            results += [message, *message.next_results]
    except Exception as exc:
        return results, exc
    return results, None


@contextlib.asynccontextmanager
async def serving(
    core: Any, overlap_prepare: bool | None = True
) -> AsyncIterator[ExecutorServicer]:
    servicer = ExecutorServicer(max_inflight_plans=4, overlap_prepare=overlap_prepare)
    servicer.attach(core, "executor-test")
    try:
        yield servicer
    finally:
        await servicer.close()


@pytest.fixture
def probed(llama_model: TinyModel) -> Callable[[int], ProbedCore]:
    def build(num_plans: int) -> ProbedCore:
        core = make_core(llama_model, page_size=PAGE_SIZE, num_pages=64, max_num_seqs=4)
        return ProbedCore(core, num_plans)

    return build


# -- tests -------------------------------------------------------------------------


async def test_plan_n_plus_1_is_prepared_on_its_thread_while_step_n_executes(
    llama_model: TinyModel, probed: Callable[[int], ProbedCore]
):
    num_plans = 6
    plans = decode_plans("a", random_prompt(7, seed=1), num_plans)
    probe = probed(num_plans)
    overlapped: dict[int, bool] = {}
    for step_id in range(1, num_plans):
        # Step N does not start its execute before plan N + 1 is prepared: with prepare
        # and execute in one thread, one after the other, this would wait in vain.
        def hold(step_id: int = step_id) -> None:
            overlapped[step_id] = probe.prepared[step_id + 1].wait(WAIT_S)

        probe.before_execute[step_id] = hold
    async with serving(probe) as servicer:
        results, error = await run_stream(servicer, plans)
        await servicer.wait_no_stream()
        assert probe.num_seqs == 0

    assert error is None
    assert overlapped == dict.fromkeys(range(1, num_plans), True)
    reference = make_core(llama_model, page_size=PAGE_SIZE, num_pages=64, max_num_seqs=4)
    expected = [result_to_proto(reference.step(plan_from_proto(p))) for p in plans]
    assert [(r.step_id, rows(r)) for r in results] == [(e.step_id, rows(e)) for e in expected]
    assert probe.ran("prepare") == probe.ran("execute") == list(range(1, num_plans + 1))
    for verb, step_id, num_executed, thread in probe.calls:
        if verb == "prepare":  # plan N + 1 waits for step N - 1: one step ahead at most
            assert num_executed >= step_id - 2, (step_id, num_executed)
            assert thread.startswith("executor-prepare")
        else:
            assert thread.startswith("executor-step")


async def test_a_failed_prepare_of_plan_n_plus_1_surfaces_after_result_n(
    probed: Callable[[int], ProbedCore],
):
    prompt = random_prompt(6, seed=2)
    plans = decode_plans("a", prompt, 3)
    plans[1].new_seqs.append(new_seq("a", prompt, 4))  # "a" is already running: refused
    probe = probed(3)
    probe.before_execute[1] = lambda: probe.prepared[2].wait(WAIT_S)  # plan 2 fails first
    async with serving(probe) as servicer:
        results, error = await run_stream(servicer, plans)
        await servicer.wait_no_stream()
        assert probe.num_seqs == 0  # "a" was dropped with the stream

    assert [r.step_id for r in results] == [1]
    assert isinstance(error, InvalidArgument) and "already running" in str(error)
    assert probe.ran("prepare") == [1, 2]
    assert probe.ran("execute") == [1]


async def test_a_failed_execute_ends_the_stream_and_later_steps_do_not_run(
    probed: Callable[[int], ProbedCore],
):
    plans = decode_plans("a", random_prompt(6, seed=3), 4)
    probe = probed(4)

    def fail() -> None:
        raise RuntimeError("device lost")

    probe.before_execute[2] = fail
    async with serving(probe) as servicer:
        results, error = await run_stream(servicer, plans)
        await servicer.wait_no_stream()
        assert probe.num_seqs == 0

    assert [r.step_id for r in results] == [1]
    assert isinstance(error, RuntimeError) and str(error) == "device lost"
    assert probe.ran("execute") == [1]
    assert 4 not in probe.ran("prepare")  # plan 4 waits for step 2, which failed


async def test_on_cpu_prepares_run_on_the_step_thread_between_steps_by_default(
    llama_model: TinyModel, probed: Callable[[int], ProbedCore]
):
    plans = decode_plans("a", random_prompt(5, seed=5), 4)
    probe = probed(4)
    async with serving(probe, overlap_prepare=None) as servicer:
        results, error = await run_stream(servicer, plans)
    assert error is None
    reference = make_core(llama_model, page_size=PAGE_SIZE, num_pages=64, max_num_seqs=4)
    expected = [result_to_proto(reference.step(plan_from_proto(p))) for p in plans]
    assert [rows(r) for r in results] == [rows(e) for e in expected]
    assert {thread.split("_")[0] for *_, thread in probe.calls} == {"executor-step"}
    assert [(verb, step_id) for verb, step_id, *_ in probe.calls] == [
        (verb, step_id) for step_id in range(1, 5) for verb in ("prepare", "execute")
    ]


async def test_a_handler_cancelled_during_the_drop_releases_the_stream_after_it(
    probed: Callable[[int], ProbedCore],
):
    """gRPC cancels the handler when the client cancels, possibly after the request
    stream already ended and the handler is dropping the stream's sequences."""
    probe = probed(1)
    plans = decode_plans("b", random_prompt(6, seed=4), 1)
    async with serving(probe) as servicer:
        end, first = asyncio.Event(), asyncio.Event()

        async def handler() -> None:
            async for _ in servicer.Step(send(plans, end), None):
                first.set()

        task = asyncio.create_task(handler())
        await first.wait()
        assert probe.has_seq("b")
        held = threading.Event()
        step_thread = servicer.step_thread
        step_thread.submit(held.wait, WAIT_S)  # the drop queues behind this
        drop_queued = asyncio.Event()
        submit = step_thread.submit

        def submit_and_tell(*args, **kwargs):
            future = submit(*args, **kwargs)
            drop_queued.set()  # on the loop's thread: the handler's end queued its drop
            return future

        step_thread.submit = submit_and_tell  # type: ignore[method-assign]
        end.set()  # the request stream ends: the handler returns and starts the drop
        await asyncio.wait_for(drop_queued.wait(), WAIT_S)
        assert not task.done() and servicer._stream.closed  # the handler waits on the drop
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        released = asyncio.create_task(servicer.wait_no_stream())
        for _ in range(3):  # turns in which a release that did not wait would finish
            await asyncio.sleep(0)
        assert not released.done() and probe.has_seq("b")
        held.set()
        await asyncio.wait_for(released, WAIT_S)
        assert not probe.has_seq("b") and probe.num_seqs == 0


async def test_both_worker_threads_bind_the_cuda_device_before_later_jobs(monkeypatch):
    calls: list[tuple[str, str]] = []

    def set_device(device: torch.device) -> None:
        calls.append((threading.current_thread().name.split("_")[0], f"bind {device}"))

    def load() -> None:  # what main.py runs on the step thread once bound
        calls.append((threading.current_thread().name.split("_")[0], "load"))

    monkeypatch.setattr(torch.cuda, "set_device", set_device)
    servicer = ExecutorServicer()
    servicer.bind_device("cuda:1")
    await asyncio.wrap_future(servicer.step_thread.submit(load))
    servicer.attach(SimpleNamespace(device=torch.device("cuda", 1), shutdown=lambda: None), "x")
    await servicer.close()  # after every job queued on both threads
    assert sorted(calls[:3]) == [
        ("executor-prepare", "bind cuda:1"),
        ("executor-step", "bind cuda:1"),
        ("executor-step", "load"),
    ]
    assert calls.index(("executor-step", "bind cuda:1")) < calls.index(("executor-step", "load"))
    assert sorted(calls[3:]) == [
        ("executor-prepare", "bind cuda:1"),
        ("executor-step", "bind cuda:1"),
    ]


@pytest.mark.parametrize("device", ["auto", "cpu", "cuda", torch.device("cpu")])
async def test_binding_anything_but_cuda_n_is_a_no_op(monkeypatch, device):
    calls: list[Any] = []
    monkeypatch.setattr(torch.cuda, "set_device", calls.append)
    async with serving(SimpleNamespace(device=torch.device("cpu"), shutdown=lambda: None)) as s:
        s.bind_device(device)
    assert calls == []
