"""Admission that answers early: refuse a request whose queue wait would be too long, at once.

The estimate is in work, not in requests: each request costs the steps it holds a place
in the batch for, by what it asks (`queue.request_work`: its prefill chunks and its
max_tokens), so a request asking for 400 tokens weighs 100 times one asking for 4. Each
executor's throughput is the work of the requests it finished per second over the last
`window_s`, or, for a run younger than that (the executor had finished nothing in the
window before it), over the run's own span, from the arrival of its first request: a
fresh executor's first second is read at its real speed, not divided by the whole
window. A new request waits about as long as the executor takes to run the work that
overflows its batch ahead of it, and then its own: the requests queued in its class or
a higher one plus the running ones, less the sequences the executor runs at once, each
at the mean work of those ahead, plus the request's own work, over the work per second.
While the batch has room it waits for nothing (the step loop admits it at its next turn).
The batch is bound by the KV pool as much as by the slots: as many sequences as the pool
holds of the size the running ones grow to (prompt plus max_tokens), and on an idle
executor of the size the queued ones ahead and the new one grow to, so a burst that
lands between two steps counts on the pool, not on `max_num_seqs`. Requests accepted on
an executor but still compiling their constraint count as queued. Because work is
counted as asked both ahead and in the rate, a warm-up of short requests does not admit
a burst of long ones on the short ones' pace. The queue keeps the work and pages per
class as running totals (`WaitQueue.ahead_of`, `pages_ahead_of`) and the running batch's
is walked once per step with its capacity, so a submit's check costs O(classes) (and
the constrained requests still compiling there).

A submit is checked at once on arrival (overload is refused before the cache round trip
of its prefix match), and again after that match, in the same turn of the event loop
that queues it, when other requests were routed meanwhile. Only the second check sees
them: a burst's submits all pass their first check before any of them is queued.

When even the executor with the shortest estimate makes a request wait longer than its
class's bound, or past its deadline, it is refused with ResourceExhausted naming the
estimate and when to retry. Classes get shares of `max_queue_wait_s`: interactive all
of it, batch half, sheddable a quarter, so under overload sheddable work is refused
first and interactive last. While an executor finished fewer than `min_finished`
requests in the window its rate is unknown and nothing is refused on a wait estimate
(the queue length limit still holds): an idle executor meets a burst with an open door.

`QueueWaits.capacity` publishes the same estimate per model (`radixmesh.capacity`):
the measured requests per second and, per class, how many more requests would be
admitted now, each counted at the mean work of the requests finished in the window,
so the gateway refuses on arrival what the scheduler would refuse.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from radixmesh.capacity import ModelCapacity
from radixmesh.errors import InvalidArgument, ResourceExhausted
from radixmesh.executor_info import ExecutorInfo
from radixmesh.retry_after import with_retry_after
from radixmesh.sampling import Priority
from services.scheduler.core.executor_state import ExecutorState
from services.scheduler.core.request import Request

CLASS_SHARE = {
    Priority.INTERACTIVE: 1.0,
    Priority.BATCH: 0.5,
    Priority.SHEDDABLE: 0.25,
    Priority.SPECULATIVE: 0.25,
}
"""Each class's share of max_queue_wait_s."""

MIN_SPAN_S = 0.1
"""A run's first finishes are read over at least this long (a few steps), so requests
that finish together right after their arrival do not read as an unbounded rate."""

MAX_HEADROOM = 2**32 - 1
"""Most requests a headroom counts (the wire's uint32)."""


@dataclass(frozen=True, slots=True)
class QueueWaitConfig:
    max_queue_wait_s: float | None = 30.0
    """Longest estimated queue wait an interactive request is admitted with (batch: half,
    sheddable: a quarter); None turns wait-based refusal off."""
    window_s: float = 10.0
    """Throughput is measured over this many seconds of finished requests (a younger run:
    over its own span)."""
    min_finished: int = 4
    """Finished requests an executor needs before its rate is trusted."""

    def class_bound_s(self, priority: Priority) -> float | None:
        """The longest estimated wait a request of `priority` is admitted with (None: off)."""
        if self.max_queue_wait_s is None:
            return None
        return self.max_queue_wait_s * CLASS_SHARE[priority]

    def __post_init__(self) -> None:
        bound = self.max_queue_wait_s
        if bound is not None and not (math.isfinite(bound) and bound > 0):
            raise InvalidArgument(f"max_queue_wait_s: must be > 0 or None, got {bound}")
        if not (math.isfinite(self.window_s) and self.window_s > 0):
            raise InvalidArgument(f"window_s: must be > 0, got {self.window_s}")
        if self.min_finished < 1:
            raise InvalidArgument(f"min_finished: must be >= 1, got {self.min_finished}")


