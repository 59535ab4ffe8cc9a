"""The executor's step pipeline: plans prepared ahead of the step that executes.

Two worker threads run an `ExecutorCore`, each strictly in plan order: the
prepare thread runs `ExecutorCore.prepare` (checks, state, host arrays,
upload), the execute thread `ExecutorCore.execute` (forward, sampling, finish
detection). Plan N + 1 is prepared while step N executes (on CUDA, while
execute waits for the sampled tokens), and no further ahead: its prepare
starts once step N - 1 has executed; a plan the core says may draft
(`ExecutorCore.drafting`: its switches allow it), or one that follows it, is
prepared once step N has executed, and any other prepare drafts nothing. Such a serial
step is prepared by the step thread itself, right after step N, then launched
(`serial_on_step_thread`): with no hand-over between the threads in between, and the
event loop's handling of step N's result (which wants the interpreter too) left to run
while step N + 1 is on the device. With `overlap_prepare` off (by default
on CPU, where there is no device time to hide and two threads only contend
for the interpreter) prepares run on the execute thread, between steps. On a
device "cuda:N" both threads make it their current device (`bind_device`,
from `attach` at the latest) before any job queued after.

Launch-ahead (`launch_ahead`, by default on a CUDA core whose prepares overlap): a
step is `launch`ed (its forward, sample and the sampled ids' copy to the host queued on
the device) and then, before it is `finish`ed (its ids read back, its finishes found,
its answer given), the step after it is launched too when both are plain
(`ExecutorCore.plain`) and that step's prepare is not waiting for this one. So the
device runs step N + 1 while the host reads step N back: no gap between two decode
steps for the read-back, the finish detection and the next launch's host work. Whichever
thread comes second launches it: the step thread right after launching step N when step
N + 1 is prepared by then, else the prepare thread as soon as it has prepared it, if step
N is still unfinished (a plan that arrives while step N runs on the device, as the next
plan does when the scheduler plans once the step before N is answered).

A multi-step plan (`StepPlan.num_steps` k) is queued as k steps of the same plan,
each its own prepare and execute (`ExecutorCore.prepare`, then `prepare_next`), with
one future per step, so each step's tokens are answered as the step ends.

A `PlanRun` is one numbered series of plans (a scheduler's Step stream, or an
in-process port's life). Once a prepare or execute of a run raises, the
failure surfaces in plan order (after the results of the plans before it) and
the run's later plans are skipped: their futures answer None. Both the
executor service's servicer and the in-process engine's port run their steps
here; `prepare_constraint` is their `PrepareConstraint`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Generic, TypeVar

import torch

from radixmesh.errors import InvalidArgument
from radixmesh.sampling import Constraint
from radixmesh.step import MAX_STEPS_PER_PLAN, StepPlan, StepResult
from services.executor.core.spec.drafting import NO_DRAFTS

if TYPE_CHECKING:
    from services.executor.core.executor import ExecutorCore
    from services.executor.core.grammar import GrammarService
    from services.executor.core.step_types import LaunchedStep, PreparedStep

R = TypeVar("R")
T = TypeVar("T")


class _OnStepThread:
    """A prepare's answer when it left its step to the step thread (`PlanRun._prepare`)."""


_ON_STEP_THREAD = _OnStepThread()


@dataclasses.dataclass(slots=True)
class PipelineCounts:
    """What a run's steps waited for, counted as they run (cumulative; `snapshot` copies)."""

    steps: int = 0
    """Steps prepared (each step of a multi-step plan counts)."""
    serial_steps: int = 0
    """Steps whose prepare waited for the step just before it (it may draft, or that one
    may have): their host work is not hidden behind a step on the device. Where the step
    thread prepares them (`StepPipeline.serial_on_step_thread`) they add nothing to
    `prepare_wait_s`."""
    idle_starts: int = 0
    """Steps queued while no step before them was running or waiting: the step thread had
    nothing to do until this one's prepare ended (the scheduler had not planned ahead)."""
    idle_s: float = 0.0
    """Seconds the step thread had run out of steps before those idle starts, each from the
    end of the step before to the plan's arrival (a run's first step adds none)."""
    prepare_wait_s: float = 0.0
    """Seconds the prepares spent waiting for the steps they were gated on."""
    launched_ahead: int = 0
    """Steps queued on the device before the step before them was finished (launch-ahead)."""
    launched_on_prepare: int = 0
    """Of those, the steps the prepare thread launched (prepared after the step before
    them was launched, while it ran)."""

    def snapshot(self) -> PipelineCounts:
        return dataclasses.replace(self)


