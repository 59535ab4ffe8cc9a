"""Constraint preparation: a constrained request's grammar compiled on its executor first.

Routing picks the executor; `Preparations.start` parks the request in that
executor's `preparing` map and compiles its constraint there in a task of its
own. When the compile is done (the grammar is cached on the executor) the
request joins the executor's queue; a compile error ends it with the
compiler's InvalidArgument. The step loops never wait on a compile.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from radixmesh.errors import RadixmeshError, Unavailable
from services.scheduler.core.executor_state import ExecutorState
from services.scheduler.core.request import Request, RequestStatus
from services.scheduler.core.stats import SchedulerStats


class Preparations:
    """Constraint compiles in flight, one task per request."""

    def __init__(
        self,
        stats: SchedulerStats,
        clock: Callable[[], float],
        ready: Callable[[ExecutorState, Request], None],
        failed: Callable[[Request, RadixmeshError], None],
    ) -> None:
        """`ready(ex, req)` queues a prepared request on ex; `failed(req, err)` ends it."""
        self._stats = stats
        self._clock = clock
        self._ready = ready
        self._failed = failed
        self._tasks: dict[str, asyncio.Task[None]] = {}
        """Compiles in flight, by req_id."""

    def start(self, ex: ExecutorState, req: Request) -> None:
        """Changes state: req waits in ex.preparing while its constraint compiles on ex."""
        req.status = RequestStatus.PREPARING
        ex.preparing[req.req_id] = req
        task = asyncio.create_task(self._prepare(ex, req), name=f"prepare-{req.req_id}")
        self._tasks[req.req_id] = task

    def cancel(self, req_id: str) -> None:
        """Stop waiting for req_id's compile (one already running on the executor finishes
        into its grammar cache)."""
        task = self._tasks.pop(req_id, None)
        if task is not None:
            task.cancel()

    def cancel_all(self) -> list[asyncio.Task[None]]:
        """Cancel every compile wait; the tasks, for the caller to await."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        return tasks

    async def _prepare(self, ex: ExecutorState, req: Request) -> None:
        assert req.constraint is not None
        start = self._clock()
        err: RadixmeshError | None = None
        try:
            await ex.port.prepare_constraint(req.constraint)
        except RadixmeshError as exc:
            err = exc
        except Exception as exc:  # a transport failure the port did not translate
            err = Unavailable(f"executor {ex.executor_id}: preparing the constraint failed: {exc}")
        finally:
            self._tasks.pop(req.req_id, None)
        if ex.preparing.pop(req.req_id, None) is None:
            return  # aborted, expired or moved meanwhile
        self._stats.constraint_prepare.observe(self._clock() - start)
        if err is not None:
            self._failed(req, err)
            return
        req.prepared_on = ex.executor_id
        self._ready(ex, req)
