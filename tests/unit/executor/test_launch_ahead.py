"""Launch-ahead on the executor core and its step pipeline: a plain step is queued on the
device before the step before it is read back, and the tokens, finishes and answers are
those of running every step whole; steps that need the host between them (a grammar,
log probabilities) are never launched ahead; a prepare that waits for the step before is
never waited on by that step."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from radixmesh.step import NewSequence, RunningSequence, StepPlan, StepResult
from services.executor.core.pipeline import StepPipeline
from services.executor.core.spec.drafting import NO_DRAFTS, DraftChoice
from services.executor.core.step_types import LaunchedStep
from tests.unit.executor.conftest import (
    STEP_IDS,
    TinyModel,
    admit,
    greedy,
    make_core,
    random_prompt,
)

WAIT_S = 10.0
DEVICE_S = 2.0
"""The longest a fake device runs a step (what a step launched too late waits for)."""


async def run_plans(core, plans: list[StepPlan], *, launch_ahead: bool):
    """Every plan's results through a pipeline with overlapping prepares, in order, and
    the number of steps it launched ahead."""
    pipeline = StepPipeline("test", overlap_prepare=True, launch_ahead=launch_ahead)
    pipeline.attach(core)
    assert pipeline.launch_ahead is launch_ahead
    run = pipeline.open(core, after_execute=lambda plan, result: result)
    futures = [f for plan in plans for f in run.submit_steps(plan)]
    results = [await asyncio.wrap_future(f) for f in futures]
    await pipeline.close()
    return results, run.counts.launched_ahead


def outputs_of(results) -> list[list[tuple]]:
    return [
        [(o.req_id, o.token_id, o.finish_reason, o.matched_stop_token_id) for o in r.outputs]
        for r in results
    ]


CUDA = pytest.param(
    "cuda",
    marks=[
        pytest.mark.gpu,
        pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    ],
)


def finish_after_next_launch(core, steps_per_plan: int) -> None:
    """Makes the device slower than the host: each step of a plan but its last finishes
    only once the step after it has been launched (bounded by WAIT_S), as when a step's
    device time covers the next step's prepare. Without it the count of steps launched
    ahead depends on which thread a busy machine runs first."""
    launched, finished = [0], [0]
    cond = threading.Condition()
    launch, finish = core.launch, core.finish

    def counting_launch(prepared):
        out = launch(prepared)
        with cond:
            launched[0] += 1
            cond.notify_all()
        return out

    def slow_finish(step):
        finished[0] += 1
        if finished[0] % steps_per_plan:
            with cond:
                cond.wait_for(lambda: launched[0] > finished[0], timeout=WAIT_S)
        return finish(step)

    core.launch, core.finish = counting_launch, slow_finish


async def decode_both_ways(
    llama_model: TinyModel, sampling: dict[str, dict], num_steps: int, device: str = "cpu"
):
    """Three sequences admitted alike in two cores, then decoded by multi-step plans with
    launch-ahead off and on: (results off, results on, steps launched ahead)."""
    runs = []
    for launch_ahead in (False, True):
        core = make_core(llama_model, num_pages=64, max_num_seqs=8, device=device)
        for i, (req_id, params) in enumerate(sampling.items()):
            pages = list(range(8 * i, 8 * i + 8))
            admit(core, req_id, random_prompt(4 + 3 * i, seed=i), pages, **params)
        if launch_ahead:
            finish_after_next_launch(core, num_steps)
        running = [RunningSequence(r, 1) for r in sampling]
        plans = [
            StepPlan(next(STEP_IDS), running_seqs=running, num_steps=num_steps) for _ in range(2)
        ]
        runs.append(await run_plans(core, plans, launch_ahead=launch_ahead))
        core.shutdown()
    (off, _), (on, launched) = runs
    return off, on, launched


@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_launched_ahead_steps_give_the_tokens_and_finishes_of_whole_steps(llama_model, device):
    # on CUDA the steps replay captured graphs and read their ids back through events (a
    # plain function running its own loop: the GPU machine's pytest has no asyncio plugin)
    sampling = {"r0": {"max_tokens": 5}, "r1": {"max_tokens": 40}, "r2": {"max_tokens": 40}}
    off, on, launched = asyncio.run(decode_both_ways(llama_model, sampling, 4, device))
    assert outputs_of(on) == outputs_of(off)
    assert launched >= 6  # the later steps of each plan were queued before the one before
    # r0 ends on its length inside the first plan and is in no later step
    ends = [o for r in on for o in r.outputs if o.finish_reason]
    assert [(o.req_id, o.finish_reason) for o in ends] == [("r0", "length")]
    assert all("r0" not in {o.req_id for o in r.outputs} for r in on[4:])


async def test_a_stop_token_found_after_the_next_step_was_launched_ends_the_sequence_there(
    llama_model,
):
    # the stop token is r1's third decoded token: found when the step after it is queued
    probe = make_core(llama_model, num_pages=64, max_num_seqs=8)
    admit(probe, "r1", random_prompt(7, seed=1), list(range(8, 16)), max_tokens=40)
    tokens = [
        probe.step(StepPlan(next(STEP_IDS), running_seqs=[RunningSequence("r1", 1)]))
        .outputs[0]
        .token_id
        for _ in range(3)
    ]
    probe.shutdown()
    stop = tokens[2]
    if stop in tokens[:2]:  # the stop must first appear at the third step
        stop = tokens[1] if tokens[1] not in tokens[:1] else tokens[0]
    sampling = {
        "r0": {"max_tokens": 40},
        "r1": {"max_tokens": 40, "stop_token_ids": [stop]},
        "r2": {"max_tokens": 40},
    }
    off, on, launched = await decode_both_ways(llama_model, sampling, num_steps=4)
    assert outputs_of(on) == outputs_of(off)
    assert launched >= 4
    ended = [
        (i, o) for i, r in enumerate(on) for o in r.outputs if o.req_id == "r1" and o.finish_reason
    ]
    assert len(ended) == 1 and ended[0][1].finish_reason == "stop"
    assert all("r1" not in {o.req_id for o in r.outputs} for r in on[ended[0][0] + 1 :])


async def test_prefill_chunks_launched_ahead_among_decodes_give_the_same_tokens(llama_model):
    # a 13-token prompt in chunks of 5, 5 and 3 (the first step samples nothing), then
    # decodes, beside a sequence decoding throughout
    long_prompt = random_prompt(13, seed=9)
    runs = []
    for launch_ahead in (False, True):
        core = make_core(llama_model, num_pages=64, max_num_seqs=8)
        admit(core, "r0", random_prompt(4, seed=0), list(range(8)), max_tokens=40)
        new = NewSequence("r9", long_prompt, 13, 0, 5, list(range(8, 16)), greedy(max_tokens=40))
        plans = [
            StepPlan(next(STEP_IDS), new_seqs=[new]),
            StepPlan(next(STEP_IDS), running_seqs=[RunningSequence("r9", 5)]),
            StepPlan(
                next(STEP_IDS), running_seqs=[RunningSequence("r0", 1), RunningSequence("r9", 3)]
            ),
            StepPlan(
                next(STEP_IDS),
                running_seqs=[RunningSequence("r0", 1), RunningSequence("r9", 1)],
                num_steps=3,
            ),
        ]
        if launch_ahead:  # every step but the last held until the next is launched
            finish_after_next_launch(core, steps_per_plan=6)
        runs.append(await run_plans(core, plans, launch_ahead=launch_ahead))
        core.shutdown()
    (off, _), (on, launched) = runs
    assert outputs_of(on) == outputs_of(off)
    assert outputs_of(on)[0] == [("r9", None, None, None)]  # a chunk samples nothing
    assert launched == 5  # every step after the first: chunks, the mixed step, decodes


async def test_steps_that_read_log_probabilities_are_never_launched_ahead(llama_model):
    core = make_core(llama_model, num_pages=64, max_num_seqs=8)
    admit(core, "lp", random_prompt(5, seed=3), list(range(8)), max_tokens=40, logprobs=True)
    plan = StepPlan(next(STEP_IDS), running_seqs=[RunningSequence("lp", 1)], num_steps=4)
    results, launched = await run_plans(core, [plan], launch_ahead=True)
    assert launched == 0
    assert [len(r.outputs) for r in results] == [1] * 4
    assert all(out.logprobs is not None for r in results for out in r.outputs)
    core.shutdown()


class OrderCore:
    """Records launch / finish / execute per step; each step plain unless listed.

    Its device is busy with a step until the step after it is launched, when that one
    should be launched ahead (plain, its prepare not waiting for this step): a finish
    waits for that launch (at most DEVICE_S), as a device still running the step would
    keep the host waiting. A pipeline that fails to launch it ahead records the finish
    first."""

    device = torch.device("cpu")

    def __init__(
        self,
        serial: set[int] = frozenset(),
        not_plain: set[int] = frozenset(),
        last: int = 0,
        fail_launch: set[int] = frozenset(),
    ):
        self.calls: list[tuple[str, int]] = []
        self.serial, self.not_plain, self.last = serial, not_plain, last
        self.fail_launch = fail_launch
        self.failed_on = ""
        """The thread a failing launch was tried on."""
        self.lock = threading.Lock()
        self.submitted = threading.Event()
        """Set once every plan is queued: the first prepare waits for it, so no step runs
        before the steps after it are queued."""
        self.launched: dict[int, threading.Event] = {}

    def _launched(self, step_id: int) -> threading.Event:
        with self.lock:
            return self.launched.setdefault(step_id, threading.Event())

    def goes_ahead(self, step_id: int) -> bool:
        """Step step_id + 1 should be launched before step step_id is finished."""
        after = step_id + 1
        return (
            after <= self.last
            and step_id not in self.serial  # the step after a drafting one waits for it
            and after not in self.serial
            and step_id not in self.not_plain
            and after not in self.not_plain
        )

    def drafting(self, plan: StepPlan, substep: int = 0) -> DraftChoice:
        # a drafting step's prepare waits for the step before it
        return (
            DraftChoice(proposer=True, forced=False) if plan.step_id in self.serial else NO_DRAFTS
        )

    def prepare(self, plan: StepPlan) -> int:
        assert self.submitted.wait(WAIT_S)
        return plan.step_id

    def plain(self, step_id: int) -> bool:
        return step_id not in self.not_plain

    def verifies(self, step_id: int) -> bool:
        return step_id in self.serial  # each step that may draft does

    def launch(self, step_id: int) -> LaunchedStep:
        if step_id in self.fail_launch:
            self.failed_on = threading.current_thread().name
            self._launched(step_id).set()  # tried: the step before may finish
            raise RuntimeError(f"step {step_id} could not be launched")
        with self.lock:
            self.calls.append(("launch", step_id))
        self._launched(step_id).set()
        result = None if self.plain(step_id) else StepResult(step_id, [], 0.0)
        return LaunchedStep(step_id, 0.0, result=result)  # type: ignore[arg-type]

    def finish(self, launched: LaunchedStep) -> StepResult:
        step_id: int = launched.prepared  # type: ignore[assignment]
        if self.goes_ahead(step_id):  # the device runs it until the next is queued
            self._launched(step_id + 1).wait(DEVICE_S)
        with self.lock:
            self.calls.append(("finish", launched.prepared))  # type: ignore[arg-type]
        return launched.result or StepResult(launched.prepared, [], 0.0)  # type: ignore[arg-type]


async def run_order(core: OrderCore, step_ids: range) -> list[int | None]:
    core.last = step_ids[-1]
    pipeline = StepPipeline("order", overlap_prepare=True, launch_ahead=True)
    pipeline.attach(core)  # type: ignore[arg-type]
    run = pipeline.open(core, after_execute=lambda plan, result: result)  # type: ignore[arg-type]
    futures = [run.submit(StepPlan(s)) for s in step_ids]
    core.submitted.set()
    done = [f.result(timeout=WAIT_S) for f in futures]
    await pipeline.close()
    return [None if r is None else r.step_id for r in done]


AHEAD_1_TO_4 = [
    ("launch", 1), ("launch", 2), ("finish", 1),
    ("launch", 3), ("finish", 2),
    ("launch", 4), ("finish", 3),
    ("finish", 4),
]  # fmt: skip
"""Four plain steps, each launched before the one before it is finished."""


async def test_the_next_plain_step_is_launched_before_this_one_is_finished():
    core = OrderCore()
    assert await run_order(core, range(1, 5)) == [1, 2, 3, 4]
    assert core.calls == AHEAD_1_TO_4


async def test_a_plan_that_comes_while_the_step_before_runs_is_launched_before_its_finish():
    # plan 3 is queued only once step 2 is launched (as a scheduler plans once step 1 is
    # answered): the prepare thread launches it while the device still runs step 2
    core = OrderCore(last=4)
    core.submitted.set()
    pipeline = StepPipeline("late", overlap_prepare=True, launch_ahead=True)
    pipeline.attach(core)  # type: ignore[arg-type]
    run = pipeline.open(core, after_execute=lambda plan, result: result)  # type: ignore[arg-type]
    futures = [run.submit(StepPlan(1)), run.submit(StepPlan(2))]
    for step_id in (3, 4):
        assert await asyncio.to_thread(core._launched(step_id - 1).wait, WAIT_S)
        futures.append(run.submit(StepPlan(step_id)))
    done = [f.result(timeout=WAIT_S) for f in futures]
    await pipeline.close()
    assert [r.step_id for r in done] == [1, 2, 3, 4]
    assert core.calls == AHEAD_1_TO_4
    assert run.counts.launched_ahead == 3 and run.counts.launched_on_prepare >= 2


async def test_a_launch_that_fails_on_the_prepare_thread_fails_its_own_step_in_order():
    # step 3's launch raises on the prepare thread (its plan came while step 2 ran): step 2
    # still answers, step 3's future raises the launch's error, step 4 is skipped
    core = OrderCore(last=4, fail_launch={3})
    core.submitted.set()
    errors: list[str] = []
    pipeline = StepPipeline("failing", overlap_prepare=True, launch_ahead=True)
    pipeline.attach(core)  # type: ignore[arg-type]
    run = pipeline.open(
        core,  # type: ignore[arg-type]
        after_execute=lambda plan, result: result,
        on_error=lambda: errors.append("failed"),
    )
    futures = [run.submit(StepPlan(1)), run.submit(StepPlan(2))]
    assert await asyncio.to_thread(core._launched(2).wait, WAIT_S)
    futures += [run.submit(StepPlan(3)), run.submit(StepPlan(4))]
    assert futures[0].result(WAIT_S).step_id == 1 and futures[1].result(WAIT_S).step_id == 2
    with pytest.raises(RuntimeError, match="step 3 could not be launched"):
        futures[2].result(WAIT_S)
    assert futures[3].result(WAIT_S) is None
    await pipeline.close()
    assert errors == ["failed"]
    assert core.failed_on.startswith("failing-prepare")
    assert ("launch", 4) not in core.calls


async def test_a_step_whose_prepare_waits_for_the_one_before_is_launched_after_it():
    # step 3 drafts: its prepare waits for step 2's execute, so step 2 must not wait for it
    core = OrderCore(serial={3}, not_plain={5})
    assert await run_order(core, range(1, 7)) == [1, 2, 3, 4, 5, 6]
    assert core.calls == [
        ("launch", 1), ("launch", 2), ("finish", 1),
        ("finish", 2),  # step 3 is not launched ahead of step 2's finish
        ("launch", 3),  # nor step 4 ahead of step 3 (it follows a drafting step)
        ("finish", 3),
        ("launch", 4), ("finish", 4),  # step 5 (not plain) runs whole at its own launch
        ("launch", 5), ("finish", 5),
        ("launch", 6), ("finish", 6),
    ]  # fmt: skip
