"""The step pipeline on a recording core: the prepare gate, skipped plans after a failure,
where prepares run, the drop after a run, and closing."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest
import torch

from radixmesh.errors import InvalidArgument
from radixmesh.sampling import Constraint, ConstraintKind
from radixmesh.step import RunningSequence, StepPlan, StepResult
from services.executor.core import pipeline as pipeline_module
from services.executor.core.pipeline import StepPipeline, prepare_constraint
from services.executor.core.spec.drafting import NO_DRAFTS, DraftChoice

WAIT_S = 10.0
MAY_DRAFT = DraftChoice(proposer=False, forced=True)


class RecordingCore:
    """Prepares and executes nothing but records (verb, step_id, steps executed, thread)."""

    device = torch.device("cpu")

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int, str]] = []
        self.num_executed = 0
        self.fail: dict[tuple[str, int], Exception] = {}
        self.before_execute: dict[int, Callable[[], None]] = {}
        self.drafts: set[int] = set()
        """Plans whose steps the core says may draft."""
        self.found_none: set[int] = set()
        """Of those, the plans whose prepare found no draft (a plain step after all)."""
        self.asked: list[int] = []
        """The plans whose drafting was asked, in order."""

    def _record(self, verb: str, step_id: int) -> None:
        self.calls.append((verb, step_id, self.num_executed, threading.current_thread().name))
        if (error := self.fail.get((verb, step_id))) is not None:
            raise error

    def drafting(self, plan: StepPlan, substep: int = 0) -> DraftChoice:
        self.asked.append(plan.step_id)
        return MAY_DRAFT if plan.step_id in self.drafts else NO_DRAFTS

    def prepare(self, plan: StepPlan) -> int:
        self._record("prepare", plan.step_id)
        return plan.step_id

    def verifies(self, step_id: int) -> bool:
        return step_id in self.drafts and step_id not in self.found_none

    def execute(self, step_id: int) -> StepResult:
        if (hook := self.before_execute.get(step_id)) is not None:
            hook()
        self._record("execute", step_id)
        self.num_executed += 1
        return StepResult(step_id, [], 0.0)

    def ran(self, verb: str) -> list[int]:
        return [step_id for v, step_id, _, _ in self.calls if v == verb]


def make_pipeline(
    core: RecordingCore, overlap_prepare: bool | None, serial_on_step_thread: bool | None = None
) -> StepPipeline:
    pipeline = StepPipeline(
        "test", overlap_prepare=overlap_prepare, serial_on_step_thread=serial_on_step_thread
    )
    pipeline.attach(core)  # type: ignore[arg-type]
    return pipeline


async def test_a_plan_arriving_after_the_step_thread_ran_dry_reports_the_gap(monkeypatch):
    """Each time a plan finds the run's step before it ended, its result carries the time
    from that step's end; a plan queued behind a running step, and the run's first, none."""
    now = [10.0]
    monkeypatch.setattr(pipeline_module.time, "perf_counter", lambda: now[0])
    core = RecordingCore()
    pipeline = make_pipeline(core, overlap_prepare=True)
    release = threading.Event()
    core.before_execute[2] = lambda: release.wait(WAIT_S)
    run = pipeline.open(core, after_execute=lambda plan, r: r)  # type: ignore[arg-type]
    first = run.submit(StepPlan(1))
    assert answers([first]) == [1]  # ends at 10.0
    now[0] = 12.5
    second = run.submit(StepPlan(2))  # the step thread had run dry for 2.5 s
    third = run.submit(StepPlan(3))  # queued behind step 2, which waits: no gap
    release.set()
    assert answers([second, third]) == [2, 3]
    await pipeline.close()
    gaps = [f.result().idle_gap_s for f in (first, second, third)]
    assert [g for g in gaps if g] == [2.5] and run.counts.idle_s == 2.5
    assert run.counts.idle_starts == 2  # the first plan, then the one after the gap


def answers(futures) -> list[int | None]:
    return [None if (r := f.result(timeout=WAIT_S)) is None else r.step_id for f in futures]


def open_overlap_run(core: RecordingCore, pipeline, held_steps):
    """A run whose steps in held_steps each start only once the next plan is being prepared
    (with prepares on the step thread they would wait in vain); returns the run and, per
    held step, whether that prepare came (filled as the steps run)."""
    prepared = {step_id: threading.Event() for step_id in range(1, 8)}
    overlapped: dict[int, bool] = {}
    run = pipeline.open(
        core,  # type: ignore[arg-type]
        after_execute=lambda plan, result: result,
        before_prepare=lambda plan: prepared[plan.step_id].set(),
    )
    for step_id in held_steps:
        def hold(step_id: int = step_id) -> None:
            overlapped[step_id] = prepared[step_id + 1].wait(WAIT_S)

        core.before_execute[step_id] = hold
    return run, overlapped


async def test_plan_n_plus_1_is_prepared_during_step_n_and_no_further_ahead():
    core = RecordingCore()
    pipeline = make_pipeline(core, overlap_prepare=True)
    run, overlapped = open_overlap_run(core, pipeline, range(1, 6))
    futures = [run.submit(StepPlan(step_id)) for step_id in range(1, 7)]
    assert answers(futures) == [1, 2, 3, 4, 5, 6]
    await pipeline.close()
    assert overlapped == dict.fromkeys(range(1, 6), True)
    assert core.ran("prepare") == core.ran("execute") == [1, 2, 3, 4, 5, 6]
    for verb, step_id, num_executed, thread in core.calls:
        if verb == "prepare":  # plan N + 1 waits for step N - 1: one step ahead at most
            assert num_executed >= step_id - 2, (step_id, num_executed)
            assert thread.startswith("test-prepare")
        else:
            assert thread.startswith("test-step")


def drafted_plan(step_id: int) -> StepPlan:
    return StepPlan(step_id, running_seqs=[RunningSequence("a", 1, [], 4)])


async def test_a_plan_allowing_drafts_that_the_core_declines_is_prepared_during_the_step_before():
    core = RecordingCore()  # every plan allows draft tokens; the core drafts only in plan 4
    core.drafts = {4}
    pipeline = make_pipeline(core, overlap_prepare=True)
    # plan 3 (before a drafting plan) and 4 (drafts) are not held
    run, overlapped = open_overlap_run(core, pipeline, (1, 2, 5))
    futures = [run.submit(drafted_plan(step_id)) for step_id in range(1, 7)]
    assert answers(futures) == [1, 2, 3, 4, 5, 6]
    await pipeline.close()
    assert overlapped == {1: True, 2: True, 5: True}
    num_executed_at = {step_id: n for verb, step_id, n, _ in core.calls if verb == "prepare"}
    assert num_executed_at[4] == 3  # may draft: prepared once step 3 executed
    assert num_executed_at[5] == 4  # after a drafting step: once it executed
    assert core.asked == [1, 2, 3, 4, 5, 6]  # once per step


async def test_the_step_after_one_that_may_draft_but_found_none_is_prepared_while_it_runs():
    core = RecordingCore()  # plan 4 may draft, but its prepare finds no draft
    core.drafts, core.found_none = {4, 6}, {4}
    pipeline = make_pipeline(core, overlap_prepare=True)
    # step 4 runs only once plan 5 is being prepared: 5 must not wait for it
    run, overlapped = open_overlap_run(core, pipeline, (1, 2, 4))
    futures = [run.submit(drafted_plan(step_id)) for step_id in range(1, 8)]
    assert answers(futures) == [1, 2, 3, 4, 5, 6, 7]
    await pipeline.close()
    assert overlapped == {1: True, 2: True, 4: True}
    num_executed_at = {step_id: n for verb, step_id, n, _ in core.calls if verb == "prepare"}
    assert num_executed_at[4] == 3  # may draft: still prepared once step 3 executed
    assert num_executed_at[7] == 6  # after a step that drafted: once it executed
    assert run.counts.serial_steps == 3  # plans 4, 6 (may draft) and 7 (after 6's drafts)


def prepared_on(core: RecordingCore) -> dict[int, str]:
    return {step_id: thread.rsplit("_", 1)[0] for verb, step_id, _, thread in core.calls if verb == "prepare"}


@pytest.mark.parametrize("on_step_thread", [True, False])
async def test_a_serial_step_is_prepared_by_the_step_thread_right_after_the_step_before(
    on_step_thread,
):
    core = RecordingCore()  # plans 3 and 4 may draft (4 after 3's drafts); 6 found none
    core.drafts, core.found_none = {3, 4, 6}, {6}
    pipeline = make_pipeline(core, overlap_prepare=True, serial_on_step_thread=on_step_thread)
    run = pipeline.open(core, after_execute=lambda plan, result: result)  # type: ignore[arg-type]
    futures = [run.submit(drafted_plan(step_id)) for step_id in range(1, 9)]
    assert answers(futures) == list(range(1, 9))
    await pipeline.close()
    assert core.ran("prepare") == core.ran("execute") == list(range(1, 9))
    serial = {3, 4, 5, 6}  # 5: after 4's drafts; 7 follows 6, which found none
    step_thread = "test-step" if on_step_thread else "test-prepare"
    assert prepared_on(core) == {
        step_id: step_thread if step_id in serial else "test-prepare" for step_id in range(1, 9)
    }
    num_executed_at = {step_id: n for verb, step_id, n, _ in core.calls if verb == "prepare"}
    for step_id in serial:
        assert num_executed_at[step_id] == step_id - 1  # once the step before executed
    assert run.counts.serial_steps == len(serial)


async def test_a_serial_prepare_that_fails_on_the_step_thread_surfaces_in_order():
    core = RecordingCore()
    core.drafts = {2, 3}
    core.fail[("prepare", 2)] = InvalidArgument("plan 2 refused")
    pipeline = make_pipeline(core, overlap_prepare=True, serial_on_step_thread=True)
    errors: list[str] = []
    run = pipeline.open(
        core,  # type: ignore[arg-type]
        after_execute=lambda plan, result: result.step_id,
        on_error=lambda: errors.append("failed"),
    )
    futures = [run.submit(drafted_plan(step_id)) for step_id in range(1, 5)]
    assert futures[0].result(timeout=WAIT_S) == 1
    with pytest.raises(InvalidArgument, match="plan 2 refused"):
        futures[1].result(timeout=WAIT_S)
    assert [f.result(timeout=WAIT_S) for f in futures[2:]] == [None, None]
    await pipeline.close()  # the plans after it were not left waiting
    assert core.ran("prepare") == [1, 2] and core.ran("execute") == [1]
    assert prepared_on(core)[2] == "test-step"
    assert run.prepare_failed and run.execute_failed and errors == ["failed"]


def test_serial_prepare_mode_comes_from_the_environment(monkeypatch):
    core = RecordingCore()
    monkeypatch.setenv("RADIXMESH_SERIAL_PREPARE", "prepare")
    assert not make_pipeline(core, overlap_prepare=True).serial_on_step_thread
    monkeypatch.setenv("RADIXMESH_SERIAL_PREPARE", "step")
    assert make_pipeline(core, overlap_prepare=True).serial_on_step_thread
    assert not make_pipeline(core, overlap_prepare=False).serial_on_step_thread  # one thread
    monkeypatch.setenv("RADIXMESH_SERIAL_PREPARE", "sideways")
    with pytest.raises(InvalidArgument, match="RADIXMESH_SERIAL_PREPARE must be one of step, prepare"):
        make_pipeline(core, overlap_prepare=True)


async def test_after_a_failed_execute_later_plans_answer_none_and_the_error_is_counted():
    core = RecordingCore()
    core.fail[("execute", 2)] = RuntimeError("device lost")
    pipeline = make_pipeline(core, overlap_prepare=True)
    errors: list[str] = []
    run = pipeline.open(
        core,  # type: ignore[arg-type]
        after_execute=lambda plan, result: result,
        on_error=lambda: errors.append(threading.current_thread().name),
    )
    futures = [run.submit(StepPlan(step_id)) for step_id in range(1, 6)]
    assert futures[0].result(timeout=WAIT_S).step_id == 1
    with pytest.raises(RuntimeError, match="device lost"):
        futures[1].result(timeout=WAIT_S)
    assert answers(futures[2:]) == [None, None, None]
    await pipeline.close()
    assert core.ran("execute") == [1, 2]
    assert 4 not in core.ran("prepare")  # plan 4 waits for step 2, which failed
    assert len(errors) == 1 and errors[0].startswith("test-step")
    assert run.execute_failed and not run.prepare_failed


async def test_a_failed_prepare_surfaces_after_the_steps_before_it():
    core = RecordingCore()
    core.fail[("prepare", 2)] = InvalidArgument("plan 2 refused")
    pipeline = make_pipeline(core, overlap_prepare=True)
    run = pipeline.open(core, after_execute=lambda plan, result: result.step_id)  # type: ignore[arg-type]
    futures = [run.submit(StepPlan(step_id)) for step_id in range(1, 4)]
    assert futures[0].result(timeout=WAIT_S) == 1
    with pytest.raises(InvalidArgument, match="plan 2 refused"):
        futures[1].result(timeout=WAIT_S)
    assert futures[2].result(timeout=WAIT_S) is None
    await pipeline.close()
    assert core.ran("execute") == [1]
    assert run.prepare_failed and run.execute_failed


@pytest.mark.parametrize("overlap_prepare", [None, False])
async def test_without_overlap_each_plan_is_prepared_then_executed_on_the_step_thread(
    overlap_prepare,
):
    core = RecordingCore()  # a CPU core: None means no overlap
    pipeline = make_pipeline(core, overlap_prepare)
    run = pipeline.open(core, after_execute=lambda plan, result: result)  # type: ignore[arg-type]
    futures = [run.submit(StepPlan(step_id)) for step_id in range(1, 5)]
    assert answers(futures) == [1, 2, 3, 4]
    await pipeline.close()
    assert [(verb, step_id) for verb, step_id, *_ in core.calls] == [
        (verb, step_id) for step_id in range(1, 5) for verb in ("prepare", "execute")
    ]
    assert {thread.split("_")[0] for *_, thread in core.calls} == {"test-step"}


async def test_a_closed_run_skips_its_queued_plans_and_run_after_follows_them():
    core = RecordingCore()
    pipeline = make_pipeline(core, overlap_prepare=True)
    tracked: list[int] = []
    run = pipeline.open(
        core,  # type: ignore[arg-type]
        after_execute=lambda plan, result: result,
        before_prepare=lambda plan: tracked.append(plan.step_id),
    )
    release = threading.Event()
    core.before_execute[1] = lambda: release.wait(WAIT_S)
    futures = [run.submit(StepPlan(step_id)) for step_id in range(1, 5)]
    run.closed = True  # the stream ends while step 1 executes
    dropped = pipeline.run_after(run, lambda: list(core.ran("prepare")))
    release.set()
    assert answers(futures) == [1, None, None, None]
    prepared_at_drop = await asyncio.wrap_future(dropped)
    assert prepared_at_drop == core.ran("prepare") == tracked
    assert core.ran("execute") == [1]
    await pipeline.close()


async def test_close_runs_the_last_job_after_queued_steps_and_closing_again_does_nothing():
    core = RecordingCore()
    pipeline = make_pipeline(core, overlap_prepare=True)
    run = pipeline.open(core, after_execute=lambda plan, result: result)  # type: ignore[arg-type]
    futures = [run.submit(StepPlan(step_id)) for step_id in range(1, 4)]
    order: list[str] = []
    await pipeline.close(lambda: order.append(f"shutdown after {core.num_executed} steps"))
    assert answers(futures) == [1, 2, 3]
    assert order == ["shutdown after 3 steps"]
    await pipeline.close(lambda: order.append("again"))
    assert order == ["shutdown after 3 steps"]


async def test_prepare_constraint_without_a_grammar_backend_names_the_executor():
    with pytest.raises(InvalidArgument, match="constraint: executor e-1 has no grammar backend"):
        await prepare_constraint(None, Constraint(ConstraintKind.REGEX, "a+"), "e-1")
