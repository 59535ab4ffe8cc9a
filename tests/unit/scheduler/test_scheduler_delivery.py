"""A step's updates on their way out: the servicer's StreamResponses and the token stats.

The servicer writes a plain update (token ids only) with fewer checks than
`wire.update_to_proto`, and the stats observe a batch's equal inter-token gaps at
once; both are checked against the general path, update by update.
"""

from __future__ import annotations

import dataclasses

import pytest

from radixmesh import wire
from radixmesh.errors import ResourceExhausted
from radixmesh.sampling import SamplingParams
from radixmesh.speculation import SpecUsage
from radixmesh.step import TokenLogprobs
from radixmesh.updates import RequestUpdate
from radixmesh.v1 import scheduler_pb2
from services.scheduler.core import StepUpdates
from services.scheduler.core.request import Request
from services.scheduler.core.stats import SchedulerStats
from services.scheduler.server import SchedulerServicer, _Stream


def _updates() -> list[RequestUpdate]:
    lp = TokenLogprobs(7, -0.5, [(7, -0.5), (8, -1.5)])
    return [
        RequestUpdate("1/a", [5]),
        RequestUpdate("2/x", [6, 7]),
        RequestUpdate("1/b", [9], num_prompt_tokens=4, num_cached_tokens=2),
        RequestUpdate("1/gone", [1]),  # no longer on its stream: dropped
        RequestUpdate("3/y", [2]),  # no such stream: dropped
        RequestUpdate("1/c", [7], logprobs=[lp]),
        RequestUpdate("2/z", [], error=ResourceExhausted("pool full")),
        RequestUpdate("1/a", [4], finish_reason="stop", matched_stop_token_id=4),
        RequestUpdate("1/d", [3], prompt_logprobs=[lp]),
        RequestUpdate("1/e", [2], finish_reason="length", speculation=SpecUsage(1, 2, 1, [1])),
        RequestUpdate("2/x", []),
    ]


def test_a_step_goes_out_as_one_response_per_stream_written_as_update_to_proto_would():
    servicer = SchedulerServicer()
    streams = {n: _Stream(n) for n in (1, 2, 4)}
    streams[1].req_ids.update("abcde")
    streams[2].req_ids.update("xz")
    streams[4].req_ids.add("q")  # nothing of it in this step: no response
    servicer._streams.update(streams)
    updates = _updates()
    servicer.deliver(StepUpdates(9, updates))

    expected = {n: scheduler_pb2.StreamResponse(step_id=9) for n in (1, 2)}
    for update in updates:
        number, _, req_id = update.req_id.partition("/")
        if update.req_id not in ("1/gone", "3/y"):
            wire.update_to_proto(update, req_id, expected[int(number)].updates.add())
    for n, response in expected.items():
        got = streams[n].outbox.get_nowait()
        assert got == response
        assert streams[n].outbox.empty()
    assert streams[4].outbox.empty()
    assert streams[1].req_ids == {"b", "c", "d"}  # a and e finished
    assert streams[2].req_ids == {"x"}  # z failed


def test_a_step_with_only_updates_of_gone_requests_sends_nothing():
    servicer = SchedulerServicer()
    stream = _Stream(1)
    stream.req_ids.add("a")
    servicer._streams[1] = stream
    servicer.deliver(StepUpdates(3, [RequestUpdate("1/old", [5])]))
    assert stream.outbox.empty()


def _request(req_id: str, model: str, last: float | None) -> Request:
    req = Request(req_id, [1, 2], SamplingParams(max_tokens=4), arrival_time=1.0, model=model)
    req.last_token_time = last
    return req


def test_tokens_of_a_batch_count_as_token_request_by_request():
    # first tokens, gaps shared by several requests, a gap of its own, two models
    lasts = [None, 2.0, 2.0, 2.0, 2.5, None, 2.0, 1.25]
    models = ["m", "m", "m", "n", "m", "n", "n", "m"]
    one_by_one, batched = SchedulerStats(), SchedulerStats()
    reqs_a = [_request(f"r{i}", m, t) for i, (m, t) in enumerate(zip(models, lasts, strict=True))]
    reqs_b = [dataclasses.replace(r) for r in reqs_a]
    for req in reqs_a:
        one_by_one.token(req, 3.0)
    batched.tokens(reqs_b, 3.0)

    assert [r.last_token_time for r in reqs_b] == [3.0] * len(lasts)
    assert batched.num_generation_tokens == one_by_one.num_generation_tokens == len(lasts)
    a, b = one_by_one.inter_token_latency, batched.inter_token_latency
    assert b.counts == a.counts and b.sum == pytest.approx(a.sum)
    for priority, hist in one_by_one.time_to_first_token.items():
        assert batched.time_to_first_token[priority].counts == hist.counts
    assert one_by_one.by_model.keys() == batched.by_model.keys() == {"m", "n"}
    for model, totals in one_by_one.by_model.items():
        got = batched.by_model[model]
        assert (got.ttft_count, got.itl_count) == (totals.ttft_count, totals.itl_count)
        assert got.ttft_sum == pytest.approx(totals.ttft_sum)
        assert got.itl_sum == pytest.approx(totals.itl_sum)
    assert one_by_one.inter_token_latency.count == 6
