"""A traced request's spans in the scheduler, written once it ends from the times the core noted.

The servicer gives a request a `RequestTrace` when its SubmitRequest carries a
traceparent and tracing is on; the core then notes plain timestamps at the
request's events (`req.trace.<event>(...)`, guarded by `if req.trace`), and
`finished` writes the spans, children of the gateway's span:

    scheduler.request           submit -> end   (model, priority, executor, tokens, finish)
      scheduler.queue_wait      submit -> first admission (again after each preemption)
      scheduler.prefill_chunk   one per chunk: scheduled -> the next event (tokens, step id)
      scheduler.decode          first token -> end, with its step count
    events on scheduler.request: preempted (tokens kept), first_token

Executor steps are spans of their own in the executor (`executor.step`, with
`radixmesh.executor_id` and `radixmesh.step_id`); each chunk and the decode
span carry the executor id and step ids that join them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from services.common.tracing import SpanKind, context_from_traceparent, record_span, tracer

_TRACER_NAME = "radixmesh.scheduler"


@dataclass(slots=True)
class RequestTrace:
    parent: Any
    """The gateway span's context."""
    arrival_s: float
    """time.monotonic at submit (the core's arrival_time)."""
    queued: list[float] = field(default_factory=list)
    """Each time the request (re)joined a queue."""
    admitted: list[float] = field(default_factory=list)
    chunks: list[tuple[float, int, int]] = field(default_factory=list)
    """(scheduled at, tokens, step id) per prefill chunk."""
    preempted: list[tuple[float, int]] = field(default_factory=list)
    """(at, computed tokens kept) per preemption."""
    first_token_s: float | None = None
    last_token_s: float | None = None
    num_tokens: int = 0
    decode_steps: list[int] = field(default_factory=list)
    """First and last decode step id."""

    @classmethod
    def start(cls, traceparent: str, arrival_s: float) -> RequestTrace | None:
        """A trace for a request whose gateway sent a valid traceparent, else None."""
        parent = context_from_traceparent(traceparent)
        return None if parent is None else cls(parent, arrival_s, queued=[arrival_s])

    def on_admitted(self, now: float) -> None:
        self.admitted.append(now)

    def on_started(self, num_tokens: int, step_id: int) -> None:
        """(Re)admitted into a batch with its first chunk."""
        now = time.monotonic()
        self.admitted.append(now)
        self.chunks.append((now, num_tokens, step_id))

    def on_scheduled(self, num_tokens: int, prefilling: bool, step_id: int) -> None:
        """A running request got `num_tokens` in the step being planned."""
        if prefilling:
            self.chunks.append((time.monotonic(), num_tokens, step_id))
        elif not self.decode_steps:
            self.decode_steps = [step_id, step_id]
        else:
            self.decode_steps[1] = step_id

    def on_preempted(self, num_computed: int) -> None:
        now = time.monotonic()
        self.preempted.append((now, num_computed))
        self.queued.append(now)

    def on_token(self, now: float) -> None:
        if self.first_token_s is None:
            self.first_token_s = now
        self.last_token_s = now
        self.num_tokens += 1

    def finished(self, now: float, req: Any, finish_reason: str | None, code: str) -> None:
        """Write the request's spans (see the module docstring)."""
        t = tracer(_TRACER_NAME)
        executor_id = getattr(req, "executor_id", None) or ""
        events: list[tuple[str, float, dict[str, Any]]] = [
            ("preempted", at, {"radixmesh.num_computed_tokens": kept})
            for at, kept in self.preempted
        ]
        if self.first_token_s is not None:
            events.append(("first_token", self.first_token_s, {}))
        root = record_span(
            t, "scheduler.request", self.arrival_s, now, self.parent,
            attributes={
                "radixmesh.req_id": req.req_id,
                "radixmesh.model": req.model,
                "radixmesh.priority": req.priority.name.lower(),
                "radixmesh.executor_id": executor_id,
                "radixmesh.num_prompt_tokens": len(req.prompt_token_ids),
                "radixmesh.num_cached_tokens": req.num_cached_tokens or 0,
                "radixmesh.num_output_tokens": self.num_tokens,
                "radixmesh.num_preemptions": len(self.preempted),
                "radixmesh.finish_reason": finish_reason or "error",
                "radixmesh.code": code,
            },
            events=events, kind=SpanKind.SERVER,
        )  # fmt: skip
        for i, queued in enumerate(self.queued):
            end = self.admitted[i] if i < len(self.admitted) else now
            record_span(t, "scheduler.queue_wait", queued, end, root,
                        {"radixmesh.attempt": i})  # fmt: skip
        marks = sorted([c[0] for c in self.chunks] + [x for x in (self.first_token_s,) if x])
        for at, num_tokens, step_id in self.chunks:
            later = [m for m in marks if m > at]
            record_span(
                t, "scheduler.prefill_chunk", at, later[0] if later else now, root,
                {"radixmesh.num_scheduled_tokens": num_tokens, "radixmesh.step_id": step_id,
                 "radixmesh.executor_id": executor_id},
            )  # fmt: skip
        if self.first_token_s is not None:
            attrs: dict[str, Any] = {
                "radixmesh.num_steps": max(self.num_tokens - 1, 0),
                "radixmesh.executor_id": executor_id,
            }
            if self.decode_steps:
                attrs["radixmesh.first_step_id"], attrs["radixmesh.last_step_id"] = (
                    self.decode_steps
                )
            record_span(t, "scheduler.decode", self.first_token_s, now, root, attrs)