@dataclass(frozen=True, slots=True)
class Rate:
    """An executor's measured throughput."""

    requests_per_s: float
    work_per_s: float
    """`queue.request_work` of the finished requests per second."""

    @property
    def work_per_request(self) -> float:
        """The mean work of the requests it finished."""
        return self.work_per_s / self.requests_per_s


class Throughput:
    """Requests and their work finished per second by one executor, over a sliding window
    (a run younger than the window: over its own span)."""

    def __init__(self, config: QueueWaitConfig) -> None:
        self._config = config
        self._finished: deque[tuple[float, int]] = deque()
        """(finish time, work) of the requests finished in the window, oldest first."""
        self._work = 0
        """The work of `_finished`, kept as they come and go."""
        self._run_start = 0.0
        """Arrival of the earliest request finished in this run (the run starts when one
        finishes after nothing did for a whole window)."""

    def note_finished(self, now: float, work: int, arrival_time: float, count: int = 1) -> None:
        """Changes state: `count` requests of `work` each, that arrived at `arrival_time`,
        finished at `now`."""
        self._trim(now)
        if not self._finished:
            self._run_start = arrival_time
        self._run_start = min(self._run_start, arrival_time)
        self._finished.extend([(now, work)] * count)
        self._work += work * count

    def rate(self, now: float) -> Rate | None:
        """Per second over the window, or since the run started when that is later (at
        least MIN_SPAN_S); None while fewer than min_finished finished in the window (an
        executor that was idle, or is stuck, is not judged on its old pace)."""
        self._trim(now)
        num_finished = len(self._finished)
        if num_finished < self._config.min_finished:
            return None
        span = max(MIN_SPAN_S, min(self._config.window_s, now - self._run_start))
        return Rate(num_finished / span, self._work / span)

    def _trim(self, now: float) -> None:
        while self._finished and self._finished[0][0] <= now - self._config.window_s:
            self._work -= self._finished.popleft()[1]


