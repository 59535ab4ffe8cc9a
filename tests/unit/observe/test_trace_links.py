"""A traced request's context reaches the cache verbs it causes and the executor steps it is in."""

from __future__ import annotations

import pytest

from mesh.engine.ports import InProcessCache
from radixmesh import wire
from radixmesh.sampling import SamplingParams
from radixmesh.step import NewSequence, RunningSequence, StepPlan
from radixmesh.v1 import cache_pb2
from services.cache.core import CacheCore
from services.cache.server import CacheServicer
from services.cache.store import InProcessStore, StoreConfig
from services.common import tracing
from services.executor.server import ExecutorServicer, _Stream
from services.scheduler.core.config import SchedulerConfig
from services.scheduler.core.scheduler import SchedulerCore
from services.scheduler.tracing import RequestTrace
from tests.fixtures.otlp import spans_in_memory
from tests.unit.scheduler.sched_fakes import greedy, make_rig

GATEWAY = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
OTHER = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture
def exported(monkeypatch):
    return spans_in_memory(monkeypatch)


class RecordingCache(InProcessCache):
    """The in-process cache port, noting the traceparent current at each verb."""

    def __init__(self, core: CacheCore) -> None:
        super().__init__(core)
        self.seen: list[tuple[str, str]] = []

    async def acquire(self, *args, **kwargs):
        self.seen.append(("acquire", tracing.current_traceparent()))
        return await super().acquire(*args, **kwargs)

    async def extend(self, *args, **kwargs):
        self.seen.append(("extend", tracing.current_traceparent()))
        return await super().extend(*args, **kwargs)

    async def commit(self, *args, **kwargs):
        self.seen.append(("commit", tracing.current_traceparent()))
        return await super().commit(*args, **kwargs)

    async def release(self, *args, **kwargs):
        self.seen.append(("release", tracing.current_traceparent()))
        return await super().release(*args, **kwargs)


async def test_the_scheduler_sends_the_request_span_with_its_verbs_and_its_new_sequence(exported):
    rig = make_rig(page_size=4)
    cache = RecordingCache(rig.cache)
    config = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=16, page_lookahead=1)
    core = SchedulerCore(config, cache, rig.ports, rig.sink)
    await core.start()
    traced = await core.submit("traced", list(range(1, 10)), greedy(12))
    traced.trace = RequestTrace.start(GATEWAY, traced.arrival_time)
    plain = await core.submit("plain", list(range(20, 26)), greedy(3))
    await rig.sink.wait("traced", "plain")
    await core.stop()

    trace = traced.trace
    assert trace is not None
    request_span = next(s for s in exported.get_finished_spans() if s.name == "scheduler.request")
    assert trace.traceparent.split("-")[1:3] == [
        format(request_span.context.trace_id, "032x"),
        format(request_span.context.span_id, "016x"),
    ]
    assert format(request_span.parent.span_id, "016x") == "b7ad6b7169203331"
    verbs = [verb for verb, tp in cache.seen if tp == trace.traceparent]
    assert verbs[0] == "acquire" and "extend" in verbs and verbs[-1] == "commit"
    assert sum(1 for _, tp in cache.seen if tp == "") >= 2  # the untraced request's verbs
    new = {s.req_id: s for plan in rig.toy.plans for s in plan.new_seqs}
    assert new["traced"].traceparent == trace.traceparent
    assert new["plain"].traceparent == ""
    assert plain.trace is None


def test_the_traceparent_crosses_the_step_contract():
    seq = NewSequence("r1", [1, 2, 3], 3, 0, 3, [0], SamplingParams(), traceparent=GATEWAY)
    back = wire.plan_from_proto(wire.plan_to_proto(StepPlan(1, new_seqs=[seq])))
    assert back.new_seqs[0].traceparent == GATEWAY
    seq.traceparent = ""
    back = wire.plan_from_proto(wire.plan_to_proto(StepPlan(1, new_seqs=[seq])))
    assert back.new_seqs[0].traceparent == ""


