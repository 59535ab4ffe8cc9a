"""The runtime's port to the scheduler: submit one request that continues a context, release holds.

A request is the gateway's one submission type, `PreparedRequest`. Its
`hold_id` names a context hold: when the request finishes normally the scheduler keeps
its tokens (prompt + output) committed and locked in the radix tree under that name,
replacing an earlier hold of the same name; `release_hold` ends it. Closing the
connection ends every hold made on it. Implementations: `gateway.programs.backend`
(the scheduler client), and an in-process one over the engine in the tests.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from gateway.core.prepare import PreparedRequest
from radixmesh.updates import RequestUpdate


class ProgramBackend(Protocol):
    def submit(self, request: PreparedRequest) -> AsyncIterator[RequestUpdate]:
        """The request's updates until its finish or error; leaving early aborts it."""
        ...

    async def release_hold(self, hold_id: str) -> None:
        """End a hold; unknown ids are ignored."""
        ...

    @property
    def supports_holds(self) -> bool: ...

    @property
    def supports_prompt_logprobs(self) -> bool: ...
