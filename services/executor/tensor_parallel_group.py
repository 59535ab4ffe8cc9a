"""The processes of a tensor-parallel executor: this one is rank 0, ranks 1..N-1 are its
children (spawned, one device each: cuda:0..N-1 from the configured device, or all on
the CPU with gloo).

Only rank 0 serves gRPC and registers the pool: the group is one executor to the
scheduler and the cache. Rank 0 starts the followers before it loads its own shard
(they wait for it in the group's rendezvous), hands its core to the servicer wrapped
in `LeaderCore`, and at shutdown its core's shutdown tells the followers to stop; a
follower that exits early ends the whole executor (`wait_any_exit`).
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import multiprocessing.connection
from multiprocessing.process import BaseProcess

import torch

from radixmesh.errors import InvalidArgument
from services.common.config import free_port
from services.common.logging import configure_logging, get_logger
from services.executor.core.config import ExecutorConfig
from services.executor.core.resources import resolve_device

log = get_logger(__name__)

_JOIN_TIMEOUT_S = 30.0


def rank_device(device: str, rank: int) -> str:
    """The device of `rank`: consecutive CUDA devices from the configured one, else CPU."""
    resolved = resolve_device(device)
    if resolved.type != "cuda":
        return "cpu"
    return f"cuda:{(resolved.index or 0) + rank}"


def rank_config(config: ExecutorConfig, rank: int) -> ExecutorConfig:
    return dataclasses.replace(config, device=rank_device(config.device, rank))


def group_init_method() -> str:
    """A rendezvous address on this host for one group (every rank gets the same one)."""
    return f"tcp://127.0.0.1:{free_port()}"


def start_followers(
    config: ExecutorConfig, init_method: str, with_grammar: bool, log_level: str
) -> list[BaseProcess]:
    """Ranks 1..N-1 as child processes (spawned: a fresh interpreter, no inherited CUDA)."""
    if config.tensor_parallel_size > 1 and rank_device(config.device, 0).startswith("cuda"):
        last = rank_device(config.device, config.tensor_parallel_size - 1)
        if int(last.split(":")[1]) >= torch.cuda.device_count():
            raise InvalidArgument(
                f"executor.tensor_parallel_size {config.tensor_parallel_size} needs devices up "
                f"to {last}; {torch.cuda.device_count()} CUDA devices are visible"
            )
    ctx = multiprocessing.get_context("spawn")
    procs: list[BaseProcess] = []
    for rank in range(1, config.tensor_parallel_size):
        proc = ctx.Process(
            target=follower_main,
            args=(rank_config(config, rank), rank, init_method, with_grammar, log_level),
            name=f"executor-rank-{rank}",
            daemon=False,
        )
        proc.start()
        procs.append(proc)
    return procs


def load_rank(config: ExecutorConfig, rank: int, init_method: str, with_grammar: bool):
    """(core, grammar service or None) of one rank, after joining the group."""
    from services.executor.core.executor import ExecutorCore
    from services.executor.core.tensor_parallel import init_group
    from services.executor.main import load_grammar

    group = init_group(rank, config.tensor_parallel_size, init_method, resolve_device(config.device))
    grammar = load_grammar(config, with_grammar)
    try:
        return ExecutorCore(config, grammar, group.tp), grammar, group
    except BaseException:
        if grammar is not None:
            grammar.close()
        raise


def follower_main(
    config: ExecutorConfig, rank: int, init_method: str, with_grammar: bool, log_level: str
) -> None:
    """A follower's life: join, load its shard, run the leader's steps until told to stop."""
    import torch.distributed as dist

    from services.executor.core.tensor_parallel import run_follower

    configure_logging(f"executor-rank-{rank}", log_level)
    core, grammar, group = load_rank(config, rank, init_method, with_grammar)
    log.info("follower_ready", rank=rank, device=str(core.device))
    try:
        num_steps = run_follower(core, group)
        log.info("follower_stopped", rank=rank, num_steps=num_steps)
    finally:
        core.shutdown()
        if grammar is not None:
            grammar.close()
        dist.destroy_process_group()


def wait_any_exit(procs: list[BaseProcess]) -> BaseProcess:
    """Blocks until one of `procs` exits; returns it (run it on a thread)."""
    ready = multiprocessing.connection.wait([p.sentinel for p in procs])
    return next(p for p in procs if p.sentinel in ready)


def stop_followers(procs: list[BaseProcess]) -> None:
    """Joins the followers (which the leader's core shutdown told to stop); a follower
    still running after the grace is terminated."""
    for proc in procs:
        proc.join(_JOIN_TIMEOUT_S)
        if proc.is_alive():
            log.warning("follower_terminated", name=proc.name)
            proc.terminate()
            proc.join(_JOIN_TIMEOUT_S)
