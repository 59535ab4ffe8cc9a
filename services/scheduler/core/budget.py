"""`StepBudget`: what one step may still take (tokens and sequences), and what planning it decided."""

from __future__ import annotations

from dataclasses import dataclass, field

from radixmesh.errors import ResourceExhausted
from services.scheduler.core.request import Request


@dataclass(slots=True)
class StepBudget:
    num_tokens: int
    num_seqs: int
    preempted_req_ids: set[str] = field(default_factory=set)
    """Requests preempted while planning this step; they do not resume in it."""
    failed: list[tuple[Request, ResourceExhausted]] = field(default_factory=list)
    """Requests that can never fit the pool, to end with an error."""

    def take(self, num_tokens: int) -> None:
        self.num_tokens -= num_tokens
        self.num_seqs -= 1
