"""CacheCore.continuation: the cached tokens that follow a prefix, read-only."""

from __future__ import annotations

import pytest

from radixmesh.cache_types import MAX_CONTINUATION_TOKENS
from radixmesh.errors import InvalidArgument


def cached(core, tokens, pool="exec-0", holder="sched"):
    """Computes `tokens` on a lease of `pool` and commits them (their full pages stay)."""
    lease = core.acquire(pool, tokens, len(tokens), holder)
    core.commit(lease.lease_id, tokens)


def test_continuation_follows_the_matched_prefix_token_by_token(make_core):
    core = make_core(page_size=4)
    earlier = list(range(100, 122))  # 22 tokens: 5 full pages are cached
    cached(core, earlier)
    # A prompt of 6 tokens: one whole page walks, the next two agree token by token.
    found = core.continuation(earlier[:6], "m", max_tokens=8)
    assert (found.executor_id, found.num_matched_tokens) == ("exec-0", 6)
    assert found.token_ids == earlier[6:14]
    # The continuation ends where the cached pages end (the partial last page is not cached).
    assert core.continuation(earlier[:6], None, 100).token_ids == earlier[6:20]
    # Diverging inside the second page: what follows the agreeing part.
    diverged = [*earlier[:5], 7, 7, 7]
    found = core.continuation(diverged, "m", 3)
    assert (found.num_matched_tokens, found.token_ids) == (5, earlier[5:8])


def test_continuation_takes_the_most_recently_used_branch(make_core, clock):
    core = make_core(num_pages=32, page_size=4)
    prompt = [1, 2, 3, 4, 5, 6, 7, 8]
    first, second = [*prompt, 10, 11, 12, 13, 14], [*prompt, 20, 21, 22, 23, 24]
    cached(core, first)
    clock.advance(1)
    cached(core, second)
    assert core.continuation(prompt, "m", 4).token_ids == [20, 21, 22, 23]
    clock.advance(1)
    cached(core, first)  # used again: its branch is the most recent now
    assert core.continuation(prompt, "m", 4).token_ids == [10, 11, 12, 13]
    # A request that already names the branch's first token stays on it.
    assert core.continuation([*prompt, 20], "m", 3).token_ids == [21, 22, 23]


def test_continuation_across_pools_longest_match_wins_and_changes_nothing(make_core):
    core = make_core(page_size=4)
    core.register_pool("exec-1", "m", 16, 4)
    core.register_pool("exec-2", "other-model", 16, 4)
    cached(core, list(range(0, 9)))
    cached(core, list(range(0, 13)), pool="exec-1")
    cached(core, list(range(0, 17)), pool="exec-2")
    before = [(s.num_prefix_queries, s.num_locked_pages, s.num_free_pages) for s in core.stats()]
    found = core.continuation(list(range(0, 8)), "m", 16)
    assert (found.executor_id, found.token_ids) == ("exec-1", [8, 9, 10, 11])
    assert core.continuation(list(range(0, 8)), "other-model", 16).token_ids == list(range(8, 16))
    assert core.continuation(list(range(0, 8)), None, 16).executor_id == "exec-2"
    after = [(s.num_prefix_queries, s.num_locked_pages, s.num_free_pages) for s in core.stats()]
    assert after == before


def test_no_match_no_continuation_and_bad_max_tokens_named(make_core):
    core = make_core(page_size=4)
    cached(core, list(range(0, 12)))
    found = core.continuation([50, 51, 52, 53, 54], "m", 8)
    assert (found.executor_id, found.num_matched_tokens, found.token_ids) == ("", 0, [])
    assert core.continuation([], "m", 8).token_ids == []
    for bad in (0, MAX_CONTINUATION_TOKENS + 1):
        with pytest.raises(InvalidArgument, match="max_tokens"):
            core.continuation([0, 1], "m", bad)
