"""Protobuf <-> executor objects: the step contract from `radixmesh.wire`, plus GetInfo."""

from __future__ import annotations

from radixmesh.wire import (
    constraint_from_proto,
    constraint_to_proto,
    health_from_proto,
    health_to_proto,
    info_to_proto,
    plan_from_proto,
    plan_to_proto,
    result_from_proto,
    result_to_proto,
    sampling_from_proto,
    sampling_to_proto,
)

__all__ = [
    "constraint_from_proto",
    "constraint_to_proto",
    "health_from_proto",
    "health_to_proto",
    "info_to_proto",
    "plan_from_proto",
    "plan_to_proto",
    "result_from_proto",
    "result_to_proto",
    "sampling_from_proto",
    "sampling_to_proto",
]

