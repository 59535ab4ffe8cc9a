"""Drafts from the cache's radix tree: the proposer and the per-sequence prefetch."""

from __future__ import annotations

import asyncio
import threading

import pytest

from mesh.engine.ports import InProcessCache
from radixmesh.cache_types import Continuation
from radixmesh.errors import InvalidArgument, Unavailable
from radixmesh.sampling import SamplingParams
from radixmesh.step import NewSequence, StepPlan
from services.cache.core import CacheCore
from services.executor.core.spec import SpeculativeConfig, make_proposer
from services.executor.core.spec.radix import RadixProposer, TreePrefetch

PS = 4


def radix_proposer() -> RadixProposer:
    proposer = make_proposer(SpeculativeConfig(method="radix", min_match_len=2, max_match_len=4))
    assert isinstance(proposer, RadixProposer)
    return proposer


def new_seq(req_id: str, token_ids: list[int]) -> NewSequence:
    return NewSequence(req_id, token_ids, len(token_ids), 0, len(token_ids), [], SamplingParams())


def cache_with(*sequences: list[int]) -> CacheCore:
    """A cache core with pool "exec-1" of model "m" holding each sequence (full pages)."""
    core = CacheCore()
    core.register_pool("exec-1", "m", 64, PS)
    for tokens in sequences:
        lease = core.acquire("exec-1", tokens, len(tokens), "sched")
        core.commit(lease.lease_id, tokens)
    return core


def test_references_from_another_thread_draft_and_the_longest_match_wins() -> None:
    proposer = radix_proposer()
    worker = threading.Thread(target=proposer.add_reference, args=([6, 7, 30, 31, 32],))
    worker.start()
    worker.join()
    assert proposer.propose([1, 6, 7], 3).token_ids == [30, 31, 32]
    assert proposer.num_tree_drafts == 1
    proposer.observe([5, 6, 7, 40, 41])  # a recent output matching one token longer
    proposer.take_in()
    assert proposer.propose([5, 6, 7], 2).token_ids == [40, 41]
    assert proposer.num_tree_drafts == 1
    # Its own context matching as long as the longest suffix: prompt lookup, first.
    assert proposer.propose([1, 2, 3, 4, 0, 1, 2, 3, 4], 2).token_ids == [0, 1]
    assert proposer.propose([70, 71, 72], 2).token_ids == []


async def test_prefetch_hands_the_earlier_output_to_a_repeated_prompt() -> None:
    prompt = list(range(100, 110))
    output = list(range(500, 520))
    proposer = radix_proposer()
    prefetch = TreePrefetch(proposer, InProcessCache(cache_with(prompt + output)), "m", 16)
    # Nothing is known yet: the repeated prompt has no draft of its own.
    assert proposer.propose(prompt, 4).token_ids == []
    prefetch.on_plan(StepPlan(1, new_seqs=[new_seq("b", prompt), new_seq("short", [1])]))
    await prefetch.wait_idle()
    assert (prefetch.num_lookups, prefetch.num_found, prefetch.num_failed) == (1, 1, 0)
    assert proposer.propose(prompt, 4).token_ids == output[:4]
    # Later, having followed the earlier output for a while, it still drafts from it.
    assert proposer.propose(prompt + output[:9], 4).token_ids == output[9:13]
    assert proposer.num_tree_drafts == 2


class FailingSource:
    async def continuation(self, token_ids, model, max_tokens) -> Continuation:
        await asyncio.sleep(0)
        raise Unavailable("cache: connection refused")


async def test_a_failed_lookup_only_means_no_tree_draft() -> None:
    proposer = radix_proposer()
    prefetch = TreePrefetch(proposer, FailingSource(), "m", 16)
    prefetch.on_plan(StepPlan(1, new_seqs=[new_seq("a", list(range(10)))]))
    await prefetch.wait_idle()
    assert (prefetch.num_lookups, prefetch.num_found, prefetch.num_failed) == (1, 0, 1)
    assert proposer.propose(list(range(10)), 4).token_ids == []


def test_radix_method_and_its_tree_length_are_validated() -> None:
    with pytest.raises(InvalidArgument, match="max_tree_tokens"):
        SpeculativeConfig(method="radix", max_tree_tokens=0)
    assert SpeculativeConfig(method="radix").enabled
