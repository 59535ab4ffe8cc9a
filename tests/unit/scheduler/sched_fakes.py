"""A toy executor that keeps its 'KV' in real page slots, and factories for scheduler tests.

The toy model's next token is a hash of the whole context, and the context is
read back from the page slots the scheduler assigned, so any page mix-up (a
page reused while still needed, a cached prefix that does not hold what the
tree says) changes the tokens and is recorded in `corruptions`.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mesh.engine.ports import InProcessCache
from radixmesh.errors import InvalidArgument, Unavailable
from radixmesh.executor_info import ExecutorInfo
from radixmesh.sampling import Constraint, Priority, SamplingParams
from radixmesh.step import SequenceOutput, StepPlan, StepResult
from radixmesh.v1 import executor_pb2
from radixmesh.wire import result_from_proto, result_to_proto
from services.cache.core import CacheCore
from services.scheduler.core import SchedulerConfig, SchedulerCore, StepUpdates

VOCAB = 101
EOS = 0


def next_token(context: list[int]) -> int:
    """The toy model: a hash of every token so far, never EOS unless the hash lands on it."""
    h = 17
    for t in context:
        h = (h * 31 + t + 1) % 1_000_003
    return h % VOCAB


def reference(prompt: list[int], max_tokens: int, ignore_eos: bool = True) -> list[int]:
    """Tokens a request gets when it runs alone."""
    tokens, out = list(prompt), []
    while len(out) < max_tokens:
        tok = next_token(tokens)
        tokens.append(tok)
        out.append(tok)
        if tok == EOS and not ignore_eos:
            break
    return out


@dataclass(slots=True)
class _Seq:
    token_ids: list[int]
    num_prompt_tokens: int
    num_computed_tokens: int
    page_ids: list[int]
    sampling: SamplingParams
    stopped: bool = False


class ToyExecutor:
    """Runs step plans with the executor core's semantics over a toy model."""

    def __init__(self, num_pages: int, page_size: int, max_model_len: int = 512) -> None:
        self.page_size = page_size
        self.num_pages = num_pages
        self.max_model_len = max_model_len
        self.kv: list[list[int | None]] = [[None] * page_size for _ in range(num_pages)]
        self.seqs: dict[str, _Seq] = {}
        self.corruptions: list[str] = []
        self.plans: list[StepPlan] = []
        self.next_step_id = 1
        self.num_substeps_run = 0
        """Later steps of multi-step plans run (each plan's first step is in `plans`)."""
        self.num_copied_tokens = 0
        """Slots the plans' page copies (NewSequence.page_copy) copied."""
        self.undrafted: Callable[[StepPlan, int, StepResult], int] | None = None
        """(plan, substep, result) -> the result's undrafted_steps, as a speculating
        executor's switch would say it; None: 0."""
        self.keeps_drafts = False
        """True: a decode offered d draft tokens verifies a draft of the toy model's own next
        d tokens and keeps them all (KV for d + 1 positions, d + 1 tokens out), as a
        perfect proposer would; False: offered drafts are not drafted."""

    def _report(self, plan: StepPlan, substep: int, result: StepResult) -> StepResult:
        if self.undrafted is not None:
            result.undrafted_steps = self.undrafted(plan, substep, result)
        return result

    def stop(self, req_ids: list[str]) -> None:
        """A plan's abort_req_ids, as it arrives: later steps of a multi-step plan skip them."""
        for req_id in req_ids:
            if (seq := self.seqs.get(req_id)) is not None:
                seq.stopped = True

    def step_next(self, plan: StepPlan, substep: int) -> StepResult:
        """Step `substep` of a multi-step plan: one more decode of each sequence left."""
        self.num_substeps_run += 1
        work = []
        for running in plan.running_seqs:
            seq = self.seqs.get(running.req_id)
            if seq is None or seq.stopped:
                continue
            num_out = len(seq.token_ids) - seq.num_prompt_tokens
            max_tokens = seq.sampling.max_tokens
            if len(seq.token_ids) < self.max_model_len and (
                max_tokens is None or num_out < max_tokens
            ):
                work.append((running.req_id, seq, 1))
        for req_id, seq, n in work:
            self._write(req_id, seq, n)
        outputs = [self._sample(req_id, seq, n) for req_id, seq, n in work]
        return self._report(plan, substep, StepResult(plan.step_id, outputs, substep=substep))

    def step(self, plan: StepPlan) -> StepResult:
        assert plan.step_id == self.next_step_id, (plan.step_id, self.next_step_id)
        self.next_step_id += 1
        self.plans.append(plan)
        for req_id in (*plan.finished_req_ids, *plan.abort_req_ids):
            self.seqs.pop(req_id, None)
        work = []
        for new in plan.new_seqs:
            assert new.req_id not in self.seqs, f"{new.req_id} sent twice"
            seq = _Seq(
                list(new.token_ids),
                new.num_prompt_tokens,
                new.num_computed_tokens,
                list(new.page_ids),
                new.sampling,
            )
            self.seqs[new.req_id] = seq
            work.append((new.req_id, seq, new.num_scheduled_tokens))
        drafts: dict[str, int] = {}
        for running in plan.running_seqs:
            seq = self.seqs.get(running.req_id)
            if seq is not None:
                seq.page_ids.extend(running.appended_page_ids)
                work.append((running.req_id, seq, running.num_scheduled_tokens))
                if self.keeps_drafts and running.num_draft_tokens:
                    drafts[running.req_id] = running.num_draft_tokens
        for req_id, seq, n in work:  # every KV write of the step happens before any read
            self._write(req_id, seq, n)
        self._copy([new.page_copy for new in plan.new_seqs if new.page_copy is not None])
        outputs = [
            self._verify(req_id, seq, drafts[req_id])
            if req_id in drafts
            else self._sample(req_id, seq, n)
            for req_id, seq, n in work
        ]
        return self._report(plan, 0, StepResult(plan.step_id, outputs))

    def _verify(self, req_id: str, seq: _Seq, num_draft: int) -> SequenceOutput:
        """A decode whose draft of `num_draft` tokens is the model's own: each kept token's
        KV written in the sequence's pages (the step's first position is written already),
        the tokens out as accepted ones and the one after them, up to the sequence's end."""
        kept: list[int] = []
        out = self._sample(req_id, seq, 1)
        while len(kept) < num_draft and out.finish_reason is None and out.token_id is not None:
            kept.append(out.token_id)
            self._write(req_id, seq, 1)
            out = self._sample(req_id, seq, 1)
        out.accepted_token_ids = kept
        out.num_draft_tokens = num_draft
        return out

    def _copy(self, copies: list) -> None:
        """The step's page copies, as the executor's layers run them: after the step's
        writes, before any read, every source read before any destination is written."""
        slots = [
            (c.dst_page_id, off, self.kv[c.src_page_id][off])
            for c in copies
            for off in range(c.num_tokens)
        ]
        for page, off, token in slots:
            self.kv[page][off] = token
        self.num_copied_tokens += len(slots)

    def _slot(self, seq: _Seq, pos: int) -> tuple[int, int]:
        return seq.page_ids[pos // self.page_size], pos % self.page_size

    def _write(self, req_id: str, seq: _Seq, n: int) -> None:
        end = seq.num_computed_tokens + n
        assert n >= 1 and end <= len(seq.token_ids), (req_id, seq.num_computed_tokens, n)
        assert len(seq.page_ids) * self.page_size >= end, f"{req_id}: pages do not cover {end}"
        for pos in range(seq.num_computed_tokens, end):
            page, off = self._slot(seq, pos)
            self.kv[page][off] = seq.token_ids[pos]

    def _sample(self, req_id: str, seq: _Seq, n: int) -> SequenceOutput:
        seq.num_computed_tokens += n
        end = seq.num_computed_tokens
        if end < len(seq.token_ids):
            return SequenceOutput(req_id, None)
        context = [self.kv[p][o] for p, o in (self._slot(seq, i) for i in range(end))]
        if context != seq.token_ids:
            self.corruptions.append(req_id)
        tok = next_token([t if t is not None else -1 for t in context])
        seq.token_ids.append(tok)
        num_out = len(seq.token_ids) - seq.num_prompt_tokens
        params = seq.sampling
        reason = None
        if tok == EOS and not params.ignore_eos:
            reason = "stop"
        elif (params.max_tokens is not None and num_out >= params.max_tokens) or len(
            seq.token_ids
        ) >= self.max_model_len:
            reason = "length"
        if reason is not None:
            del self.seqs[req_id]
        return SequenceOutput(req_id, tok, None, reason, tok if reason == "stop" else None)


class ToyExecutorPort:
    """ExecutorPort over a ToyExecutor; a test may hold steps (gate) or make it fail."""

    def __init__(
        self, executor_id: str, toy: ToyExecutor, model: str = "toy", **info_fields: Any
    ) -> None:
        """`info_fields`: ExecutorInfo fields it reports besides its pool's (e.g. what it
        says of speculative decoding; the toy itself never verifies drafts)."""
        self.toy = toy
        self._info = ExecutorInfo(
            executor_id, model, toy.page_size, toy.num_pages, toy.max_model_len, VOCAB, (EOS,),
            **info_fields,
        )  # fmt: skip
        self._plans: collections.deque[tuple[StepPlan, int]] = collections.deque()
        """Each plan's steps (plan, substep), in order."""
        self.gate: asyncio.Event | None = None
        """When set to an Event, each step waits for it (tests clear it to hold steps)."""
        self.fail_at_step: int | None = None
        self.num_steps_run = 0
        self.step_done = asyncio.Event()
        self.closed = False
        self.clock: list[float] | None = None
        """The rig's manual clock: each step advances it by step_seconds."""
        self.step_seconds = 0.0
        self.prepare_gate: asyncio.Event | None = None
        """When set to an Event, each constraint preparation waits for it."""
        self.bad_constraints: dict[str, str] = {}
        """Constraint value -> the compiler's message for it."""
        self.prepared: list[Constraint] = []
        self.through_wire = False
        """Each result goes through its protobuf, read as the gRPC port reads it (columnar)."""
        self.round_trip_steps = 0
        """A plan that finds fewer steps than this still queued reached the executor after
        they ran out: its first result says so (`StepResult.idle_gap_s`, as the executor's
        pipeline measures it), and the scheduler deepens its pipeline. 0: never late."""
        self._late: set[int] = set()
        self.steps_left_at_plans: list[int] = []
        """Steps still queued as each plan (not abort-only) arrived."""

    @property
    def info(self) -> ExecutorInfo:
        return self._info

    def submit(self, plan: StepPlan) -> None:
        self.toy.stop(plan.abort_req_ids)
        if not plan.abort_req_ids:
            left = len(self._plans)
            self.steps_left_at_plans.append(left)
            if self.num_steps_run and left < self.round_trip_steps:
                self._late.add(plan.step_id)
        self._plans.extend((plan, substep) for substep in range(plan.num_steps))

    async def next_result(self) -> StepResult:
        if self.gate is not None:
            await self.gate.wait()
        await asyncio.sleep(0)  # a step takes time: let submit/abort callers in
        plan, substep = self._plans.popleft()
        if self.clock is not None:
            self.clock[0] += self.step_seconds
        if self.fail_at_step is not None and plan.step_id >= self.fail_at_step:
            raise Unavailable("toy executor lost")
        result = self.toy.step_next(plan, substep) if substep else self.toy.step(plan)
        if not substep and plan.step_id in self._late:
            self._late.discard(plan.step_id)
            result.idle_gap_s = 0.002
        self.num_steps_run += 1
        self.step_done.set()
        if self.through_wire:
            msg = executor_pb2.StepResult.FromString(result_to_proto(result).SerializeToString())
            return result_from_proto(msg, columnar=True)
        return result

    async def prepare_constraint(self, constraint: Constraint) -> float:
        if self.prepare_gate is not None:
            await self.prepare_gate.wait()
        if constraint.value in self.bad_constraints:
            raise InvalidArgument(self.bad_constraints[constraint.value])
        self.prepared.append(constraint)
        return 0.0

    async def close(self) -> None:
        self.closed = True


class Collector:
    """The scheduler's sink: every batch, and per request its tokens and ending."""

    def __init__(self, clock: list[float] | None = None) -> None:
        self.clock = clock
        self.token_times: dict[str, list[float]] = collections.defaultdict(list)
        """With a clock: per request, the clock at each batch that carried a token of it."""
        self.finish_times: dict[str, float] = {}
        self.batches: list[StepUpdates] = []
        self.tokens: dict[str, list[int]] = collections.defaultdict(list)
        self.finished: dict[str, object] = {}
        self.first: dict[str, object] = {}
        self.order: list[str] = []
        """req_ids in the order their first token arrived."""
        self._events: dict[str, asyncio.Event] = collections.defaultdict(asyncio.Event)
        self._any = asyncio.Event()

    def __call__(self, batch: StepUpdates) -> None:
        self.batches.append(batch)
        for u in batch.updates:
            self.first.setdefault(u.req_id, u)
            if u.token_ids and u.req_id not in self.order:
                self.order.append(u.req_id)
            self.tokens[u.req_id].extend(u.token_ids)
            if self.clock is not None:
                self.token_times[u.req_id] += [self.clock[0]] * len(u.token_ids)
                if u.finished:
                    self.finish_times[u.req_id] = self.clock[0]
            if u.finished:
                assert u.req_id not in self.finished, f"{u.req_id} finished twice"
                self.finished[u.req_id] = u
                self._events[u.req_id].set()
        self._any.set()

    async def wait(self, *req_ids: str, timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout):
            for req_id in req_ids:
                await self._events[req_id].wait()

    async def next_batch(self, timeout: float = 10.0) -> None:
        """Until the next batch of updates arrives."""
        self._any.clear()
        async with asyncio.timeout(timeout):
            await self._any.wait()

    async def wait_tokens(self, req_id: str, n: int, timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout):
            while len(self.tokens[req_id]) < n and req_id not in self.finished:
                self._any.clear()
                await self._any.wait()


@dataclass
class Rig:
    scheduler: SchedulerCore
    cache: CacheCore
    toys: list[ToyExecutor]
    ports: list[ToyExecutorPort]
    sink: Collector
    clock: list[float] = field(default_factory=lambda: [0.0])

    @property
    def toy(self) -> ToyExecutor:
        return self.toys[0]

    @property
    def port(self) -> ToyExecutorPort:
        return self.ports[0]

    def stats(self, i: int = 0):
        return self.cache.stats(self.ports[i].info.executor_id)[0]


_ids = itertools.count()


class MessageCache(InProcessCache):
    """The cache core behind the cache client's outbox: the verbs called before the event
    loop turns go out as one message (`messages`, their verb names in call order) and run
    in that order when it is sent, as over the Batch stream."""

    def __init__(self, core: CacheCore) -> None:
        super().__init__(core)
        self.messages: list[list[str]] = []
        self._outbox: list[tuple[str, Callable[[], Any], asyncio.Future]] = []

    async def _send(self, verb: str, run: Callable[[], Any]) -> Any:
        future = asyncio.get_running_loop().create_future()
        self._outbox.append((verb, run, future))
        if len(self._outbox) == 1:
            asyncio.get_running_loop().call_soon(self._write)
        return await future

    def _write(self) -> None:
        ops, self._outbox = self._outbox, []
        self.messages.append([verb for verb, _, _ in ops])
        for _, run, future in ops:
            try:
                future.set_result(run())
            except Exception as exc:
                future.set_exception(exc)

    async def match(self, token_ids, model=None):
        return await self._send("match", lambda: self.core.match(token_ids, model or None))

    async def acquire(self, executor_id, token_ids, num_tokens, holder):
        return await self._send(
            "acquire", lambda: self.core.acquire(executor_id, token_ids, num_tokens, holder)
        )

    async def extend(self, lease_id, num_pages):
        return await self._send("extend", lambda: self.core.extend(lease_id, num_pages))

    async def commit(self, lease_id, token_ids, keep_locked=False):
        return await self._send(
            "commit", lambda: self.core.commit(lease_id, token_ids, keep_locked)
        )

    async def release(self, lease_id):
        return await self._send("release", lambda: self.core.release(lease_id))


def make_rig(
    config: SchedulerConfig | None = None,
    *,
    num_pages: int = 64,
    page_size: int = 4,
    num_executors: int = 1,
    max_model_len: int = 512,
    models: list[str] | None = None,
    manual_clock: bool = False,
    executor_info: dict[str, Any] | None = None,
    cache_port: Callable[[CacheCore], InProcessCache] = InProcessCache,
) -> Rig:
    """A scheduler over the real cache core and toy executors (one pool per executor);
    `executor_info`: more ExecutorInfo fields every toy reports; `cache_port`: the
    scheduler's port onto the cache core (`MessageCache` counts messages)."""
    config = config or SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=16)
    cache = CacheCore()
    toys, ports = [], []
    for i in range(num_executors):
        model = models[i] if models else "toy"
        ex_id = f"toy-{next(_ids)}"
        cache.register_pool(ex_id, model, num_pages, page_size)
        toy = ToyExecutor(num_pages, page_size, max_model_len)
        toys.append(toy)
        ports.append(ToyExecutorPort(ex_id, toy, model, **(executor_info or {})))
    clock = [0.0]
    sink = Collector(clock if manual_clock else None)
    if manual_clock:
        for port in ports:
            port.clock = clock
    kwargs = {"clock": lambda: clock[0]} if manual_clock else {}
    scheduler = SchedulerCore(config, cache_port(cache), ports, sink, **kwargs)
    return Rig(scheduler, cache, toys, ports, sink, clock)


async def run_checked(
    rig: Rig,
    check: Callable[[], None],
    classes: tuple[Priority, ...] = (Priority.INTERACTIVE,),
    num_requests: int = 24,
) -> None:
    """Serve num_requests of mixed lengths (their classes cycling through `classes`) on a
    started rig, calling check after each submit and inside every step's result processing
    (just after finished requests left), a step every third submit; then stop."""
    sink = rig.scheduler._sink

    def checking_sink(batch):
        check()
        sink(batch)

    rig.scheduler._sink = checking_sink
    await rig.scheduler.start()
    req_ids = []
    for i in range(num_requests):
        req_ids.append(f"r{i}")
        await rig.scheduler.submit(
            f"r{i}",
            list(range(1, 2 + i % 13)),
            greedy(4 + (i * 7) % 30),
            priority=classes[i % len(classes)],
        )
        check()  # between steps: admissions and page growth since the last check
        if i % 3 == 2:
            await rig.sink.next_batch()
    await rig.sink.wait(*req_ids)
    await rig.scheduler.stop()


def greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **kw)