@dataclasses.dataclass(slots=True, eq=False)
class _Slot:
    """One queued step: what its prepare waits for, and what the step before it sees."""

    plan: StepPlan
    substep: int
    last: Future | None
    """The execute of the step queued just before (waited for when the prepare is serial)."""
    older: Future | None
    """The execute of the step before that (waited for otherwise)."""
    prepare: Future[PreparedStep | _OnStepThread | None] | None = None
    """Set by the loop thread right after the prepare is queued."""
    prepared: PreparedStep | None = None
    ready: bool = False
    """Under `PlanRun._launching`: prepared (as `prepared`) without waiting for the step
    before it, so the step thread may launch it ahead of that step's finish."""
    inline: threading.Event | None = None
    """Serial and left to the step thread (`PlanRun._prepare`): set once it has prepared
    the step, so the prepare thread prepares the step after it no earlier."""
    may_draft: bool = False
    """Left to the step thread: what the core said of its drafting."""
    idle_gap_s: float = 0.0
    """The step thread had run out of the run's steps this long before the step came."""


class PlanRun(Generic[R]):
    """One series of plans through a pipeline; each plan's future answers `after_execute`'s
    value, or None when the plan was skipped (the run closed or an earlier plan failed).

    Hooks: `before_prepare(plan)` on the prepare thread just before the core prepares a
    plan it will run; `after_execute(plan, result)` on the execute thread after the step;
    `on_error()` on the execute thread when a prepare or execute surfaces as failed. A
    plan that arrives after the run's step before it has ended carries, on its first
    step's result, how long the step thread had had nothing of the run to do
    (`StepResult.idle_gap_s`; summed in `PipelineCounts.idle_s`).
    """

    def __init__(
        self,
        pipeline: StepPipeline,
        core: ExecutorCore,
        after_execute: Callable[[StepPlan, StepResult], R],
        before_prepare: Callable[[StepPlan], None] | None = None,
        on_error: Callable[[], None] | None = None,
    ) -> None:
        self._pipeline = pipeline
        self._core = core
        self._after_execute = after_execute
        self._before_prepare = before_prepare
        self._on_error = on_error
        self._last_end = 0.0
        """Execute thread: `time.perf_counter()` as the run's last step ended (read by the
        submitting thread once that step's future is done)."""
        self._executes: deque[Future[R | None]] = deque(maxlen=2)
        """Loop thread: the last two plans' executes; plan N + 1's prepare waits for the older."""
        self._drafts_before = False
        """Prepare thread: the core said the step prepared last may draft (the step
        thread's, for a step it prepared)."""
        self._inline_before: threading.Event | None = None
        """Prepare thread: the event of the last step left to the step thread."""
        self.last_prepare: Future[PreparedStep | _OnStepThread | None] | None = None
        """Loop thread: the last prepare queued (`StepPipeline.run_after` waits for it)."""
        self.closed = False
        """Set by the owner: the run is ending; plans not yet prepared or executed are skipped."""
        self.prepare_failed = False
        """Prepare thread: a prepare raised; the plans after it are skipped."""
        self.execute_failed = False
        """Execute thread: a step raised (or a failed prepare surfaced); later ones are skipped."""
        self.counts = PipelineCounts()
        """Prepare thread (idle_starts: loop thread; launched_ahead and launched_on_prepare:
        under `_launching`): what the steps waited for."""
        self._slots: deque[_Slot] = deque()
        """The steps queued and not yet executed, oldest first (appended by the loop thread,
        taken by the step thread)."""
        self._launching = threading.Lock()
        """Held to launch a step ahead and to change `_running` and `_ahead`."""
        self._running: _Slot | None = None
        """The step launched by the step thread and not yet finished (its next step may be
        launched ahead by either thread)."""
        self._ahead: LaunchedStep | BaseException | None = None
        """The next step, launched while the one before it ran (or what its launch raised)."""

    def submit(self, plan: StepPlan) -> Future[R | None]:
        """`submit_steps` for a plan of one step: its one future."""
        if plan.num_steps != 1:
            raise InvalidArgument(f"plan {plan.step_id}: submit_steps runs multi-step plans")
        return self.submit_steps(plan)[0]

    def submit_steps(self, plan: StepPlan) -> list[Future[R | None]]:
        """Queue each step of the plan (`plan.num_steps`, one future per step, in order).

        Its abort_req_ids are stopped at once (`ExecutorCore.stop`), so a multi-step plan
        queued before skips them from its next step prepared. A plan's shape is checked
        by its first step's prepare; should that refuse it, its later steps are skipped.
        """
        if plan.abort_req_ids:
            self._core.stop(plan.abort_req_ids)
        num_steps = max(1, min(plan.num_steps, MAX_STEPS_PER_PLAN))
        return [self._submit_one(plan, substep) for substep in range(num_steps)]

    def _submit_one(self, plan: StepPlan, substep: int) -> Future[R | None]:
        """Queue one step's prepare and execute (see `_prepare` for what the prepare waits for)."""
        executes = self._executes
        last = executes[-1] if executes else None
        older = executes[0] if len(executes) == executes.maxlen else None
        slot = _Slot(plan, substep, last, older)
        if last is None or last.done():
            self.counts.idle_starts += 1
            if last is not None:
                slot.idle_gap_s = max(0.0, time.perf_counter() - self._last_end)
                self.counts.idle_s += slot.idle_gap_s
        self._slots.append(slot)
        prepare = self._pipeline.prepare_thread.submit(self._prepare, slot)
        slot.prepare = self.last_prepare = prepare
        execute = self._pipeline.step_thread.submit(self._execute, slot)
        executes.append(execute)
        return execute

    def _prepare(self, slot: _Slot) -> PreparedStep | _OnStepThread | None:
        """On the prepare thread: step N + 1 is prepared once step N - 1 (`older`) has
        executed, or step N (`last`) when the core says this step may draft
        (`ExecutorCore.drafting`, asked first) or the step before drafted (a draft is
        proposed from the token sampled last, and a verified one moves the position). The
        core's prepare follows the answer it gave for the plan, so a step prepared without
        waiting for `last` drafts nothing. A step that may draft but found no draft at its
        prepare (`ExecutorCore.verifies` false) is a plain one, and the step after it is
        prepared while it runs, as after any plain step (at batch 128 on a lent H100, 63%
        of a speculating engine's steps were prepared after the step before ended, about
        a sixth of them after a step that had found no draft: bench/RESULTS.md).

        A serial step is left to the step thread where prepares overlap
        (`StepPipeline.serial_on_step_thread`): it prepares the step right after step N,
        then launches it, so no hand-over between the two threads lies between the steps,
        and the event loop's handling of step N's result runs while step N + 1 is on the
        device, not before its prepare. The answer is then `_ON_STEP_THREAD`, and the
        step after it is prepared once the step thread has prepared it."""
        plan, substep = slot.plan, slot.substep
        if (before := self._inline_before) is not None:
            self._inline_before = None
            before.wait()  # prepares stay in plan order: the step before is prepared first
        if self.closed or self.prepare_failed or self.execute_failed:
            return None
        try:
            drafting = self._core.drafting(plan, substep)
        except BaseException:
            self.prepare_failed = True
            raise
        may_draft = drafting != NO_DRAFTS
        serial = may_draft or self._drafts_before
        self._drafts_before = may_draft
        counts = self.counts
        counts.steps += 1
        counts.serial_steps += serial and slot.last is not None
        if serial and slot.last is not None and self._pipeline.serial_on_step_thread:
            slot.may_draft = may_draft
            slot.inline = self._inline_before = threading.Event()
            return _ON_STEP_THREAD
        gate = slot.last if serial else slot.older
        if gate is not None and not gate.done():
            start = time.perf_counter()
            wait([gate])
            counts.prepare_wait_s += time.perf_counter() - start
        prepared = self._prepare_step(slot, may_draft)
        if not serial and self._pipeline.launch_ahead:
            self._launch_if_next(slot, prepared)
        return prepared

    def _prepare_step(self, slot: _Slot, may_draft: bool) -> PreparedStep | None:
        """The core's prepare of the slot's step, on the prepare thread or (a serial step
        where prepares overlap) on the step thread; None when the run closed or failed."""
        plan, substep = slot.plan, slot.substep
        if self.closed or self.prepare_failed or self.execute_failed:
            return None
        if self._before_prepare is not None and not substep:
            self._before_prepare(plan)
        try:
            if substep:
                prepared = self._core.prepare_next(plan, substep)
            else:
                prepared = self._core.prepare(plan)  # with `drafting`: NO_DRAFTS unless it waited
        except BaseException:
            self.prepare_failed = True
            raise
        if may_draft and prepared is not None and not self._core.verifies(prepared):
            self._drafts_before = False  # found no draft: a plain step, the next may overlap it
        return prepared

    def _execute(self, slot: _Slot) -> R | None:
        """One step, on the execute thread; None when the run closed or failed before it."""
        try:
            return self._execute_step(slot)
        finally:
            if slot.inline is not None:  # prepared here or never: the next prepare may go
                slot.inline.set()
            self._last_end = time.perf_counter()  # before the future is done

    def _execute_step(self, slot: _Slot) -> R | None:
        with self._launching:
            taken = self._slots.popleft()
            ahead, self._ahead = self._ahead, None
        assert taken is slot, "steps execute in the order queued"
        if self.closed or self.execute_failed:
            return None
        try:
            assert slot.prepare is not None
            prepared = slot.prepare.result()  # a failed prepare raises here, after the steps before
            if isinstance(prepared, _OnStepThread):
                prepared = self._prepare_step(slot, slot.may_draft)
                assert slot.inline is not None
                slot.inline.set()  # before the launch: the next prepare overlaps this step
            if prepared is None:
                return None
            if not self._pipeline.launch_ahead:
                result = self._core.execute(prepared)
            else:
                if isinstance(ahead, BaseException):
                    raise ahead
                assert ahead is None or ahead.prepared is prepared, "launched in queue order"
                launched = ahead if ahead is not None else self._core.launch(prepared)
                if launched.result is None:  # plain: the next step may go before its finish
                    self._launch_next(slot)
                try:
                    result = self._core.finish(launched)
                finally:
                    with self._launching:
                        self._running = None
        except BaseException:
            self.execute_failed = True
            if self._on_error is not None:
                self._on_error()
            raise
        result.idle_gap_s = slot.idle_gap_s
        return self._after_execute(slot.plan, result)

    def _launch_next(self, running: _Slot) -> None:
        """On the step thread, `running`'s step just launched: launches the step queued
        after it if that one is prepared already (and plain, and its prepare did not wait
        for `running`); else its prepare thread may, once it has prepared it, until
        `running` is finished. A failed prepare is left for that step's execute."""
        with self._launching:
            self._running = running
            if not self._slots:
                return  # the next plan has not come: the prepare thread may launch it
            slot = self._slots[0]
            if slot.ready:
                self._launch(slot.prepared)

    def _launch_if_next(self, slot: _Slot, prepared: PreparedStep | None) -> None:
        """On the prepare thread, `slot` (not serial) just prepared: launches it now if the
        step before it is launched and not yet finished (and it is plain); else leaves it
        ready for the step thread, which launches it with the step before it."""
        with self._launching:
            slot.prepared, slot.ready = prepared, True
            if self._running is None or not self._slots or self._slots[0] is not slot:
                return
            if self._launch(prepared):
                self.counts.launched_on_prepare += 1

    def _launch(self, prepared: PreparedStep | None) -> bool:
        """Under `_launching`: launch the next step ahead unless it was, it is not plain, or
        the run is closing."""
        if self._ahead is not None or self.closed or prepared is None or not self._core.plain(prepared):
            return False
        try:
            self._ahead = self._core.launch(prepared)
        except BaseException as exc:  # its own execute raises it, in plan order
            self._ahead = exc
            return False
        self.counts.launched_ahead += 1
        return True


