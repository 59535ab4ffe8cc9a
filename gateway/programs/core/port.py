"""The runtime's port to the scheduler: submit one request that continues a context, release holds.

`hold_id` names a context hold: when the request finishes normally the scheduler keeps
its tokens (prompt + output) committed and locked in the radix tree under that name,
replacing an earlier hold of the same name; `release_hold` ends it. Closing the
connection ends every hold made on it. Implementations: `gateway.programs.backend`
(the scheduler client), and an in-process one over the engine in the tests.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from radixmesh.sampling import Constraint, Priority, SamplingParams
from radixmesh.updates import RequestUpdate


@dataclass(frozen=True, slots=True)
class ContextRequest:
    req_id: str
    model: str
    token_ids: tuple[int, ...]
    sampling: SamplingParams
    constraint: Constraint | None = None
    hold_id: str = ""
    """Keep this request's tokens held under this name when it finishes ("" : no hold)."""
    priority: Priority = Priority.INTERACTIVE
    deadline_unix_ms: int = 0


class ProgramBackend(Protocol):
    def submit(self, request: ContextRequest) -> AsyncIterator[RequestUpdate]:
        """The request's updates until its finish or error; leaving early aborts it."""
        ...

    async def release_hold(self, hold_id: str) -> None:
        """End a hold; unknown ids are ignored."""
        ...

    @property
    def supports_holds(self) -> bool: ...

    @property
    def supports_prompt_logprobs(self) -> bool: ...
