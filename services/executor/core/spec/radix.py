"""Drafts from the cache service's radix tree (`--speculative radix`).

The cache's tree holds every finished sequence of every executor (prompt and output, in
whole pages), so a request whose prompt an earlier request had, on any executor, finds
that request's output right after its own prompt in the tree. `TreePrefetch` looks each
new sequence's prompt up once (`GetContinuation`: the tokens cached after its longest
match), off the step's path: the lookup is a task on the event loop that answers while
the prompt is prefilled, and its tokens join `RadixProposer`'s reference index, which the
step thread reads. No step waits for the cache and no step sends it anything.

`RadixProposer` drafts from the best of three sources, the longest matched suffix
winning: the sequence's own tokens (prompt lookup), the tree's continuations, and the
recent outputs of this executor (the `suffix` method's index).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Sequence
from typing import Protocol

from radixmesh.cache_types import Continuation
from radixmesh.errors import RadixmeshError
from radixmesh.step import StepPlan
from services.executor.core.spec.proposers import (
    NO_DRAFT,
    Draft,
    NgramIndex,
    PromptLookup,
    SuffixIndex,
)


class TreeSource(Protocol):
    """The cache's `continuation` verb (CacheClient over gRPC, or the in-process core)."""

    async def continuation(
        self, token_ids: Sequence[int], model: str | None, max_tokens: int
    ) -> Continuation: ...


class RadixProposer:
    """Prompt lookup, the tree's continuations, recent outputs (a `Proposer`).

    `add_reference` may be called from any thread: references queue on a deque, and the
    step thread moves them into the index when it next proposes, so only that thread
    ever changes the indexes.
    """

    def __init__(self, lookup: PromptLookup, tree: SuffixIndex, recent: SuffixIndex) -> None:
        self.lookup = lookup
        self.tree = tree
        self.recent = recent
        self._pending: deque[list[int]] = deque()
        self.num_tree_drafts = 0
        """Drafts proposed from the tree's continuations (the step thread counts)."""

    @property
    def context_len(self) -> int:
        """Tokens before a continuation that its reference keeps (the longest suffix
        matched), so a sequence at the end of its prompt matches into it."""
        return self.lookup.max_match_len

    def add_reference(self, token_ids: Sequence[int]) -> None:
        """Text to draft from: a continuation from the tree with the context before it."""
        self._pending.append(list(token_ids))

    def propose(
        self, token_ids: Sequence[int], max_tokens: int, own: NgramIndex | None = None
    ) -> Draft:
        while self._pending:
            self.tree.add(self._pending.popleft())
        mine = self.lookup.propose(token_ids, max_tokens, own)
        if mine.match_len >= self.lookup.max_match_len:
            return mine
        best, source = mine, "own"
        for name, index in (("tree", self.tree), ("recent", self.recent)):
            found = index.lookup(token_ids, max_tokens)
            if found.match_len > best.match_len:
                best, source = found, name
        if source == "tree" and best.token_ids:
            self.num_tree_drafts += 1
        return best if best.token_ids else NO_DRAFT

    def index_for(self) -> NgramIndex:
        return self.lookup.index_for()

    def observe(self, token_ids: Sequence[int], num_prompt_tokens: int = 0) -> None:
        self.recent.defer(token_ids, num_prompt_tokens)

    def take_in(self) -> None:
        self.recent.take_in()


class TreePrefetch:
    """One tree lookup per new sequence of a plan, as a task on the running event loop.

    `on_plan` is called on the loop for each plan before it is submitted. A lookup that
    fails (the cache restarting, a deadline) only means no tree draft for that sequence:
    it is counted in `num_failed` and otherwise ignored.
    """

    def __init__(
        self, proposer: RadixProposer, source: TreeSource, model: str, max_tokens: int
    ) -> None:
        self.proposer = proposer
        self.source = source
        self.model = model
        self.max_tokens = max_tokens
        self.num_lookups = 0
        self.num_found = 0
        self.num_failed = 0
        self.lookup_seconds = 0.0
        """Wall time of every finished lookup, summed (on the loop, not on a step)."""
        self._tasks: set[asyncio.Task[None]] = set()

    def on_plan(self, plan: StepPlan) -> None:
        for new in plan.new_seqs:
            if len(new.token_ids) <= self.proposer.lookup.min_match_len:
                continue
            task = asyncio.get_running_loop().create_task(self.fetch(new.token_ids))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def fetch(self, token_ids: Sequence[int]) -> None:
        """Looks `token_ids` up and hands what follows them in the tree to the proposer."""
        start = time.perf_counter()
        try:
            found = await self.source.continuation(token_ids, self.model, self.max_tokens)
        except RadixmeshError:
            self.num_failed += 1
            return
        finally:
            self.num_lookups += 1
            self.lookup_seconds += time.perf_counter() - start
        if not found.token_ids:
            return
        self.num_found += 1
        matched = found.num_matched_tokens
        context = list(token_ids[max(0, matched - self.proposer.context_len) : matched])
        self.proposer.add_reference(context + found.token_ids)

    async def wait_idle(self) -> None:
        """Until every lookup started so far has finished (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
