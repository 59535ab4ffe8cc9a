"""What the scheduler publishes about its capacity, per model: the measured throughput,
how many more requests of each priority class it admits right now, and the context its
executors serve.

The scheduler computes it from its queue-wait admission (services/scheduler/core/
queue_wait.py) and answers it in `GetLoad`; the gateway reads it to refuse on arrival
what the scheduler would refuse (gateway/core/capacity.py), to size per-key token
buckets from the measured rate (`--rate-limit adaptive`), and to check prompts and
max_tokens against the context the executors serve rather than the model folder's
(gateway/core/models.py). The protobuf conversions (`GetLoadResponse.capacity`) are
kept beside the type.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from radixmesh.sampling import Priority
from radixmesh.v1 import scheduler_pb2


@dataclass(frozen=True, slots=True)
class ModelCapacity:
    model: str
    requests_per_s: float | None = None
    """Requests the model's executors finish per second, measured; None until measured."""
    headroom: Mapping[Priority, int] = field(default_factory=dict)
    """Per class: requests the scheduler admits now before its queue-wait bound refuses
    one (0: it refuses the next), each counted at the mean work of the requests its
    executors finished lately (the estimate is in work: services/scheduler/core/
    queue_wait.py). A class that is absent is not bounded now (the bound is off, or no
    executor of the model has a measured rate yet)."""
    max_model_len: int | None = None
    """The longest sequence (prompt and output) every live executor of the model serves:
    the least of theirs, at most the model's context (an executor lowers it to what its KV
    pool holds). None: not said (no live executor)."""


def capacity_to_proto(capacity: ModelCapacity, out: scheduler_pb2.ModelCapacity) -> None:
    """Fill `out` (a GetLoadResponse.capacity entry) from `capacity`."""
    out.model = capacity.model
    if capacity.requests_per_s is not None:
        out.requests_per_s = capacity.requests_per_s
    for priority, room in capacity.headroom.items():
        out.headroom[priority.name.lower()] = max(0, room)
    if capacity.max_model_len is not None:
        out.max_model_len = capacity.max_model_len


def capacity_from_proto(msg: scheduler_pb2.ModelCapacity) -> ModelCapacity:
    """The entry as the core type; class names this version does not know are skipped."""
    headroom = {
        Priority[name.upper()]: room
        for name, room in msg.headroom.items()
        if name.upper() in Priority.__members__
    }
    rate = msg.requests_per_s if msg.HasField("requests_per_s") else None
    max_model_len = msg.max_model_len if msg.HasField("max_model_len") else None
    return ModelCapacity(msg.model, rate, headroom, max_model_len)
