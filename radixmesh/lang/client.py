"""The client side of `radixmesh.v1.Programs`: Run in one call, or a Session statement by
statement. asyncio first (grpc.aio); the Program object adds the sync forms."""

from __future__ import annotations

import asyncio
import json
import math
import os
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc

from radixmesh.v1 import program_pb2 as pb
from radixmesh.v1 import program_pb2_grpc

DEFAULT_TARGET = "127.0.0.1:8080"


class ProgramFailed(Exception):
    """The program ended with a gRPC status (e.g. INVALID_ARGUMENT naming a statement)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


@dataclass
class ProgramResult:
    value: Any
    """The Return's value (None without one)."""
    variables: dict[str, Any]
    usage: list[dict[str, Any]] = field(default_factory=list)
    """Per statement: {"statement", "model", "prompt_tokens", "completion_tokens", "cached_tokens"}."""
    events: list[pb.ProgramEvent] = field(default_factory=list)

    def __getitem__(self, name: str) -> Any:
        return self.variables[name]

    @classmethod
    def from_event(cls, result: pb.ProgramResult, events: list[pb.ProgramEvent]) -> ProgramResult:
        usage = [
            {
                "statement": u.statement,
                "model": u.model,
                "prompt_tokens": u.usage.prompt_tokens,
                "completion_tokens": u.usage.completion_tokens,
                "cached_tokens": u.usage.cached_tokens,
            }
            for u in result.usage
        ]
        variables = {k: json.loads(v) for k, v in result.vars_json.items()}
        return cls(json.loads(result.value_json), variables, usage, events)


def _failed(exc: grpc.aio.AioRpcError) -> ProgramFailed:
    return ProgramFailed(exc.code().name, exc.details() or "")


class Client:
    """Where programs run: Envoy's public port of a `radixmesh serve` (or a gateway).

    `timeout_s` (None: no limit; else a finite number of seconds > 0) is the gRPC
    deadline of each call this client makes, which bounds the whole program in either
    mode: a Run (compiled mode) from its start to its result, and a Session
    (interactive mode) from its start to its end, every statement and the Python
    between them included. Past it the program fails with ProgramFailed
    DEADLINE_EXCEEDED, and the server stops what was running.
    """

    def __init__(
        self, target: str | None = None, api_key: str | None = None, timeout_s: float | None = None
    ) -> None:
        if timeout_s is not None and (
            isinstance(timeout_s, bool)
            or not isinstance(timeout_s, int | float)
            or not math.isfinite(timeout_s)
            or timeout_s <= 0
        ):
            raise ValueError(
                f"timeout_s: must be None or a finite number of seconds > 0, got {timeout_s!r}"
            )
        self.target = target or os.environ.get("RADIXMESH_TARGET", DEFAULT_TARGET)
        self.api_key = api_key if api_key is not None else os.environ.get("RADIXMESH_API_KEY")
        self.timeout_s = timeout_s

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.api_key}"),) if self.api_key else ()

    async def run(
        self, program: pb.Program, inputs: Mapping[str, str], request_id: str = ""
    ) -> AsyncIterator[pb.ProgramEvent]:
        """The program's events, ProgramResult last."""
        request = pb.RunProgramRequest(program=program, inputs=dict(inputs), request_id=request_id)
        async with grpc.aio.insecure_channel(self.target) as channel:
            stub = program_pb2_grpc.ProgramsStub(channel)
            try:
                async for event in stub.Run(request, metadata=self.metadata, timeout=self.timeout_s):
                    yield event
            except grpc.aio.AioRpcError as exc:
                raise _failed(exc) from None

    def session(self, start: pb.SessionStart) -> Session:
        return Session(self, start)


class Session:
    """One Programs/Session stream: `await session.run(statement)` returns its events
    (StatementDone last); leaving the `async with` ends it (the server releases its pages).
    The client's `timeout_s` is the deadline of the whole session, from `async with` on."""

    def __init__(self, client: Client, start: pb.SessionStart) -> None:
        self._client = client
        self._start = start
        self._outbox: asyncio.Queue[pb.SessionRequest | None] = asyncio.Queue()
        self._channel: grpc.aio.Channel | None = None
        self._call: Any = None

    async def __aenter__(self) -> Session:
        self._channel = grpc.aio.insecure_channel(self._client.target)
        stub = program_pb2_grpc.ProgramsStub(self._channel)
        self._outbox.put_nowait(pb.SessionRequest(start=self._start))
        self._call = stub.Session(
            self._requests(), metadata=self._client.metadata, timeout=self._client.timeout_s
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._outbox.put_nowait(None)
        if self._call is not None:
            self._call.cancel()
        if self._channel is not None:
            await self._channel.close()

    async def _requests(self) -> AsyncIterator[pb.SessionRequest]:
        while (message := await self._outbox.get()) is not None:
            yield message

    async def run(
        self, statement: pb.Statement, on_event: Callable[[pb.ProgramEvent], None] | None = None
    ) -> list[pb.ProgramEvent]:
        self._outbox.put_nowait(pb.SessionRequest(statement=statement))
        events = []
        try:
            while True:
                event = await self._call.read()
                if event is grpc.aio.EOF:
                    raise ProgramFailed("UNAVAILABLE", "the session ended before the statement did")
                events.append(event)
                if on_event is not None:
                    on_event(event)
                if event.WhichOneof("event") == "done":
                    return events
        except grpc.aio.AioRpcError as exc:
            raise _failed(exc) from None
