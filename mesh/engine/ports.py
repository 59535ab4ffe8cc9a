"""In-process ports: the scheduler core talks to the cache and executor cores directly.

The cache core is called inline (its verbs take microseconds). Each executor
core runs its steps on a worker thread of its own, in submission order, so
the event loop plans step N+1 while step N computes. On a CUDA device the
core's prepare (checks, state, host arrays, upload) runs on a second thread,
so plan N+1 is prepared while step N executes, as in the executor service.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import time
from typing import TYPE_CHECKING

import torch

from radixmesh.errors import InvalidArgument, Unavailable
from radixmesh.sampling import Constraint
from radixmesh.step import StepPlan, StepResult
from services.cache.core import CacheCore
from services.scheduler.core import ExecutorInfo, LeaseGrant

if TYPE_CHECKING:
    from services.executor.core.executor import ExecutorCore, PreparedStep
    from services.executor.core.grammar import GrammarService


class InProcessCache:
    """CachePort over a CacheCore in the same process."""

    def __init__(self, core: CacheCore) -> None:
        self.core = core

    async def match(self, token_ids: list[int], model: str | None = None) -> dict[str, int]:
        return self.core.match(token_ids, model or None)

    async def acquire(
        self, executor_id: str, token_ids: list[int], num_tokens: int, holder: str
    ) -> LeaseGrant:
        lease = self.core.acquire(executor_id, token_ids, num_tokens, holder)
        return LeaseGrant(lease.lease_id, lease.page_ids, lease.num_cached_tokens)

    async def extend(self, lease_id: str, num_pages: int) -> list[int]:
        return self.core.extend(lease_id, num_pages)

    async def commit(self, lease_id: str, token_ids: list[int]) -> int:
        return self.core.commit(lease_id, token_ids).num_cached_tokens

    async def release(self, lease_id: str) -> None:
        self.core.release(lease_id)

    async def heartbeat(self, holder: str) -> int:
        return self.core.heartbeat(holder)


def executor_info(executor_id: str, core: ExecutorCore) -> ExecutorInfo:
    info = core.info
    return ExecutorInfo(
        executor_id=executor_id,
        model=info.name,
        page_size=info.page_size,
        num_pages=info.num_pages,
        max_model_len=info.max_model_len,
        vocab_size=info.vocab_size,
        eos_token_ids=tuple(info.eos_token_ids),
    )


class InProcessExecutor:
    """ExecutorPort over an ExecutorCore: steps run on one worker thread, in order.

    `grammar` is the service behind the core's matcher factory: constraints are
    compiled into its cache ahead of scheduling. Without it a constraint is
    accepted as is when the core has a matcher factory of its own (compiled at
    step time), and refused when the core has no grammar backend.

    `overlap_prepare`: prepare plan N + 1 on a thread of its own while step N
    executes (no further ahead: its prepare waits for step N - 1). None: on a
    CUDA device only; on CPU the two threads would only contend for the
    interpreter, so each plan is prepared and executed on the step thread.
    """

    def __init__(
        self,
        executor_id: str,
        core: ExecutorCore,
        grammar: GrammarService | None = None,
        *,
        has_grammar: bool = False,
        overlap_prepare: bool | None = None,
    ) -> None:
        """`has_grammar`: the core was given a matcher factory (implied by `grammar`)."""
        self.core = core
        self.grammar = grammar
        self._has_grammar = has_grammar or grammar is not None
        self._info = executor_info(executor_id, core)
        self._worker = concurrent.futures.ThreadPoolExecutor(1, f"executor-{executor_id}")
        if overlap_prepare is None:
            overlap_prepare = core.device.type == "cuda"
        self._prepare_thread = (
            concurrent.futures.ThreadPoolExecutor(1, f"executor-{executor_id}-prepare")
            if overlap_prepare
            else None
        )
        if core.device.type == "cuda" and core.device.index is not None:
            for thread in (self._worker, self._prepare_thread):
                if thread is not None:
                    thread.submit(torch.cuda.set_device, core.device)  # FIFO: before any step
        self._executes: collections.deque[concurrent.futures.Future[StepResult]] = (
            collections.deque(maxlen=2)
        )
        """The last two plans' executes: plan N + 1's prepare waits for the older one."""
        self._failed = False
        """A prepare or execute raised: the core's state is undefined, later plans are refused."""
        self._pending: collections.deque[asyncio.Future[StepResult]] = collections.deque()
        self._closed = False

    @property
    def info(self) -> ExecutorInfo:
        return self._info

    def submit(self, plan: StepPlan) -> None:
        if self._closed:
            raise Unavailable(f"executor {self._info.executor_id} is closed")
        if self._prepare_thread is None:
            future = self._worker.submit(self.core.step, plan)
        else:
            executes = self._executes
            gate = executes[0] if len(executes) == executes.maxlen else None
            prepared = self._prepare_thread.submit(self._prepare, plan, gate)
            future = self._worker.submit(self._execute, prepared)
            executes.append(future)
        self._pending.append(asyncio.wrap_future(future))

    async def next_result(self) -> StepResult:
        if not self._pending:
            raise Unavailable(f"executor {self._info.executor_id}: no step in flight")
        return await self._pending.popleft()

    def _prepare(
        self, plan: StepPlan, gate: concurrent.futures.Future[StepResult] | None
    ) -> PreparedStep:
        """On the prepare thread, once `gate` (step N - 1 for plan N + 1) has executed."""
        if gate is not None:
            concurrent.futures.wait([gate])
        if self._failed:
            raise Unavailable(
                f"executor {self._info.executor_id}: step {plan.step_id} not run, "
                "an earlier step failed"
            )
        try:
            return self.core.prepare(plan)
        except BaseException:
            self._failed = True
            raise

    def _execute(self, prepared: concurrent.futures.Future[PreparedStep]) -> StepResult:
        """On the step thread; a failed prepare raises here, in plan order."""
        step = prepared.result()
        try:
            return self.core.execute(step)
        except BaseException:
            self._failed = True
            raise

    async def prepare_constraint(self, constraint: Constraint) -> float:
        if self.grammar is None:
            if self._has_grammar:
                return 0.0
            raise InvalidArgument(
                f"constraint: executor {self._info.executor_id} has no grammar backend"
            )
        start = time.monotonic()
        compiled = await self.grammar.compile(constraint)
        return min(time.monotonic() - start, compiled.compile_seconds)

    async def close(self) -> None:
        self._closed = True
        pending, self._pending = list(self._pending), collections.deque()
        for future in pending:
            with contextlib.suppress(Exception):  # the loop that owned these results is gone
                await future
        if self._prepare_thread is not None:
            self._prepare_thread.shutdown(wait=True)
        self._worker.shutdown(wait=True)
