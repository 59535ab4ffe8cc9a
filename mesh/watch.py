"""Keep a running mesh up: a service that exits is started again, the others keep serving.

    reason = await keep_serving(mesh, report=print, on_restarted=publish)   # returns when it gives up

Each exit is answered by `mesh.restart(name)` on the same ports after the backoff
of `mesh.config.restart_policy` (see `mesh.restarts`); a restart that fails counts
as another exit. Once a service has used up its restarts in one window,
`keep_serving` returns a message naming it, its exit code and the tail of its
log, and the caller stops the mesh. After each restart that serves,
`on_restarted(name)` runs (serve re-registers the mesh: the service's PID changed).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from mesh.launcher import Mesh
from mesh.restarts import RestartBudget
from mesh.supervisor import ServiceFailed


async def keep_serving(
    mesh: Mesh,
    report: Callable[[str], None],
    on_restarted: Callable[[str], object] | None = None,
) -> str:
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
        if on_restarted is not None:
            on_restarted(exited.name)
        report(f"service {exited.name!r} is serving again")
