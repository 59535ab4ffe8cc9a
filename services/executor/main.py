"""`python -m services.executor.main --model DIR --cache-address HOST:PORT [...]`

Lifecycle: start the server (health NOT_SERVING), load the model on the step
thread (the loop keeps answering health checks), register the KV pool with
the cache service (dropping one a previous process of this executor left), then
SERVING; whenever the cache service comes back after going away (a restart), the
pool is registered again. On SIGTERM/SIGINT: health NOT_SERVING, open
Step streams finish their queued plans and end, the pool is unregistered
(best effort), the core shuts down. A model that fails to load, or a cache
service that cannot be reached, ends the process with exit code 1 and a
message naming the model folder or the cache address.

With --tensor-parallel-size N this process is rank 0 of N: ranks 1..N-1 are spawned as
child processes before the model loads (tensor_parallel_group.py), each loads its shard,
and only rank 0 serves and registers the one pool; a rank that exits ends the executor.

Flags and environment are read here only: RADIXMESH_EXECUTOR_ID and
RADIXMESH_CACHE_ADDRESS are the defaults of --executor-id and --cache-address.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import socket
import sys
from collections.abc import Sequence
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from radixmesh.errors import InvalidArgument, NotFound, RadixmeshError
from radixmesh.v1 import cache_pb2, cache_pb2_grpc, executor_pb2_grpc
from services.cache.client import CacheClient
from services.common.config import ServerConfig, add_server_arguments
from services.common.gc_policy import tune_gc
from services.common.health import follow_serving
from services.common.interceptor import error_from_rpc_error
from services.common.logging import configure_logging, get_logger
from services.common.metrics import REGISTRY
from services.common.server import ServiceRuntime, run_service
from services.executor.core.config import DTYPES, QUANTIZATIONS, ExecutorConfig
from services.executor.core.spec.config import (
    JUMP_FORWARD_MODES,
    SPECULATIVE_METHODS,
    SpeculativeConfig,
)
from services.executor.health import (
    DeviceHealthCollector,
    HealthSampler,
    NvmlDevice,
    cuda_uuid,
    open_nvml_device,
)
from services.executor.metrics import GraphStepsCollector, SpecSwitchCollector
from services.executor.server import DEFAULT_MAX_INFLIGHT_PLANS, SERVICE_NAME, ExecutorServicer
from services.executor.tensor_parallel_group import (
    group_init_method,
    rank_config,
    start_followers,
    stop_followers,
    wait_any_exit,
)
from services.executor.tree_drafts import start_tree_prefetch

if TYPE_CHECKING:
    from radixmesh.executor_info import ExecutorInfo
    from services.executor.core.executor import ExecutorCore

log = get_logger(__name__)

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
_UNREGISTER_TIMEOUT_S = 2.0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m services.executor.main", description="radixmesh executor service"
    )
    parser.add_argument("--model", required=True, help="Hugging Face model folder")
    parser.add_argument(
        "--executor-id",
        default=os.environ.get("RADIXMESH_EXECUTOR_ID"),
        help="unique id of this executor's pool (default: $RADIXMESH_EXECUTOR_ID, "
        "else <hostname>:<port>)",
    )
    parser.add_argument(
        "--cache-address",
        default=os.environ.get("RADIXMESH_CACHE_ADDRESS"),
        help="cache service HOST:PORT (default: $RADIXMESH_CACHE_ADDRESS)",
    )
    parser.add_argument(
        "--cache-timeout-seconds",
        type=float,
        default=30.0,
        help="how long to wait for the cache service at start (default %(default)s)",
    )
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--dtype", default="auto", choices=DTYPES)
    parser.add_argument(
        "--quantization",
        default="auto",
        choices=QUANTIZATIONS,
        help="projection weights: auto (the checkpoint's format), fp8 (quantize at load: "
        "per-row weight scales, per-token activation scales; FP8 tensor cores on CUDA), none",
    )
    parser.add_argument(
        "--tensor-parallel-size",
        type=int,
        default=1,
        help="split the model over N devices (one process each; gloo on CPU, NCCL on CUDA); "
        "the group is one executor to the mesh (default %(default)s)",
    )
    parser.add_argument("--page-size", type=int, default=16, help="tokens per KV page")
    parser.add_argument("--num-pages", type=int, default=None, help="KV pages (default: sized)")
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192)
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0, help="seed for unseeded requests")
    parser.add_argument(
        "--max-inflight-plans",
        type=int,
        default=DEFAULT_MAX_INFLIGHT_PLANS,
        help="plans read ahead of the results sent (default %(default)s)",
    )
    parser.add_argument(
        "--kv-memory-fraction",
        type=float,
        default=_config_default("kv_memory_fraction"),
        help="on CUDA without --num-pages: share of the memory free after the weights and "
        "the activation reserve given to the KV pool, in (0, 1] (default %(default)s)",
    )
    parser.add_argument(
        "--no-cuda-graphs",
        action="store_true",
        help="run decode steps eagerly on CUDA instead of replaying captured graphs",
    )
    parser.add_argument(
        "--extend-graph-tokens",
        type=int,
        default=0,
        help="on CUDA with graphs: steps that are not plain decodes (extends, short "
        "prefills, decodes mixed with them) of at most this many tokens replay captured "
        "graphs too, bucketed by tokens and sequences; 0 (default): they run eagerly",
    )
    parser.add_argument(
        "--no-grammar", action="store_true", help="refuse constraints (no tokenizer needed)"
    )
    parser.add_argument(
        "--kernel-backend",
        action="append",
        default=[],
        metavar="OP=MODULE:OBJECT",
        help="replace one op with a site's implementation (checked against the op's torch "
        "reference at startup); repeatable",
    )
    parser.add_argument(
        "--no-kernel-entry-points",
        action="store_true",
        help="ignore the kernel backends installed under the radixmesh.kernels entry points",
    )
    parser.add_argument(
        "--launch-ahead",
        choices=("auto", "on", "off"),
        default="auto",
        help="queue a plain decode step on the device before the step before it is read "
        "back; auto: on a CUDA device",
    )
    add_speculative_arguments(parser)
    parser.add_argument("--log-level", default="info")
    add_server_arguments(parser)
    return parser


def executor_config(args: argparse.Namespace) -> ExecutorConfig:
    return ExecutorConfig(
        model_path=args.model,
        device=args.device,
        dtype=args.dtype,
        quantization=args.quantization,
        page_size=args.page_size,
        num_pages=args.num_pages,
        kv_memory_fraction=args.kv_memory_fraction,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        seed=args.seed,
        cuda_graphs=not args.no_cuda_graphs,
        extend_graph_tokens=args.extend_graph_tokens,
        kernel_backends=tuple(args.kernel_backend),
        kernel_entry_points=not args.no_kernel_entry_points,
        tensor_parallel_size=args.tensor_parallel_size,
        batch_invariant=args.batch_invariant,
        speculative=speculative_config(args),
    )


def add_speculative_arguments(parser: argparse.ArgumentParser) -> None:
    """--speculative and its sizes (the executor's; `radixmesh serve` passes them on)."""
    parser.add_argument(
        "--speculative",
        default="off",
        choices=SPECULATIVE_METHODS,
        help="draft tokens without a draft model: ngram (prompt lookup over the request's "
        "prompt and output), suffix (that, else recent outputs of other requests), radix "
        "(suffix, and what followed the prompt in the cache's radix tree), off (default)",
    )
    parser.add_argument(
        "--num-speculative-tokens",
        type=int,
        default=SpeculativeConfig().max_draft_tokens,
        help="most draft tokens verified per sequence and step (default %(default)s)",
    )
    parser.add_argument(
        "--speculative-max-batch-size",
        type=int,
        default=SpeculativeConfig().max_batch_size,
        help="no drafts in a step with more decodes than this (default: measured at start-up "
        "on CUDA with graphs, a decode step timed against a verification step per batch size, "
        "then weighed per step against the tokens drafts gain; 8 on the CPU)",
    )
    parser.add_argument(
        "--jump-forward",
        default="auto",
        choices=tuple(JUMP_FORWARD_MODES),
        help="constrained decodes verify the tokens their grammar forces as a draft, at any "
        "batch size and with --speculative off too; same output in fewer steps. auto "
        "(default): on the CPU, not on CUDA (its eager verification was slower there)",
    )
    parser.add_argument(
        "--batch-invariant",
        action="store_true",
        help="a sequence's logits do not depend on the rest of the batch or on verifying "
        "against decoding: greedy outputs equal with speculation on and off at any batch "
        "size (slower; plain weights, one rank)",
    )
    parser.add_argument(
        "--max-forced-tokens",
        type=int,
        default=SpeculativeConfig().max_forced_tokens,
        help="jump-forward: most forced tokens per constrained decode and step "
        "(default %(default)s)",
    )


def speculative_config(args: argparse.Namespace) -> SpeculativeConfig:
    return SpeculativeConfig(
        method=args.speculative,
        max_draft_tokens=args.num_speculative_tokens,
        max_batch_size=args.speculative_max_batch_size,
        jump_forward=JUMP_FORWARD_MODES[args.jump_forward],
        max_forced_tokens=args.max_forced_tokens,
    )


def _config_default(name: str):
    return next(f.default for f in dataclasses.fields(ExecutorConfig) if f.name == name)


def load_grammar(config: ExecutorConfig, with_grammar: bool):
    """The grammar service over the model folder's tokenizer, or None."""
    folder = Path(config.model_path)
    if with_grammar and any((folder / name).is_file() for name in _TOKENIZER_FILES):
        from services.executor.core.grammar import GrammarService

        return GrammarService.from_model_dir(folder)
    if with_grammar:
        log.warning("grammar_off", reason=f"no tokenizer in {folder}; constraints are refused")
    return None


def load(config: ExecutorConfig, with_grammar: bool, init_method: str | None = None):
    """(core, grammar service or None); runs on the step thread. With tensor parallelism
    the core is rank 0's, wrapped to send every step to the followers (`init_method`:
    the group's rendezvous, which the followers were given)."""
    if config.tensor_parallel_size > 1:
        from services.executor.core.tensor_parallel import LeaderCore
        from services.executor.tensor_parallel_group import load_rank

        assert init_method is not None
        core, grammar, group = load_rank(config, 0, init_method, with_grammar)
        return LeaderCore(core, group), grammar
    from services.executor.core.executor import ExecutorCore

    grammar = load_grammar(config, with_grammar)
    try:
        return ExecutorCore(config, grammar), grammar
    except BaseException:
        if grammar is not None:
            grammar.close()
        raise


async def register_pool(
    address: str, request: cache_pb2.RegisterPoolRequest, timeout: float, fresh: bool = False
):
    """RegisterPool; with `fresh`, first drop a pool of the same executor_id that a previous
    process of this executor left (its pages name KV tensors that died with it)."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = cache_pb2_grpc.CacheStub(channel)
        try:
            if fresh:
                with contextlib.suppress(NotFound):
                    await _unregister(stub, request.executor_id, timeout)
            await stub.RegisterPool(request, timeout=timeout, wait_for_ready=True)
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc_error(exc) from None


async def _unregister(stub: cache_pb2_grpc.CacheStub, executor_id: str, timeout: float) -> None:
    try:
        reply = await stub.UnregisterPool(
            cache_pb2.UnregisterPoolRequest(executor_id=executor_id),
            timeout=timeout,
            wait_for_ready=True,
        )
    except grpc.aio.AioRpcError as exc:
        if exc.code() == grpc.StatusCode.NOT_FOUND:
            raise NotFound(exc.details() or "") from None
        raise
    log.warning("stale_pool_dropped", num_leases_dropped=reply.num_leases_dropped)


async def keep_registered(args: argparse.Namespace, executor_id: str, info: Any) -> None:
    """Forever (cancel to stop): each time the cache service serves again after it went
    away (a restart: a new pool epoch, an empty tree), register the pool again."""
    first = True

    async def changed(serving: bool, reason: str) -> None:
        nonlocal first
        if not serving:
            log.error("cache_lost", cache_address=args.cache_address, reason=reason)
            return
        if first:
            first = False
            return
        try:
            await _register(args, executor_id, info, fresh=False)
        except _StartupError as exc:
            log.error("pool_reregister_failed", reason=str(exc))

    await follow_serving(args.cache_address, "", changed)


async def unregister_pool(address: str, executor_id: str) -> None:
    """Best effort: a failure is logged, never raised."""
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            response = await cache_pb2_grpc.CacheStub(channel).UnregisterPool(
                cache_pb2.UnregisterPoolRequest(executor_id=executor_id),
                timeout=_UNREGISTER_TIMEOUT_S,
            )
        log.info("pool_unregistered", num_leases_dropped=response.num_leases_dropped)
    except grpc.aio.AioRpcError as exc:
        log.warning("pool_unregister_failed", code=exc.code().name, message=exc.details())


async def serve(args: argparse.Namespace) -> int:
    try:
        configure_logging("executor", args.log_level)
        if not args.cache_address:
            raise InvalidArgument("--cache-address (or $RADIXMESH_CACHE_ADDRESS) is required")
        config = executor_config(args)
        server_config = ServerConfig.from_args("executor", args)
    except InvalidArgument as exc:
        print(f"executor: {exc}", file=sys.stderr)
        return 2
    followers: list[BaseProcess] = []
    init_method = None
    if config.tensor_parallel_size > 1:
        try:
            config = rank_config(config, 0)
            init_method = group_init_method()
            followers = start_followers(config, init_method, not args.no_grammar, args.log_level)
        except InvalidArgument as exc:
            print(f"executor: {exc}", file=sys.stderr)
            return 2
    runtime = ServiceRuntime(server_config)
    health = HealthSampler()  # reads the GPU once the model is loaded on one
    collector = DeviceHealthCollector(health)
    REGISTRY.register(collector)
    servicer = ExecutorServicer(
        max_inflight_plans=args.max_inflight_plans,
        launch_ahead={"auto": None, "on": True, "off": False}[args.launch_ahead],
        shutdown_requested=runtime.wait_shutdown_requested,
        health=health,
    )
    REGISTRY.register(
        GraphStepsCollector(lambda: None if servicer.core is None else servicer.core.forward.graph_steps())
    )
    REGISTRY.register(SpecSwitchCollector(lambda: _spec_switch_state(servicer.core)))
    await runtime.start(
        lambda server: executor_pb2_grpc.add_ExecutorServicer_to_server(servicer, server),
        [SERVICE_NAME],
    )
    executor_id = args.executor_id or f"{socket.gethostname()}:{runtime.port}"
    loaded = False
    watch: list[asyncio.Task[None]] = []
    clients: list[CacheClient] = []  # --speculative radix: the tree lookups' channel

    async def start_up() -> int:
        nonlocal loaded
        try:
            core = await _load(args, config, servicer, executor_id, init_method)
            loaded = True
            tree_cache = start_tree_prefetch(servicer, core, args.cache_address)
            if tree_cache is not None:
                clients.append(tree_cache)
            health.attach(await asyncio.to_thread(_open_device, core.info.device))
            await _register(args, executor_id, core.info)
        except Exception as exc:
            print(f"executor: {exc}", file=sys.stderr)
            runtime.request_shutdown()
            return 1
        watch.append(asyncio.create_task(keep_registered(args, executor_id, core.info)))
        if followers:
            watch.append(asyncio.create_task(_watch_followers(followers, runtime)))
        tune_gc()  # the loaded model's wrappers frozen: no collection walks them per step
        runtime.set_serving()
        return 0

    async def on_shutdown() -> None:
        startup.cancel()  # a signal during loading: stop waiting for it
        for task in watch:
            task.cancel()
        try:
            if loaded:
                await unregister_pool(args.cache_address, executor_id)
        finally:
            await servicer.close()
            for client in clients:
                await client.close()
            health.close()
            REGISTRY.unregister(collector)
            if followers:
                await asyncio.to_thread(stop_followers, followers)

    startup = asyncio.create_task(start_up())
    await runtime.serve_until_signal(on_shutdown)
    if startup.cancelled():
        return 0
    return startup.result()


async def _watch_followers(followers: list[BaseProcess], runtime: ServiceRuntime) -> None:
    """A follower that exits while serving leaves the group unable to step: shut down."""
    proc = await asyncio.to_thread(wait_any_exit, followers)
    log.error("tensor_parallel_rank_exited", name=proc.name, exitcode=proc.exitcode)
    runtime.request_shutdown()


def _spec_switch_state(core: ExecutorCore | None) -> dict[str, object] | None:
    """The speculation switch's state for /metrics; None before the model loads or with
    speculation off (no proposer)."""
    if core is None or core.proposer is None:
        return None
    return core.spec_switch.describe()


def _open_device(device: str) -> NvmlDevice | None:
    return open_nvml_device(device, uuid=cuda_uuid(device))


class _StartupError(Exception):
    """The model did not load, or the cache did not take the pool: exit 1 with this message."""


async def _load(
    args: argparse.Namespace,
    config: ExecutorConfig,
    servicer: ExecutorServicer,
    executor_id: str,
    init_method: str | None = None,
) -> ExecutorCore:
    """Load on the step thread, then attach to the servicer."""
    loop = asyncio.get_running_loop()
    servicer.bind_device(config.device)  # the core is built on the step thread's device
    try:
        core, grammar = await loop.run_in_executor(
            servicer.step_thread, load, config, not args.no_grammar, init_method
        )
    except Exception as exc:
        log.error("model_load_failed", model=args.model, reason=str(exc))
        raise _StartupError(f"cannot load model {args.model}: {exc}") from exc
    servicer.attach(core, executor_id, grammar)
    info = core.info
    timings = {f"{phase}_s": round(s, 3) for phase, s in core.startup_seconds.items()}
    log.info("model_loaded", executor_id=executor_id, model=info.model, device=info.device,
             num_pages=info.num_pages, page_size=info.page_size, **timings)  # fmt: skip
    return core


async def _register(
    args: argparse.Namespace, executor_id: str, info: ExecutorInfo, fresh: bool = True
) -> None:
    request = cache_pb2.RegisterPoolRequest(
        executor_id=executor_id, model=info.model, num_pages=info.num_pages, page_size=info.page_size
    )
    try:
        await register_pool(args.cache_address, request, args.cache_timeout_seconds, fresh)
    except RadixmeshError as exc:
        log.error("pool_register_failed", cache_address=args.cache_address, reason=str(exc))
        raise _StartupError(
            f"cannot register the pool with the cache service at {args.cache_address}: "
            f"{exc.code} {exc}"
        ) from exc
    log.info("pool_registered", cache_address=args.cache_address)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_service(serve(args))


if __name__ == "__main__":
    sys.exit(main())
