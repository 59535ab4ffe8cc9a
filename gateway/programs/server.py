"""The `radixmesh.v1.Programs` servicer: convert, run the program, convert its events.

Run checks the whole program before streaming (INVALID_ARGUMENT naming the statement);
Session keeps one context across the statements a client sends. A client that cancels
either call cancels the run, whose holds are released (pages back to the pool).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncIterator

from gateway import convert as gateway_convert
from gateway.core.auth import Admission, client_address
from gateway.programs import convert
from gateway.programs.core import events as ev
from gateway.programs.core.model import Program
from gateway.programs.core.runtime import ProgramRun, RuntimeDeps
from gateway.tracing import request_trace
from radixmesh import wire
from radixmesh.errors import InvalidArgument
from radixmesh.v1 import program_pb2, program_pb2_grpc
from services.common.logging import get_logger
from services.common.tracing import traceparent_from_metadata

log = get_logger(__name__)


async def admit(admission: Admission, context) -> None:
    authorization, forwarded = "", []
    for key, value in context.invocation_metadata() or ():
        if key == "authorization":
            authorization = str(value)
        elif key == "x-forwarded-for":
            forwarded.append(str(value))
    await admission.admit(authorization, client_address(",".join(forwarded), context.peer() or ""))


def _run_id(request_id: str) -> str:
    return gateway_convert.check_request_id(request_id) if request_id else uuid.uuid4().hex


class ProgramsServicer(program_pb2_grpc.ProgramsServicer):
    def __init__(self, deps: RuntimeDeps, admission: Admission = Admission()) -> None:
        self._deps = deps
        self._admission = admission

    async def Run(
        self, request: program_pb2.RunProgramRequest, context
    ) -> AsyncIterator[program_pb2.ProgramEvent]:
        await admit(self._admission, context)
        if not request.HasField("program"):
            raise InvalidArgument("program: required")
        if not request.program.body:
            raise InvalidArgument("program.body: empty; a program runs at least one statement")
        program = convert.program_from_proto(request.program, self._deps.limits)
        priority = wire.priority_from_proto(request.priority)
        run_id = _run_id(request.request_id)
        run = ProgramRun(program, dict(request.inputs), self._deps, run_id, priority)
        started, outcome, num_events = time.monotonic(), "cancelled", 0
        traceparent = traceparent_from_metadata(context.invocation_metadata())
        try:
            with request_trace("programs.Run", traceparent, run_id):
                async with contextlib.aclosing(run.events()) as events:
                    async for event in events:
                        if isinstance(event, ev.ProgramResult):
                            outcome = "ok"
                        num_events += 1
                        yield convert.event_to_proto(event)
        except Exception as exc:
            outcome = getattr(exc, "code", "INTERNAL")
            raise
        finally:
            total = ev.Usage()
            for entry in run.usage:
                total = total + entry.usage
            log.info(
                "program_finished",
                program=program.name,
                run_id=run_id,
                outcome=outcome,
                seconds=round(time.monotonic() - started, 3),
                events=num_events,
                prompt_tokens=total.prompt_tokens,
                completion_tokens=total.completion_tokens,
                cached_tokens=total.cached_tokens,
            )

    async def Session(
        self, request_iterator: AsyncIterator[program_pb2.SessionRequest], context
    ) -> AsyncIterator[program_pb2.ProgramEvent]:
        await admit(self._admission, context)
        first = await anext(aiter(request_iterator), None)
        if first is None or first.WhichOneof("op") != "start":
            raise InvalidArgument("session: the first request must be a start")
        start = first.start
        priority = wire.priority_from_proto(start.priority, "start.")
        limits = convert.limits_from_proto(self._deps.limits, start.limits)
        program = Program(body=(), name=start.name, model=start.model, limits=limits)
        run = ProgramRun(program, dict(start.inputs), self._deps, uuid.uuid4().hex, priority)
        try:
            index = 0
            async for message in request_iterator:
                if (op := message.WhichOneof("op")) != "statement":
                    got = "a second start" if op == "start" else "an empty request"
                    raise InvalidArgument(f"statement[{index}]: expected a statement, got {got}")
                statement = convert.statement_from_proto(message.statement, f"statement[{index}]")
                index += 1
                async with contextlib.aclosing(run.run_statement(statement)) as events:
                    async for event in events:
                        yield convert.event_to_proto(event)
                        if isinstance(event, ev.StatementDone) and event.returned:
                            return
        finally:
            await run.release_holds()
