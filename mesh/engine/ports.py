"""In-process ports: the scheduler core talks to the cache and executor cores directly.

The cache core is called inline (its verbs take microseconds). Each executor
core runs its steps on its step pipeline (`services/executor/core/pipeline.py`,
the executor service's too), in submission order, so the event loop plans step
N+1 while step N computes; on a CUDA device plan N+1 is also prepared while
step N executes.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from radixmesh.cache_types import CommitResult, Continuation, Lease
from radixmesh.errors import Unavailable
from radixmesh.executor_info import ExecutorInfo
from radixmesh.sampling import Constraint
from radixmesh.step import StepPlan, StepResult
from services.cache.core import CacheCore
from services.executor.core.pipeline import PipelineCounts, StepPipeline, prepare_constraint

if TYPE_CHECKING:
    from services.executor.core.executor import ExecutorCore
    from services.executor.core.grammar import GrammarService


class InProcessCache:
    """CachePort over a CacheCore in the same process."""

    def __init__(self, core: CacheCore) -> None:
        self.core = core

    async def match(self, token_ids: list[int], model: str | None = None) -> dict[str, int]:
        return self.core.match(token_ids, model or None)

    async def acquire(
        self, executor_id: str, token_ids: list[int], num_tokens: int, holder: str
    ) -> Lease:
        return self.core.acquire(executor_id, token_ids, num_tokens, holder)

    async def extend(self, lease_id: str, num_pages: int) -> list[int]:
        return self.core.extend(lease_id, num_pages)

    async def commit(
        self, lease_id: str, token_ids: list[int], keep_locked: bool = False
    ) -> CommitResult:
        return self.core.commit(lease_id, token_ids, keep_locked)

    async def release(self, lease_id: str) -> None:
        self.core.release(lease_id)

    async def heartbeat(self, holder: str) -> int:
        return self.core.heartbeat(holder)

    async def continuation(
        self, token_ids: Sequence[int], model: str | None, max_tokens: int
    ) -> Continuation:
        return self.core.continuation(token_ids, model or None, max_tokens)


class InProcessExecutor:
    """ExecutorPort over an ExecutorCore, on its step pipeline (`core/pipeline.py`).

    `grammar` is the service behind the core's grammar backend: constraints are
    compiled into its cache ahead of scheduling; without it constraints are refused.

    `overlap_prepare`: prepare plan N + 1 on a thread of its own while step N
    executes (no further ahead: its prepare waits for step N - 1). None: on a
    CUDA device only; on CPU the two threads would only contend for the
    interpreter, so each plan is prepared and executed on the step thread.
    `launch_ahead`: queue a plain step before the one before it is read back (see
    `StepPipeline`); None: on a CUDA device only.
    """

    def __init__(
        self,
        executor_id: str,
        core: ExecutorCore,
        grammar: GrammarService | None = None,
        *,
        overlap_prepare: bool | None = None,
        launch_ahead: bool | None = None,
        on_plan: Callable[[StepPlan], None] | None = None,
    ) -> None:
        """`on_plan`: called with each plan before it is queued (on the event loop), e.g.
        the tree lookups of `--speculative radix` (`spec.radix.TreePrefetch.on_plan`)."""
        self.grammar = grammar
        self._on_plan = on_plan
        self._info = dataclasses.replace(core.info, executor_id=executor_id)
        self._pipeline = StepPipeline(
            executor_id, overlap_prepare=overlap_prepare, launch_ahead=launch_ahead
        )
        self._pipeline.attach(core)
        self._run = self._pipeline.open(core, after_execute=_result)
        """One run for the port's life: once a step fails, later plans are refused."""
        self._pending: collections.deque[tuple[int, asyncio.Future[StepResult | None]]] = (
            collections.deque()
        )
        self._closed = False

    @property
    def info(self) -> ExecutorInfo:
        return self._info

    @property
    def pipeline(self) -> StepPipeline:
        """The step pipeline this port's core runs on."""
        return self._pipeline

    @property
    def pipeline_counts(self) -> PipelineCounts:
        """What this port's steps waited for so far (cumulative)."""
        return self._run.counts.snapshot()

    def submit(self, plan: StepPlan) -> None:
        if self._closed:
            raise Unavailable(f"executor {self._info.executor_id} is closed")
        if self._on_plan is not None:
            self._on_plan(plan)
        for future in self._run.submit_steps(plan):  # a multi-step plan: one per step
            self._pending.append((plan.step_id, asyncio.wrap_future(future)))

    async def next_result(self) -> StepResult:
        if not self._pending:
            raise Unavailable(f"executor {self._info.executor_id}: no step in flight")
        step_id, future = self._pending.popleft()
        result = await future
        if result is None:
            raise Unavailable(
                f"executor {self._info.executor_id}: step {step_id} not run, "
                "an earlier step failed"
            )
        return result

    async def prepare_constraint(self, constraint: Constraint) -> float:
        return await prepare_constraint(self.grammar, constraint, self._info.executor_id)

    async def close(self) -> None:
        self._closed = True
        pending, self._pending = list(self._pending), collections.deque()
        for _, future in pending:
            with contextlib.suppress(Exception):  # the loop that owned these results is gone
                await future
        await self._pipeline.close()


def _result(plan: StepPlan, result: StepResult) -> StepResult:
    return result
