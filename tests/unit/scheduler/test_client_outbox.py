"""The scheduler client's outbox: what it sends, in order, with consecutive submits in one
`SubmitBatch` message, consecutive hold releases in one `ReleaseHolds`, and every other
message alone."""

from __future__ import annotations

import asyncio

from radixmesh.v1 import scheduler_pb2 as pb
from services.scheduler.client import _Outbox


def submit(req_id: str) -> pb.SubmitRequest:
    return pb.SubmitRequest(req_id=req_id, token_ids=[1, 2])


def describe(message: pb.StreamRequest) -> tuple:
    op = message.WhichOneof("op")
    if op == "submit_batch":
        return (op, [s.req_id for s in message.submit_batch.submits])
    if op == "submit":
        return (op, message.submit.req_id)
    if op == "abort":
        return (op, message.abort.req_id)
    if op == "release_holds":
        return (op, list(message.release_holds.hold_ids))
    return (op, message.release_hold.hold_id)


async def sent(outbox: _Outbox) -> list[tuple]:
    return [describe(m) async for m in outbox.messages()]


async def test_consecutive_submits_go_as_one_batch_and_the_rest_keeps_its_place():
    outbox = _Outbox()
    for item in (
        submit("a"), submit("b"),
        pb.StreamRequest(abort=pb.AbortRequest(req_id="a")),
        submit("c"),
        pb.StreamRequest(release_hold=pb.ReleaseHold(hold_id="h")),
        submit("d"), submit("e"), submit("f"),
        None,
        submit("never"),  # after the end
    ):  # fmt: skip
        outbox.put_nowait(item)
    assert await sent(outbox) == [
        ("submit_batch", ["a", "b"]),
        ("abort", "a"),
        ("submit", "c"),
        ("release_hold", "h"),
        ("submit_batch", ["d", "e", "f"]),
    ]


async def test_consecutive_hold_releases_go_as_one_message_between_the_submits():
    outbox = _Outbox()
    for item in (
        submit("a"),
        pb.ReleaseHold(hold_id="h1"), pb.ReleaseHold(hold_id="h2"), pb.ReleaseHold(hold_id="h3"),
        submit("b"), submit("c"),
        pb.ReleaseHold(hold_id="h4"),
        None,
    ):  # fmt: skip
        outbox.put_nowait(item)
    assert await sent(outbox) == [
        ("submit", "a"),
        ("release_holds", ["h1", "h2", "h3"]),
        ("submit_batch", ["b", "c"]),
        ("release_hold", "h4"),
    ]


async def test_submits_queued_in_one_turn_of_the_loop_wait_for_no_one_and_leave_together():
    outbox = _Outbox()
    messages = outbox.messages()
    first = asyncio.ensure_future(anext(messages))  # the writer waits for work
    await asyncio.sleep(0)
    assert not first.done()

    async def branch(req_id: str) -> None:
        outbox.put_nowait(submit(req_id))

    await asyncio.gather(*(branch(f"b{i}") for i in range(4)))
    assert describe(await first) == ("submit_batch", ["b0", "b1", "b2", "b3"])
    outbox.put_nowait(submit("late"))  # alone: sent alone, at once
    assert describe(await anext(messages)) == ("submit", "late")
    outbox.put_nowait(None)
    assert [m async for m in messages] == []
