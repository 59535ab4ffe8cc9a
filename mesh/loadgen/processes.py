"""The load spread over several client processes, when one Python process cannot offer enough.

    run = await run_load_processes(ClientSpec("grpc", url, model), workload, load, 8, start)

Process i of N takes every N-th script of the workload (so together they send the
same scripts one process would), 1/N of the concurrency, of the request budget and of
the warmup, and a Poisson stream of rate/N (N independent Poisson streams of rate
r/N are one Poisson stream of rate r). Each warms up, says it is ready, and waits;
once all are, `on_measure_start()` runs (the metrics snapshot) and all start together.
Their results come back whole and are merged into one `LoadRun`: its percentiles are
of the merged samples, its duration from the first start to the last end (the run's
clock, time.perf_counter, is the system's monotonic clock, shared by the processes).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import multiprocessing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from typing import Any

from mesh.loadgen.runner import LoadConfig, LoadRun
from radixmesh.errors import InvalidArgument

MAX_CLIENT_PROCESSES = 256
GO = "go"


class ClientProcessFailed(Exception):
    """A client process could not run its share of the load; the message says why."""


@dataclass(frozen=True, slots=True)
class ClientSpec:
    """What each process needs to build its own client (clients do not cross processes)."""

    api: str
    target: str
    model: str
    api_key: str = ""


def _share(total: int, index: int, count: int) -> int:
    return total // count + (1 if index < total % count else 0)


def shard_load(load: LoadConfig, index: int, count: int) -> LoadConfig:
    """Process `index`'s part of the load (see the module docstring)."""
    if not 1 <= count <= MAX_CLIENT_PROCESSES:
        raise InvalidArgument(
            f"client_processes: must be in [1, {MAX_CLIENT_PROCESSES}], got {count}"
        )
    if load.concurrency < count:
        raise InvalidArgument(
            f"client_processes: {count} processes need a concurrency of at least {count}, "
            f"got {load.concurrency}"
        )
    if load.num_requests is not None and load.num_requests < count:
        raise InvalidArgument(
            f"client_processes: {count} processes need num_requests >= {count}, "
            f"got {load.num_requests}"
        )
    return replace(
        load,
        concurrency=_share(load.concurrency, index, count),
        request_rate=load.request_rate / count,
        num_requests=None if load.num_requests is None else _share(load.num_requests, index, count),
        warmup=_share(load.warmup, index, count),
        seed=load.seed * MAX_CLIENT_PROCESSES + index,
    )


def merge_runs(runs: list[LoadRun]) -> LoadRun:
    """One run of every process's results: first start to last end."""
    return LoadRun(
        results=[r for run in runs for r in run.results],
        started_s=min(run.started_s for run in runs),
        ended_s=max(run.ended_s for run in runs),
    )


def _worker(conn: Connection, spec: ClientSpec, workload: Any, load: LoadConfig, index: int,
            count: int) -> None:  # fmt: skip
    """A client process's body (module level, so the spawn start method can find it)."""
    try:
        run = asyncio.run(_worker_run(conn, spec, workload, load, index, count))
        conn.send(("done", run))
    except BaseException as exc:  # the parent reports it; nothing else would
        with contextlib.suppress(OSError):
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


async def _worker_run(conn: Connection, spec: ClientSpec, workload: Any, load: LoadConfig,
                      index: int, count: int) -> LoadRun:  # fmt: skip
    from mesh.loadgen.client import make_client
    from mesh.loadgen.runner import run_load
    from mesh.loadgen.workloads import iter_scripts

    client = make_client(spec.api, spec.target, spec.model, spec.api_key)

    async def ready_then_wait() -> None:
        conn.send(("ready", None))
        message = await asyncio.to_thread(conn.recv)
        if message != GO:
            raise ClientProcessFailed(f"expected {GO!r} from the parent, got {message!r}")

    scripts = itertools.islice(iter_scripts(workload), index, None, count)
    try:
        return await run_load(scripts, client, load, on_measure_start=ready_then_wait)
    finally:
        await client.close()


async def _receive(conn: Connection, index: int, expected: str) -> Any:
    try:
        kind, value = await asyncio.to_thread(conn.recv)
    except EOFError:
        raise ClientProcessFailed(f"client process {index} exited without a report") from None
    if kind == "error":
        raise ClientProcessFailed(f"client process {index} failed: {value}")
    if kind != expected:
        raise ClientProcessFailed(f"client process {index}: expected {expected}, got {kind}")
    return value


async def run_load_processes(
    spec: ClientSpec,
    workload: Any,
    load: LoadConfig,
    count: int,
    on_measure_start: Callable[[], Awaitable[None]] | None = None,
) -> LoadRun:
    """The load over `count` processes, merged. Raises ClientProcessFailed naming the one
    that failed (the others are stopped)."""
    shards = [shard_load(load, i, count) for i in range(count)]
    context = multiprocessing.get_context("spawn")  # no copy of this process's loop or threads
    conns: list[Connection] = []
    processes = []
    finished = False
    try:
        for i, shard in enumerate(shards):
            parent, child = context.Pipe()
            process = context.Process(
                target=_worker, args=(child, spec, workload, shard, i, count), daemon=True
            )
            process.start()
            child.close()
            conns.append(parent)
            processes.append(process)
        for i, conn in enumerate(conns):
            await _receive(conn, i, "ready")
        if on_measure_start is not None:
            await on_measure_start()
        for conn in conns:
            conn.send(GO)
        runs = [await _receive(conn, i, "done") for i, conn in enumerate(conns)]
        finished = True
    finally:
        for process in processes:  # after their reports they only exit; else stop them
            await asyncio.to_thread(process.join, 30 if finished else 0)
            if process.is_alive():
                process.kill()
                await asyncio.to_thread(process.join, 10)
        for conn in conns:
            conn.close()
    return merge_runs(runs)
