"""Multi-step decode plans on the executor core and its step pipeline: k steps of one
plan, one result each, sequences ending inside the plan, aborts between its steps,
and plans that break the multi-step contract refused with the field named."""

from __future__ import annotations

import asyncio

import pytest

from radixmesh.errors import InvalidArgument
from radixmesh.step import MAX_STEPS_PER_PLAN, NewSequence, RunningSequence, StepPlan
from services.executor.core.pipeline import StepPipeline
from tests.unit.executor.conftest import (
    STEP_IDS,
    TinyModel,
    admit,
    greedy,
    make_core,
    random_prompt,
)


@pytest.fixture
def core(llama_model: TinyModel):
    core = make_core(llama_model, num_pages=64, max_num_seqs=8)
    yield core
    core.shutdown()


async def run_steps(core, plan: StepPlan) -> list:
    """The plan's results through a step pipeline, in order."""
    pipeline = StepPipeline("test", overlap_prepare=False)
    pipeline.attach(core)
    run = pipeline.open(core, after_execute=lambda plan, result: result)
    futures = run.submit_steps(plan)
    results = [await asyncio.wrap_future(f) for f in futures]
    await pipeline.close()
    return results


async def test_a_plan_of_k_steps_answers_k_results_equal_to_k_single_steps(llama_model):
    prompts = [random_prompt(n, seed=n) for n in (5, 9, 3)]
    pages = [list(range(8 * i, 8 * i + 8)) for i in range(3)]
    single = make_core(llama_model, num_pages=64, max_num_seqs=8)
    expected = {}
    for i, prompt in enumerate(prompts):
        expected[f"r{i}"] = [admit(single, f"r{i}", prompt, pages[i], max_tokens=4 + 3 * i)]
    for _ in range(6):
        plan = StepPlan(next(STEP_IDS), running_seqs=[RunningSequence(r, 1) for r in expected])
        for out in single.step(plan).outputs:
            expected[out.req_id].append(out.token_id)
    single.shutdown()
    multi = make_core(llama_model, num_pages=64, max_num_seqs=8)
    got = {
        f"r{i}": [admit(multi, f"r{i}", p, pages[i], max_tokens=4 + 3 * i)]
        for i, p in enumerate(prompts)
    }
    plan = StepPlan(next(STEP_IDS), running_seqs=[RunningSequence(r, 1) for r in got], num_steps=6)
    results = await run_steps(multi, plan)
    assert [r.substep for r in results] == list(range(6))
    assert {r.step_id for r in results} == {plan.step_id}
    for result in results:
        for out in result.outputs:
            got[out.req_id].append(out.token_id)
    assert got == expected
    # r0 (max_tokens 4) ends at the plan's third step and is in no step after it
    assert [len(result.outputs) for result in results] == [3, 3, 3, 2, 2, 2]
    ends = {
        out.req_id: out.finish_reason for r in results for out in r.outputs if out.finish_reason
    }
    assert ends == {"r0": "length", "r1": "length"}
    assert [len(t) for t in got.values()] == [4, 7, 7]
    multi.shutdown()


def test_a_stopped_row_runs_in_no_later_step_of_its_plan_and_its_abort_plan_drops_it(core):
    for i in range(2):
        admit(core, f"r{i}", random_prompt(4, seed=i), list(range(8 * i, 8 * i + 8)))
    decodes = [RunningSequence("r0", 1), RunningSequence("r1", 1)]
    plan = StepPlan(next(STEP_IDS), running_seqs=decodes, num_steps=4)
    first = core.execute(core.prepare(plan))
    assert {o.req_id for o in first.outputs} == {"r0", "r1"}
    core.stop(["r1"])  # as the pipeline does when a plan with abort_req_ids arrives
    later = [core.execute(core.prepare_next(plan, i)) for i in (1, 2, 3)]
    assert [[o.req_id for o in r.outputs] for r in later] == [["r0"]] * 3
    assert [r.substep for r in later] == [1, 2, 3]
    assert core.has_seq("r1")  # stopped, not yet dropped
    abort = StepPlan(next(STEP_IDS), abort_req_ids=["r1"])
    assert core.step(abort).outputs == []
    assert not core.has_seq("r1") and core.has_seq("r0")


@pytest.mark.parametrize(
    ("plan", "field"),
    [
        (StepPlan(1, running_seqs=[RunningSequence("r0", 2)], num_steps=4), "num_scheduled_tokens"),
        (
            StepPlan(1, running_seqs=[RunningSequence("r0", 1, [], 2)], num_steps=4),
            "num_draft_tokens",
        ),
        (StepPlan(1, num_steps=0), "num_steps"),
        (StepPlan(1, num_steps=MAX_STEPS_PER_PLAN + 1), "num_steps"),
    ],
)
def test_a_plan_outside_the_multi_step_contract_is_refused_naming_the_field(core, plan, field):
    admit(core, "r0", random_prompt(4, seed=1), [0, 1])
    with pytest.raises(InvalidArgument, match=field):
        core.step(plan)
    assert core.has_seq("r0")  # nothing changed


def test_a_multi_step_plan_admits_nothing(core):
    new = NewSequence("n", [3, 4], 2, 0, 2, [5], greedy())
    with pytest.raises(InvalidArgument, match="new_seqs"):
        core.step(StepPlan(1, new_seqs=[new], num_steps=2))
    assert not core.has_seq("n")


def test_a_multi_step_plan_needs_pages_for_every_step_a_sequence_may_run(core):
    admit(core, "r0", random_prompt(6, seed=2), [0, 1], max_tokens=20)  # 7 tokens, 8 slots
    with pytest.raises(InvalidArgument, match=r"appended_page_ids: 2 pages of 4 cannot hold"):
        core.step(StepPlan(next(STEP_IDS), running_seqs=[RunningSequence("r0", 1)], num_steps=4))
    # pages for the steps max_tokens leaves are enough
    admit(core, "r1", random_prompt(6, seed=3), [2, 3], max_tokens=3)  # 2 decodes left
    plan = StepPlan(next(STEP_IDS), running_seqs=[RunningSequence("r1", 1)], num_steps=4)
    assert core.step(plan).outputs[0].token_id is not None


def test_a_plan_without_num_steps_on_the_wire_is_one_step():
    from radixmesh.v1 import executor_pb2
    from radixmesh.wire import plan_from_proto, plan_to_proto

    assert plan_from_proto(executor_pb2.StepPlan(step_id=3)).num_steps == 1
    assert plan_to_proto(StepPlan(3)).num_steps == 0  # the default stays off the wire
    assert plan_from_proto(plan_to_proto(StepPlan(3, num_steps=8))).num_steps == 8