class StepPipeline:
    """The two worker threads of one executor core; see the module docstring.

    Threads are named "<name>-prepare" and "<name>-step". `overlap_prepare`: prepare
    on the prepare thread while a step executes; `launch_ahead`: launch a plain step
    before the one before it is finished (only with overlapping prepares); None: on a
    CUDA core only. `serial_on_step_thread`: a step whose prepare must wait for the step
    before it is prepared by the step thread (only with overlapping prepares); None: from
    RADIXMESH_SERIAL_PREPARE ("step", the default, or "prepare" for the prepare thread).
    """

    def __init__(
        self,
        name: str = "executor",
        *,
        overlap_prepare: bool | None = None,
        launch_ahead: bool | None = None,
        serial_on_step_thread: bool | None = None,
    ) -> None:
        self._prepare_thread = ThreadPoolExecutor(1, thread_name_prefix=f"{name}-prepare")
        self._execute_thread = ThreadPoolExecutor(1, thread_name_prefix=f"{name}-step")
        self._overlap_prepare = overlap_prepare
        self._launch_ahead = launch_ahead
        self._prepare_on = self._prepare_thread
        """Where prepares run: the prepare thread, or the execute thread (set by `attach`)."""
        self.launch_ahead = False
        """Steps launched before the step before them is finished (set by `attach`)."""
        self._serial_on_step_thread = serial_on_step_thread
        self.serial_on_step_thread = False
        """Serial steps prepared by the step thread (set by `attach`; see `PlanRun._prepare`)."""
        self._closed = False

    def attach(self, core: ExecutorCore) -> None:
        """Bind the core's device and decide where prepares run; before any `open`."""
        self.bind_device(core.device)
        overlap = self._overlap_prepare
        if overlap is None:
            overlap = core.device.type == "cuda"
        self._prepare_on = self._prepare_thread if overlap else self._execute_thread
        ahead = self._launch_ahead
        if ahead is None:
            ahead = core.device.type == "cuda"
        # the step thread may wait for the next prepare: never one queued behind it
        self.launch_ahead = ahead and overlap
        serial = self._serial_on_step_thread
        if serial is None:
            serial = serial_prepare_from_env()
        self.serial_on_step_thread = serial and overlap

    def bind_device(self, device: torch.device | str) -> None:
        """Make `device` the current CUDA device of both worker threads, before any job
        queued after this call (a load on `step_thread` too); anything but "cuda:N" is a no-op."""
        try:
            device = torch.device(device)
        except RuntimeError:  # "auto"
            return
        if device.type == "cuda" and device.index is not None:
            for thread in (self._prepare_thread, self._execute_thread):
                thread.submit(torch.cuda.set_device, device)  # FIFO: before later jobs

    @property
    def step_thread(self) -> ThreadPoolExecutor:
        """The thread that executes steps (loading may use it too)."""
        return self._execute_thread

    @property
    def prepare_thread(self) -> ThreadPoolExecutor:
        """Where prepares run: the prepare thread, or the step thread without overlap."""
        return self._prepare_on

    def open(
        self,
        core: ExecutorCore,
        after_execute: Callable[[StepPlan, StepResult], R],
        before_prepare: Callable[[StepPlan], None] | None = None,
        on_error: Callable[[], None] | None = None,
    ) -> PlanRun[R]:
        """A new series of plans on `core` (see `PlanRun` for the hooks)."""
        return PlanRun(self, core, after_execute, before_prepare, on_error)

    def run_after(self, run: PlanRun, job: Callable[[], T]) -> Future[T]:
        """`job` on the step thread, once every plan of `run` is prepared and executed."""

        def after() -> T:
            if run.last_prepare is not None:
                wait([run.last_prepare])
            return job()

        return self._execute_thread.submit(after)

    async def close(self, last: Callable[[], None] | None = None) -> None:
        """After every queued prepare and step, run `last` on the step thread (the core's
        shutdown), then stop both threads. Closing again does nothing."""
        if self._closed:
            return
        self._closed = True
        try:
            await asyncio.wrap_future(self._prepare_on.submit(_nothing))
            await asyncio.wrap_future(self._execute_thread.submit(last or _nothing))
        finally:
            self._prepare_thread.shutdown(wait=False)
            self._execute_thread.shutdown(wait=False)


