"""The cache service's capacity over gRPC: verbs per second and latency, against a real
`python -m services.cache.main` process on a free port.

Verbs: match (a prompt's tokens), acquire + extend + commit (the lifecycle of one request's
lease: acquire for the prompt, one page more, commit the whole prompt, which ends the
lease), heartbeat, and (unary only) continuation: the 256 cached tokens after a prompt's
match, the lookup `--speculative radix` makes once per request. Each is run unary (one call at a time, then `--concurrency` calls
in flight) and over the Batch stream (batches of 1, 16 and 64 ops, `--concurrency`
batches in flight). Reported per mode: verbs/s by the wall clock, latency of one call
(or one batch) at p50/p99, and the cache process's own CPU seconds per verb (read from
/proc), which is its ceiling on one core whatever the client costs: on this shared 2-core
machine the client often is the limit.

    python bench/cache_service.py [--prompt-len 640 --prefix-len 512 --seconds 2]

The fleet's need is printed beside it: executors x requests/s x verbs per request
(docs/architecture.md, "The cache service at fleet scale").
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from radixmesh.cache_types import Lease
from services.cache.client import AcquireOp, CacheClient, CommitOp, ExtendOp, HeartbeatOp, MatchOp
from services.common.config import free_port
from services.common.health import wait_for_serving

EXECUTOR = "bench-exec"
HOLDER = "bench-sched"
VOCAB_SIZE = 128_000
PAGE_SIZE = 16


@dataclass(frozen=True, slots=True)
class Figure:
    mode: str
    verb: str
    verbs_per_s: float
    p50_ms: float
    p99_ms: float
    server_cpu_us_per_verb: float


def server_cpu_s(pid: int) -> float:
    """utime + stime of process `pid` in seconds (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Workload:
    """Prompts with shared prefixes (`num_prefixes` of them) and unique suffixes."""

    def __init__(self, prompt_len: int, prefix_len: int, num_prefixes: int = 16) -> None:
        self.rng = random.Random(0)
        self.prefixes = [self._draw(prefix_len) for _ in range(num_prefixes)]
        self.suffix_len = prompt_len - prefix_len

    def _draw(self, n: int) -> list[int]:
        return [self.rng.randrange(VOCAB_SIZE) for _ in range(n)]

    def prompt(self) -> list[int]:
        return self.rng.choice(self.prefixes) + self._draw(self.suffix_len)


async def timed(
    pid: int, seconds: float, concurrency: int, call: Callable[[], Awaitable[int]]
) -> tuple[float, list[float], float]:
    """Runs `call` (returns verbs done) from `concurrency` tasks for `seconds`:
    (verbs/s, per-call latencies in ms, server CPU us per verb)."""
    latencies: list[float] = []
    verbs = 0
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal verbs
        while time.perf_counter() < deadline:
            start = time.perf_counter()
            verbs += await call()
            latencies.append((time.perf_counter() - start) * 1e3)

    cpu0, wall0 = server_cpu_s(pid), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall, cpu = time.perf_counter() - wall0, server_cpu_s(pid) - cpu0
    return verbs / wall, latencies, cpu / max(verbs, 1) * 1e6


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def unary_calls(client: CacheClient, work: Workload) -> dict[str, Callable[[], Awaitable[int]]]:
    async def match() -> int:
        await client.match(work.prompt())
        return 1

    async def lease() -> int:
        tokens = work.prompt()
        got = await client.acquire(EXECUTOR, tokens, len(tokens), HOLDER)
        await client.extend(got.lease_id, 1)
        await client.commit(got.lease_id, tokens)
        return 3

    async def heartbeat() -> int:
        await client.heartbeat(HOLDER)
        return 1

    async def continuation() -> int:  # after the leases' commits: the prefixes are cached
        await client.continuation(work.prompt(), None, 256)
        return 1

    return {"match": match, "acquire+extend+commit": lease, "heartbeat": heartbeat,
            "continuation(256)": continuation}  # fmt: skip


def batch_calls(
    client: CacheClient, work: Workload, size: int
) -> dict[str, Callable[[], Awaitable[int]]]:
    async def match() -> int:
        await client.batch([MatchOp(work.prompt()) for _ in range(size)])
        return size

    async def lease() -> int:
        prompts = [work.prompt() for _ in range(size)]
        leases = await client.batch([AcquireOp(EXECUTOR, t, len(t), HOLDER) for t in prompts])
        ids = [lease.lease_id for lease in leases if isinstance(lease, Lease)]
        await client.batch([ExtendOp(i, 1) for i in ids])
        await client.batch([CommitOp(i, t) for i, t in zip(ids, prompts, strict=False)])
        return 3 * size

    async def heartbeat() -> int:
        await client.batch([HeartbeatOp(HOLDER) for _ in range(size)])
        return size

    return {"match": match, "acquire+extend+commit": lease, "heartbeat": heartbeat}


async def run(args: argparse.Namespace) -> list[Figure]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.cache.main", "--port", str(port), "--log-level", "warning"]
    )
    figures: list[Figure] = []
    try:
        address = f"127.0.0.1:{port}"
        await wait_for_serving(address, timeout=60)
        async with CacheClient(address, timeout_s=30) as client:
            await client.register_pool(EXECUTOR, "bench-model", args.num_pages, PAGE_SIZE)
            work = Workload(args.prompt_len, args.prefix_len)
            modes: list[tuple[str, int, dict[str, Callable[[], Awaitable[int]]]]] = [
                ("unary, 1 in flight", 1, unary_calls(client, work)),
                (f"unary, {args.concurrency} in flight", args.concurrency, unary_calls(client, work)),
            ]
            for size in (1, 16, 64):
                name = f"Batch stream, {size} ops/batch, {args.concurrency} batches in flight"
                modes.append((name, args.concurrency, batch_calls(client, work, size)))
            for mode, concurrency, calls in modes:
                for verb, call in calls.items():
                    rate, lat, cpu_us = await timed(proc.pid, args.seconds, concurrency, call)
                    figures.append(Figure(mode, verb, rate, pct(lat, 0.5), pct(lat, 0.99), cpu_us))
                    print(f"{mode:58s} {verb:22s} {rate:9.0f} verbs/s  p50 {pct(lat, 0.5):7.2f} ms"
                          f"  p99 {pct(lat, 0.99):7.2f} ms  server {cpu_us:6.1f} us/verb", flush=True)  # fmt: skip
        if args.clients:
            await asyncio.to_thread(saturate, address, proc.pid, args)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return figures


