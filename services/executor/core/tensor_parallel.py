"""A tensor-parallel group of executor cores that is one executor to the mesh.

One process per device; every rank builds an `ExecutorCore` over its shard of the
model (models/tensor_parallel.py) and runs the same plans in the same order, so the
ranks' sequence state, sampled tokens and page tables stay identical: the logits are
whole on every rank (gathered) and sampling is seeded per sequence. Rank 0 (the
leader) is the only one the scheduler talks to: `LeaderCore` wraps its core and, before
each prepare and execute, broadcasts the call to the others over a gloo control group
(`broadcast_object_list`, no gRPC hop per rank); `run_follower` is the others' loop.
Collectives of the model go over the data group (NCCL on CUDA with NVLink multicast
off, gloo on CPU), so the leader's prepare thread and execute thread never share a
group. Results are read from the leader only.

    group = init_group(rank, world_size, init_method, device)
    core = ExecutorCore(config, grammar, group.tp)
    if rank == 0: core = LeaderCore(core, group)   # hand it to the step pipeline
    else:         run_follower(core, group)        # until the leader stops
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from radixmesh.errors import InvalidArgument, RadixmeshError
from radixmesh.step import StepPlan, StepResult
from services.common.logging import get_logger
from services.executor.core.models.tensor_parallel import TensorParallel
from services.executor.core.step_types import LaunchedStep

log = get_logger(__name__)

_PREPARE, _EXECUTE, _STOP = "prepare", "execute", "stop"
_PREPARE_NEXT, _STOP_SEQS = "prepare_next", "stop_seqs"
"""A multi-step plan's later steps, and the sequences an abort plan stops in them."""
_CONTROL_TIMEOUT = timedelta(days=365)


@dataclass(frozen=True, slots=True)
class Group:
    tp: TensorParallel
    """The data group: the model's all-reduces and all-gathers."""
    control: Any
    """A gloo group for the leader's broadcasts of plans."""


def init_group(rank: int, world_size: int, init_method: str, device: torch.device) -> Group:
    """Joins the group (every rank calls it with the same `init_method`, e.g.
    "tcp://127.0.0.1:PORT" or "file:///path"); NCCL on CUDA, gloo on CPU."""
    if world_size < 2:
        raise InvalidArgument(f"executor.tensor_parallel_size must be >= 2 here, got {world_size}")
    backend = "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl":
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast off
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size)
    # A follower waits on the control group between plans for as long as the mesh is idle.
    control = dist.new_group(backend="gloo", timeout=_CONTROL_TIMEOUT)
    return Group(TensorParallel(rank, world_size, dist.group.WORLD), control)


def _broadcast(message: Any, group: Group) -> Any:
    box = [message]
    dist.broadcast_object_list(box, src=0, group=group.control)
    return box[0]


class LeaderCore:
    """Rank 0's core as the pipeline and the servicer see it: each prepare and execute is
    first sent to the other ranks; every other attribute is the wrapped core's."""

    def __init__(self, core: Any, group: Group) -> None:
        self._core = core
        self._group = group
        self._send_lock = threading.Lock()  # the prepare and execute threads both send
        self._stopped = False
        self._choice: tuple[StepPlan, Any] | None = None
        """The plan `drafting` was asked about last and the wrapped core's answer."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self._core, name)

    def _send(self, message: Any) -> None:
        with self._send_lock:
            if self._stopped:
                raise InvalidArgument("the tensor-parallel group was stopped")
            _broadcast(message, self._group)

    def drafting(self, plan: StepPlan, substep: int = 0) -> Any:
        choice = self._core.drafting(plan, substep)
        self._choice = (plan, choice)
        return choice

    def prepare(self, plan: StepPlan, drafting: Any = None) -> Any:
        if drafting is None and self._choice is not None and self._choice[0] is plan:
            drafting = self._choice[1]
        self._choice = None
        self._send((_PREPARE, (plan, drafting)))  # the leader's drafting choice on every rank
        return self._core.prepare(plan, drafting)

    def prepare_next(self, plan: StepPlan, substep: int) -> Any:
        # under the lock with the local prepare: a `stop` (another thread) takes effect
        # between the same two prepares on every rank
        with self._send_lock:
            self._check_running()
            _broadcast((_PREPARE_NEXT, (plan, substep)), self._group)
            return self._core.prepare_next(plan, substep)

    def stop(self, req_ids: list[str]) -> None:
        with self._send_lock:
            self._check_running()
            _broadcast((_STOP_SEQS, req_ids), self._group)
            self._core.stop(req_ids)

    def execute(self, prepared: Any) -> StepResult:
        self._send((_EXECUTE, prepared.index))
        return self._core.execute(prepared)

    def plain(self, prepared: Any) -> bool:
        """Never: every rank runs a step whole when the leader does (no launch-ahead)."""
        return False

    def verifies(self, prepared: Any) -> bool:
        return self._core.verifies(prepared)

    def launch(self, prepared: Any) -> LaunchedStep:
        return LaunchedStep(prepared, time.perf_counter(), result=self.execute(prepared))

    def finish(self, launched: LaunchedStep) -> StepResult:
        assert launched.result is not None
        return launched.result

    def _check_running(self) -> None:
        if self._stopped:
            raise InvalidArgument("the tensor-parallel group was stopped")

    def step(self, plan: StepPlan) -> StepResult:
        return self.execute(self.prepare(plan))

    def stop_followers(self) -> None:
        """Ends every follower's loop (once); the leader's core stays usable locally."""
        with self._send_lock:
            if not self._stopped:
                self._stopped = True
                _broadcast((_STOP, None), self._group)

    def shutdown(self) -> None:
        self.stop_followers()
        self._core.shutdown()


def run_follower(core: Any, group: Group) -> int:
    """Runs the leader's calls on this rank's core until it says stop; returns the number
    of steps executed. A plan the core refuses is refused on the leader too (the checks
    are the same), and a prepared step the leader never executes (a pipeline skips the
    plans after a failure) is dropped when a later one executes."""
    prepared: dict[int, Any] = {}
    executed = 0
    while True:
        kind, payload = _broadcast(None, group)
        if kind == _STOP:
            return executed
        if kind == _PREPARE:
            try:
                step = core.prepare(*payload)
            except RadixmeshError as exc:
                log.info("follower_plan_refused", step_id=payload[0].step_id, reason=str(exc))
                continue
            prepared[step.index] = step
        elif kind == _PREPARE_NEXT:
            step = core.prepare_next(*payload)
            prepared[step.index] = step
        elif kind == _STOP_SEQS:
            core.stop(payload)
        elif kind == _EXECUTE:
            for index in [i for i in prepared if i < payload]:
                del prepared[index]
            core.execute(prepared.pop(payload))
            executed += 1
        else:
            raise InvalidArgument(f"unknown message from the leader: {kind!r}")
