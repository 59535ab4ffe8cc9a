"""A traced request's span in the scheduler: one live span per request, its phases written at the end.

The servicer gives a request a `RequestTrace` when its SubmitRequest carries a
traceparent of a sampled trace and tracing is on. `start` opens the request's span at
once (so its traceparent can travel to the executor with the new sequence); the core
then notes plain timestamps at the request's events (`req.trace.<event>(...)`, guarded
by `if req.trace`), and `finished` writes the phases as timed events of that one span
and ends it (after the commit of its lease, which follows), a child of the gateway's span:

    scheduler.request           submit -> end   (model, priority, executor, tokens, finish)
      events, each at its start with its length in radixmesh.duration_ms:
        cache.match, cache.acquire, cache.extend, cache.commit, cache.release
                                each cache verb the request caused (its round trip)
        scheduler.queue_wait    submit -> first admission (again after each preemption)
        scheduler.prefill_chunk one per chunk: scheduled -> the next chunk or the first token
                                (tokens, step id)
        scheduler.decode        first token -> end (its step count, first and last step id)
        preempted (tokens kept), first_token

Events, not child spans: a span costs the SDK a hundred microseconds or more of CPU to
create, encode and export, an event a few, and a request's phases are many (tracing
every request at batch 64 on CPU cost about 2% of the mesh's CPU with a span per phase
and per cache verb; bench/RESULTS.md).

The servicer holds `trace.active()` over the submit (its prefix match) and the core holds
it while it awaits a later cache verb for the request: the request's span is then the
current one, and the cache client adds the verb's event to it. Executor steps are batched
over many requests: each `executor.step` span links to the request spans of the
sequences in it (the traceparent the NewSequence carried), and each chunk event and
the decode event name the step ids, the request's span its executor.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace

from services.common.tracing import (
    SpanKind,
    context_from_traceparent,
    epoch_ns,
    traceparent_of,
    tracer,
)

_TRACER_NAME = "radixmesh.scheduler"


@dataclass(slots=True)
class RequestTrace:
    root: Any
    """The request's span (`scheduler.request`), open from submit until `finished`."""
    traceparent: str
    """The root span's W3C traceparent (what the cache verbs and the executor carry)."""
    arrival_s: float
    """time.monotonic at submit (the core's arrival_time)."""
    queued: list[float] = field(default_factory=list)
    """Each time the request (re)joined a queue."""
    admitted: list[float] = field(default_factory=list)
    chunks: list[tuple[float, int, int]] = field(default_factory=list)
    """(scheduled at, tokens, step id) per prefill chunk."""
    preempted: list[tuple[float, int]] = field(default_factory=list)
    """(at, computed tokens kept) per preemption."""
    checkpoints: list[tuple[float, int]] = field(default_factory=list)
    """(at, computed tokens kept) per prefix checkpoint (`Leases.checkpoint`)."""
    first_token_s: float | None = None
    last_token_s: float | None = None
    num_tokens: int = 0
    decode_steps: list[int] = field(default_factory=list)
    """First and last decode step id."""
    ended_s: float | None = None
    """When the request finished, while its span waits for the lease's last verb."""

    @classmethod
    def start(cls, traceparent: str, arrival_s: float) -> RequestTrace | None:
        """A trace for a request whose gateway sent a valid traceparent of a sampled trace,
        else None (an unsampled request costs the scheduler nothing more)."""
        parent = context_from_traceparent(traceparent)
        if parent is None or not trace.get_current_span(parent).get_span_context().trace_flags.sampled:
            return None
        root = tracer(_TRACER_NAME).start_span(
            "scheduler.request", context=parent, kind=SpanKind.SERVER,
            start_time=epoch_ns(arrival_s),
        )  # fmt: skip
        return cls(root, traceparent_of(root), arrival_s, queued=[arrival_s])

    def arrived(self, arrival_s: float) -> None:
        """The core took the request at `arrival_s` (its arrival_time): the first queue
        wait starts there (the span itself started before, with the submit's prefix match)."""
        self.arrival_s = arrival_s
        self.queued = [arrival_s]

    def refused(self, error: Exception) -> None:
        """The submit raised (overload, bad input): end the span with the error."""
        self.root.set_attributes(
            {"radixmesh.code": getattr(error, "code", "INTERNAL"),
             "radixmesh.finish_reason": "error"}
        )  # fmt: skip
        self.root.set_status(trace.Status(trace.StatusCode.ERROR, str(error)))
        self.root.end()

    def active(self) -> AbstractContextManager[Any]:
        """The request's span as the current one (a cache verb awaited inside is its event).
        Once the request `finished` with its lease still held, the block that ends the
        lease (its commit or release) ends the span too."""
        if self.ended_s is not None:
            return self._ending(self.ended_s)
        return trace.use_span(
            self.root, end_on_exit=False, record_exception=False, set_status_on_exception=False
        )

    @contextmanager
    def _ending(self, ended_s: float) -> Iterator[Any]:
        self.ended_s = None
        try:
            with trace.use_span(self.root, end_on_exit=False, record_exception=False,
                                set_status_on_exception=False):  # fmt: skip
                yield self.root
        finally:
            self.root.end(end_time=epoch_ns(max(time.monotonic(), ended_s)))

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

    def on_preempted(self, num_computed: int, checkpoint: bool = False) -> None:
        """Re-queued with `num_computed` tokens kept in the tree: preempted, or (`checkpoint`)
        its prompt put in the tree for the waiting requests that share it."""
        now = time.monotonic()
        (self.checkpoints if checkpoint else self.preempted).append((now, num_computed))
        self.queued.append(now)

    def on_token(self, now: float) -> None:
        if self.first_token_s is None:
            self.first_token_s = now
        self.last_token_s = now
        self.num_tokens += 1

    def finished(self, now: float, req: Any, finish_reason: str | None, code: str) -> None:
        """Write the request's phases as events and end its span (the module docstring)."""
        executor_id = getattr(req, "executor_id", None) or ""
        root = self.root
        root.set_attributes(
            {
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
            }
        )
        for event, at_s, attrs in sorted(self._events(now), key=lambda e: e[1]):
            root.add_event(event, attrs, timestamp=epoch_ns(at_s))
        if getattr(req, "lease_id", None) is not None:
            self.ended_s = max(now, self.arrival_s)  # its commit is next: `active` ends it
        else:
            root.end(end_time=epoch_ns(max(now, self.arrival_s)))

    def _events(self, now: float) -> list[tuple[str, float, dict[str, Any]]]:
        """(name, at, attributes) of each phase: queue waits, prefill chunks (each until the
        next chunk or the first token), decode, preemptions and the first token."""
        events: list[tuple[str, float, dict[str, Any]]] = [
            ("preempted", at, {"radixmesh.num_computed_tokens": kept})
            for at, kept in self.preempted
        ]
        events += [
            ("scheduler.prefix_checkpoint", at, {"radixmesh.num_computed_tokens": kept})
            for at, kept in self.checkpoints
        ]
        for i, queued in enumerate(self.queued):
            end = self.admitted[i] if i < len(self.admitted) else now
            events.append(("scheduler.queue_wait", queued,
                           {"radixmesh.attempt": i, "radixmesh.duration_ms": _ms(queued, end)}))  # fmt: skip
        marks = sorted([c[0] for c in self.chunks] + [x for x in (self.first_token_s,) if x])
        for at, num_tokens, step_id in self.chunks:
            later = [m for m in marks if m > at]
            events.append(("scheduler.prefill_chunk", at, {
                "radixmesh.num_scheduled_tokens": num_tokens, "radixmesh.step_id": step_id,
                "radixmesh.duration_ms": _ms(at, later[0] if later else now),
            }))  # fmt: skip
        if self.first_token_s is not None:
            events.append(("first_token", self.first_token_s, {}))
            attrs: dict[str, Any] = {
                "radixmesh.num_steps": max(self.num_tokens - 1, 0),
                "radixmesh.duration_ms": _ms(self.first_token_s, now),
            }
            if self.decode_steps:
                attrs["radixmesh.first_step_id"], attrs["radixmesh.last_step_id"] = (
                    self.decode_steps
                )
            events.append(("scheduler.decode", self.first_token_s, attrs))
        return events


def _ms(start_s: float, end_s: float) -> float:
    return round(max(end_s - start_s, 0.0) * 1e3, 3)
