"""The scheduler core: intake, one step loop per executor, results back to the consumer.

Each executor gets a loop task that owns that executor's state: it applies
aborts and deadlines, plans a step (running decodes first, then prefill
chunks, then admissions) while the previous step runs, and turns each step
result into one batch of updates. Only that loop changes its executor's
requests, so planning never races with results.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable, Sequence

import structlog

from radixmesh.capacity import ModelCapacity
from radixmesh.errors import (
    Aborted,
    DeadlineExceeded,
    InvalidArgument,
    RadixmeshError,
    ResourceExhausted,
    Unavailable,
)
from radixmesh.sampling import Constraint, Priority, SamplingParams
from radixmesh.step import StepPlan, StepResult
from radixmesh.updates import RequestUpdate
from services.scheduler.core.admission import admit_waiting
from services.scheduler.core.budget import StepBudget
from services.scheduler.core.config import SchedulerConfig
from services.scheduler.core.executor_state import (
    ExecutorLoad,
    ExecutorState,
    running_by_priority,
    waiting_by_priority,
)
from services.scheduler.core.groups import join_group, lend_prompt_logprobs, members_of, settle_wait
from services.scheduler.core.holds import Holds
from services.scheduler.core.intake import check_request, make_room_in_queue
from services.scheduler.core.leases import Leases
from services.scheduler.core.multi_step import (
    abort_plan,
    extend_to_steps,
    max_steps_per_plan,
    may_run_steps,
)
from services.scheduler.core.ports import CachePort, ExecutorPort
from services.scheduler.core.preemption import preempt_for_priority
from services.scheduler.core.preparing import Preparations
from services.scheduler.core.queue_wait import QueueWaitConfig, QueueWaits
from services.scheduler.core.request import Request, RequestStatus, StepUpdates
from services.scheduler.core.results import read_outputs, start_update
from services.scheduler.core.routing import route
from services.scheduler.core.running import schedule_running
from services.scheduler.core.stats import SchedulerStats

log = structlog.get_logger(__name__)

UpdateSink = Callable[[StepUpdates], None]

SUBMIT_SETTLE_S = 0.05
"""Most an idle executor's loop waits for submits still matching before it plans."""


