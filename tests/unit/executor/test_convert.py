"""Protobuf <-> step contract conversion: round trips, field presence, errors naming the field."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixmesh.errors import InvalidArgument
from radixmesh.sampling import Constraint, ConstraintKind, SamplingParams
from radixmesh.step import (
    NewSequence,
    RunningSequence,
    SequenceOutput,
    StepPlan,
    StepResult,
    TokenLogprobs,
)
from radixmesh.v1 import executor_pb2, inference_pb2
from radixmesh.wire import (
    constraint_from_proto,
    constraint_to_proto,
    info_to_proto,
    plan_from_proto,
    plan_to_proto,
    read_float32,
    result_from_proto,
    result_to_proto,
    sampling_from_proto,
    sampling_to_proto,
)


def f32(low: float, high: float, exclude_min: bool = False) -> st.SearchStrategy[float]:
    """Values a float32 proto field holds exactly, so round trips compare equal."""
    return st.floats(low, high, width=32, exclude_min=exclude_min)


def f32_sampling(low: float, high: float, exclude_min: bool = False) -> st.SearchStrategy[float]:
    """Sampling floats as the wire reads them back: each float32's shortest decimal."""
    return f32(low, high, exclude_min).map(read_float32)


logprob_fields = st.one_of(
    st.just({"logprobs": False, "top_logprobs": 0}),
    st.integers(0, 20).map(lambda k: {"logprobs": True, "top_logprobs": k}),
)
"""top_logprobs needs logprobs."""

sampling_params = st.builds(
    lambda logprobs, **fields: SamplingParams(**logprobs, **fields),
    logprob_fields,
    max_tokens=st.none() | st.integers(1, 4096),
    min_tokens=st.just(0),
    temperature=f32_sampling(0.0, 2.0),
    top_p=f32_sampling(0.0, 1.0, exclude_min=True),
    top_k=st.integers(-1, 100),
    min_p=f32_sampling(0.0, 1.0),
    seed=st.none() | st.integers(0, 2**64 - 1),
    repetition_penalty=f32_sampling(0.0, 4.0, exclude_min=True),
    frequency_penalty=f32_sampling(-2.0, 2.0),
    presence_penalty=f32_sampling(-2.0, 2.0),
    stop=st.lists(st.text(min_size=1, max_size=4), max_size=3).map(tuple),
    stop_token_ids=st.lists(st.integers(0, 2**31 - 1), max_size=3).map(tuple),
    ignore_eos=st.booleans(),
    n=st.integers(1, 16),
)

constraints = st.one_of(
    st.builds(Constraint, st.just(ConstraintKind.JSON_SCHEMA), st.just('{"type": "string"}')),
    st.builds(Constraint, st.just(ConstraintKind.REGEX), st.text(min_size=1, max_size=8)),
    st.builds(Constraint, st.just(ConstraintKind.EBNF), st.just('root ::= "a" | "b"')),
    st.builds(Constraint, st.just(ConstraintKind.JSON_OBJECT)),
    st.builds(
        Constraint,
        st.just(ConstraintKind.CHOICES),
        choices=st.lists(st.text(min_size=1, max_size=5), min_size=1, max_size=4).map(tuple),
    ),
)

token_lists = st.lists(st.integers(0, 2**31 - 1), max_size=12)
req_ids = st.text(min_size=1, max_size=8)

new_sequences = st.builds(
    NewSequence,
    req_id=req_ids,
    token_ids=token_lists,
    num_prompt_tokens=st.integers(0, 2**32 - 1),
    num_computed_tokens=st.integers(0, 2**32 - 1),
    num_scheduled_tokens=st.integers(0, 2**32 - 1),
    page_ids=token_lists,
    sampling=sampling_params,
    constraint=st.none() | constraints,
)

plans = st.builds(
    StepPlan,
    step_id=st.integers(1, 2**64 - 1),
    new_seqs=st.lists(new_sequences, max_size=3),
    running_seqs=st.lists(
        st.builds(RunningSequence, req_ids, st.integers(0, 2**32 - 1), token_lists), max_size=3
    ),
    finished_req_ids=st.lists(st.text(max_size=8), max_size=3),
    num_steps=st.integers(1, 2**32 - 1),
    abort_req_ids=st.lists(st.text(max_size=8), max_size=3),
)

outputs = st.builds(
    SequenceOutput,
    req_id=req_ids,
    token_id=st.none() | st.integers(0, 2**31 - 1),
    logprobs=st.none()
    | st.builds(
        TokenLogprobs,
        st.integers(0, 2**31 - 1),
        f32(-100.0, 0.0),
        st.lists(st.tuples(st.integers(0, 2**31 - 1), f32(-100.0, 0.0)), max_size=4),
    ),
    finish_reason=st.sampled_from([None, "stop", "length"]),
    matched_stop_token_id=st.none() | st.integers(0, 2**31 - 1),
)

