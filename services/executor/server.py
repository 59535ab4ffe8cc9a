"""The `radixmesh.v1.Executor` servicer: a thin shell over `ExecutorCore`.

`Step` is one long-lived bidirectional stream per scheduler, one at a time.
Two tasks share it:

- the reader receives plans, checks they are numbered 1, 2, 3... without gaps,
  converts each (and compiles its grammars) and queues it on the core's step
  pipeline (`core/pipeline.py`: plan N + 1 prepared while step N executes, in
  plan order); it reads at most `max_inflight_plans` plans ahead of the
  results sent;
- the writer (the handler itself) awaits each step's result in order and
  sends it (a multi-step plan's k results each as its step ends; the plan's
  slot frees with its last); the steps that ended while it was sending go in
  the same message, in order (`StepResult.next_results`), so a writer that
  fell behind catches up in one message and those steps wake nothing.

A failed prepare or execute, a plan out of order or a bad plan ends the stream
with its status after the results of the plans before it; later plans do not
run. When the stream ends for any reason (the scheduler closed it, went away,
or an error), every sequence it created is dropped from the core, after every
prepare and execute of the stream; a cancelled handler does not cut the drop
short, and the next stream (and `wait_no_stream`) waits for it. On shutdown
the reader stops taking plans, the queued ones finish, and the stream ends
UNAVAILABLE.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import grpc
import torch

from radixmesh.errors import FailedPrecondition, InvalidArgument, Unavailable
from radixmesh.step import RunningSequence, StepPlan, StepResult
from radixmesh.v1 import executor_pb2, executor_pb2_grpc
from radixmesh.wire import (
    constraint_from_proto,
    info_to_proto,
    plan_from_proto,
    result_to_proto,
)
from services.common import tracing
from services.common.logging import get_logger
from services.executor.core.pipeline import PlanRun, StepPipeline, prepare_constraint
from services.executor.health import HealthSampler
from services.executor.metrics import StepMetrics
from services.executor.step_trace import StepTraces

if TYPE_CHECKING:
    from services.executor.core.executor import ExecutorCore
    from services.executor.core.grammar import GrammarService
    from services.executor.core.spec.radix import TreePrefetch

SERVICE_NAME = executor_pb2.DESCRIPTOR.services_by_name["Executor"].full_name
DEFAULT_MAX_INFLIGHT_PLANS = 4
MAX_RESULTS_PER_MESSAGE = 16
"""Most step results one Step stream message carries (its own and its next_results)."""

log = get_logger(__name__)

_END = object()  # the scheduler closed its side of the stream


class _Stream:
    """One Step stream: its run of plans and the sequences it created; each field says
    which thread writes it."""

    __slots__ = ("ended", "links", "num_steps", "req_ids", "run", "step_traces", "traced")

    def __init__(self, executor_id: str = "") -> None:
        self.req_ids: set[str] = set()
        """Prepare thread: sequences this stream created that the core may still hold."""
        self.traced: dict[str, tracing.Link] = {}
        """Prepare thread: a link to the request span of each traced sequence it holds."""
        self.links: dict[int, list[tracing.Link]] = {}
        """Prepare thread adds a planned step's links; the execute thread takes them."""
        self.step_traces = StepTraces(executor_id)
        """Execute thread: the `executor.step` span of the plan being answered."""
        self.ended: deque[str] = deque()
        """Execute thread appends the sequences the core ended; the prepare thread forgets them."""
        self.num_steps = 0
        """Execute thread: steps answered."""
        self.run: PlanRun[executor_pb2.StepResult]
        """The stream's plans on the pipeline (set by the servicer as the stream opens)."""

    @property
    def closed(self) -> bool:
        """The stream is ending: queued plans are skipped."""
        return self.run.closed


