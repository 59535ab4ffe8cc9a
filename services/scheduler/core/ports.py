"""What the scheduler needs from the cache and from each executor, as async protocols.

The in-process engine implements them over the cores directly; the scheduler
service implements them over gRPC streams. The scheduler core sees only these.
"""

from __future__ import annotations

from typing import Protocol

from radixmesh.cache_types import CommitResult, Lease
from radixmesh.executor_info import ExecutorInfo
from radixmesh.sampling import Constraint
from radixmesh.step import StepPlan, StepResult


class CachePort(Protocol):
    async def match(self, token_ids: list[int], model: str | None = None) -> dict[str, int]:
        """Read-only: per executor id, the prompt tokens an acquire would reuse there."""

    async def acquire(
        self, executor_id: str, token_ids: list[int], num_tokens: int, holder: str
    ) -> Lease:
        """Changes state: lock the cached prefix of token_ids, lease pages up to num_tokens.

        Raises ResourceExhausted, changing nothing, when the pool cannot make room.
        """

    async def extend(self, lease_id: str, num_pages: int) -> list[int]:
        """Changes state: more pages for a lease; ResourceExhausted when none are left."""

    async def commit(
        self, lease_id: str, token_ids: list[int], keep_locked: bool = False
    ) -> CommitResult:
        """Changes state: insert the computed tokens' full pages, end the lease (with
        keep_locked, keep it as a lock on the committed path: a context hold; the result
        says how many pages that lock holds)."""

    async def release(self, lease_id: str) -> None:
        """Changes state: end a lease, inserting nothing."""

    async def heartbeat(self, holder: str) -> int:
        """Changes state: renew the holder's leases; returns how many it holds."""


class ExecutorPort(Protocol):
    @property
    def info(self) -> ExecutorInfo: ...

    def submit(self, plan: StepPlan) -> None:
        """Queue a plan; plans run in submission order."""

    async def next_result(self) -> StepResult:
        """The result of the oldest unanswered plan. Raises when the executor is gone."""

    async def prepare_constraint(self, constraint: Constraint) -> float:
        """Compile the constraint into the executor's grammar cache, so the step that
        first carries it does not compile; returns the compile's seconds (0: cached).

        Raises InvalidArgument with the compiler's reason, or when the executor has
        no grammar backend.
        """

    async def close(self) -> None: ...
