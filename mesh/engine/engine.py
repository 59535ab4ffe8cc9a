"""The in-process engine: one cache core, executor cores, and the scheduler core, no gRPC.

    async with Engine(EngineConfig.for_model("/models/tiny-llama")) as engine:
        stream = await engine.generate(prompt_ids, SamplingParams(max_tokens=32))
        async for update in stream:
            print(update.token_ids)

Each executor core runs on a worker thread of its own; the event loop plans
the next step while a step computes. The scheduler delivers every request's
new tokens of a step in one batch; the engine fans them out to per-request
streams.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mesh.engine.ports import InProcessCache, InProcessExecutor

if TYPE_CHECKING:  # the executor core imports torch; loading waits for start()
    from services.executor.core.executor import ExecutorCore
    from services.executor.core.grammar import GrammarService
from radixmesh.errors import InvalidArgument, RadixmeshError, Unavailable
from radixmesh.sampling import Constraint, Priority, SamplingParams
from radixmesh.speculation import SpecUsage
from radixmesh.step import StepPlan, TokenLogprobs
from radixmesh.updates import RequestUpdate
from services.cache.core import CacheConfig, CacheCore, PoolStats
from services.common.gc_policy import hold_tuned_gc, release_tuned_gc
from services.executor.core.config import ExecutorConfig
from services.executor.core.spec.radix import RadixProposer, TreePrefetch
from services.scheduler.core import SchedulerConfig, SchedulerCore, StepUpdates, fit_to_executors


@dataclass(frozen=True, slots=True)
class EngineConfig:
    executors: tuple[ExecutorConfig, ...]
    """One ExecutorConfig per executor (the same model twice gives two replicas)."""
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    """Its token and sequence limits are lowered to the executors' where those are smaller."""
    cache: CacheConfig = field(default_factory=CacheConfig)
    overlap_prepare: bool | None = None
    """Prepare plan N + 1 on a thread of its own while step N executes. None: on CUDA
    devices only (on CPU the threads would only contend for the interpreter)."""
    launch_ahead: bool | None = None
    """Queue a plain step on the device before the step before it is read back
    (services/executor/core/pipeline.py; needs overlapping prepares). None: on CUDA."""
    tune_gc: bool = True
    """Once started, freeze what the start made and raise the collector's young threshold
    (services/common/gc_policy.py), as the services do: process-wide, so a caller that
    embeds the engine in a process of its own design may turn it off."""

    def __post_init__(self) -> None:
        if not self.executors:
            raise InvalidArgument("engine.executors must name at least one executor")

    @classmethod
    def for_model(
        cls,
        model_path: str,
        *,
        num_executors: int = 1,
        scheduler: SchedulerConfig | None = None,
        overlap_prepare: bool | None = None,
        launch_ahead: bool | None = None,
        tune_gc: bool = True,
        **executor_fields: object,
    ) -> EngineConfig:
        """One model folder served by `num_executors` executors built from executor_fields."""
        executor = ExecutorConfig(model_path=model_path, **executor_fields)  # type: ignore[arg-type]
        return cls(
            executors=(executor,) * num_executors,
            scheduler=scheduler or SchedulerConfig(),
            overlap_prepare=overlap_prepare,
            launch_ahead=launch_ahead,
            tune_gc=tune_gc,
        )


@dataclass(slots=True)
class Completion:
    """A whole request's result, gathered from its stream."""

    req_id: str
    token_ids: list[int]
    finish_reason: str | None
    num_prompt_tokens: int
    num_cached_tokens: int
    logprobs: list[TokenLogprobs]
    matched_stop_token_id: int | None = None
    prompt_logprobs: list[TokenLogprobs] = field(default_factory=list)
    """With sampling.prompt_logprobs_start k: prompt positions k, k + 1, ... scored."""
    speculation: SpecUsage | None = None
    """Speculative decoding counters, when the request verified any draft."""


class RequestStream:
    """The updates of one request, in order; the last has finish_reason or error."""

    def __init__(self, req_id: str, engine: Engine) -> None:
        self.req_id = req_id
        self._engine = engine
        self._queue: asyncio.Queue[RequestUpdate] = asyncio.Queue()
        self._done = False

    def __aiter__(self) -> AsyncIterator[RequestUpdate]:
        return self

    async def __anext__(self) -> RequestUpdate:
        if self._done:
            raise StopAsyncIteration
        update = await self._queue.get()
        self._done = update.finished
        return update

    def abort(self) -> bool:
        return self._engine.abort(self.req_id)

    async def collect(self) -> Completion:
        """Every update merged; raises the request's error if it failed."""
        result = Completion(self.req_id, [], None, 0, 0, [])
        async for update in self:
            if update.num_prompt_tokens is not None:
                result.num_prompt_tokens = update.num_prompt_tokens
                result.num_cached_tokens = update.num_cached_tokens or 0
            result.prompt_logprobs += update.prompt_logprobs
            result.token_ids += update.token_ids
            result.logprobs += update.logprobs
            if update.error is not None:
                raise update.error
            result.finish_reason = update.finish_reason
            result.matched_stop_token_id = update.matched_stop_token_id
            if update.speculation is not None:
                result.speculation = update.speculation
        return result

    def _put(self, update: RequestUpdate) -> None:
        self._queue.put_nowait(update)


