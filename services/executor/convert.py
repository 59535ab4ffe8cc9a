"""Protobuf <-> executor objects: the step contract from `radixmesh.wire`, plus GetInfo."""

from __future__ import annotations

from typing import TYPE_CHECKING

from radixmesh.v1 import executor_pb2
from radixmesh.wire import (
    constraint_from_proto,
    constraint_to_proto,
    health_from_proto,
    health_to_proto,
    plan_from_proto,
    plan_to_proto,
    result_from_proto,
    result_to_proto,
    sampling_from_proto,
    sampling_to_proto,
)

if TYPE_CHECKING:  # the core imports torch; conversion does not need it
    from services.executor.core.executor import ModelInfo

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


# -- info ---------------------------------------------------------------------


def info_to_proto(executor_id: str, info: ModelInfo) -> executor_pb2.GetInfoResponse:
    return executor_pb2.GetInfoResponse(
        executor_id=executor_id,
        model=info.name,
        max_model_len=info.max_model_len,
        vocab_size=info.vocab_size,
        num_pages=info.num_pages,
        page_size=info.page_size,
        eos_token_ids=info.eos_token_ids,
        device=info.device,
        max_num_seqs=info.max_num_seqs,
        max_num_batched_tokens=info.max_num_batched_tokens,
    )