class QueueWaits:
    """The scheduler's queue-wait admission: each executor's measured throughput, the wait
    estimate it gives a new request, and the refusal on arrival when that is too long."""

    def __init__(
        self,
        config: QueueWaitConfig,
        max_num_seqs: int,
        held_pages: Callable[[str], int] | None = None,
    ) -> None:
        self.config = config
        self._max_num_seqs = max_num_seqs
        self._held_pages = held_pages or (lambda _executor_id: 0)
        """Pages locked by context holds on an executor (not the batch's room)."""
        self._throughput: dict[str, Throughput] = {}
        """Requests and work finished per second, per executor id."""
        self._last_pages: dict[str, int] = {}
        """Per executor id: the pages the last finished request held at its end."""
        self._batches: dict[str, tuple[tuple[object, ...], ExecutorInfo, int, int]] = {}
        """Per executor id: the state `_batch` was computed in, and its figures."""

    def note_finished(self, ex: ExecutorState, req: Request, now: float) -> None:
        """Changes state: req finished on ex at `now` (its work counts in ex's rate; the
        pages it holds at its end size an idle batch, see `_capacity`)."""
        work = ex.queue.work(req)
        self._finished_on(ex.executor_id).note_finished(now, work, req.arrival_time)
        if req.page_table:
            self._last_pages[ex.executor_id] = len(req.page_table)

    def rate(self, ex: ExecutorState, now: float) -> Rate | None:
        """Read-only: what ex finished per second lately; None while not measured."""
        return self._finished_on(ex.executor_id).rate(now)

    def capacity(self, executors: Iterable[ExecutorState], now: float) -> list[ModelCapacity]:
        """Read-only: per model of the live executors, the measured requests per second
        (summed), each class's headroom (see `headroom`) and the least context they serve."""
        by_model: dict[str, list[ExecutorState]] = {}
        for ex in executors:
            if ex.alive:
                by_model.setdefault(ex.info.model, []).append(ex)
        out = []
        for model, group in by_model.items():
            rates = [r.requests_per_s for ex in group if (r := self.rate(ex, now)) is not None]
            headroom = {}
            for priority in CLASS_SHARE:
                room = self.headroom(group, priority, now)
                if room is not None:
                    headroom[priority] = room
            max_model_len = min(ex.info.max_model_len for ex in group)
            out.append(ModelCapacity(model, sum(rates) if rates else None, headroom, max_model_len))
        return out

    def headroom(
        self, executors: Iterable[ExecutorState], priority: Priority, now: float
    ) -> int | None:
        """Read-only: how many more requests of `priority` `check` admits now, each of the
        mean work of those its executor finished lately, summed over the executors (each
        new one lengthens the wait of the next); None when it refuses none on the
        estimate (the bound is off, or no executor has a measured rate)."""
        bound = self.config.class_bound_s(priority)
        if bound is None:
            return None
        total, measured = 0, False
        for ex in executors:
            rate = self.rate(ex, now)
            measured = measured or rate is not None
            total += self._num_admitted(ex, priority, bound, rate)
        return min(total, MAX_HEADROOM) if measured else None

    def _num_admitted(
        self, ex: ExecutorState, priority: Priority, bound_s: float, rate: Rate | None
    ) -> int:
        """How many more requests of `priority`, each of rate's mean work per request,
        `check` admits on ex one after the other (rate None: while its batch has room)."""
        num_queued, queued_work, queued_pages = self._ahead(ex, priority)
        num_running = len(ex.running)
        capacity = self._capacity(ex, self._batch(ex)[0], num_queued, queued_pages)
        if rate is None:  # admits while its batch has room (a wait of 0), then unknown
            return max(0, capacity - num_queued - num_running)
        work, work_per_s = rate.work_per_request, rate.work_per_s
        running_work = self._batch(ex)[1]

        def wait_s(num_new: int) -> float:
            """`estimate_s` of a new request with num_new more like it queued ahead."""
            ahead_work = queued_work + num_new * work + running_work
            past = work_past_capacity(num_queued + num_new, num_running, capacity, ahead_work)
            return estimate_wait_s(past, work, work_per_s) or 0.0

        return num_within(wait_s, bound_s)

    def check(
        self, req: Request, candidates: Sequence[ExecutorState], now: float
    ) -> list[ExecutorState]:
        """Raise ResourceExhausted when even the best candidate's estimated queue wait is
        over req's class bound or its deadline; else the candidates req may wait on (those
        whose estimate is within both, or unknown), for routing to choose among: routing
        weighs prompt tokens and cached prefixes, and left to all candidates it could
        place an admitted request on an executor whose queue keeps it past the bound."""
        estimates = [
            self.estimate_s(ex, req.priority, now, ex.queue.work(req), ex.queue.pages(req))
            for ex in candidates
        ]
        check_wait(self.config, req.priority, estimates, now, req.deadline)
        bound = self.config.class_bound_s(req.priority)
        return [
            ex
            for ex, wait in zip(candidates, estimates, strict=True)
            if wait is None or wait_allowed(wait, bound, now, req.deadline)
        ] or list(candidates)

    def best_estimate_s(
        self, executors: Iterable[ExecutorState], priority: Priority, now: float
    ) -> float | None:
        """Read-only: the shortest estimated queue wait over the live executors for a
        request of the mean work each finished lately (None: unknown, when any of them
        has no measured rate)."""
        estimates = [self.estimate_s(ex, priority, now) for ex in executors if ex.alive]
        known = [e for e in estimates if e is not None]
        return min(known) if known and len(known) == len(estimates) else None

    def estimate_s(
        self,
        ex: ExecutorState,
        priority: Priority,
        now: float,
        work: int | None = None,
        pages: int | None = None,
    ) -> float | None:
        """Read-only: how long a new request of `priority`, `work` (None: the mean work of
        the requests ex finished lately) and `final_pages` `pages` (None: as the last one
        ex finished) would wait in ex's queue."""
        num_queued, queued_work, queued_pages = self._ahead(ex, priority)
        batch, running_work = self._batch(ex)
        capacity = self._capacity(ex, batch, num_queued, queued_pages, pages)
        past = work_past_capacity(num_queued, len(ex.running), capacity, queued_work + running_work)
        rate = self.rate(ex, now)
        if rate is None:
            return estimate_wait_s(past, 0, None)
        own = rate.work_per_request if work is None else work
        return estimate_wait_s(past, own, rate.work_per_s)

    def _ahead(self, ex: ExecutorState, priority: Priority) -> tuple[int, int, int]:
        """The requests on ex a new one of `priority` is served after, with their work and
        `final_pages`: those queued in its class or a higher one, and those accepted there
        whose constraint still compiles (they join the queue once it is cached)."""
        queue = ex.queue
        num, work = queue.ahead_of(priority)
        pages = queue.pages_ahead_of(priority)
        for r in ex.preparing.values():
            if r.priority <= priority:
                num, work, pages = num + 1, work + queue.work(r), pages + queue.pages(r)
        return num, work, pages

    def _capacity(
        self,
        ex: ExecutorState,
        batch: int,
        num_ahead: int,
        pages_ahead: int,
        own_pages: int | None = None,
    ) -> int:
        """The batch a new request's wait counts on: `batch` (ex's `batch_capacity`) while
        requests run.
        On an idle executor the queue forms the next batch: as many sequences as its pool
        holds of the size the `num_ahead` requests ahead (`pages_ahead` in all) and the new
        one (`own_pages`; None: of the size ex's last finished request grew to) grow to,
        so a burst that lands on it counts on the pool, not the slots; with nothing to
        size by, its slots."""
        if ex.running:
            return batch
        if own_pages is None:
            own_pages = self._last_pages.get(ex.executor_id, 0)
        pages = pages_ahead + own_pages
        if not pages:
            return batch
        per_seq = -(-pages // (num_ahead + (1 if own_pages else 0)))
        room = pool_room(ex, self._held_pages(ex.executor_id))
        return max(1, min(self._max_num_seqs, room // per_seq))

    def batch_capacity(self, ex: ExecutorState) -> int:
        """`batch_capacity` (see `_batch`)."""
        return self._batch(ex)[0]

    def _batch(self, ex: ExecutorState) -> tuple[int, int]:
        """`batch_capacity` and the work of the running requests, walked once per step:
        again only when a plan was built or a result read since, or the running set
        changed (pages change only then; a plan being built over a remote cache may grow
        them during its awaits, which the next figure counts) or a context hold was kept
        or ended there."""
        num_held = self._held_pages(ex.executor_id)
        state = (
            num_held,
            ex.next_step_id,
            ex.num_steps_answered,
            len(ex.running),
            next(reversed(ex.running), None),  # an admission appends: the last one changes
        )
        cached = self._batches.get(ex.executor_id)
        if cached is not None and cached[0] == state and cached[1] is ex.info:
            return cached[2], cached[3]
        capacity = batch_capacity(ex, self._max_num_seqs, num_held)
        running_work = sum(ex.queue.work(r) for r in ex.running.values())
        self._batches[ex.executor_id] = (state, ex.info, capacity, running_work)
        return capacity, running_work

    def _finished_on(self, executor_id: str) -> Throughput:
        throughput = self._throughput.get(executor_id)
        if throughput is None:
            throughput = self._throughput[executor_id] = Throughput(self.config)
        return throughput


def pool_room(ex: ExecutorState, num_held_pages: int) -> int:
    """Pages of ex's pool a batch can use: all but those context holds lock (at least 1)."""
    return max(1, ex.info.num_pages - num_held_pages)


def batch_capacity(ex: ExecutorState, max_num_seqs: int, num_held_pages: int = 0) -> int:
    """Sequences ex can run at once: its slots, or fewer when its pool holds fewer
    sequences of the size its running ones grow to (prompt plus max_tokens, within the
    context: a batch bound by KV pages; the pages they hold when just admitted would
    overcount the room). `num_held_pages`: pages context holds lock, not the batch's."""
    running = list(ex.running.values())
    if not running:
        return max_num_seqs
    pages = 0
    for r in running:  # (the queue keeps each request's final pages: `Request.final_pages`)
        pages += max(len(r.page_table), ex.queue.pages(r))
    per_seq = max(1, -(-pages // len(running)))
    return max(1, min(max_num_seqs, pool_room(ex, num_held_pages) // per_seq))


def num_ahead_past_capacity(num_queued_ahead: int, num_running: int, max_running: int) -> int:
    """Requests that must finish before a new one can start: those queued ahead of it and
    those running, less the sequences the executor runs at once, plus one for the new
    request's own place (continuous batching admits a request at once while a slot is
    free; once those ahead fill every slot, one of them must finish first)."""
    return max(0, num_queued_ahead + num_running + 1 - max_running)


def work_past_capacity(
    num_queued_ahead: int, num_running: int, max_running: int, work: float
) -> float:
    """The work that must run before a new request can start: the requests past the batch
    (`num_ahead_past_capacity`), each at the mean of `work`, the work of those queued ahead
    and running together (which of them finish first is not known)."""
    num_ahead = num_ahead_past_capacity(num_queued_ahead, num_running, max_running)
    if num_ahead <= 0:
        return 0.0
    return num_ahead * work / (num_queued_ahead + num_running)


def estimate_wait_s(work_past: float, own_work: float, work_per_s: float | None) -> float | None:
    """Seconds until a request starts that has work_past beyond the batch ahead of it (0:
    the batch has room, no wait) and asks own_work; None when the rate is unknown."""
    if work_past <= 0:
        return 0.0
    if work_per_s is None:
        return None
    return math.inf if work_per_s <= 0 else (work_past + own_work) / work_per_s


def num_within(wait_s: Callable[[int], float], bound_s: float) -> int:
    """How many new requests are admitted one after the other: the smallest n whose
    wait_s(n) (the estimate with n queued ahead, never falling as n grows) is over
    bound_s, found by doubling then halving (at most MAX_HEADROOM)."""
    if wait_s(0) > bound_s:
        return 0
    low, high = 0, 1  # wait_s(low) is within the bound
    while wait_s(high) <= bound_s:
        if high >= MAX_HEADROOM:
            return MAX_HEADROOM
        low, high = high, 2 * high
    while high - low > 1:
        middle = (low + high) // 2
        if wait_s(middle) <= bound_s:
            low = middle
        else:
            high = middle
    return high


def wait_allowed(wait_s: float, bound_s: float | None, now: float, deadline: float | None) -> bool:
    """A known estimate within the class's bound (None: no bound) and the deadline (see
    `check_wait`)."""
    if bound_s is not None and wait_s > bound_s:
        return False
    return deadline is None or wait_s <= 0 or not now < deadline < now + wait_s


def check_wait(
    config: QueueWaitConfig,
    priority: Priority,
    estimates: list[float | None],
    now: float,
    deadline: float | None,
) -> float | None:
    """Raise ResourceExhausted when the best of `estimates` (one per candidate executor)
    is over the class's bound or the deadline; else the best estimate (None: unknown)."""
    known = [e for e in estimates if e is not None]
    if not known:
        return None  # no executor has a measured rate: admit
    # (an unknown estimate is an executor with a queue that finished too little lately
    # to be measured: not a better place than the measured ones; an idle one is 0.0)
    best = min(known)
    bound = config.class_bound_s(priority)
    if bound is not None and best > bound:
        raise ResourceExhausted(
            with_retry_after(
                f"overloaded: estimated queue wait {_seconds(best)} exceeds the "
                f"{priority.name.lower()} bound of {bound:g}s",
                _retry_after_s(best - bound),
            )
        )
    if not wait_allowed(best, None, now, deadline):
        # (a deadline already passed is the step loop's: it ends with DEADLINE_EXCEEDED)
        assert deadline is not None
        raise ResourceExhausted(
            with_retry_after(
                f"overloaded: estimated queue wait {_seconds(best)} passes the request's "
                f"deadline in {max(0.0, deadline - now):.1f}s",
                _retry_after_s(best),
            )
        )
    return best


def _seconds(value: float) -> str:
    return "unbounded (no request finished lately)" if math.isinf(value) else f"{value:.1f}s"


def _retry_after_s(excess_s: float) -> int:
    return 60 if math.isinf(excess_s) else max(1, min(60, math.ceil(excess_s)))
