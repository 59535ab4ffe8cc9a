"""The Step stream's writer sends the steps that ended while it was behind in one message
(`StepResult.next_results`, in order, at most MAX_RESULTS_PER_MESSAGE results a message),
and the scheduler's port gives them back one at a time."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from radixmesh import wire
from radixmesh.errors import InvalidArgument
from radixmesh.step import SequenceOutput, StepResult
from radixmesh.v1 import executor_pb2
from services.executor import server as executor_server
from services.executor.server import ExecutorServicer
from tests.unit.executor.conftest import TinyModel, make_core, random_prompt
from tests.unit.executor.test_server_overlap import decode_plans, new_seq

K = 4


def _plans(prompt: list[int]) -> list[executor_pb2.StepPlan]:
    """Plan 1 prefills "a", plan 2 decodes it K steps."""
    first = executor_pb2.StepPlan(step_id=1, new_seqs=[new_seq("a", prompt, K + 2)])
    decode = executor_pb2.RunningSequence(req_id="a", num_scheduled_tokens=1)
    return [first, executor_pb2.StepPlan(step_id=2, running_seqs=[decode], num_steps=K)]


async def _behind_writer(llama_model: TinyModel, prompt: list[int]) -> list[executor_pb2.StepResult]:
    """The stream's messages when the writer is held after step 1 until every step ran."""
    core = make_core(llama_model, page_size=4, num_pages=64, max_num_seqs=4)
    servicer = ExecutorServicer(max_inflight_plans=4)
    servicer.attach(core, "executor-test")
    sent, end = asyncio.Event(), asyncio.Event()

    async def send() -> AsyncIterator[executor_pb2.StepPlan]:
        for plan in _plans(prompt):
            yield plan
        sent.set()  # the reader asked past the last plan: both are queued
        await end.wait()

    messages = []
    try:
        stream = servicer.Step(send(), None)
        messages.append(await anext(stream))
        await asyncio.wait_for(sent.wait(), 10)
        await asyncio.wrap_future(servicer.step_thread.submit(lambda: None))  # after every step
        end.set()
        messages += [m async for m in stream]
    finally:
        await servicer.close()
    return messages


def _reference_tokens(llama_model: TinyModel, prompt: list[int]) -> list[list[int | None]]:
    core = make_core(llama_model, page_size=4, num_pages=64, max_num_seqs=4)
    plans = decode_plans("a", prompt, K + 1)  # the same sequence, one decode a plan
    return [[o.token_id for o in core.step(wire.plan_from_proto(p)).rows()] for p in plans]


def _steps(messages: list[executor_pb2.StepResult]) -> list[list[tuple[int, int]]]:
    return [[(r.step_id, r.substep) for r in wire.results_from_proto(m)] for m in messages]


async def test_steps_that_ended_while_the_writer_waited_go_in_one_message(llama_model):
    prompt = random_prompt(6, seed=3)
    messages = await _behind_writer(llama_model, prompt)
    # step 1's message (with any step that ended before it went), then one with the rest
    assert len(messages) == 2
    assert [s for m in _steps(messages) for s in m] == [(1, 0), *((2, s) for s in range(K))]
    steps = [r for m in messages for r in wire.results_from_proto(m)]
    assert [[o.token_id for o in r.outputs] for r in steps] == _reference_tokens(llama_model, prompt)


async def test_a_message_carries_at_most_the_limit(llama_model, monkeypatch):
    monkeypatch.setattr(executor_server, "MAX_RESULTS_PER_MESSAGE", 3)
    prompt = random_prompt(6, seed=4)
    messages = await _behind_writer(llama_model, prompt)
    steps = _steps(messages)
    assert [s for m in steps for s in m] == [(1, 0), *((2, s) for s in range(K))]
    assert max(map(len, steps)) == 3  # the held writer's first message is full
    assert all(len(m) == 3 for m in steps[1:-1])


def test_results_from_proto_unrolls_in_order_and_refuses_nesting():
    first = wire.result_to_proto(StepResult(5, [SequenceOutput("a", 1)], substep=0))
    for substep, token in ((1, 2), (2, 3)):
        first.next_results.append(wire.result_to_proto(
            StepResult(5, [SequenceOutput("a", token)], substep=substep)
        ))  # fmt: skip
    msg = executor_pb2.StepResult.FromString(first.SerializeToString())
    results = wire.results_from_proto(msg)
    assert [(r.substep, r.outputs) for r in results] == [
        (0, [SequenceOutput("a", 1)]), (1, [SequenceOutput("a", 2)]), (2, [SequenceOutput("a", 3)]),
    ]  # fmt: skip
    assert wire.result_from_proto(msg).outputs == [SequenceOutput("a", 1)]
    msg.next_results[1].next_results.add(step_id=6)
    with pytest.raises(InvalidArgument, match=r"^step 5: next_results\[1\] carries next_results"):
        wire.results_from_proto(msg)
