"""The executor's step spans: one per plan that ran a traced sequence, its steps as events."""

from __future__ import annotations

import pytest

from radixmesh.sampling import SamplingParams
from radixmesh.step import NewSequence, RunningSequence, SequenceOutput, StepPlan, StepResult
from services.common import tracing
from services.executor.step_trace import StepTraces
from tests.fixtures.otlp import spans_in_memory

A = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
B = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture
def exported(monkeypatch):
    return spans_in_memory(monkeypatch)


def links(*traceparents: str) -> list[tracing.Link]:
    return [link for t in traceparents if (link := tracing.link_to(t)) is not None]


def result(step_id: int, substep: int, *req_ids: str, ended: tuple[str, ...] = ()) -> StepResult:
    outputs = [SequenceOutput(r, token_id=7, finish_reason="length" if r in ended else None)
               for r in req_ids]  # fmt: skip
    return StepResult(step_id, outputs, step_seconds=0.01, substep=substep)


def decode_plan(step_id: int, num_steps: int, *req_ids: str) -> StepPlan:
    return StepPlan(step_id, running_seqs=[RunningSequence(r, 1) for r in req_ids],
                    num_steps=num_steps)  # fmt: skip


def span_ids(span) -> list[str]:
    return [format(link.context.span_id, "016x") for link in span.links]


def test_a_one_step_plan_is_one_span_with_a_link_per_traced_sequence_and_no_events(exported):
    traces = StepTraces("exec-0")
    seq = NewSequence("a", [1, 2, 3], 3, 0, 3, [0], SamplingParams(), traceparent=A)
    plan = StepPlan(1, new_seqs=[seq], running_seqs=[RunningSequence("b", 1)])
    traces.on_result(plan, result(1, 0, "a", "b"), links(A, B))
    (span,) = exported.get_finished_spans()  # written at once: the plan had one step
    assert span.name == "executor.step" and span_ids(span) == ["b7ad6b7169203331", "00f067aa0ba902b7"]
    assert dict(span.attributes) == {
        "radixmesh.executor_id": "exec-0", "radixmesh.step_id": 1, "radixmesh.num_new_seqs": 1,
        "radixmesh.num_running_seqs": 1, "radixmesh.num_scheduled_tokens": 4,
        "radixmesh.num_steps": 1,
    }  # fmt: skip
    assert span.events == ()


def test_a_multi_step_plan_is_one_span_over_its_steps_linked_once(exported):
    traces = StepTraces("exec-0")
    plan = decode_plan(5, 4, "a", "b")
    traces.on_result(plan, result(5, 0, "a", "b"), links(A, B))
    for substep in (1, 2):
        traces.on_result(decode_plan(5, 1, "a", "b"), result(5, substep, "a", "b"), None)
    assert exported.get_finished_spans() == ()  # a step of the plan is still to come
    traces.on_result(decode_plan(5, 1, "a", "b"), result(5, 3, "a", "b"), None)
    (span,) = exported.get_finished_spans()
    assert len(span.links) == 2
    assert span.attributes["radixmesh.num_steps"] == 4
    assert span.attributes["radixmesh.num_scheduled_tokens"] == 8
    events = [(e.name, e.attributes["radixmesh.substep"], e.attributes["radixmesh.num_seqs"])
              for e in span.events]  # fmt: skip
    assert events == [("executor.substep", i, 2) for i in range(4)]
    assert all(e.attributes["radixmesh.duration_ms"] == pytest.approx(10.0) for e in span.events)
    assert span.start_time == span.events[0].timestamp
    assert span.start_time < span.events[-1].timestamp < span.end_time


def test_a_plan_whose_sequences_all_end_early_is_written_then(exported):
    traces = StepTraces("exec-0")
    traces.on_result(decode_plan(2, 4, "a", "b"), result(2, 0, "a", "b", ended=("a",)), links(A, B))
    assert exported.get_finished_spans() == ()
    traces.on_result(decode_plan(2, 1, "b"), result(2, 1, "b", ended=("b",)), None)
    (span,) = exported.get_finished_spans()
    assert span.attributes["radixmesh.num_steps"] == 2
    assert span.attributes["radixmesh.num_scheduled_tokens"] == 3
    traces.on_result(decode_plan(2, 1), result(2, 2), None)  # nothing left of it
    assert len(exported.get_finished_spans()) == 1


def test_a_plan_cut_short_is_written_by_the_next_plan_or_the_streams_end(exported):
    traces = StepTraces("exec-0")
    traces.on_result(decode_plan(3, 4, "a"), result(3, 0, "a"), links(A))  # "a" aborted next
    traces.on_result(decode_plan(4, 1, "b"), result(4, 0, "b"), links(B))
    assert [s.attributes["radixmesh.step_id"] for s in exported.get_finished_spans()] == [3, 4]
    traces.on_result(decode_plan(6, 4, "b"), result(6, 0, "b"), links(B))
    traces.flush()
    traces.flush()
    assert [s.attributes["radixmesh.step_id"] for s in exported.get_finished_spans()] == [3, 4, 6]


def test_a_plan_without_a_traced_sequence_makes_no_span(exported):
    traces = StepTraces("exec-0")
    traces.on_result(decode_plan(1, 1, "a"), result(1, 0, "a"), [])
    traces.on_result(decode_plan(2, 4, "a"), result(2, 1, "a"), None)  # its first step unseen
    traces.on_result(StepPlan(3, finished_req_ids=["a"]), result(3, 0), links(A))
    traces.flush()
    assert exported.get_finished_spans() == ()
