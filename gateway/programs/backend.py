"""The runtime's scheduler port over the gateway's scheduler client (`SchedulerClient`).

Holds are used when the client takes them (`generate(..., hold_id=)` and
`release_hold`); without them programs still run, each statement re-using the
context through the radix tree's ordinary prefix cache.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator
from typing import Any

from gateway.core.prepare import PreparedRequest
from radixmesh.updates import RequestUpdate


class SchedulerBackend:
    """ProgramBackend over a scheduler client (the shape of `gateway.core.generate.Upstream`)."""

    def __init__(self, client: Any) -> None:
        self._client = client
        parameters = inspect.signature(client.generate).parameters
        self._holds = "hold_id" in parameters and hasattr(client, "release_hold")
        self._groups = "group_id" in parameters
        self._group_sizes = "group_size" in parameters

    @property
    def supports_holds(self) -> bool:
        return self._holds

    @property
    def supports_prompt_logprobs(self) -> bool:
        return True

    def submit(self, request: PreparedRequest) -> AsyncIterator[RequestUpdate]:
        extra: dict[str, str | int] = {}
        if self._holds and request.hold_id:
            extra["hold_id"] = request.hold_id
        if self._groups and request.group_id:
            extra["group_id"] = request.group_id
            if self._group_sizes and request.group_size:
                extra["group_size"] = request.group_size
        return self._client.generate(
            request.req_id,
            request.prompt_token_ids,
            request.sampling,
            constraint=request.constraint,
            model=request.model,
            priority=request.priority,
            deadline_unix_ms=request.deadline_unix_ms,
            **extra,
        )

    async def release_hold(self, hold_id: str) -> None:
        if self._holds:
            await self._client.release_hold(hold_id)
