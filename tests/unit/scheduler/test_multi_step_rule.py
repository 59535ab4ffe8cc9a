"""When a plan may run several decode steps: every request with work left decodes in it."""

from __future__ import annotations

from sched_fakes import ToyExecutor, ToyExecutorPort

from radixmesh.sampling import SamplingParams
from radixmesh.step import RunningSequence
from services.scheduler.core import SchedulerConfig
from services.scheduler.core.budget import StepBudget
from services.scheduler.core.executor_state import ExecutorState
from services.scheduler.core.multi_step import may_run_steps
from services.scheduler.core.request import Request


def decoding(req_id: str, max_tokens: int, planned: int) -> Request:
    """A request of a 4-token prompt with `planned` decode steps planned so far."""
    req = Request(req_id, [1, 2, 3, 4], SamplingParams(max_tokens=max_tokens), 0.0)
    req.num_admitted_tokens = 4
    req.num_computed_tokens = 4 + planned
    req.on_executor = True
    return req


def state(*running: Request) -> ExecutorState:
    ex = ExecutorState.create(ToyExecutorPort("toy-0", ToyExecutor(64, 4)), SchedulerConfig())
    ex.running = {r.req_id: r for r in running}
    return ex


def test_a_request_whose_last_steps_are_in_flight_does_not_keep_the_others_to_one_step():
    # "done" has its last decode planned (its results in flight): nothing left to plan
    done, busy = decoding("done", max_tokens=3, planned=2), decoding("busy", 40, planned=2)
    budget = StepBudget(num_tokens=64, num_seqs=8)
    assert may_run_steps(state(done, busy), [RunningSequence("busy", 1)], 0, budget)


def test_a_request_left_out_of_the_step_keeps_the_plan_to_one_step():
    waiting, busy = decoding("waits", 40, planned=2), decoding("busy", 40, planned=2)
    prefilling = decoding("prefills", 40, planned=0)
    prefilling.num_admitted_tokens, prefilling.num_computed_tokens = 30, 8  # a chunk to go
    budget = StepBudget(num_tokens=64, num_seqs=8)
    step = [RunningSequence("busy", 1)]
    assert not may_run_steps(state(waiting, busy), step, 0, budget)  # it waits for pages
    assert not may_run_steps(state(prefilling, busy), step, 0, budget)  # its chunk waits
