"""The service's edge pieces without a server: protobuf conversion and scrape-time metrics."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry
from sched_fakes import greedy as g
from sched_fakes import make_rig

from radixmesh import wire
from radixmesh.errors import DeadlineExceeded, InvalidArgument
from radixmesh.sampling import ConstraintKind, Priority, SamplingParams
from radixmesh.step import NewSequence, RunningSequence, StepPlan, TokenLogprobs
from radixmesh.updates import RequestUpdate
from radixmesh.v1 import inference_pb2 as ipb
from radixmesh.v1 import scheduler_pb2
from services.scheduler import convert
from services.scheduler.metrics import SchedulerMetricsCollector


def test_a_submit_becomes_a_submission_with_a_monotonic_deadline():
    msg = scheduler_pb2.SubmitRequest(
        req_id="r1",
        token_ids=[5, 6],
        sampling=ipb.SamplingParams(max_tokens=7, temperature=0.0),
        constraint=ipb.Constraint(regex="a+"),
        priority=ipb.PRIORITY_SHEDDABLE,
        deadline_unix_ms=1_000_500,
    )
    sub = convert.submission_from_proto(msg, now_unix=1000.0, now=50.0)
    assert sub.sampling == SamplingParams(max_tokens=7, temperature=0.0)
    assert sub.constraint.kind is ConstraintKind.REGEX and sub.constraint.value == "a+"
    assert sub.priority is Priority.SHEDDABLE
    assert sub.deadline == pytest.approx(50.5)
    plain = convert.submission_from_proto(scheduler_pb2.SubmitRequest(req_id="r2", token_ids=[1]))
    assert (plain.priority, plain.deadline, plain.constraint) == (Priority.INTERACTIVE, None, None)


@pytest.mark.parametrize(
    ("msg", "field"),
    [
        (scheduler_pb2.SubmitRequest(token_ids=[1]), "req_id"),
        (
            scheduler_pb2.SubmitRequest(req_id="x", sampling=ipb.SamplingParams(temperature=9)),
            "submit['x'].sampling.temperature",
        ),
        (scheduler_pb2.SubmitRequest(req_id="x", priority=42), "priority"),
    ],
)
def test_bad_submits_name_the_field(msg, field):
    with pytest.raises(InvalidArgument, match=field.replace("[", r"\[").replace("]", r"\]")):
        convert.submission_from_proto(msg)


def test_an_update_carries_tokens_logprobs_counts_and_errors():
    update = RequestUpdate(
        "7/r1",
        token_ids=[3, 4],
        logprobs=[TokenLogprobs(3, -0.5, [(3, -0.5), (9, -1.5)]), TokenLogprobs(4, -0.1)],
        finish_reason="stop",
        matched_stop_token_id=4,
        num_prompt_tokens=10,
        num_cached_tokens=8,
    )
    msg = wire.update_to_proto(update, "r1")
    assert (msg.req_id, list(msg.token_ids), msg.finish_reason) == ("r1", [3, 4], "stop")
    assert (msg.num_prompt_tokens, msg.num_cached_tokens, msg.matched_stop_token_id) == (10, 8, 4)
    assert [(t.token_id, t.logprob) for t in msg.logprobs[0].top] == [(3, -0.5), (9, -1.5)]
    failed = wire.update_to_proto(RequestUpdate("r2", error=DeadlineExceeded("late")), "r2")
    assert (failed.error_code, failed.error_message) == (4, "late")
    assert not failed.HasField("num_prompt_tokens")


def test_plans_keep_every_field_on_the_wire():
    from radixmesh.wire import plan_from_proto, plan_to_proto  # both ends of the wire

    sampling = SamplingParams(max_tokens=3, temperature=0.0, stop_token_ids=(7,))
    plan = StepPlan(
        4,
        [NewSequence("a", [1, 2, 3], 2, 0, 3, [5], sampling)],
        [RunningSequence("b", 1, [8, 9])],
        ["c"],
    )
    assert plan_from_proto(plan_to_proto(plan)) == plan


async def test_metrics_read_the_core_at_scrape_time():
    rig = make_rig()
    await rig.scheduler.submit("a", [1, 2], g(1), priority=Priority.BATCH)
    await rig.scheduler.submit("b", [1, 2], g(1), priority=Priority.BATCH)
    registry = CollectorRegistry()
    registry.register(SchedulerMetricsCollector(lambda: rig.scheduler))
    ex_id = rig.port.info.executor_id
    waiting = registry.get_sample_value(
        "radixmesh_scheduler_waiting_requests", {"executor_id": ex_id, "model": "toy"}
    )
    assert waiting == 2
    assert (
        registry.get_sample_value("radixmesh_scheduler_waiting_by_priority", {"priority": "batch"})
        == 2
    )
    assert registry.get_sample_value("radixmesh_scheduler_preemptions_total") == 0
