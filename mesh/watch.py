"""Keep a running mesh up: a service that exits is started again, the others keep serving.

    reason = await keep_serving(mesh, report=print)   # returns only when it gives up

Each exit is answered by `mesh.restart(name)` on the same ports after the backoff
of `mesh.config.restart_policy` (see `mesh.restarts`); a restart that fails counts
as another exit. Once a service has used up its restarts in one window,
`keep_serving` returns a message naming it, its exit code and the tail of its
log, and the caller stops the mesh.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from mesh.launcher import Mesh
from mesh.restarts import RestartBudget
from mesh.supervisor import ServiceFailed


async def keep_serving(mesh: Mesh, report: Callable[[str], None]) -> str:
    """Restart whatever exits until one service exits too often; then the reason."""
    policy = mesh.config.restart_policy
    budget = RestartBudget(policy)
    while True:
        exited = await mesh.wait_exit_info()
        delay = budget.next_delay(exited.name)
        if delay is None:
            tail = exited.log_tail.rstrip()
            return (
                f"service {exited.name!r} exited with code {exited.code} after "
                f"{policy.max_restarts} restarts within {policy.window_s:g}s; giving up"
                + (f"\n--- last lines of its log ---\n{tail}" if tail else "")
            )
        number = budget.num_restarts(exited.name)
        report(
            f"service {exited.name!r} exited with code {exited.code}; "
            f"restarting it in {delay:g}s (restart {number})"
        )
        await asyncio.sleep(delay)
        try:
            await mesh.restart(exited.name)
        except ServiceFailed as exc:
            report(f"restart of {exited.name!r} failed: {exc.reason}")
            continue
        report(f"service {exited.name!r} is serving again")
