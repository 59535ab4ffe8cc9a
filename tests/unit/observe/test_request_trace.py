"""The scheduler's span of one traced request, its phases written from the times the core noted."""

from __future__ import annotations

import pytest

from radixmesh.errors import ResourceExhausted
from radixmesh.sampling import Priority, SamplingParams
from services.common import tracing
from services.scheduler.core.request import Request
from services.scheduler.tracing import RequestTrace
from tests.fixtures.otlp import spans_in_memory

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def exported(monkeypatch):
    return spans_in_memory(monkeypatch)


def test_one_span_with_events_covers_queue_chunks_preemption_and_decode(exported, monkeypatch):
    clock = iter([1.0, 1.5, 2.0, 2.5])  # started, chunk scheduled, preempted, restarted
    monkeypatch.setattr("services.scheduler.tracing.time.monotonic", lambda: next(clock))
    req = Request("r1", [1, 2, 3, 4], SamplingParams(), arrival_time=0.5, priority=Priority.BATCH)
    req.executor_id = "exec-0"
    trace = RequestTrace.start(PARENT, req.arrival_time)
    assert trace is not None
    trace.on_started(2, step_id=3)
    trace.on_scheduled(2, prefilling=True, step_id=4)
    trace.on_preempted(num_computed=4)
    trace.on_started(4, step_id=9)
    for i, at in enumerate((3.0, 3.1, 3.2)):
        trace.on_token(at)
        if i:
            trace.on_scheduled(1, prefilling=False, step_id=10 + i)
    trace.finished(3.3, req, "length", "OK")

    # one span: its phases are timed events of it, in time order
    (root,) = exported.get_finished_spans()
    assert root.name == "scheduler.request"
    assert format(root.parent.span_id, "016x") == "b7ad6b7169203331"
    assert root.attributes["radixmesh.num_preemptions"] == 1
    assert root.attributes["radixmesh.executor_id"] == "exec-0"
    assert (root.start_time, root.end_time) == (tracing.epoch_ns(0.5), tracing.epoch_ns(3.3))
    assert [e.name for e in root.events] == [
        "scheduler.queue_wait", "scheduler.prefill_chunk", "scheduler.prefill_chunk",
        "preempted", "scheduler.queue_wait", "scheduler.prefill_chunk", "first_token",
        "scheduler.decode",
    ]  # fmt: skip
    assert [e.timestamp for e in root.events] == sorted(e.timestamp for e in root.events)

    def named(name):
        return [e for e in root.events if e.name == name]

    def ms(event) -> float:
        return event.attributes["radixmesh.duration_ms"]

    waits = named("scheduler.queue_wait")
    assert [(w.timestamp, ms(w), w.attributes["radixmesh.attempt"]) for w in waits] == [
        (tracing.epoch_ns(0.5), 500.0, 0),
        (tracing.epoch_ns(2.0), 500.0, 1),
    ]
    chunks = named("scheduler.prefill_chunk")
    assert [c.attributes["radixmesh.step_id"] for c in chunks] == [3, 4, 9]
    assert [c.attributes["radixmesh.num_scheduled_tokens"] for c in chunks] == [2, 2, 4]
    assert [(c.timestamp, ms(c)) for c in chunks] == [
        (tracing.epoch_ns(1.0), 500.0),
        (tracing.epoch_ns(1.5), 1000.0),  # until the next chunk (after the preemption)
        (tracing.epoch_ns(2.5), 500.0),  # the last chunk ends at the first token
    ]
    (preempted,) = named("preempted")
    assert preempted.attributes["radixmesh.num_computed_tokens"] == 4
    (decode,) = named("scheduler.decode")
    assert decode.timestamp == tracing.epoch_ns(3.0) and ms(decode) == pytest.approx(300.0)
    assert decode.attributes["radixmesh.num_steps"] == 2
    assert (decode.attributes["radixmesh.first_step_id"], decode.attributes["radixmesh.last_step_id"]) == (11, 12)


def test_a_malformed_traceparent_traces_nothing():
    assert RequestTrace.start("00-not-a-trace", 0.0) is None
    assert RequestTrace.start("", 0.0) is None


def test_a_request_finished_with_its_lease_ends_its_span_after_the_commit(exported):
    from opentelemetry.trace import StatusCode

    req = Request("r2", [1, 2, 3], SamplingParams(), arrival_time=1.0)
    req.lease_id = "lease-1"
    trace = RequestTrace.start(PARENT, req.arrival_time)
    assert trace is not None
    with trace.active():  # a refused verb is the verb's event, not the request's error
        assert tracing.recording_span() is trace.root
        try:
            raise ResourceExhausted("pool full")
        except ResourceExhausted:
            pass
    trace.finished(2.0, req, "length", "OK")
    assert exported.get_finished_spans() == ()  # the commit is still to come
    with trace.active():
        tracing.recording_span().add_event("cache.commit", {"radixmesh.duration_ms": 1.0})
    (span,) = exported.get_finished_spans()
    assert [e.name for e in span.events][-1] == "cache.commit"
    assert span.end_time >= tracing.epoch_ns(2.0)
    assert span.status.status_code is StatusCode.UNSET
    with trace.active():  # a late block makes no second end
        pass
    assert len(exported.get_finished_spans()) == 1


def test_a_prefix_checkpoint_is_its_own_event_and_not_a_preemption(exported, monkeypatch):
    clock = iter([1.0, 2.0, 2.5])  # started, checkpointed, restarted
    monkeypatch.setattr("services.scheduler.tracing.time.monotonic", lambda: next(clock))
    req = Request("r1", [1, 2, 3, 4], SamplingParams(), arrival_time=0.5, priority=Priority.BATCH)
    trace = RequestTrace.start(PARENT, req.arrival_time)
    assert trace is not None
    trace.on_started(4, step_id=3)
    trace.on_preempted(num_computed=4, checkpoint=True)
    trace.on_started(1, step_id=5)
    trace.on_token(3.0)
    trace.finished(3.1, req, "length", "OK")

    (root,) = exported.get_finished_spans()
    assert root.attributes["radixmesh.num_preemptions"] == 0
    names = [e.name for e in root.events]
    assert "preempted" not in names
    (event,) = [e for e in root.events if e.name == "scheduler.prefix_checkpoint"]
    assert event.timestamp == tracing.epoch_ns(2.0)
    assert event.attributes["radixmesh.num_computed_tokens"] == 4
    assert names.count("scheduler.queue_wait") == 2  # it waited again, from the checkpoint
