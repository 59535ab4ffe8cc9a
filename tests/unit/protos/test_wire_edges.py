"""The contract's one converter per concept at the edges: status codes, priority, request
updates, executor information, float sampling fields, and the scheduler's fit to its executors."""

from __future__ import annotations

import struct

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixmesh import errors, wire
from radixmesh.executor_info import ExecutorInfo
from radixmesh.sampling import Priority, SamplingParams
from radixmesh.status import STATUS_BY_NAME, status_of, status_of_number
from radixmesh.step import TokenLogprobs
from radixmesh.updates import RequestUpdate
from radixmesh.v1 import executor_pb2, inference_pb2, scheduler_pb2
from services.scheduler.core import SchedulerConfig, fit_to_executors

ERROR_CLASSES = errors.RadixmeshError.__subclasses__()


def test_the_status_table_is_grpcs_numbering():
    assert {code.name for code in grpc.StatusCode} == set(STATUS_BY_NAME)
    for code in grpc.StatusCode:
        assert STATUS_BY_NAME[code.name].number == code.value[0]


@pytest.mark.parametrize(
    ("cls", "http_status", "error_type"),
    [
        (errors.InvalidArgument, 400, "invalid_request_error"),
        (errors.FailedPrecondition, 400, "invalid_request_error"),
        (errors.Unauthenticated, 401, "authentication_error"),
        (errors.NotFound, 404, "invalid_request_error"),
        (errors.Aborted, 409, "conflict_error"),
        (errors.ResourceExhausted, 429, "rate_limit_error"),
        (errors.Unavailable, 503, "server_error"),
        (errors.DeadlineExceeded, 504, "timeout_error"),
    ],
)
def test_each_error_has_one_http_status(cls, http_status, error_type):
    row = status_of(cls.code)
    assert (row.http_status, row.error_type) == (http_status, error_type)


def test_unknown_codes_fall_back_to_internal_and_unknown():
    assert status_of("NOT_A_CODE").name == "INTERNAL"
    assert status_of("NOT_A_CODE").http_status == 500
    assert status_of_number(99).name == "UNKNOWN"


@pytest.mark.parametrize("cls", ERROR_CLASSES)
def test_error_for_code_gives_back_the_class(cls):
    error = errors.error_for_code(cls.code, "lease 7 is unknown")
    assert type(error) is cls and str(error) == "lease 7 is unknown"


def test_a_code_with_no_class_keeps_its_name():
    error = errors.error_for_code("PERMISSION_DENIED", "no")
    assert type(error) is errors.RadixmeshError and error.code == "PERMISSION_DENIED"


def test_priority_numbers_are_the_protos():
    for priority in Priority:
        proto = inference_pb2.Priority.Value(f"PRIORITY_{priority.name}")
        assert int(priority) == proto == wire.priority_to_proto(priority)
        assert wire.priority_from_proto(proto) is priority
    assert wire.priority_from_proto(inference_pb2.PRIORITY_UNSPECIFIED) is Priority.INTERACTIVE
    assert Priority.INTERACTIVE < Priority.BATCH < Priority.SHEDDABLE  # lower is served first


def test_an_unknown_priority_is_refused_naming_the_field():
    with pytest.raises(errors.InvalidArgument, match=r"^submit\.priority must be one of .* got 42"):
        wire.priority_from_proto(42, "submit.")


def _through_bytes(msg):
    return type(msg).FromString(msg.SerializeToString())


def test_an_update_survives_the_wire():
    update = RequestUpdate(
        "r1",
        token_ids=[3, 4],
        logprobs=[TokenLogprobs(3, -0.5, [(3, -0.5), (9, -1.5)]), TokenLogprobs(4, -0.25)],
        finish_reason="stop",
        matched_stop_token_id=4,
        num_prompt_tokens=10,
        num_cached_tokens=8,
    )
    assert wire.update_from_proto(_through_bytes(wire.update_to_proto(update))) == update
    plain = RequestUpdate("r2", token_ids=[7])
    assert wire.update_from_proto(_through_bytes(wire.update_to_proto(plain))) == plain


@pytest.mark.parametrize("cls", ERROR_CLASSES)
def test_an_error_update_keeps_its_class_and_message(cls):
    msg = wire.update_to_proto(RequestUpdate("r", error=cls("late")))
    assert msg.error_code == status_of(cls.code).number
    back = wire.update_from_proto(_through_bytes(msg))
    assert type(back.error) is cls and str(back.error) == "late" and back.finished


def test_an_unknown_error_number_reads_as_unknown():
    back = wire.update_from_proto(scheduler_pb2.TokenUpdate(req_id="r", error_code=99))
    assert back.error is not None and back.error.code == "UNKNOWN" and str(back.error) == "UNKNOWN"


INFO = ExecutorInfo(
    executor_id="ex-1",
    model="tiny",
    page_size=16,
    num_pages=64,
    max_model_len=256,
    vocab_size=128,
    eos_token_ids=(2, 5),
    max_num_seqs=8,
    max_num_batched_tokens=512,
    device="cuda:0",
    architecture="LlamaForCausalLM",
    dtype="bfloat16",
)


def test_executor_info_survives_the_wire_with_every_field():
    assert wire.info_from_proto(_through_bytes(wire.info_to_proto(INFO))) == INFO


def test_unstated_limits_travel_as_zero_and_read_back_as_none():
    info = ExecutorInfo("ex-2", "tiny", page_size=4, num_pages=8, max_model_len=64)
    msg = wire.info_to_proto(info)
    assert (msg.vocab_size, msg.max_num_seqs, msg.max_num_batched_tokens) == (0, 0, 0)
    assert wire.info_from_proto(msg) == info


