"""Speculative decoding counters of one request, as the scheduler sums them from step
results and a response's usage reports them."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class SpecUsage:
    num_drafts: int = 0
    """Steps that verified a draft for the request."""
    num_draft_tokens: int = 0
    """Draft tokens verified."""
    num_accepted_tokens: int = 0
    """Draft tokens kept (each saved one step)."""
    accepted_by_position: list[int] = field(default_factory=list)
    """accepted_by_position[j]: drafts whose token at position j (0-based) was kept."""
    num_forced_tokens: int = 0
    """Jump-forward: draft tokens kept that the constraint forced (the only token its mask
    allowed); each saved one step. Counted in num_draft_tokens and num_accepted_tokens."""

    def record(self, num_draft_tokens: int, num_accepted: int, num_forced: int = 0) -> None:
        """One verified draft; `num_forced`: how many of the kept tokens were forced."""
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        self.num_forced_tokens += num_forced
        by_position = self.accepted_by_position
        if len(by_position) < num_accepted:
            by_position.extend([0] * (num_accepted - len(by_position)))
        for j in range(num_accepted):
            by_position[j] += 1

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens per verifying step: 1 + accepted / drafts (0 without drafts)."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0
