"""In-process ports: the scheduler core talks to the cache and executor cores directly.

The cache core is called inline (its verbs take microseconds). Each executor
core runs its steps on a worker thread of its own, in submission order, so
the event loop plans step N+1 while step N computes.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import time
from typing import TYPE_CHECKING

from services.cache.core import CacheCore
from services.common.errors import InvalidArgument, Unavailable
from services.common.sampling import Constraint
from services.common.step import StepPlan, StepResult
from services.scheduler.core import ExecutorInfo, LeaseGrant

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
    """

    def __init__(
        self,
        executor_id: str,
        core: ExecutorCore,
        grammar: GrammarService | None = None,
        *,
        has_grammar: bool = False,
    ) -> None:
        """`has_grammar`: the core was given a matcher factory (implied by `grammar`)."""
        self.core = core
        self.grammar = grammar
        self._has_grammar = has_grammar or grammar is not None
        self._info = executor_info(executor_id, core)
        self._worker = concurrent.futures.ThreadPoolExecutor(1, f"executor-{executor_id}")
        self._pending: collections.deque[asyncio.Future[StepResult]] = collections.deque()
        self._closed = False

    @property
    def info(self) -> ExecutorInfo:
        return self._info

    def submit(self, plan: StepPlan) -> None:
        if self._closed:
            raise Unavailable(f"executor {self._info.executor_id} is closed")
        loop = asyncio.get_running_loop()
        self._pending.append(loop.run_in_executor(self._worker, self.core.step, plan))

    async def next_result(self) -> StepResult:
        if not self._pending:
            raise Unavailable(f"executor {self._info.executor_id}: no step in flight")
        return await self._pending.popleft()

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
        self._worker.shutdown(wait=True)
