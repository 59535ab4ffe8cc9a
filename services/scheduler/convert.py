"""Protobuf <-> scheduler core objects, at the edge only: SubmitRequest -> `Submission`.

Everything else the scheduler puts on the wire has one converter in the contract
(`radixmesh.wire`): sampling, constraints and priority, request updates, step
plans and results, executor information. Unset optional sampling fields take the
dataclass defaults; bad values raise InvalidArgument naming the field.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from radixmesh.errors import InvalidArgument
from radixmesh.sampling import Constraint, Priority, SamplingParams
from radixmesh.v1 import scheduler_pb2
from radixmesh.wire import constraint_from_proto, priority_from_proto, sampling_from_proto


@dataclass(frozen=True, slots=True)
class Submission:
    req_id: str
    model: str
    token_ids: list[int]
    sampling: SamplingParams
    constraint: Constraint | None
    priority: Priority
    deadline: float | None
    """On the scheduler's clock (time.monotonic)."""
    hold_id: str = ""
    """The stream's name for the context hold a normal finish makes; empty: none."""
    group_id: str = ""
    """The stream's name of the program group the request belongs to; empty: none."""
    group_size: int = 0
    """How many requests that group has in all; 0: not said."""


def submission_from_proto(
    msg: scheduler_pb2.SubmitRequest, now_unix: float | None = None, now: float | None = None
) -> Submission:
    """Validated; the deadline moves from Unix milliseconds to the monotonic clock."""
    if not msg.req_id:
        raise InvalidArgument("submit.req_id must not be empty")
    where = f"submit[{msg.req_id!r}]."
    try:
        priority = priority_from_proto(msg.priority)
        sampling = sampling_from_proto(msg.sampling)
        constraint = constraint_from_proto(msg.constraint) if msg.HasField("constraint") else None
    except InvalidArgument as exc:
        raise InvalidArgument(f"{where}{exc}") from None
    deadline = None
    if msg.deadline_unix_ms:
        now_unix = time.time() if now_unix is None else now_unix
        now = time.monotonic() if now is None else now
        deadline = now + (msg.deadline_unix_ms / 1000.0 - now_unix)
    return Submission(
        req_id=msg.req_id,
        model=msg.model,
        token_ids=list(msg.token_ids),
        sampling=sampling,
        constraint=constraint,
        priority=priority,
        deadline=deadline,
        hold_id=msg.hold_id,
        group_id=msg.group_id,
        group_size=msg.group_size,
    )
