"""When a crashed service is started again: exponential backoff, and a limit per time window.

    budget = RestartBudget(RestartPolicy(max_restarts=5, window_s=60))
    delay = budget.next_delay("executor-0")   # None: the limit is reached, give up
    if delay is not None:
        await asyncio.sleep(delay)            # then start it again

The n-th restart of a service within `window_s` waits `backoff_initial_s * 2**(n-1)`,
at most `backoff_max_s`; a service that stayed up for a whole window starts over
at the first delay. More than `max_restarts` restarts within one window is a
service that cannot run: the supervisor stops the mesh and names it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from radixmesh.errors import InvalidArgument


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    max_restarts: int = 5
    """Restarts of one service allowed within `window_s`; 0 turns restarting off."""
    window_s: float = 60.0
    """The window over which restarts are counted, in seconds."""
    backoff_initial_s: float = 0.5
    """Wait before the first restart in a window."""
    backoff_max_s: float = 8.0
    """Longest wait before a restart."""

    def __post_init__(self) -> None:
        if isinstance(self.max_restarts, bool) or not (0 <= self.max_restarts <= 1000):
            raise InvalidArgument(f"max_restarts: must be in [0, 1000], got {self.max_restarts}")
        for name in ("window_s", "backoff_initial_s", "backoff_max_s"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise InvalidArgument(f"{name}: must be a finite number >= 0, got {value!r}")
        if self.backoff_max_s < self.backoff_initial_s:
            raise InvalidArgument(
                f"backoff_max_s: must be >= backoff_initial_s ({self.backoff_initial_s}), "
                f"got {self.backoff_max_s}"
            )

    def delay(self, num_restarts: int) -> float:
        """The wait before restart number `num_restarts` (1-based) of one window."""
        exponent = min(max(0, num_restarts - 1), 60)
        return min(self.backoff_max_s, self.backoff_initial_s * 2.0**exponent)


class RestartBudget:
    """Restart times per service name, against one policy (see the module docstring)."""

    def __init__(self, policy: RestartPolicy, clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy
        self._clock = clock
        self._restarts: dict[str, list[float]] = {}
        self._totals: dict[str, int] = {}

    def next_delay(self, name: str) -> float | None:
        """Changes state: records a restart of `name` now and returns its wait; None (and
        nothing recorded) when `name` already used up its restarts in this window."""
        now = self._clock()
        recent = [t for t in self._restarts.get(name, ()) if now - t < self.policy.window_s]
        if len(recent) >= self.policy.max_restarts:
            self._restarts[name] = recent
            return None
        recent.append(now)
        self._restarts[name] = recent
        self._totals[name] = self._totals.get(name, 0) + 1
        return self.policy.delay(len(recent))

    def num_restarts(self, name: str) -> int:
        """Read-only: restarts of `name` recorded so far (all windows)."""
        return self._totals.get(name, 0)
