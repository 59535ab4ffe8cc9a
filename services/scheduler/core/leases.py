"""The scheduler's side of page leases: admit, grow, preempt, finish, drop.

Every lease this scheduler takes passes through here, so the page accounting
of a request (page_table, num_computed_tokens, lease_id) changes in one place.
"""

from __future__ import annotations

import asyncio
from contextlib import AbstractContextManager, nullcontext

import structlog

from radixmesh.cache_types import PageCopy
from radixmesh.errors import RadixmeshError, ResourceExhausted
from services.scheduler.core.config import SchedulerConfig
from services.scheduler.core.executor_state import ExecutorState
from services.scheduler.core.ports import CachePort
from services.scheduler.core.request import Request, RequestStatus
from services.scheduler.core.sharing import InflightPrefixes
from services.scheduler.core.stats import SchedulerStats

log = structlog.get_logger(__name__)


def pages_for(num_tokens: int, page_size: int) -> int:
    return -(-num_tokens // page_size)


async def _no_pages() -> list[int]:
    return []


def _traced(req: Request) -> AbstractContextManager[object]:
    """While a cache verb req caused is awaited: its trace's span is the current one."""
    return req.trace.active() if req.trace is not None else nullcontext()


class Leases:
    def __init__(self, cache: CachePort, config: SchedulerConfig, stats: SchedulerStats) -> None:
        self._cache = cache
        self._stats = stats
        self._holder = config.lease_holder
        self._lookahead = config.page_lookahead
        self.inflight = InflightPrefixes()
        """Prompt pages being computed, for admission to wait on instead of recomputing."""
        self._copies: dict[str, PageCopy] = {}
        """Granted leases' copies of a cached partial page not yet sent (`take_copy`)."""

    async def admit(
        self, ex: ExecutorState, req: Request, max_cached_tokens: int | None = None
    ) -> bool:
        """Lease pages for every known token (plus lookahead); False when they do not fit.

        The lookup leaves the last token out, so at least one token is computed
        and the step yields its logits; a request scoring its prompt looks up no more
        than `req.max_cached_tokens`, so the logits it scores are computed too.
        `max_cached_tokens` overrides that cap (a group's follower whose leader
        scores the shared positions for it: groups.py).
        """
        tokens = req.all_token_ids
        page_size = ex.page_size
        wanted = min(len(tokens) + self._lookahead * page_size, ex.info.max_model_len)
        cap = req.max_cached_tokens if max_cached_tokens is None else max_cached_tokens
        lookup = tokens[: len(tokens) - 1 if cap is None else min(cap, len(tokens) - 1)]
        for num_tokens in dict.fromkeys((max(wanted, len(tokens)), len(tokens))):
            try:
                with _traced(req):
                    grant = await self._cache.acquire(
                        ex.executor_id, lookup, num_tokens, self._holder
                    )
            except ResourceExhausted:
                continue
            req.lease_id = grant.lease_id
            req.page_table = list(grant.page_ids)
            req.num_unsent_pages = 0
            # tokens copied from a cached partial page count as computed once it is sent
            req.num_computed_tokens = grant.num_reused_tokens
            req.num_admitted_tokens = len(tokens)
            if grant.page_copy is not None:
                self._copies[req.req_id] = grant.page_copy
            if req.num_cached_tokens is None:
                req.num_cached_tokens = grant.num_reused_tokens
            self.inflight.register(
                req, page_size, req.num_computed_tokens, len(tokens), tentative=False
            )
            return True
        return False

    def take_copy(self, req: Request) -> PageCopy | None:
        """The copy req's lease was granted with, for req's first step (its NewSequence);
        None when there is none or it was taken."""
        return self._copies.pop(req.req_id, None)

    async def publish(self, ex: ExecutorState, req: Request, num_tokens: int) -> bool:
        """Put req's first num_tokens (whole pages of its lease that the step being planned
        computes) in the tree, still locked by req's lease, so requests of its group take
        them as a cached prefix in the same step (groups.py). False, changing nothing,
        when they are not req's own pages.

        The commit frees req's later pages and an extend leases as many again (the pool
        just got them back); should it be refused, req runs up to its pages this step and
        grows as a running prefill. Only the step loop of req's executor inserts into its
        tree, so no other commit can have put those pages there meanwhile. The two verbs
        are queued together, the extend after the commit: over gRPC they share one
        message and one round trip (the cache runs a message's verbs in order).
        """
        page_size = ex.page_size
        num_pages = num_tokens // page_size
        if req.lease_id is None or num_pages * page_size <= req.num_computed_tokens:
            return False
        lease_id = req.lease_id
        tokens = req.all_token_ids
        num_tail = len(req.page_table) - num_pages
        with _traced(req):
            committing = self._cache.commit(lease_id, tokens[: num_pages * page_size], keep_locked=True)
            extending = self._cache.extend(lease_id, num_tail) if num_tail > 0 else _no_pages()
            committed, tail = await asyncio.gather(committing, extending, return_exceptions=True)
        if isinstance(committed, BaseException):
            raise committed
        if isinstance(tail, ResourceExhausted):
            log.warning("pages after a shared prefix not lent again", req_id=req.req_id)
            tail = []
        elif isinstance(tail, BaseException):
            raise tail
        req.page_table = req.page_table[:num_pages] + tail
        self.inflight.register(
            req, page_size, num_pages * page_size, len(tokens), tentative=False
        )
        return True

    async def grow(self, ex: ExecutorState, req: Request, num_tokens: int) -> bool:
        """Make the page table cover num_tokens positions; False when the pool is short."""
        missing = pages_for(num_tokens, ex.page_size) - len(req.page_table)
        if missing <= 0:
            return True
        assert req.lease_id is not None
        for num_pages in dict.fromkeys((max(missing, self._lookahead), missing)):
            try:
                with _traced(req):
                    page_ids = await self._cache.extend(req.lease_id, num_pages)
            except ResourceExhausted:
                continue
            req.page_table.extend(page_ids)
            req.num_unsent_pages += len(page_ids)
            return True
        return False

    async def preempt(self, ex: ExecutorState, req: Request) -> None:
        """Give the pages back, keeping what was computed in the tree, and re-queue."""
        num_computed = await self._requeue(ex, req)
        self._stats.num_preemptions += 1
        if req.trace is not None:
            req.trace.on_preempted(num_computed)
        log.debug("preempted", req_id=req.req_id, num_computed_tokens=num_computed)

    async def checkpoint(self, ex: ExecutorState, req: Request) -> None:
        """As `preempt`, for a request whose prompt the waiting requests share: its prompt
        goes in the tree for them, and it resumes at once (counted apart from preemptions,
        which operators read as page pressure)."""
        num_computed = await self._requeue(ex, req)
        self._stats.num_prefix_checkpoints += 1
        if req.trace is not None:
            req.trace.on_preempted(num_computed, checkpoint=True)
        log.debug("prefix_checkpoint", req_id=req.req_id, num_computed_tokens=num_computed)

    async def _requeue(self, ex: ExecutorState, req: Request) -> int:
        """Give the pages back, keeping what was computed in the tree, and re-queue: the
        tokens kept."""
        num_computed = min(req.num_computed_tokens, req.num_tokens)
        await self._end(req, req.all_token_ids[:num_computed])
        ex.running.pop(req.req_id, None)
        self.forget_on_executor(ex, req)
        ex.queue.push(req)
        req.hold_until_answered = ex.num_steps_sent
        return num_computed

    async def finish(self, req: Request, hold: bool = False) -> tuple[str, int] | None:
        """The executor ended the sequence: its computed tokens become a cached prefix.

        With `hold`, the lease stays as a lock on that prefix: (its id, the pages the
        lock holds, as the cache counts them: its partial last page included) is returned
        (None when nothing was held), and `release_hold` ends it."""
        # the last sampled token was never fed back; a score-only request sampled none
        num_known = req.num_tokens - 1 if req.output_token_ids else req.num_tokens
        num_computed = min(req.num_computed_tokens, num_known)
        commit_tokens = req.all_token_ids[:num_computed]
        lease_id = req.lease_id
        if hold and lease_id is not None and commit_tokens:
            self._copies.pop(req.req_id, None)  # sent: a finished request had its steps
            self.inflight.forget(req)
            req.lease_id = None
            req.page_table = []
            req.num_unsent_pages = req.num_computed_tokens = req.num_admitted_tokens = 0
            req.status = RequestStatus.FINISHED
            try:
                with _traced(req):
                    result = await self._cache.commit(lease_id, commit_tokens, keep_locked=True)
            except RadixmeshError as exc:
                log.warning("holding a context failed", req_id=req.req_id, error=str(exc))
                return None
            return lease_id, result.num_locked_pages
        await self._end(req, commit_tokens)
        req.status = RequestStatus.FINISHED
        return None

    async def release_hold(self, lease_id: str) -> None:
        """End a hold made by `finish(hold=True)`: its pages become evictable again."""
        try:
            await self._cache.release(lease_id)
        except RadixmeshError as exc:  # the cache expires what it could not end
            log.warning("ending a hold failed", lease_id=lease_id, error=str(exc))

    async def drop(self, req: Request) -> None:
        """An error (or a request yielding its lease): end the lease inserting nothing."""
        await self._end(req, None)

    async def cut(self, req: Request) -> None:
        """An abort or a deadline: the tokens whose KV the executor wrote become a cached
        prefix, as at a normal finish (a stop string the edge matched ends a request this
        way: the next turn of its conversation, or a program's next statement, reuses it).
        Steps prepared before the abort still run the sequence and write only its own
        tokens' KV, before any later step reads those pages."""
        num_known = req.num_tokens - 1 if req.output_token_ids else req.num_tokens
        num_computed = min(req.num_computed_tokens, num_known)
        await self._end(req, req.all_token_ids[:num_computed])

    def forget_on_executor(self, ex: ExecutorState, req: Request) -> None:
        if req.on_executor:
            ex.dropped_req_ids.append(req.req_id)
            req.on_executor = False

    async def _end(self, req: Request, commit_tokens: list[int] | None) -> None:
        unsent = self._copies.pop(req.req_id, None)
        if unsent is not None and commit_tokens:  # never started: the copy never ran
            commit_tokens = commit_tokens[: req.num_computed_tokens - unsent.num_tokens]
        self.inflight.forget(req)
        req.step_share = None
        lease_id, req.lease_id = req.lease_id, None
        req.page_table = []
        req.num_unsent_pages = 0
        req.num_computed_tokens = 0
        req.num_admitted_tokens = 0
        if lease_id is None:
            return
        try:
            with _traced(req):
                if commit_tokens:
                    await self._cache.commit(lease_id, commit_tokens)
                else:
                    await self._cache.release(lease_id)
        except RadixmeshError as exc:  # the cache expires what it could not end
            log.warning("ending lease failed", req_id=req.req_id, lease_id=lease_id, error=str(exc))
