"""What the scheduler streams back for one request: its new tokens of one step.

One type on both sides of `Scheduler.Stream`: the scheduler core yields it,
`radixmesh.wire.update_to_proto` / `update_from_proto` carry it over the wire,
and the gateway, the in-process engine and `SchedulerClient` read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from radixmesh.errors import RadixmeshError
from radixmesh.speculation import SpecUsage
from radixmesh.step import TokenLogprobs


@dataclass(slots=True)
class RequestUpdate:
    """New tokens of one request from one step; the last one carries finish_reason or error."""

    req_id: str
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    """One entry per token when logprobs were asked for."""
    finish_reason: str | None = None
    """"stop", "length" or "abort" on the last update."""
    matched_stop_token_id: int | None = None
    num_prompt_tokens: int | None = None
    """Set on the request's first update."""
    num_cached_tokens: int | None = None
    """Set on the request's first update."""
    error: RadixmeshError | None = None
    """A failed request (its last update)."""
    prompt_logprobs: list[TokenLogprobs] = field(default_factory=list)
    """With sampling.prompt_logprobs_start k: the prompt tokens' log probabilities at
    positions k, k + 1, ... (all of them), on the request's first update."""
    speculation: SpecUsage | None = None
    """Speculative decoding counters of the whole request, on its last update when it
    verified any draft."""

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None or self.error is not None
