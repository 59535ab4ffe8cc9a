"""Which executor serves a request: by model, then cached prefix against load."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from services.scheduler.core.request import Request


def load_tokens(waiting: Sequence[Request], running: Sequence[Request]) -> int:
    """Tokens an executor must still run before a new request's turn (a load estimate)."""
    queued = sum(r.num_tokens for r in waiting)
    prefilling = sum(max(0, r.num_admitted_tokens - r.num_computed_tokens) for r in running)
    return queued + prefilling + len(running)


def choose_executor(
    num_prompt_tokens: int, loads: Mapping[str, int], matches: Mapping[str, int]
) -> str:
    """The executor with the least work before this request ends its prefill.

    cost = load + prompt tokens not cached there; ties go to the first listed.
    """
    if not loads:
        raise ValueError("choose_executor needs at least one executor")
    return min(loads, key=lambda ex_id: loads[ex_id] + num_prompt_tokens - matches.get(ex_id, 0))