results = st.builds(
    StepResult,
    step_id=st.integers(0, 2**64 - 1),
    outputs=st.lists(outputs, max_size=4),
    step_seconds=st.floats(0, 10),
    substep=st.integers(0, 2**32 - 1),
    undrafted_steps=st.integers(0, 2**32 - 1),
)


def wire(msg):
    """Through bytes, as a peer sees it."""
    return type(msg).FromString(msg.SerializeToString())


@settings(max_examples=60, deadline=None)
@given(sampling_params)
def test_sampling_round_trip(params):
    assert sampling_from_proto(wire(sampling_to_proto(params))) == params


@settings(max_examples=40, deadline=None)
@given(constraints)
def test_constraint_round_trip(constraint):
    assert constraint_from_proto(wire(constraint_to_proto(constraint))) == constraint


@settings(max_examples=40, deadline=None)
@given(plans)
def test_plan_round_trip(plan):
    assert plan_from_proto(wire(plan_to_proto(plan))) == plan


@settings(max_examples=40, deadline=None)
@given(results)
def test_result_round_trip(result):
    assert result_from_proto(wire(result_to_proto(result))) == result


def test_unset_sampling_fields_take_the_defaults():
    assert sampling_from_proto(inference_pb2.SamplingParams()) == SamplingParams()
    params = sampling_from_proto(inference_pb2.SamplingParams(max_tokens=5))
    assert params == dataclasses.replace(SamplingParams(), max_tokens=5)
    assert params.temperature == 1.0 and params.top_p == 1.0 and params.n == 1


def test_a_set_zero_keeps_its_value():
    """Presence, not the zero value, decides: temperature 0 is greedy, unset is 1.0."""
    greedy = sampling_from_proto(inference_pb2.SamplingParams(temperature=0.0, top_k=0))
    assert greedy.temperature == 0.0 and greedy.greedy
    assert greedy.top_k == 0
    assert sampling_from_proto(inference_pb2.SamplingParams(seed=0)).seed == 0
    assert sampling_from_proto(inference_pb2.SamplingParams()).seed is None


def test_sampling_to_proto_sets_only_what_differs_from_the_defaults():
    msg = sampling_to_proto(SamplingParams(temperature=0.0, max_tokens=3))
    assert {d.name for d, _ in msg.ListFields()} == {"temperature", "max_tokens"}
    assert sampling_to_proto(SamplingParams()).ByteSize() == 0


@pytest.mark.parametrize(
    ("fields", "field_name"),
    [
        ({"temperature": 2.5}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"min_tokens": 5, "max_tokens": 2}, "min_tokens"),
        ({"top_logprobs": 21}, "top_logprobs"),
        ({"n": 0}, "n"),
        ({"frequency_penalty": 3.0}, "frequency_penalty"),
        ({"stop": [""]}, "stop"),
        ({"temperature": float("nan")}, "temperature"),
    ],
)
def test_bad_sampling_in_a_plan_names_the_sequence_and_field(fields, field_name):
    plan = executor_pb2.StepPlan(step_id=1)
    plan.new_seqs.add(req_id="r7", token_ids=[1, 2], num_prompt_tokens=2, num_scheduled_tokens=2)
    plan.new_seqs[0].sampling.CopyFrom(inference_pb2.SamplingParams(**fields))
    with pytest.raises(InvalidArgument, match=rf"^new_seqs\['r7'\]\.sampling\.{field_name} "):
        plan_from_proto(plan)


def test_bad_constraints_name_the_field():
    with pytest.raises(InvalidArgument, match=r"constraint\.json_object"):
        constraint_from_proto(inference_pb2.Constraint(json_object=False))
    with pytest.raises(InvalidArgument, match=r"^new_seqs\['r1'\]\.constraint\.choices"):
        constraint_from_proto(
            inference_pb2.Constraint(choices=inference_pb2.Choices(choices=[])), "new_seqs['r1']."
        )
    with pytest.raises(InvalidArgument, match=r"constraint\.regex"):
        constraint_from_proto(inference_pb2.Constraint(regex=""))


@pytest.mark.parametrize(
    ("message", "error"),
    [
        (
            inference_pb2.Constraint(regex="a" * 3_000_000),
            r"^constraint\.regex: must be at most 65536 characters, got 3000000$",
        ),
        (
            inference_pb2.Constraint(ebnf="root ::= " + '"a" ' * 20_000),
            r"^constraint\.ebnf: must be at most 65536 characters, got 80009$",
        ),
        (
            inference_pb2.Constraint(json_schema=" " * 300_000 + "{}"),
            r"^constraint\.json_schema: must be at most 262144 characters, got 300002$",
        ),
        (
            inference_pb2.Constraint(choices=inference_pb2.Choices(choices=["ab" * 2_000_000])),
            r"^constraint\.choices: must hold at most 65536 characters in all, got 4000000$",
        ),
        (
            inference_pb2.Constraint(choices=inference_pb2.Choices(choices=["x"] * 1025)),
            r"^constraint\.choices: must hold at most 1024 strings, got 1025$",
        ),
    ],
)
def test_oversized_constraints_name_the_field_and_the_limit(message, error):
    with pytest.raises(InvalidArgument, match=error):
        constraint_from_proto(wire(message))