class _Outbox:
    """The reader's queue to the writer: each step's future with whether it is its plan's
    last, then _END or the error. The writer waits on the loop only for a step not yet
    done (`asyncio.wrap_future`), so a step that ends while the writer is busy wakes
    nothing: the writer finds it done and sends it with the one before (`pop_ready`)."""

    __slots__ = ("_items", "_put")

    def __init__(self) -> None:
        self._items: deque[Any] = deque()
        self._put = asyncio.Event()

    def put_nowait(self, item: Any) -> None:
        self._items.append(item)
        self._put.set()

    async def get(self) -> Any:
        while not self._items:
            self._put.clear()
            await self._put.wait()
        return self._items.popleft()

    def pop_ready(self) -> tuple[executor_pb2.StepResult, bool] | None:
        """The next step's answer and whether it ends its plan, if that step has already
        ended with one (not an error, a skip, _END or a step still running)."""
        if not self._items or not isinstance(self._items[0], tuple):
            return None
        future, last_of_plan = self._items[0]
        if not future.done() or future.cancelled() or future.exception() is not None:
            return None
        response = future.result()
        if response is None:
            return None
        self._items.popleft()
        return response, last_of_plan


class ExecutorServicer(executor_pb2_grpc.ExecutorServicer):
    """Serves one `ExecutorCore`, attached once the model is loaded (until then UNAVAILABLE)."""

    def __init__(
        self,
        *,
        max_inflight_plans: int = DEFAULT_MAX_INFLIGHT_PLANS,
        shutdown_requested: Callable[[], Awaitable[None]] | None = None,
        metrics: StepMetrics | None = None,
        health: HealthSampler | None = None,
        overlap_prepare: bool | None = None,
        launch_ahead: bool | None = None,
    ) -> None:
        """`shutdown_requested`: returns once the service is shutting down
        (`ServiceRuntime.wait_shutdown_requested`); open streams then wind down.
        `health`: the device's health, attached to a step result about once a second.
        `overlap_prepare`: prepare plan N + 1 on its own thread while step N executes;
        None: on a CUDA device only (on CPU there is no device time to hide, and the
        two threads only contend for the interpreter: prepares then run on the step
        thread, between steps). `launch_ahead`: queue a plain step on the device before
        the step before it is read back (`StepPipeline`); None: on a CUDA device only."""
        if max_inflight_plans < 1:
            raise InvalidArgument(f"max_inflight_plans must be >= 1, got {max_inflight_plans}")
        self._max_inflight = max_inflight_plans
        self._shutdown_requested = shutdown_requested
        self._metrics = metrics or StepMetrics.create()
        self._health = health or HealthSampler()
        self._pipeline = StepPipeline(
            "executor", overlap_prepare=overlap_prepare, launch_ahead=launch_ahead
        )
        self._core: ExecutorCore | None = None
        self._grammar: GrammarService | None = None
        self._executor_id = ""
        self._stream: _Stream | None = None
        self._stream_released = asyncio.Event()
        self._release: asyncio.Task | None = None
        self._prefetch: TreePrefetch | None = None

    def attach(
        self, core: ExecutorCore, executor_id: str, grammar: GrammarService | None = None
    ) -> None:
        """Start serving `core`; `grammar` compiles constraints ahead of the step threads."""
        self._core, self._executor_id, self._grammar = core, executor_id, grammar
        self._pipeline.attach(core)

    def set_prefetch(self, prefetch: TreePrefetch | None) -> None:
        """`--speculative radix`: each received plan's new sequences are looked up in the
        cache's tree (`prefetch.on_plan`, a task on this loop) before the plan is queued."""
        self._prefetch = prefetch

    def bind_device(self, device: torch.device | str) -> None:
        """Make `device` the current CUDA device of both worker threads, before any job
        queued after this call (a load on `step_thread` too); anything but "cuda:N" is a no-op."""
        self._pipeline.bind_device(device)

    @property
    def step_thread(self) -> ThreadPoolExecutor:
        """The thread that executes steps (loading may use it too)."""
        return self._pipeline.step_thread

    async def close(self) -> None:
        """Shut the core down after every queued prepare and step, then stop the threads."""
        core, self._core = self._core, None
        if self._prefetch is not None:
            self._prefetch.close()
        try:
            await self._pipeline.close(core.shutdown if core is not None else None)
        finally:
            if self._grammar is not None:
                self._grammar.close()

    async def wait_no_stream(self) -> None:
        """Return once no Step stream is open and the last one has dropped its sequences."""
        while self._stream is not None:
            await self._stream_released.wait()

    @property
    def core(self) -> ExecutorCore | None:
        """The loaded core; None before its model is loaded."""
        return self._core

    def _require_core(self) -> ExecutorCore:
        if self._core is None:
            raise Unavailable("executor: the model is not loaded (yet)")
        return self._core

    async def GetInfo(
        self, request: executor_pb2.GetInfoRequest, context: grpc.aio.ServicerContext
    ) -> executor_pb2.GetInfoResponse:
        info = dataclasses.replace(self._require_core().info, executor_id=self._executor_id)
        return info_to_proto(info)

    async def PrepareConstraint(
        self, request: executor_pb2.PrepareConstraintRequest, context: grpc.aio.ServicerContext
    ) -> executor_pb2.PrepareConstraintResponse:
        """Compile into the grammar cache on the compile threads (never a step thread).

        compile_seconds: how long this call waited for the compile, at most the
        compile's own time (about 0 when it was cached).
        """
        self._require_core()
        constraint = constraint_from_proto(request.constraint)
        if constraint is None:
            raise InvalidArgument("constraint: must be set")
        waited = await prepare_constraint(self._grammar, constraint, self._executor_id)
        return executor_pb2.PrepareConstraintResponse(compile_seconds=waited)

    async def Step(
        self,
        request_iterator: AsyncIterator[executor_pb2.StepPlan],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[executor_pb2.StepResult]:
        core = self._require_core()
        stream = await self._claim_stream(core)
        log.info("step_stream_opened")
        queue = _Outbox()
        slots = asyncio.Semaphore(self._max_inflight)
        reader = asyncio.create_task(self._read(request_iterator, core, stream, queue, slots))
        watcher = None
        if self._shutdown_requested is not None:
            watcher = asyncio.create_task(self._stop_reading_on_shutdown(reader))
        try:
            while True:
                item = await queue.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                future, last_of_plan = item
                if future.done() and not future.cancelled():
                    response = future.result()  # ended while the writer was busy: no wake-up
                else:
                    response = await asyncio.wrap_future(future)
                if response is None:  # skipped: cannot happen while the writer is alive
                    return
                num_plans_done = int(last_of_plan)
                while len(response.next_results) + 1 < MAX_RESULTS_PER_MESSAGE:
                    ready = queue.pop_ready()  # a later step ended while this one waited
                    if ready is None:
                        break
                    response.next_results.append(ready[0])
                    num_plans_done += ready[1]
                yield response
                for _ in range(num_plans_done):
                    slots.release()
        finally:
            stream.run.closed = True
            reader.cancel()
            if watcher is not None:
                watcher.cancel()
            self._release = asyncio.create_task(self._end_stream(core, stream))
            await asyncio.shield(self._release)  # a cancelled handler leaves it running

    # -- the stream's parts --------------------------------------------------

    async def _claim_stream(self, core: ExecutorCore) -> _Stream:
        while self._stream is not None:
            if not self._stream.closed:
                raise FailedPrecondition(
                    "Step: a scheduler stream is already open on this executor (one at a time)"
                )
            await self._stream_released.wait()  # the old stream is dropping its sequences
        stream = self._stream = _Stream(self._executor_id)
        stream.run = self._pipeline.open(
            core,
            after_execute=lambda plan, result: self._answer(core, stream, plan, result),
            before_prepare=lambda plan: self._track(core, stream, plan),
            on_error=self._metrics.record_error,
        )
        self._stream_released.clear()
        return stream

    async def _read(
        self,
        requests: AsyncIterator[executor_pb2.StepPlan],
        core: ExecutorCore,
        stream: _Stream,
        queue: _Outbox,
        slots: asyncio.Semaphore,
    ) -> None:
        """Receive, check, convert and queue plans; end the queue with _END or the error."""
        plans = aiter(requests)
        expected = 1
        try:
            while True:
                await slots.acquire()
                msg = await anext(plans, None)
                if msg is None:
                    queue.put_nowait(_END)
                    return
                if msg.step_id != expected:
                    raise FailedPrecondition(
                        f"step_id: expected {expected}, got {msg.step_id} (plans are numbered "
                        "from 1 on each stream, without gaps)"
                    )
                expected += 1
                plan = plan_from_proto(msg)
                if self._prefetch is not None and plan.new_seqs:
                    self._prefetch.on_plan(plan)
                if self._grammar is not None:
                    await self._compile_constraints(plan)
                futures = stream.run.submit_steps(plan)
                for i, future in enumerate(futures, 1):
                    queue.put_nowait((future, i == len(futures)))
        except asyncio.CancelledError:
            # Shutdown (or the writer ending): plans already queued still answer first.
            queue.put_nowait(Unavailable("executor: shutting down, no further plans are taken"))
            raise
        except Exception as exc:
            queue.put_nowait(exc)

    async def _compile_constraints(self, plan: StepPlan) -> None:
        """Compile new grammars here, while earlier steps run; the core then hits the cache."""
        assert self._grammar is not None
        for new in plan.new_seqs:
            if new.constraint is not None:
                await self._grammar.compile(new.constraint)

    async def _stop_reading_on_shutdown(self, reader: asyncio.Task) -> None:
        assert self._shutdown_requested is not None
        await self._shutdown_requested()
        reader.cancel()

    def _track(self, core: ExecutorCore, stream: _Stream, plan: StepPlan) -> None:
        """Before the core prepares `plan`, on the thread that prepares it (the prepare
        thread, or the step thread for a serial step; one at a time, in plan order): the
        sequences the stream holds."""
        req_ids = stream.req_ids
        while stream.ended:  # ended by the core, unless this thread admitted the id again
            req_id = stream.ended.popleft()
            if not core.has_seq(req_id):
                req_ids.discard(req_id)
                stream.traced.pop(req_id, None)
        req_ids.difference_update(plan.finished_req_ids)
        req_ids.difference_update(plan.abort_req_ids)
        req_ids.update(new.req_id for new in plan.new_seqs)
        if tracing.enabled():
            self._note_links(stream, plan)

    @staticmethod
    def _note_links(stream: _Stream, plan: StepPlan) -> None:
        """The step's links: one to the request span of each traced sequence in it."""
        traced = stream.traced
        for req_id in (*plan.finished_req_ids, *plan.abort_req_ids):
            traced.pop(req_id, None)
        for new in plan.new_seqs:
            link = tracing.link_to(new.traceparent)
            if link is not None:
                traced[new.req_id] = link
            else:
                traced.pop(new.req_id, None)
        if traced:
            req_ids = [n.req_id for n in plan.new_seqs] + [r.req_id for r in plan.running_seqs]
            stream.links[plan.step_id] = [traced[r] for r in req_ids if r in traced]

    def _answer(
        self, core: ExecutorCore, stream: _Stream, plan: StepPlan, result: StepResult
    ) -> executor_pb2.StepResult:
        """On the execute thread, after a step: its answer, metrics and health."""
        for output in result.outputs:
            if output.finish_reason is not None:
                stream.ended.append(output.req_id)
        stream.num_steps += 1
        if not result.substep:
            self._metrics.record(plan, result, core.num_seqs)
        else:  # a later step of a multi-step plan: the decodes it ran
            self._metrics.record_decodes(len(result.outputs), result, core.num_seqs)
            if tracing.enabled():
                decodes = [RunningSequence(out.req_id, 1) for out in result.outputs]
                plan = StepPlan(plan.step_id, running_seqs=decodes)
        links = stream.links.pop(plan.step_id, None) if not result.substep else None
        if tracing.enabled():
            stream.step_traces.on_result(plan, result, links)
        if result.idle_gap_s:  # the plan came after the step thread ran out of steps
            self._metrics.idle_gap_seconds.observe(result.idle_gap_s)
        result.health = self._health.poll()  # about once a second; None on CPU
        return result_to_proto(result)

    def _drop(self, core: ExecutorCore, stream: _Stream) -> int:
        """On the execute thread, after every prepare and step of the stream: forget its
        sequences (the prepare thread is idle: nothing is queued there until the release)."""
        stream.step_traces.flush()
        req_ids = sorted(r for r in stream.req_ids if core.has_seq(r))
        stream.req_ids.clear()
        if req_ids:
            core.step(StepPlan(step_id=0, finished_req_ids=req_ids))
        return len(req_ids)

    async def _end_stream(self, core: ExecutorCore, stream: _Stream) -> None:
        """Drop the stream's sequences, then release it (a task: the handler may be cancelled)."""
        try:
            drop = self._pipeline.run_after(stream.run, lambda: self._drop(core, stream))
            num_dropped = await asyncio.wrap_future(drop)
            log.info("step_stream_closed", num_steps=stream.num_steps, num_dropped=num_dropped)
        except Exception as exc:  # the core is shutting down: nothing left to drop into
            log.warning("step_stream_cleanup_failed", error=repr(exc))
        finally:
            self._stream = None
            self._stream_released.set()