class SchedulerCore:
    def __init__(
        self,
        config: SchedulerConfig,
        cache: CachePort,
        executors: Sequence[ExecutorPort],
        sink: UpdateSink,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not executors:
            raise InvalidArgument("scheduler needs at least one executor")
        self.config = config
        self._cache = cache
        self._sink = sink
        self._clock = clock
        self.stats = SchedulerStats()
        """Request latencies and counts, read by the metrics collector."""
        self._leases = Leases(cache, config, self.stats)
        self.holds = Holds(self._leases)
        """Context holds by name (see holds.py)."""
        self._num_matching = 0
        """Submits waiting on their prefix match (an idle step loop waits for them)."""
        self._matched = asyncio.Event()
        self._matched.set()
        self._num_routed = 0
        """Requests routed to an executor so far (a submit's second check is needed only
        when some were routed during its prefix match)."""
        self._executors = {p.info.executor_id: ExecutorState.create(p, config) for p in executors}
        self._requests: dict[str, Request] = {}
        self._batch_ids = itertools.count(1)
        self._tasks: list[asyncio.Task[None]] = []
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._preparations = Preparations(self.stats, clock, self._enqueue, self._end_one)
        """Constraint compiles in flight (see preparing.py)."""
        self._stopping = False
        self._queue_waits = QueueWaits(
            QueueWaitConfig(config.max_queue_wait_s), config.max_num_seqs, self.holds.num_pages
        )
        """Throughput per executor and the refusal on arrival (see queue_wait.py)."""
        self.on_executor_lost: Callable[[str], None] | None = None
        """Called with an executor's id when its step stream fails (the service brings it
        back with `readmit`)."""

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        self._stopping = False
        for ex in self._executors.values():
            self._tasks.append(asyncio.create_task(self._loop(ex), name=f"step-{ex.executor_id}"))
        self._heartbeat_task = asyncio.create_task(self._heartbeat(), name="lease-heartbeat")

    async def stop(self, grace_s: float = 5.0) -> None:
        """Abort everything still queued or running, give leases back, close the ports.

        Each step loop ends at its next turn (the step in hand finishes and its
        result is handled); one still busy after grace_s is cancelled.
        """
        self._stopping = True
        for ex in self._executors.values():
            ex.wake.set()
        if self._heartbeat_task is not None:
            self._heartbeat_task.cancel()
        preparing = self._preparations.cancel_all()
        tasks = [t for t in (*self._tasks, self._heartbeat_task, *preparing) if t is not None]
        if self._tasks:
            _, late = await asyncio.wait(self._tasks, timeout=grace_s)
            for task in late:
                task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        self._heartbeat_task = None
        updates = []
        for req in list(self._requests.values()):
            await self._leases.drop(req)
            updates.append(self._end(req, error=Aborted("scheduler is shutting down")))
        self._deliver(updates)
        await self.holds.release_all()
        for ex in self._executors.values():
            await ex.port.close()

    def readmit(self, port: ExecutorPort) -> None:
        """An executor that failed serves again (`port` is connected, its health checked):
        it starts over with an empty queue and batch, and routing uses it at once."""
        executor_id = port.info.executor_id
        old = self._executors.get(executor_id)
        if old is not None and old.alive:
            raise InvalidArgument(f"executor_id: {executor_id!r} is still running")
        ex = ExecutorState.create(port, self.config)
        self._executors[executor_id] = ex
        self._tasks = [t for t in self._tasks if not t.done()]
        self._tasks.append(asyncio.create_task(self._loop(ex), name=f"step-{executor_id}"))
        log.info("executor readmitted", executor_id=executor_id)

    def executor_lost(self, executor_id: str, reason: str) -> None:
        """The executor's health check says it is gone: its loop fails it at its next turn
        (at once when idle), as if its Step stream had broken."""
        ex = self._executors.get(executor_id)
        if ex is not None and ex.alive:
            ex.lost_reason = reason
            ex.wake.set()

    def cache_lost(self, reason: str) -> None:
        """The cache service went away: its leases, and the pages they named, are gone
        (a restarted cache hands those pages out again). Every request holding a lease
        leaves its executor and ends UNAVAILABLE; queued ones stay. Each step loop
        applies it at its next turn."""
        for ex in self._executors.values():
            ex.reset_reason = reason
            ex.wake.set()

    # -- intake ----------------------------------------------------------------------------

    @property
    def models(self) -> list[str]:
        return list(dict.fromkeys(ex.info.model for ex in self._executors.values()))

    async def submit(
        self,
        req_id: str,
        prompt_token_ids: Sequence[int],
        sampling: SamplingParams,
        *,
        constraint: Constraint | None = None,
        model: str = "",
        priority: Priority = Priority.INTERACTIVE,
        deadline: float | None = None,
        hold_id: str = "",
        group_id: str = "",
        group_size: int = 0,
    ) -> Request:
        """Queue a request; its updates go to the sink. Raises on bad input or overload.

        With `hold_id`, a normal finish keeps the request's context (prompt + output)
        locked in the prefix cache under that name, replacing a hold of the same name,
        until `release_hold` (see holds.py). Requests with one `group_id` (a select's
        choices, a fork's branches) are scheduled as one group (groups.py): routed to
        one executor, admitted together, never partly preempted by unrelated work;
        `group_size` (the group's requests in all, 0: not said) lets an idle executor
        wait for every member before it starts them.

        A constrained request first has its constraint prepared (compiled) on the
        executor routing picks, in a task of its own; it joins that executor's
        queue once the grammar is cached there, or ends with the compiler's
        InvalidArgument. The step loops never wait on a compile.
        """
        if not req_id:
            raise InvalidArgument("req_id must not be empty")
        if req_id in self._requests:
            raise InvalidArgument(f"req_id {req_id!r} is already in use")
        tokens = list(prompt_token_ids)
        model = model or self.models[0]
        candidates = [ex for ex in self._executors.values() if ex.alive and ex.info.model == model]
        if not candidates:
            raise Unavailable(f"no executor serves model {model!r}")
        check_request(tokens, sampling, group_id, group_size, candidates)
        req = Request(
            req_id=req_id,
            prompt_token_ids=tokens,
            sampling=sampling,
            arrival_time=self._clock(),
            constraint=constraint,
            model=model,
            priority=Priority(priority),
            deadline=deadline,
            hold_id=hold_id or None,
            group_id=group_id or None,
            group_size=group_size,
        )
        req.group_arrival_time = req.arrival_time
        # before the cache round trip: refuse at once (see queue_wait.py); routing chooses
        # among the executors whose wait the check allows. A named group is admitted or
        # refused as a whole, at its first member: a program whose third branch is refused
        # after two were accepted has lost the work of both
        within = None
        if self._first_member(req) is None:
            within = self._queue_waits.check(req, candidates, self._clock())
        routed = self._num_routed
        matches = await self._match(tokens, model)
        if req_id in self._requests:
            raise InvalidArgument(f"req_id {req_id!r} is already in use")
        # and again in the turn that queues it where others were routed meanwhile: a
        # burst's submits all pass the first check before the first of them is queued
        # (each waits for its match), so only this one sees the requests ahead of it
        member = self._first_member(req)
        if self._num_routed != routed and member is None:
            within = self._queue_waits.check(req, candidates, self._clock())
        shed = make_room_in_queue(self._executors.values(), req, self.config.max_queue_len)
        if shed is not None:
            self._executors[shed.executor_id or ""].queue.remove(shed.req_id)
            self._end_one(shed, ResourceExhausted(f"request {shed.req_id} shed for interactive traffic"))
        self._route(req, candidates, matches, member, within)
        self._requests[req_id] = req
        return req

    def abort(self, req_id: str) -> bool:
        """Cancel a request; its last update has finish_reason "abort". False if unknown."""
        req = self._requests.get(req_id)
        if req is None or req.executor_id is None:
            return False
        ex = self._executors[req.executor_id]
        ex.abort_req_ids.add(req_id)
        ex.wake.set()
        return True

    async def release_hold(self, hold_id: str) -> bool:
        """End the hold named hold_id (its pages become evictable); a request still running
        under that name makes none. False when no hold had that name."""
        return await self.holds.release(hold_id, list(self._requests.values()))

    @property
    def num_preemptions(self) -> int:
        """Requests preempted so far (they resume and recompute what the cache lost)."""
        return self.stats.num_preemptions

    def num_running(self) -> dict[Priority, int]:
        return running_by_priority(self._executors.values())

    def num_waiting(self) -> dict[Priority, int]:
        return waiting_by_priority(self._executors.values())

    def executor_loads(self) -> list[ExecutorLoad]:
        """Per executor: running and waiting counts, leased page fraction, health."""
        return [ex.load(self.holds.num_pages(ex.executor_id)) for ex in self._executors.values()]

    async def _match(self, tokens: list[int], model: str) -> dict[str, int]:
        self._num_matching += 1
        self._matched.clear()
        try:
            return await self._cache.match(tokens[:-1], model)
        except RadixmeshError as exc:
            log.warning("match failed; routing by load only", error=str(exc))
            return {}
        finally:
            self._num_matching -= 1
            if not self._num_matching:
                self._matched.set()

    async def _settle_submits(self) -> None:
        """Wait (at most SUBMIT_SETTLE_S) for the submits still in their prefix match, so
        that requests sent together (a select's choices) start in the same step."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._matched.wait(), SUBMIT_SETTLE_S)

    def _first_member(self, req: Request) -> Request | None:
        """A live request of req's named group (None: none, or no group)."""
        return next(iter(members_of(req, self._requests.values())), None)

    def _route(
        self,
        req: Request,
        candidates: list[ExecutorState],
        matches: dict[str, int],
        member: Request | None,
        within: list[ExecutorState] | None = None,
    ) -> None:
        """Queues req on an executor: its group's (`member`, a live request of its group),
        else the one routing picks among `within` (the candidates whose queue wait
        admission allows; None: all)."""
        if member is not None:  # a group runs on one executor (it shares its context there)
            join_group(req, member)
            same = [ex for ex in candidates if ex.executor_id == member.executor_id]
            candidates = same or candidates
        elif within:
            candidates = within
        executor_id, num_shared = route(
            req, candidates, matches, self._leases.inflight, self._clock(), self.config
        )
        self._num_routed += 1
        ex = self._executors[executor_id]
        req.executor_id = ex.executor_id
        req.num_routed_shared_tokens = num_shared
        req.match_tokens = matches.get(ex.executor_id, 0)
        if (cap := req.max_cached_tokens) is not None:
            req.match_tokens = min(req.match_tokens, cap)
        if req.constraint is not None and req.prepared_on != ex.executor_id:
            self._preparations.start(ex, req)
        else:
            self._enqueue(ex, req)

    def _enqueue(self, ex: ExecutorState, req: Request) -> None:
        if req.queued_time is None:
            req.queued_time = self._clock()
        ex.queue.push(req)
        ex.wake.set()

    def capacity(self) -> list[ModelCapacity]:
        """Read-only: per model, the measured rate and each class's admission headroom."""
        return self._queue_waits.capacity(self._executors.values(), self._clock())

    def estimated_queue_wait_s(self, priority: Priority = Priority.INTERACTIVE) -> float | None:
        """Read-only: the shortest estimated queue wait over the executors (None: unknown)."""
        return self._queue_waits.best_estimate_s(self._executors.values(), priority, self._clock())

    # -- the step loop ---------------------------------------------------------------------

    async def _loop(self, ex: ExecutorState) -> None:
        while ex.alive and not self._stopping:
            ex.wake.clear()
            if not ex.num_in_flight and self._num_matching:  # idle: let a burst land together
                await self._settle_submits()
            if not ex.num_in_flight:  # idle: a group still arriving starts in one step
                await self._settle_groups(ex)
            try:
                if ex.reset_reason is not None:
                    await self._drop_leased(ex)
                if ex.lost_reason is not None:
                    await self._executor_failed(ex, Unavailable(ex.lost_reason))
                    return
                await self._apply_aborts_and_deadlines(ex)
                wants_plan = ex.num_in_flight < ex.steps_target and ex.has_work
                plan = (
                    await self._plan(ex)
                    if wants_plan
                    else abort_plan(ex, self.config.decode_steps_per_plan)
                )
            except RadixmeshError as exc:
                log.exception("planning failed", executor_id=ex.executor_id)
                await self._fail_requests(ex, Unavailable(f"scheduling failed: {exc}"))
                continue
            if plan is None and not ex.num_in_flight:
                await self._idle(ex)
                continue
            try:
                if plan is not None:
                    ex.port.submit(plan)
                    ex.note_sent(plan)
                    continue
                result = await ex.port.next_result()
            except Exception as exc:
                await self._executor_failed(ex, exc)
                return
            ex.note_answered(result)
            ex.note_health(result.health, self._clock())
            await self._process(ex, result)

    async def _settle_groups(self, ex: ExecutorState) -> None:
        """Wait (at most groups.GROUP_SETTLE_S) for the members of a group still arriving."""
        while (wait := settle_wait(ex.queue, ex.running.values(), self._clock())) > 0:
            ex.wake.clear()  # a member's submit wakes it (the loop plans right after)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ex.wake.wait(), wait)

    async def _idle(self, ex: ExecutorState) -> None:
        """Wait for a submit or abort, or for the next deadline of this executor's requests."""
        deadlines = [
            r.deadline
            for r in itertools.chain(ex.queue, ex.running.values(), ex.preparing.values())
            if r.deadline is not None
        ]
        timeout = max(0.0, min(deadlines) - self._clock()) if deadlines else None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ex.wake.wait(), timeout)

    async def _plan(self, ex: ExecutorState) -> StepPlan | None:
        config = self.config
        budget = StepBudget(config.max_num_batched_tokens, config.max_num_seqs)
        now = self._clock()
        head = ex.queue.head()
        if head is not None:
            gap = config.priority_preemption_gap
            await preempt_for_priority(ex, self._leases, budget, head, gap, config.max_num_seqs)
        running_seqs = await schedule_running(ex, self._leases, budget)
        new_seqs = await admit_waiting(
            ex, self._leases, budget, now, config.max_num_seqs, self.stats
        )
        if budget.failed:
            updates = []
            for req, err in budget.failed:
                await self._forget(ex, req)
                updates.append(self._end(req, error=err))
            self._deliver(updates)
        if not (running_seqs or new_seqs or ex.dropped_req_ids):
            return None
        plan = StepPlan(ex.next_step_id, new_seqs, running_seqs, ex.dropped_req_ids)
        k = max_steps_per_plan(ex, len(running_seqs), config.decode_steps_per_plan)
        if k > 1 and may_run_steps(ex, running_seqs, len(new_seqs), budget):
            plan.num_steps = await extend_to_steps(ex, self._leases, running_seqs, k)
        ex.next_step_id += 1
        ex.dropped_req_ids = []
        return plan

    async def _process(self, ex: ExecutorState, result: StepResult) -> None:
        now = self._clock()
        lend_prompt_logprobs(result, self._requests)
        outcome = read_outputs(ex, result, self._requests, now, self.stats)
        finished, holding, updates = outcome.finished, outcome.holding, outcome.updates
        for req in finished:
            self._queue_waits.note_finished(ex, req, now)
            req.on_executor = False  # the executor dropped it itself
            ex.running.pop(req.req_id, None)
            ex.queue.remove(req.req_id)
            del self._requests[req.req_id]
        # commits first (together: one round trip to a remote cache), so a follow-up
        # request sent on seeing the last update finds this sequence in the tree
        held = await asyncio.gather(
            *(self._leases.finish(req, hold=req in holding) for req in finished)
        )
        for req, kept in zip(finished, held, strict=True):
            if kept is not None:
                await self.holds.keep(req, kept[0], kept[1])
        self._deliver(updates)
        for update in updates:
            leader = ex.running.get(update.req_id)
            if leader is not None and leader.followers and not leader.prefilling:
                await self._checkpoint(ex, leader)

    async def _checkpoint(self, ex: ExecutorState, leader: Request) -> None:
        """The leader's prompt is computed: put it in the tree for the requests waiting on
        it (a preemption that resumes at once, recomputing less than a page)."""
        waiting = {f: n for f, n in leader.followers.items() if f in ex.queue}
        leader.followers.clear()
        if not waiting:
            return
        for req_id, num_shared_tokens in waiting.items():
            follower = self._requests[req_id]
            follower.match_tokens = max(follower.match_tokens, num_shared_tokens)
            ex.queue.rekey(follower)
        await self._leases.checkpoint(ex, leader)

    # -- ends of requests ------------------------------------------------------------------

    async def _apply_aborts_and_deadlines(self, ex: ExecutorState) -> None:
        aborts, ex.abort_req_ids = ex.abort_req_ids, set()
        aborted = {
            req_id: req
            for req_id in aborts
            if (req := self._requests.get(req_id)) is not None and req.executor_id == ex.executor_id
        }
        now = self._clock()
        expired = [
            r
            for r in itertools.chain(ex.queue, ex.running.values(), ex.preparing.values())
            if r.deadline is not None and r.deadline <= now and r.req_id not in aborted
        ]
        if not (aborted or expired):
            return
        # their leases end together: over gRPC the verbs share the Batch stream's round trip
        cut = (*aborted.values(), *expired)
        await asyncio.gather(*(self._forget(ex, r, keep_computed=True) for r in cut))
        updates = [self._end(req, finish_reason="abort") for req in aborted.values()]
        for req in expired:
            num_tokens = len(req.output_token_ids)
            msg = f"request {req.req_id} passed its deadline after {num_tokens} tokens"
            updates.append(self._end(req, error=DeadlineExceeded(msg)))
        self._deliver(updates)

    async def _forget(self, ex: ExecutorState, req: Request, keep_computed: bool = False) -> None:
        """Take req out of this executor: preparation, queue, batch, executor state, lease
        (`keep_computed`: what its KV holds is committed to the prefix cache)."""
        if ex.preparing.pop(req.req_id, None) is not None:
            self._preparations.cancel(req.req_id)
        ex.queue.remove(req.req_id)
        ex.running.pop(req.req_id, None)
        self._leases.forget_on_executor(ex, req)
        await (self._leases.cut(req) if keep_computed else self._leases.drop(req))

    async def _executor_failed(self, ex: ExecutorState, exc: Exception) -> None:
        """Requests that streamed nothing move to another executor; the rest end Unavailable."""
        log.error("executor failed", executor_id=ex.executor_id, error=repr(exc))
        ex.alive = False
        others = [o for o in self._executors.values() if o.alive and o.info.model == ex.info.model]
        updates = []
        for req in [*ex.running.values(), *ex.queue, *ex.preparing.values()]:
            await self._forget(ex, req)
            req.on_executor = False
            if others and not req.output_token_ids:
                req.hold_until_answered = 0
                self._route(req, others, {}, self._first_member(req))
            else:
                err = Unavailable(f"executor {ex.executor_id} failed: {exc}")
                updates.append(self._end(req, error=err))
        ex.forget_in_flight()
        self._deliver(updates)
        with contextlib.suppress(Exception):
            await ex.port.close()
        if self.on_executor_lost is not None:
            self.on_executor_lost(ex.executor_id)

    async def _drop_leased(self, ex: ExecutorState) -> None:
        """After `cache_lost`: requests with a lease end (see there)."""
        reason, ex.reset_reason = ex.reset_reason, None
        leased = [r for r in (*ex.running.values(), *ex.queue) if r.lease_id is not None]
        await self._fail_requests(ex, Unavailable(f"cache service lost: {reason}"), leased)

    async def _fail_requests(
        self, ex: ExecutorState, err: RadixmeshError, reqs: list[Request] | None = None
    ) -> None:
        """End reqs (default: every request queued or running on ex) with err."""
        updates = []
        for req in [*ex.running.values(), *ex.queue] if reqs is None else reqs:
            await self._forget(ex, req)
            updates.append(self._end(req, error=err))
        self._deliver(updates)

    def _end(
        self, req: Request, *, finish_reason: str | None = None, error: RadixmeshError | None = None
    ) -> RequestUpdate:
        req.status = RequestStatus.FINISHED
        self._requests.pop(req.req_id, None)
        self.stats.finished(
            req, self._clock(), finish_reason, "OK" if error is None else error.code
        )
        update = start_update(req)
        update.finish_reason = finish_reason
        update.error = error
        return update

    def _end_one(self, req: Request, error: RadixmeshError) -> None:
        """End req with error and deliver its update at once."""
        self._deliver([self._end(req, error=error)])

    def _deliver(self, updates: list[RequestUpdate]) -> None:
        if updates:
            self._sink(StepUpdates(next(self._batch_ids), updates))

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.config.heartbeat_interval_s)
            try:
                await self._cache.heartbeat(self.config.lease_holder)
            except RadixmeshError as exc:
                log.warning("lease heartbeat failed", error=str(exc))

