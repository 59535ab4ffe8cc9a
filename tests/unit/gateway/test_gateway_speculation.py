"""The speculation counters of a request's last update reach the response's usage: the
OpenAI JSON extension, the gRPC Complete, and summed over choices."""

from __future__ import annotations

from gateway.convert import event_to_responses
from gateway.core.generate import collect, generate, total_usage
from gateway.core.openai_responses import usage_json
from radixmesh import wire
from radixmesh.speculation import SpecUsage
from radixmesh.v1 import scheduler_pb2
from tests.unit.gateway.test_gateway_generate import FakeUpstream, prepared, updates_for


async def test_usage_carries_the_speculation_of_each_choice_and_their_sum(tokenizer):
    scripts = {
        0: updates_for(tokenizer, "hello world", first=(9, 0)),
        1: updates_for(tokenizer, "abc", first=(9, 0)),
    }
    scripts[0][-1].speculation = SpecUsage(3, 9, 5, [3, 2])
    scripts[1][-1].speculation = SpecUsage(1, 4, 4, [1, 1, 1, 1])
    events = await collect(generate(prepared(tokenizer, n=2), tokenizer, FakeUpstream(scripts)), 2)
    assert [e.usage.speculation for e in events] == [SpecUsage(3, 9, 5, [3, 2]), SpecUsage(1, 4, 4, [1, 1, 1, 1])]
    total = total_usage(events)
    assert total.speculation == SpecUsage(4, 13, 9, [4, 3, 1, 1])
    body = usage_json(total)
    assert body["speculation"]["mean_acceptance_length"] == 1 + 9 / 4
    assert body["speculation"]["accepted_by_position"] == [4, 3, 1, 1]
    (complete,) = [r.complete for r in event_to_responses("req", events[0]) if r.HasField("complete")]
    assert wire.speculation_from_proto(complete.usage.speculation) == SpecUsage(3, 9, 5, [3, 2])


async def test_no_speculation_leaves_usage_as_it_was(tokenizer):
    events = await collect(
        generate(prepared(tokenizer), tokenizer, FakeUpstream({0: updates_for(tokenizer, "hi")})), 1
    )
    assert events[0].usage.speculation is None
    assert "speculation" not in usage_json(total_usage(events))


def test_the_last_update_carries_speculation_over_the_wire():
    update = wire.update_from_proto(scheduler_pb2.TokenUpdate(req_id="r", finish_reason="stop"))
    assert update.speculation is None
    update.speculation = SpecUsage(2, 8, 3, [2, 1])
    again = wire.update_from_proto(wire.update_to_proto(update))
    assert again.speculation == SpecUsage(2, 8, 3, [2, 1])