def _client_process(address: str, verb: str, args: argparse.Namespace, seed: int, out) -> None:
    """One client process of the saturation run: `verb` in batches of 64 for `seconds`."""

    async def go() -> int:
        async with CacheClient(address, timeout_s=60) as client:
            work = Workload(args.prompt_len, args.prefix_len)
            work.rng.seed(seed)
            call = batch_calls(client, work, 64)[verb]
            deadline, verbs = time.perf_counter() + args.seconds, 0

            async def worker() -> int:
                done = 0
                while time.perf_counter() < deadline:
                    done += await call()
                return done

            verbs = sum(await asyncio.gather(*(worker() for _ in range(4))))
            return verbs

    out.put(asyncio.run(go()))


def saturate(address: str, pid: int, args: argparse.Namespace) -> list[tuple[str, float, float]]:
    """`--clients` processes at once per verb: (verb, verbs/s, server CPU share of a core)."""
    ctx = multiprocessing.get_context("spawn")
    rows = []
    for verb in ("match", "acquire+extend+commit", "heartbeat"):
        out = ctx.Queue()
        procs = [
            ctx.Process(target=_client_process, args=(address, verb, args, i, out))
            for i in range(args.clients)
        ]
        for proc in procs:
            proc.start()
        time.sleep(1.0)  # the clients' imports; the server's CPU is read over their run
        cpu0, wall0 = server_cpu_s(pid), time.perf_counter()
        total = sum(out.get(timeout=120) for _ in procs)
        wall, cpu = time.perf_counter() - wall0, server_cpu_s(pid) - cpu0
        for proc in procs:
            proc.join()
        rate = total / args.seconds
        rows.append((verb, rate, cpu / wall))
        print(f"{args.clients} client processes, Batch 64 x 4 each  {verb:22s} {rate:9.0f} "
              f"verbs/s  server busy {cpu / wall:4.2f} of a core", flush=True)  # fmt: skip
    return rows


def fleet_need(args: argparse.Namespace) -> float:
    """Verbs/s a fleet sends: per request one match, one acquire, one extend per page of
    output, one commit; heartbeats are per scheduler (one per 5 s) and negligible."""
    verbs_per_request = 3 + args.output_len / PAGE_SIZE
    return args.executors * args.requests_per_s * verbs_per_request


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--prompt-len", type=int, default=640)
    p.add_argument("--prefix-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=128, help="for the fleet's verbs/request")
    p.add_argument("--num-pages", type=int, default=200_000)
    p.add_argument("--seconds", type=float, default=2.0, help="per mode and verb")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--clients", type=int, default=3, help="processes of the saturation run")
    p.add_argument("--executors", type=int, default=64)
    p.add_argument("--requests-per-s", type=float, default=50.0, help="per executor")
    args = p.parse_args()
    if not 0 < args.prefix_len < args.prompt_len:
        p.error("--prefix-len must be in (0, --prompt-len)")
    print(f"machine: {platform.machine()} {os.cpu_count()} cpus, python {platform.python_version()}")
    figures = asyncio.run(run(args))
    need = fleet_need(args)
    best = max((f for f in figures if f.verb != "heartbeat"), key=lambda f: f.verbs_per_s)
    ceiling = 1e6 / statistics.mean(
        f.server_cpu_us_per_verb for f in figures if f.mode == best.mode and f.verb != "heartbeat"
    )
    print(f"fleet: {args.executors} executors x {args.requests_per_s:g} req/s x "
          f"{3 + args.output_len / PAGE_SIZE:g} verbs/request = {need:,.0f} verbs/s")  # fmt: skip
    print(f"best measured: {best.verbs_per_s:,.0f} verbs/s ({best.mode}, {best.verb}); "
          f"server CPU ceiling on one core in that mode: {ceiling:,.0f} verbs/s")  # fmt: skip


if __name__ == "__main__":
    main()