class Engine:
    def __init__(self, config: EngineConfig, grammar: GrammarService | None = None) -> None:
        """`grammar`: the constraint compiler and grammar backend of every executor (they
        share a tokenizer); a constrained request is compiled there before it is queued,
        and its executor then finds it cached. Without it a constrained request ends with
        InvalidArgument. The engine does not close `grammar`.
        """
        self.config = config
        self.grammar = grammar
        self.cache = CacheCore(config.cache)
        self.executors: list[ExecutorCore] = []
        self.ports: list[InProcessExecutor] = []
        """The executors' in-process ports, in `executors`' order (their pipeline counts)."""
        self._holds_gc = False
        """Start tuned the collector (config.tune_gc); stop releases it."""
        self.prefetches: list[TreePrefetch] = []
        """`--speculative radix`: each executor's tree lookups (read by tests and benches)."""
        self._scheduler: SchedulerCore | None = None
        self._streams: dict[str, RequestStream] = {}
        self._req_ids = itertools.count()

    async def __aenter__(self) -> Engine:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Load every executor (on worker threads), register their pools, start scheduling."""
        from services.executor.core.executor import ExecutorCore

        cores = await asyncio.gather(
            *(
                asyncio.to_thread(ExecutorCore, cfg, self.grammar)
                for cfg in self.config.executors
            )
        )
        ports = []
        for i, core in enumerate(cores):
            port = InProcessExecutor(
                f"executor-{i}",
                core,
                self.grammar,
                overlap_prepare=self.config.overlap_prepare,
                launch_ahead=self.config.launch_ahead,
                on_plan=self._tree_prefetch(core),
            )
            info = port.info
            self.cache.register_pool(info.executor_id, info.model, info.num_pages, info.page_size)
            ports.append(port)
        self.executors = list(cores)
        self.ports = ports
        config = fit_to_executors(self.config.scheduler, (port.info for port in ports))
        self._scheduler = SchedulerCore(config, InProcessCache(self.cache), ports, self._fan_out)
        await self._scheduler.start()
        if self.config.tune_gc:
            hold_tuned_gc()
            self._holds_gc = True

    def _tree_prefetch(self, core: ExecutorCore) -> Callable[[StepPlan], None] | None:
        """`--speculative radix`: the tree lookups of each plan's new sequences, inline on
        this engine's cache core (as tasks on the loop, like the service's over gRPC)."""
        proposer = core.proposer
        if not isinstance(proposer, RadixProposer):
            return None
        prefetch = TreePrefetch(
            proposer,
            InProcessCache(self.cache),
            core.info.model,
            core.config.speculative.max_tree_tokens,
        )
        self.prefetches.append(prefetch)
        return prefetch.on_plan

    async def stop(self) -> None:
        if self._scheduler is not None:
            await self._scheduler.stop()
            self._scheduler = None
        for core in self.executors:
            core.shutdown()
        self.executors = []
        self.ports = []
        if self._holds_gc:
            self._holds_gc = False
            release_tuned_gc()  # what start froze is garbage now

    @property
    def models(self) -> list[str]:
        return self._running().models

    @property
    def scheduler(self) -> SchedulerCore:
        return self._running()

    async def generate(
        self,
        token_ids: list[int],
        sampling: SamplingParams | None = None,
        *,
        constraint: Constraint | None = None,
        model: str = "",
        priority: Priority = Priority.INTERACTIVE,
        timeout_s: float | None = None,
        req_id: str | None = None,
        hold_id: str = "",
        group_id: str = "",
        group_size: int = 0,
    ) -> RequestStream:
        """Queue a request and return its stream. Raises InvalidArgument, ResourceExhausted
        or Unavailable at once when it cannot be queued. With `hold_id`, a normal finish
        keeps its context locked in the cache until `release_hold(hold_id)`; requests with
        one `group_id` are scheduled as one program group (`group_size`: its requests in
        all, when known)."""
        scheduler = self._running()
        if timeout_s is not None and not timeout_s > 0:
            raise InvalidArgument(f"timeout_s must be > 0, got {timeout_s}")
        req_id = req_id or f"req-{next(self._req_ids)}"
        if req_id in self._streams:
            raise InvalidArgument(f"req_id {req_id!r} is already in use")
        stream = RequestStream(req_id, self)
        self._streams[req_id] = stream
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            await scheduler.submit(
                req_id,
                token_ids,
                sampling or SamplingParams(),
                constraint=constraint,
                model=model,
                priority=priority,
                deadline=deadline,
                hold_id=hold_id,
                group_id=group_id,
                group_size=group_size,
            )
        except RadixmeshError:
            self._streams.pop(req_id, None)
            raise
        return stream

    async def complete(
        self, token_ids: list[int], sampling: SamplingParams | None = None, **kw
    ) -> Completion:
        """generate, then gather the whole result."""
        return await (await self.generate(token_ids, sampling, **kw)).collect()

    def abort(self, req_id: str) -> bool:
        """Cancel a request; its stream ends with finish_reason "abort". False if unknown."""
        return self._scheduler is not None and self._scheduler.abort(req_id)

    async def release_hold(self, hold_id: str) -> bool:
        """End a context hold (see `generate`); False when none has that name."""
        return await self._running().release_hold(hold_id)

    def cache_stats(self) -> list[PoolStats]:
        return self.cache.stats()

    def _running(self) -> SchedulerCore:
        if self._scheduler is None:
            raise Unavailable("engine is not started")
        return self._scheduler

    def _fan_out(self, batch: StepUpdates) -> None:
        for update in batch.updates:
            stream = self._streams.get(update.req_id)
            if stream is None:
                continue
            if update.finished:
                del self._streams[update.req_id]
            stream._put(update)
