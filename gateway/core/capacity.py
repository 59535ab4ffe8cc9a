"""Refusal on arrival: the scheduler's published headroom, less what this gateway sent since.

The scheduler publishes per model, in `GetLoad`, how many more requests of each
priority class its queue-wait admission would take now (`radixmesh.capacity`); the
gateway reads it a few times a second (`gateway.capacity_watch`). Between two reads
every request the gateway lets through uses up one unit of the headroom of its own
class and of every lower class (a new request is queued ahead of those), so a burst
that arrives between two reads is cut where the scheduler would cut it, before any
tokenization or round trip: the refusal costs the gateway a JSON parse, not the whole
request's work. Refused requests get ResourceExhausted (HTTP 429) with a Retry-After
of the deficit over the measured rate.

The gate only ever refuses what the published numbers say is over the bound; while
it has no numbers (the scheduler unreachable, a reading older than `max_age_s`, a
model or class it did not publish) it lets the request through and the scheduler
decides, as it does for every request the gate admits (a deadline, the queue length).
With several gateway replicas each counts only what it sent itself: the scheduler's
own check still bounds the total.

The same reading also sets the first line, in Envoy (`edge_headroom`,
gateway/envoy/admission.py): a limit on requests in flight that refuses a burst's
excess before it reaches any gateway; this gate is the second line, by model and class.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from radixmesh.capacity import ModelCapacity
from radixmesh.errors import InvalidArgument, ResourceExhausted
from radixmesh.retry_after import with_retry_after
from radixmesh.sampling import Priority

Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class CapacityGateConfig:
    max_age_s: float = 1.0
    """A reading older than this is not used (the gate lets requests through)."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.max_age_s) and self.max_age_s > 0):
            raise InvalidArgument(f"capacity.max_age_s: must be > 0, got {self.max_age_s}")


class CapacityGate:
    """The scheduler's latest published capacity and this gateway's submits since."""

    def __init__(
        self, config: CapacityGateConfig = CapacityGateConfig(), clock: Clock = time.monotonic
    ) -> None:
        self.config = config
        self._clock = clock
        self._models: dict[str, ModelCapacity] = {}
        self._read_at: float | None = None
        self._sent: dict[str, dict[Priority, int]] = {}
        """Per model: requests let through per class since the last reading."""

    def update(self, capacities: Iterable[ModelCapacity]) -> None:
        """Changes state: a new reading replaces the last; the counts since start over."""
        self._models = {c.model: c for c in capacities}
        self._read_at = self._clock()
        self._sent = {}

    def clear(self) -> None:
        """Changes state: no reading (the scheduler could not be asked)."""
        self._models, self._read_at, self._sent = {}, None, {}

    def requests_per_s(self, model: str | None = None) -> float | None:
        """Read-only: the measured rate of `model`, or of every model together (None);
        None while unknown or stale."""
        if not self._fresh():
            return None
        chosen = self._models.values() if model is None else [self._models.get(model)]
        rates = [c.requests_per_s for c in chosen if c is not None and c.requests_per_s]
        return sum(rates) if rates else None

    def edge_headroom(self) -> int | None:
        """Read-only: the most new requests the published numbers admit now, whatever
        their model and class (each model's roomiest class, summed), for a limit that
        cannot tell requests apart (Envoy's, gateway/envoy/admission.py); None when a
        request might not be bounded (no fresh reading, or a model or class without one)."""
        if not self._fresh() or not self._models:
            return None
        total = 0
        for capacity in self._models.values():
            if set(capacity.headroom) != set(Priority):
                return None
            total += max(0, *capacity.headroom.values())
        return total

    def admit(self, model: str, priority: Priority, num_requests: int = 1) -> None:
        """Changes state: count num_requests of `priority` for `model` as sent, or raise
        ResourceExhausted (nothing counted) when the published headroom is used up."""
        capacity = self._models.get(model)
        if capacity is None or not self._fresh():
            return
        sent = self._sent.setdefault(model, {})
        room = capacity.headroom.get(priority)
        if room is not None:
            ahead = sum(n for p, n in sent.items() if p <= priority)
            deficit = ahead + num_requests - room
            if deficit > 0:
                raise ResourceExhausted(
                    with_retry_after(
                        f"overloaded: the scheduler admits no more {priority.name.lower()} "
                        "requests now (their estimated queue wait would pass the bound)",
                        _retry_after_s(deficit, capacity.requests_per_s),
                    )
                )
        sent[priority] = sent.get(priority, 0) + num_requests

    def _fresh(self) -> bool:
        return self._read_at is not None and self._clock() - self._read_at <= self.config.max_age_s


def _retry_after_s(deficit: int, requests_per_s: float | None) -> int:
    if not requests_per_s:
        return 1
    return max(1, min(60, math.ceil(deficit / requests_per_s)))