def _nothing() -> None:
    return None


SERIAL_PREPARE_MODES = {"step": True, "prepare": False}
"""RADIXMESH_SERIAL_PREPARE's values: which thread prepares a serial step (for A/B runs)."""


def serial_prepare_from_env() -> bool:
    """Whether serial steps are prepared on the step thread, from RADIXMESH_SERIAL_PREPARE."""
    mode = os.environ.get("RADIXMESH_SERIAL_PREPARE", "step")
    if mode not in SERIAL_PREPARE_MODES:
        raise InvalidArgument(
            f"RADIXMESH_SERIAL_PREPARE must be one of {', '.join(SERIAL_PREPARE_MODES)}, got {mode!r}"
        )
    return SERIAL_PREPARE_MODES[mode]


async def prepare_constraint(
    grammar: GrammarService | None, constraint: Constraint, executor_id: str
) -> float:
    """`PrepareConstraint`: compile into the grammar cache on its compile threads (never a
    step thread). Returns how long this call waited for the compile, at most the compile's
    own time (about 0 when it was cached)."""
    if grammar is None:
        raise InvalidArgument(f"constraint: executor {executor_id} has no grammar backend")
    start = time.monotonic()
    compiled = await grammar.compile(constraint)
    return min(time.monotonic() - start, compiled.compile_seconds)