def test_constraints_at_the_limits_are_accepted():
    assert constraint_from_proto(inference_pb2.Constraint(regex="a" * 65536)) is not None
    choices = inference_pb2.Choices(choices=["x" * 64] * 1024)
    assert constraint_from_proto(inference_pb2.Constraint(choices=choices)) is not None


@pytest.mark.parametrize("kind", [ConstraintKind.REGEX, ConstraintKind.EBNF])
def test_best_effort_is_for_json_schema_only(kind):
    with pytest.raises(
        InvalidArgument,
        match=rf"^constraint\.best_effort: applies to json_schema only, not {kind.value}$",
    ):
        Constraint(kind, "a", best_effort=True)
    with pytest.raises(InvalidArgument, match=r"^constraint\.best_effort: "):
        Constraint(ConstraintKind.CHOICES, choices=("a",), best_effort=True)
    assert Constraint(ConstraintKind.JSON_SCHEMA, "{}", best_effort=True).best_effort


def test_top_logprobs_needs_logprobs_or_prompt_logprobs():
    with pytest.raises(
        InvalidArgument,
        match=r"^sampling\.top_logprobs \(3\) requires logprobs to be true "
        r"\(or prompt_logprobs_start\)$",
    ):
        sampling_from_proto(wire(inference_pb2.SamplingParams(max_tokens=2, top_logprobs=3)))
    assert (
        sampling_from_proto(
            inference_pb2.SamplingParams(max_tokens=2, logprobs=True, top_logprobs=3)
        ).top_logprobs
        == 3
    )
    scoring = inference_pb2.SamplingParams(max_tokens=0, prompt_logprobs_start=1, top_logprobs=2)
    assert sampling_from_proto(scoring).top_logprobs == 2


def test_no_constraint_kind_is_no_constraint():
    assert constraint_from_proto(inference_pb2.Constraint()) is None
    plan = executor_pb2.StepPlan(step_id=1)
    plan.new_seqs.add(req_id="r", token_ids=[1], num_prompt_tokens=1, num_scheduled_tokens=1)
    assert plan_from_proto(plan).new_seqs[0].constraint is None


def test_empty_req_ids_are_refused():
    plan = executor_pb2.StepPlan(step_id=1)
    plan.new_seqs.add(token_ids=[1], num_prompt_tokens=1, num_scheduled_tokens=1)
    with pytest.raises(InvalidArgument, match=r"new_seqs\.req_id"):
        plan_from_proto(plan)
    plan = executor_pb2.StepPlan(step_id=1)
    plan.running_seqs.add(num_scheduled_tokens=1)
    with pytest.raises(InvalidArgument, match=r"running_seqs\.req_id"):
        plan_from_proto(plan)


def test_result_presence_of_token_and_stop_id():
    msg = result_to_proto(
        StepResult(
            3,
            [
                SequenceOutput("chunk", None),
                SequenceOutput("eos", 0, finish_reason="stop", matched_stop_token_id=0),
            ],
        )
    )
    chunk, eos = msg.outputs
    assert not chunk.HasField("token_id") and not chunk.HasField("logprobs")
    assert eos.HasField("token_id") and eos.token_id == 0
    assert eos.HasField("matched_stop_token_id") and eos.matched_stop_token_id == 0
    assert eos.finish_reason == "stop" and chunk.finish_reason == ""


def test_result_logprobs_keep_the_top_order():
    logprobs = TokenLogprobs(7, -0.25, [(7, -0.25), (3, -1.5), (9, -2.0)])
    msg = result_to_proto(StepResult(1, [SequenceOutput("r", 7, logprobs)]))
    position = msg.outputs[0].logprobs
    assert (position.sampled.token_id, position.sampled.logprob) == (7, -0.25)
    assert [(t.token_id, t.logprob) for t in position.top] == logprobs.top


def test_info_to_proto():
    from radixmesh.executor_info import ExecutorInfo

    info = ExecutorInfo(
        executor_id="ex-1", model="tiny", architecture="LlamaForCausalLM", vocab_size=128,
        max_model_len=256, eos_token_ids=(2, 5), page_size=4, num_pages=64, device="cpu",
        dtype="float32", max_num_seqs=8, max_num_batched_tokens=512,
    )  # fmt: skip
    msg = info_to_proto(info)
    assert msg.executor_id == "ex-1" and msg.model == "tiny"
    assert (msg.vocab_size, msg.max_model_len, msg.page_size, msg.num_pages) == (128, 256, 4, 64)
    assert list(msg.eos_token_ids) == [2, 5] and msg.device == "cpu"
    assert (msg.max_num_seqs, msg.max_num_batched_tokens) == (8, 512)