@pytest.mark.parametrize("field", ["page_size", "num_pages", "max_model_len"])
def test_executor_info_without_a_size_is_refused_naming_it(field):
    msg = wire.info_to_proto(INFO)
    msg.ClearField(field)
    with pytest.raises(errors.InvalidArgument, match=f"'ex-1'.*{field} must be > 0"):
        wire.info_from_proto(msg)


def test_the_scheduler_fits_its_limits_to_the_smallest_executor():
    config = SchedulerConfig(max_num_batched_tokens=4096, max_num_seqs=64)
    small = ExecutorInfo(
        "b", "tiny", 16, 64, 256, max_num_seqs=16, max_num_batched_tokens=1024
    )
    unstated = ExecutorInfo("c", "tiny", 16, 64, 256)
    fitted = fit_to_executors(config, [INFO, small, unstated])
    assert (fitted.max_num_batched_tokens, fitted.max_num_seqs) == (512, 8)
    assert fit_to_executors(config, [unstated]) == config
    assert fitted.aging_rate == config.aging_rate  # nothing else changes


def test_float_sampling_fields_read_as_what_the_client_wrote():
    msg = inference_pb2.SamplingParams(temperature=0.9, top_p=0.95, repetition_penalty=1.1)
    assert msg.temperature != 0.9  # a float32 on the wire
    params = wire.sampling_from_proto(_through_bytes(msg))
    assert (params.temperature, params.top_p, params.repetition_penalty) == (0.9, 0.95, 1.1)


def test_a_bad_float_is_reported_as_written():
    msg = inference_pb2.SamplingParams(temperature=2.1)
    with pytest.raises(errors.InvalidArgument, match=r"temperature must be in \[0, 2\], got 2\.1$"):
        wire.sampling_from_proto(msg)


def _float32(value: float) -> float:
    return struct.unpack("f", struct.pack("f", value))[0]


def _significant_digits(value: float) -> int:
    """Digits of repr(value) without sign, point, exponent and leading/trailing zeros."""
    mantissa = repr(abs(value)).split("e")[0].replace(".", "")
    return len(mantissa.strip("0")) or 1


@settings(max_examples=300, deadline=None)
@given(st.floats(width=32, allow_nan=False, allow_infinity=False))
def test_read_float32_names_the_same_float32(value):
    read = wire.read_float32(value)  # 999999986991104.0 -> 1e15: fewer digits, a longer repr
    assert _float32(read) == _float32(value)
    assert wire.read_float32(read) == read
    assert _significant_digits(read) <= _significant_digits(value)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"top_k": 2**31}, r"^sampling\.top_k must be below 2\^31, got 2147483648$"),
        ({"min_tokens": 2**31}, r"^sampling\.min_tokens must be below 2\^31"),
        ({"max_tokens": 2**31}, r"^sampling\.max_tokens must be below 2\^31"),
        ({"top_p": 1e-50}, r"^sampling\.top_p must be in \(0, 1\], got 1e-50 \(0\.0 as a 32-bit float\)$"),
        ({"repetition_penalty": 1e308}, r"^sampling\.repetition_penalty .* got 1e\+308 \(inf as a 32-bit float\)$"),
        ({"repetition_penalty": 1e-50}, r"^sampling\.repetition_penalty .* \(0\.0 as a 32-bit float\)$"),
    ],
)
def test_sampling_the_wire_cannot_carry_is_refused_naming_the_field(fields, message):
    """Counts travel as int32 and these floats as float32: a value past either would fail
    the conversion (an internal error) or arrive as another value, so it is refused."""
    with pytest.raises(errors.InvalidArgument, match=message):
        SamplingParams(**fields)


def test_sampling_at_the_wires_limits_round_trips():
    params = SamplingParams(top_k=2**31 - 1, min_tokens=2**31 - 2, max_tokens=2**31 - 1, top_p=1e-30)
    back = wire.sampling_from_proto(_through_bytes(wire.sampling_to_proto(params)))
    assert (back.top_k, back.min_tokens, back.max_tokens) == (2**31 - 1, 2**31 - 2, 2**31 - 1)
    assert back.top_p == pytest.approx(1e-30)


def test_a_float_sampling_field_round_trips_as_read():
    params = SamplingParams(temperature=0.7, min_p=0.05, presence_penalty=-1.25)
    back = wire.sampling_from_proto(_through_bytes(wire.sampling_to_proto(params)))
    assert back == params


def test_json_object_false_is_refused_in_every_message_that_carries_it():
    with pytest.raises(errors.InvalidArgument, match=r"constraint\.json_object must be true"):
        wire.constraint_from_proto(inference_pb2.Constraint(json_object=False))
    request = inference_pb2.GenerateRequest(prompt="hi", json_object=False)
    with pytest.raises(errors.InvalidArgument, match=r"constraint\.json_object must be true"):
        wire.constraint_from_proto(request, oneof="constraint")
    request = inference_pb2.GenerateRequest(prompt="hi", json_object=True)
    constraint = wire.constraint_from_proto(request, oneof="constraint")
    assert constraint is not None and constraint.kind.value == "json_object"


def test_executor_info_proto_has_a_field_for_every_dataclass_field():
    names = set(executor_pb2.GetInfoResponse.DESCRIPTOR.fields_by_name)
    assert set(ExecutorInfo.__dataclass_fields__) == names
