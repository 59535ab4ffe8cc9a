"""Protobuf <-> the request's parameters: sampling, constraints and priority
(`radixmesh.sampling`). `radixmesh.wire` gives them with the other converters.

A plan's new sequences and every submit carry a sampling message, so it is read once per
distinct message (requests repeat a few settings: one frozen `SamplingParams` each), its
set fields read with `ListFields()` (presence included); an empty one is the shared
default. Unset optional sampling fields take the dataclass defaults; a set field keeps its
value, zero included (`temperature: 0` is greedy). Proto floats are float32, so a float
sampling field is read as the shortest decimal that stands for its float32
(`read_float32`: 0.9 arrives as 0.8999999762 and reads 0.9, what the client wrote, as
protobuf's JSON printer shows it); the device computes in float32, where both are the same
number. Bad values raise `InvalidArgument` naming the field, e.g.
`new_seqs['req-1'].sampling.temperature must be in [0, 2], got 3.0`; so does a
`json_object: false` constraint (it asks for nothing) and an unknown priority.
"""

from __future__ import annotations

import functools
import struct
from dataclasses import fields
from typing import Any

from google.protobuf.descriptor import FieldDescriptor

from radixmesh.errors import InvalidArgument
from radixmesh.sampling import Constraint, ConstraintKind, Priority, SamplingParams
from radixmesh.v1 import inference_pb2

DEFAULT_SAMPLING = SamplingParams()
_REPEATED_SAMPLING_FIELDS = frozenset({"stop", "stop_token_ids"})
_SAMPLING_DEFAULTS = {f.name: getattr(DEFAULT_SAMPLING, f.name) for f in fields(SamplingParams)}
_FLOAT_SAMPLING_FIELDS = frozenset(
    f.name
    for f in inference_pb2.SamplingParams.DESCRIPTOR.fields
    if f.type == FieldDescriptor.TYPE_FLOAT
)
_F32 = struct.Struct("f")
_DECIMAL_FORMATS = (".6g", ".7g", ".8g")

# oneof field name <-> ConstraintKind (CHOICES and JSON_OBJECT carry no plain string).
_KIND_BY_FIELD = {
    "json_schema": ConstraintKind.JSON_SCHEMA,
    "regex": ConstraintKind.REGEX,
    "ebnf": ConstraintKind.EBNF,
}


def sampling_from_proto(msg: inference_pb2.SamplingParams, where: str = "") -> SamplingParams:
    """The validated dataclass; `where` prefixes error messages ("new_seqs['r1'].").
    Messages of the same bytes give the same (frozen) object, read once: requests repeat a
    few settings, and a plan's new sequences are read on the hot path."""
    data = msg.SerializeToString()
    if not data:
        return DEFAULT_SAMPLING
    try:
        return _sampling_from_bytes(data)
    except InvalidArgument as exc:
        raise InvalidArgument(f"{where}{exc}") from None


@functools.lru_cache(maxsize=4096)
def _sampling_from_bytes(data: bytes) -> SamplingParams:
    kwargs: dict[str, Any] = {}
    for descriptor, value in inference_pb2.SamplingParams.FromString(data).ListFields():
        name = descriptor.name
        if name in _REPEATED_SAMPLING_FIELDS:
            value = tuple(value)
        elif name in _FLOAT_SAMPLING_FIELDS:
            value = read_float32(value)
        kwargs[name] = value
    return SamplingParams(**kwargs)


@functools.lru_cache(maxsize=4096)  # requests repeat a few values (temperature 0.7, ...)
def read_float32(value: float) -> float:
    """The shortest decimal whose float32 is `value`'s float32 (0.8999999762 -> 0.9)."""
    pack, unpack = _F32.pack, _F32.unpack
    (single,) = unpack(pack(value))
    for digits in _DECIMAL_FORMATS:
        shortest = float(format(single, digits))
        if unpack(pack(shortest))[0] == single:
            return shortest
    return float(format(single, ".9g"))  # 9 significant digits always name a float32


def sampling_to_proto(params: SamplingParams) -> inference_pb2.SamplingParams:
    """Sets only the fields that differ from the defaults (the receiver restores them)."""
    kwargs = {}
    for name, default in _SAMPLING_DEFAULTS.items():
        value = getattr(params, name)
        if value != default:
            kwargs[name] = value
    return inference_pb2.SamplingParams(**kwargs)


def constraint_from_proto(
    msg: inference_pb2.Constraint | inference_pb2.GenerateRequest,
    where: str = "",
    oneof: str = "kind",
) -> Constraint | None:
    """None when no kind is set; a `json_object: false` is refused (it means nothing).

    Reads a Constraint's `kind` oneof, or (oneof="constraint") a GenerateRequest's.
    """
    kind = msg.WhichOneof(oneof)  # type: ignore[arg-type]
    if kind is None:
        if msg.best_effort:
            raise InvalidArgument(f"{where}constraint.best_effort: set without a json_schema")
        return None
    try:
        if kind == "choices":
            return Constraint(
                ConstraintKind.CHOICES, choices=tuple(msg.choices.choices), best_effort=msg.best_effort
            )
        if kind == "json_object":
            if not msg.json_object:
                raise InvalidArgument("constraint.json_object must be true when set")
            return Constraint(ConstraintKind.JSON_OBJECT, best_effort=msg.best_effort)
        if kind == "json_schema":
            return Constraint(
                ConstraintKind.JSON_SCHEMA, msg.json_schema, best_effort=msg.best_effort
            )
        return Constraint(_KIND_BY_FIELD[kind], getattr(msg, kind), best_effort=msg.best_effort)
    except InvalidArgument as exc:
        raise InvalidArgument(f"{where}{exc}") from None


def constraint_to_proto(constraint: Constraint) -> inference_pb2.Constraint:
    kind = constraint.kind
    if kind is ConstraintKind.CHOICES:
        return inference_pb2.Constraint(
            choices=inference_pb2.Choices(choices=list(constraint.choices))
        )
    if kind is ConstraintKind.JSON_OBJECT:
        return inference_pb2.Constraint(json_object=True)
    kwargs: dict[str, Any] = {kind.value: constraint.value}
    if constraint.best_effort:
        kwargs["best_effort"] = True
    return inference_pb2.Constraint(**kwargs)


def priority_from_proto(value: int, where: str = "") -> Priority:
    """PRIORITY_UNSPECIFIED (0) reads as INTERACTIVE; an unknown number is refused."""
    if value == inference_pb2.PRIORITY_UNSPECIFIED:
        return Priority.INTERACTIVE
    try:
        return Priority(value)
    except ValueError:
        names = ", ".join(f"{p.value} ({p.name})" for p in Priority)
        raise InvalidArgument(f"{where}priority must be one of {names}, got {value}") from None


def priority_to_proto(priority: Priority) -> inference_pb2.Priority:
    """The `radixmesh.v1.Priority` value (the enum's numbers are the proto's)."""
    return inference_pb2.Priority.Value(f"PRIORITY_{priority.name}")
