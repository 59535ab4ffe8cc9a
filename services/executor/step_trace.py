"""The executor's spans: one `executor.step` span per plan that ran a traced sequence.

A plan is one step, or (a multi-step decode plan) up to k steps run back to back,
each answered as it ends. Its span runs from its first step's start to its last
step's end and links to the request span of every traced sequence in the plan (the
traceparent its NewSequence carried): one link per sequence per plan, not per step,
since a link costs the SDK about ten microseconds of CPU to create and export and a
sequence at batch 64 is in every step. A plan of k > 1 steps has an
`executor.substep` event per step (its index, length in radixmesh.duration_ms, and
sequences), a plan of one step none.

The span is written when the plan's last step answers: its `num_steps`-th, or the
one after which no sequence of the plan is left (each ended: EOS, max_tokens, ...),
else when the next plan's first step answers or the stream ends (`flush`). Called
on the execute thread; `flush` may come from the event loop, hence the lock.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from radixmesh.step import StepPlan, StepResult
from services.common import tracing

_TRACER = "radixmesh.executor"


@dataclass(slots=True)
class _Plan:
    step_id: int
    num_steps: int
    start_s: float
    end_s: float
    links: list[tracing.Link]
    attributes: dict[str, Any]
    live: set[str]
    """The plan's sequences that have not ended yet."""
    substeps: list[tuple[int, float, float, int]] = field(default_factory=list)
    """(substep, start, end, sequences) of each step answered."""
    num_tokens: int = 0


class StepTraces:
    """The step spans of one Step stream (see the module docstring)."""

    def __init__(self, executor_id: str) -> None:
        self._executor_id = executor_id
        self._open: _Plan | None = None
        self._lock = threading.Lock()

    def on_result(
        self, plan: StepPlan, result: StepResult, links: list[tracing.Link] | None
    ) -> None:
        """A step of `plan` answered `result`; `links` (for its first step, result.substep
        0): one to the request span of each traced sequence in the plan."""
        end = time.monotonic()
        start = end - result.step_seconds
        with self._lock:
            open_plan = self._open
            if open_plan is not None and open_plan.step_id != plan.step_id:
                self._write(open_plan)
                open_plan = self._open = None
            if open_plan is None:
                if result.substep or not links:
                    return  # nothing traced ran in it (or its first step was not seen)
                open_plan = self._open = self._start(plan, links, start, end)
            open_plan.end_s = end
            if result.substep:
                open_plan.num_tokens += len(result.outputs)
            num_seqs = len(result.outputs)
            open_plan.substeps.append((result.substep, start, end, num_seqs))
            open_plan.live.difference_update(
                o.req_id for o in result.outputs if o.finish_reason is not None
            )
            if len(open_plan.substeps) >= open_plan.num_steps or not open_plan.live:
                self._write(open_plan)
                self._open = None

    def flush(self) -> None:
        """Write the open plan's span (the stream ends)."""
        with self._lock:
            open_plan, self._open = self._open, None
            if open_plan is not None:
                self._write(open_plan)

    def _start(self, plan: StepPlan, links: list[tracing.Link], start: float, end: float) -> _Plan:
        num_tokens = sum(n.num_scheduled_tokens for n in plan.new_seqs)
        num_tokens += sum(r.num_scheduled_tokens for r in plan.running_seqs)
        live = {n.req_id for n in plan.new_seqs} | {r.req_id for r in plan.running_seqs}
        attributes = {
            "radixmesh.executor_id": self._executor_id,
            "radixmesh.step_id": plan.step_id,
            "radixmesh.num_new_seqs": len(plan.new_seqs),
            "radixmesh.num_running_seqs": len(plan.running_seqs),
        }
        return _Plan(plan.step_id, max(plan.num_steps, 1), start, end, links, attributes, live,
                     num_tokens=num_tokens)  # fmt: skip

    @staticmethod
    def _write(p: _Plan) -> None:
        if p.num_tokens == 0:
            return  # a plan that only ended sequences computed nothing
        p.attributes["radixmesh.num_scheduled_tokens"] = p.num_tokens
        p.attributes["radixmesh.num_steps"] = len(p.substeps)
        events = []
        if p.num_steps > 1:
            events = [
                ("executor.substep", at, {"radixmesh.substep": i, "radixmesh.num_seqs": n,
                                          "radixmesh.duration_ms": round((end - at) * 1e3, 3)})
                for i, at, end, n in p.substeps
            ]  # fmt: skip
        tracing.record_span(tracing.tracer(_TRACER), "executor.step", p.start_s, p.end_s,
                            attributes=p.attributes, events=events, links=p.links)  # fmt: skip