def test_the_cache_span_of_a_batched_verb_is_a_child_of_the_span_that_caused_it(exported):
    core = CacheCore()
    core.register_pool("exec-0", "m", 16, 4)
    servicer = CacheServicer(core, InProcessStore(StoreConfig()))
    acquire = cache_pb2.AcquireRequest(
        executor_id="exec-0", token_ids=[1, 2, 3], num_tokens=4, holder="s"
    )
    traced = servicer.run_op(cache_pb2.CacheOp(op_id=1, acquire=acquire, traceparent=GATEWAY))
    untraced = servicer.run_op(cache_pb2.CacheOp(op_id=2, acquire=acquire))
    unsampled = servicer.run_op(
        cache_pb2.CacheOp(op_id=3, acquire=acquire, traceparent=GATEWAY[:-2] + "00")
    )
    assert traced.error_code == untraced.error_code == unsampled.error_code == 0
    # no traceparent, or an unsampled one: nothing traced caused the verb, no span of its own
    (first,) = exported.get_finished_spans()
    assert first.name == "cache.acquire"
    assert format(first.context.trace_id, "032x") == "0af7651916cd43dd8448eb211c80319c"
    assert format(first.parent.span_id, "016x") == "b7ad6b7169203331"


def _span_ids(links) -> list[str]:
    return [format(link.context.span_id, "016x") for link in links]


def test_each_step_links_to_the_traced_sequences_in_it_until_they_end(exported):
    stream = _Stream()
    sampling = SamplingParams()
    a = NewSequence("a", [1, 2], 2, 0, 2, [0], sampling, traceparent=GATEWAY)
    b = NewSequence("b", [3, 4], 2, 0, 2, [1], sampling)  # not traced
    c = NewSequence("c", [5, 6], 2, 0, 2, [2], sampling, traceparent=OTHER)
    note = ExecutorServicer._note_links
    note(stream, StepPlan(1, new_seqs=[a, b]))
    note(stream, StepPlan(2, new_seqs=[c], running_seqs=[RunningSequence("a", 1)]))
    note(stream, StepPlan(3, running_seqs=[RunningSequence("b", 1)]))
    note(stream, StepPlan(4, running_seqs=[RunningSequence("c", 1)], finished_req_ids=["a"]))
    assert _span_ids(stream.links[1]) == ["b7ad6b7169203331"]
    assert _span_ids(stream.links[2]) == ["00f067aa0ba902b7", "b7ad6b7169203331"]
    assert stream.links[3] == []  # only an untraced sequence ran
    assert _span_ids(stream.links[4]) == ["00f067aa0ba902b7"]
    assert set(stream.traced) == {"c"}
    note(stream, StepPlan(5, finished_req_ids=["c"]))
    assert 5 not in stream.links and not stream.traced


def test_a_step_span_keeps_a_link_per_traced_sequence_past_the_sdks_default_limit():
    assert tracing.configure_tracing("links-test", "http://127.0.0.1:9")
    try:
        links = [tracing.link_to(f"00-{i + 1:032x}-{i + 1:016x}-01") for i in range(300)]
        span = tracing.tracer("t").start_span("executor.step", links=links)
        assert len(span.links) == 300  # not ended: nothing is exported
    finally:
        tracing.shutdown_tracing()


def test_a_refused_submit_ends_its_request_span_with_the_error(exported):
    from opentelemetry.trace import StatusCode

    from radixmesh.errors import ResourceExhausted

    trace = RequestTrace.start(GATEWAY, 1.0)
    assert trace is not None
    trace.refused(ResourceExhausted("queue full"))
    [span] = exported.get_finished_spans()
    assert span.name == "scheduler.request" and span.status.status_code is StatusCode.ERROR
    assert span.attributes["radixmesh.code"] == "RESOURCE_EXHAUSTED"
    assert span.status.description == "queue full"
