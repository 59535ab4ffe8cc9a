"""A step result's plain rows cross the wire columnar; the other rows as messages, in order."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixmesh import wire
from radixmesh.errors import InvalidArgument
from radixmesh.step import SequenceOutput, StepResult, TokenLogprobs, is_plain
from radixmesh.v1 import executor_pb2

LP = TokenLogprobs(5, -0.5, [(5, -0.5), (6, -1.25)])


def through_bytes(result: StepResult) -> executor_pb2.StepResult:
    return executor_pb2.StepResult.FromString(wire.result_to_proto(result).SerializeToString())


def mixed_rows() -> list[SequenceOutput]:
    """Plain rows around every kind of other row, a finish and an abort in the middle."""
    return [
        SequenceOutput("a", 11),
        SequenceOutput("b", 12),
        SequenceOutput("stop", 0, finish_reason="stop", matched_stop_token_id=0),
        SequenceOutput("c", 13),
        SequenceOutput("abort", None, finish_reason="abort"),
        SequenceOutput("chunk", None),
        SequenceOutput("d", 14),
        SequenceOutput("lp", 5, LP),
        SequenceOutput("draft", 9, accepted_token_ids=[7, 8], num_draft_tokens=3),
        SequenceOutput("prompt", 4, prompt_logprobs=[LP], prompt_logprobs_position=2),
        SequenceOutput("length", 15, finish_reason="length"),
        SequenceOutput("e", 16),
        SequenceOutput("f", 17),
    ]


def test_plain_rows_go_columnar_and_the_others_keep_their_rows():
    rows = mixed_rows()
    msg = through_bytes(StepResult(7, rows, 0.25, substep=2))
    assert list(msg.plain_req_ids) == ["a", "b", "c", "d", "e", "f"]
    assert list(msg.plain_token_ids) == [11, 12, 13, 14, 16, 17]
    assert [o.req_id for o in msg.outputs] == [
        "stop", "abort", "chunk", "lp", "draft", "prompt", "length",
    ]  # fmt: skip
    assert list(msg.output_rows) == [2, 4, 5, 7, 8, 9, 10]
    back = wire.result_from_proto(msg)
    assert back == StepResult(7, rows, 0.25, substep=2)
    assert not back.plain_req_ids


def test_columnar_reading_keeps_the_columns_and_the_order():
    rows = mixed_rows()
    back = wire.result_from_proto(through_bytes(StepResult(3, rows)), columnar=True)
    assert back.plain_req_ids == ["a", "b", "c", "d", "e", "f"]
    assert back.plain_token_ids == [11, 12, 13, 14, 16, 17]
    assert [o.req_id for o in back.outputs] == [r.req_id for r in rows if not is_plain(r)]
    assert back.num_rows == len(rows)
    assert back.rows() == rows
    again = through_bytes(back)  # a columnar result is written as it is
    assert wire.result_from_proto(again).outputs == rows


def test_a_step_of_only_plain_or_only_other_rows():
    plain = [SequenceOutput(f"r{i}", i) for i in range(5)]
    msg = through_bytes(StepResult(1, plain))
    assert len(msg.outputs) == 0 and not msg.output_rows and len(msg.plain_req_ids) == 5
    assert wire.result_from_proto(msg, columnar=True).rows() == plain
    other = [SequenceOutput("x", 3, finish_reason="length"), SequenceOutput("y", None)]
    msg = through_bytes(StepResult(2, other))
    assert not msg.plain_req_ids and not msg.output_rows  # as a writer before the columns
    assert wire.result_from_proto(msg, columnar=True).outputs == other


def test_a_message_of_the_old_layout_reads_the_same():
    msg = executor_pb2.StepResult(step_id=4)
    msg.outputs.add(req_id="a", token_id=3)
    msg.outputs.add(req_id="b", token_id=0, finish_reason="stop", matched_stop_token_id=0)
    expected = [
        SequenceOutput("a", 3),
        SequenceOutput("b", 0, finish_reason="stop", matched_stop_token_id=0),
    ]
    for columnar in (False, True):
        back = wire.result_from_proto(msg, columnar=columnar)
        assert back.outputs == expected and not back.plain_req_ids


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"plain_req_ids": ["a", "b"], "plain_token_ids": [1]}, r"plain_token_ids has 1 entries"),
        ({"plain_token_ids": [1]}, r"plain_token_ids and output_rows need plain_req_ids"),
        ({"output_rows": [1]}, r"plain_token_ids and output_rows need plain_req_ids"),
        ({"plain_req_ids": ["a"], "plain_token_ids": [1]}, r"output_rows has 0 entries, outputs 2"),
        (
            {"plain_req_ids": ["a"], "plain_token_ids": [1], "output_rows": [1, 0]},
            r"output_rows must increase",
        ),
        (
            {"plain_req_ids": ["a"], "plain_token_ids": [1], "output_rows": [0, 3]},
            r"below the step's 3 rows",
        ),
    ],
)
def test_columns_that_disagree_are_refused_naming_the_field(fields, match):
    msg = executor_pb2.StepResult(step_id=9, **fields)
    msg.outputs.add(req_id="x", finish_reason="abort")
    msg.outputs.add(req_id="y")
    with pytest.raises(InvalidArgument, match=rf"^step 9: .*{match}"):
        wire.result_from_proto(msg, columnar=True)


rows = st.lists(
    st.one_of(
        st.builds(SequenceOutput, st.text(max_size=6), st.integers(0, 2**31 - 1)),
        st.builds(
            SequenceOutput,
            st.text(max_size=6),
            st.none() | st.integers(0, 2**31 - 1),
            finish_reason=st.sampled_from(["stop", "length", "abort"]),
        ),
        st.builds(SequenceOutput, st.text(max_size=6), st.none()),
        st.builds(SequenceOutput, st.text(max_size=6), st.integers(0, 9), st.just(LP)),
    ),
    max_size=12,
)


@settings(max_examples=80, deadline=None)
@given(rows)
def test_any_mix_round_trips_in_order(outputs):
    result = StepResult(5, outputs, 0.5, substep=1)
    msg = through_bytes(result)
    assert len(msg.plain_req_ids) == sum(map(is_plain, outputs))
    assert wire.result_from_proto(msg) == result
    assert wire.result_from_proto(msg, columnar=True).rows() == outputs
