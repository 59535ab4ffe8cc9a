"""Admission that answers early: refuse a request whose queue wait would be too long, at once.

Each executor's throughput is measured as the requests it finished per second
over the last `window_s`. A new request would wait about as long as it takes the
executor to finish the requests that overflow its batch ahead of it (queued in its
class or a higher one, plus running, less the sequences it runs at once):
`(num_ahead + 1) / rate`. While the batch has room it waits for nothing (the step
loop admits it at its next turn). When even the executor with the shortest estimate
makes it wait longer than its class's bound, or past its deadline, it is refused
with ResourceExhausted naming the estimate and when to retry. Classes get
shares of `max_queue_wait_s`: interactive all of it, batch half, sheddable a
quarter, so under overload sheddable work is refused first and interactive last.
While an executor finished fewer than `min_finished` requests in the window its rate
is unknown and nothing is refused on a wait estimate (the queue length limit still
holds): an idle executor meets a burst with an open door.

`QueueWaits.capacity` publishes the same estimate per model (`radixmesh.capacity`):
the measured rate and, per class, how many more requests would be admitted now, so
the gateway refuses on arrival what the scheduler would refuse.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable
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


@dataclass(frozen=True, slots=True)
class QueueWaitConfig:
    max_queue_wait_s: float | None = 30.0
    """Longest estimated queue wait an interactive request is admitted with (batch: half,
    sheddable: a quarter); None turns wait-based refusal off."""
    window_s: float = 10.0
    """Throughput is measured over this many seconds of finished requests."""
    min_finished: int = 4
    """Finished requests an executor needs before its rate is trusted."""

    def __post_init__(self) -> None:
        bound = self.max_queue_wait_s
        if bound is not None and not (math.isfinite(bound) and bound > 0):
            raise InvalidArgument(f"max_queue_wait_s: must be > 0 or None, got {bound}")
        if not (math.isfinite(self.window_s) and self.window_s > 0):
            raise InvalidArgument(f"window_s: must be > 0, got {self.window_s}")
        if self.min_finished < 1:
            raise InvalidArgument(f"min_finished: must be >= 1, got {self.min_finished}")


class Throughput:
    """Requests finished per second by one executor, over a sliding window."""

    def __init__(self, config: QueueWaitConfig) -> None:
        self._config = config
        self._finished: deque[float] = deque()
        self._num_finished = 0

    def note_finished(self, now: float, count: int = 1) -> None:
        """Changes state: `count` requests finished at `now`."""
        self._finished.extend([now] * count)
        self._trim(now)

    def rate(self, now: float) -> float | None:
        """Requests per second over the window; None while fewer than min_finished finished
        in it (an executor that was idle, or is stuck, is not judged on its old pace)."""
        self._trim(now)
        if len(self._finished) < self._config.min_finished:
            return None
        return len(self._finished) / self._config.window_s

    def _trim(self, now: float) -> None:
        while self._finished and self._finished[0] <= now - self._config.window_s:
            self._finished.popleft()


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
        """Requests finished per second, per executor id."""
        self._last_pages: dict[str, int] = {}
        """Per executor id: the pages the last finished request held at its end."""
        self._capacities: dict[str, tuple[tuple[object, ...], ExecutorInfo, int]] = {}
        """Per executor id: `batch_capacity` and the state it was computed in."""

    def note_finished(self, executor_id: str, now: float, num_pages: int = 0) -> None:
        """Changes state: a request on `executor_id` finished at `now`, holding num_pages
        KV pages at the end (0: unknown)."""
        self._finished_on(executor_id).note_finished(now)
        if num_pages > 0:
            self._last_pages[executor_id] = num_pages

    def rate(self, ex: ExecutorState, now: float) -> float | None:
        """Read-only: requests per second ex finished lately; None while not measured."""
        return self._finished_on(ex.executor_id).rate(now)

    def capacity(self, executors: Iterable[ExecutorState], now: float) -> list[ModelCapacity]:
        """Read-only: per model of the live executors, the measured rate (summed) and each
        class's headroom (see `headroom`)."""
        by_model: dict[str, list[ExecutorState]] = {}
        for ex in executors:
            if ex.alive:
                by_model.setdefault(ex.info.model, []).append(ex)
        out = []
        for model, group in by_model.items():
            rates = [r for r in (self.rate(ex, now) for ex in group) if r is not None]
            headroom = {}
            for priority in CLASS_SHARE:
                room = self.headroom(group, priority, now)
                if room is not None:
                    headroom[priority] = room
            out.append(ModelCapacity(model, sum(rates) if rates else None, headroom))
        return out

    def headroom(
        self, executors: Iterable[ExecutorState], priority: Priority, now: float
    ) -> int | None:
        """Read-only: how many more requests of `priority` `check` admits now, summed over
        the executors (each new one lengthens the wait of the next); None when it refuses
        none on the estimate (the bound is off, or no executor has a measured rate)."""
        if self.config.max_queue_wait_s is None:
            return None
        bound = self.config.max_queue_wait_s * CLASS_SHARE[priority]
        total, measured = 0, False
        for ex in executors:
            counts = ex.queue.count_by_priority()
            queued = sum(n for p, n in counts.items() if p <= priority)
            free = self._capacity_for_new(ex) - queued - len(ex.running)
            rate = self.rate(ex, now)
            if rate is None:  # admits while its batch has room (a wait of 0), then unknown
                total += max(0, free)
                continue
            measured = True
            total += max(0, free + max_num_ahead(bound, rate) + 1)
        return total if measured else None

    def check(self, req: Request, candidates: Iterable[ExecutorState], now: float) -> None:
        """Raise ResourceExhausted when even the best candidate's estimated queue wait is
        over req's class bound or its deadline."""
        estimates = [self.estimate_s(ex, req.priority, now) for ex in candidates]
        check_wait(self.config, req.priority, estimates, now, req.deadline)

    def best_estimate_s(
        self, executors: Iterable[ExecutorState], priority: Priority, now: float
    ) -> float | None:
        """Read-only: the shortest estimated queue wait over the live executors (None:
        unknown, when any of them has no measured rate)."""
        estimates = [self.estimate_s(ex, priority, now) for ex in executors if ex.alive]
        known = [e for e in estimates if e is not None]
        return min(known) if known and len(known) == len(estimates) else None

    def estimate_s(self, ex: ExecutorState, priority: Priority, now: float) -> float | None:
        """Read-only: how long a new request of `priority` would wait in ex's queue."""
        counts = ex.queue.count_by_priority()
        queued = sum(n for p, n in counts.items() if p <= priority)
        capacity = self.batch_capacity(ex)
        num_ahead = num_ahead_past_capacity(queued, len(ex.running), capacity)
        return estimate_wait_s(num_ahead, self.rate(ex, now))

    def _capacity_for_new(self, ex: ExecutorState) -> int:
        """The batch the headroom counts on: as `batch_capacity` while requests run; on an
        idle executor, sequences of the size its last finished request grew to (a burst
        that lands on it fills the pool, not the slots), else its slots."""
        pages = self._last_pages.get(ex.executor_id)
        if ex.running or not pages:
            return self.batch_capacity(ex)
        room = pool_room(ex, self._held_pages(ex.executor_id))
        return max(1, min(self._max_num_seqs, room // pages))

    def batch_capacity(self, ex: ExecutorState) -> int:
        """`batch_capacity`, walked once per step: again only when a plan was built or a
        result read since, or the running set changed (pages change only then; a plan
        being built over a remote cache may grow them during its awaits, which the next
        figure counts) or a context hold was kept or ended there."""
        num_held = self._held_pages(ex.executor_id)
        state = (
            num_held,
            ex.next_step_id,
            ex.last_result_step,
            len(ex.running),
            next(reversed(ex.running), None),  # an admission appends: the last one changes
        )
        cached = self._capacities.get(ex.executor_id)
        if cached is not None and cached[0] == state and cached[1] is ex.info:
            return cached[2]
        capacity = batch_capacity(ex, self._max_num_seqs, num_held)
        self._capacities[ex.executor_id] = (state, ex.info, capacity)
        return capacity

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
    page_size, limit = ex.info.page_size, ex.info.max_model_len
    pages = 0
    for r in running:
        final = min(len(r.prompt_token_ids) + (r.sampling.max_tokens or limit), limit)
        pages += max(len(r.page_table), -(-final // page_size))
    per_seq = max(1, -(-pages // len(running)))
    return max(1, min(max_num_seqs, pool_room(ex, num_held_pages) // per_seq))


def num_ahead_past_capacity(num_queued_ahead: int, num_running: int, max_running: int) -> int:
    """Requests that must finish before a new one can start: those queued ahead of it and
    those running, less the sequences the executor runs at once (continuous batching admits
    a request at once while a slot is free; only what overflows the slots waits)."""
    return max(0, num_queued_ahead + num_running - max_running)


def max_num_ahead(bound_s: float, rate: float) -> int:
    """The most requests ahead past the batch with which a request's estimated wait
    (`estimate_wait_s`) stays within bound_s (0: only a request with none ahead)."""
    if rate <= 0:
        return 0
    k = max(0, math.floor(bound_s * rate) - 1)
    while k > 0 and (k + 1) / rate > bound_s:  # float rounding at the edge
        k -= 1
    while (k + 2) / rate <= bound_s:
        k += 1
    return k


def estimate_wait_s(num_ahead: int, rate: float | None) -> float | None:
    """Seconds until a request with num_ahead requests queued before it starts; None when
    the rate is unknown."""
    if num_ahead <= 0:
        return 0.0
    if rate is None:
        return None
    return math.inf if rate <= 0 else (num_ahead + 1) / rate


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
    if config.max_queue_wait_s is not None:
        bound = config.max_queue_wait_s * CLASS_SHARE[priority]
        if best > bound:
            raise ResourceExhausted(
                with_retry_after(
                    f"overloaded: estimated queue wait {_seconds(best)} exceeds the "
                    f"{priority.name.lower()} bound of {bound:g}s",
                    _retry_after_s(best - bound),
                )
            )
    if deadline is not None and best > 0 and now < deadline < now + best:
        # (a deadline already passed is the step loop's: it ends with DEADLINE_EXCEEDED)
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
