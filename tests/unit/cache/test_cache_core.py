"""Each verb of the cache core, and each of its errors."""

from __future__ import annotations

import pytest
from cache_checks import cached_sequences, check_pool

from radixmesh.errors import InvalidArgument, NotFound, ResourceExhausted
from services.cache.core import EVICTION_POLICIES, CacheConfig, CacheCore, LRUPolicy

PS = 4  # page size of the default test pool


def seq(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def committed(core: CacheCore, tokens: list[int], extra: int = 0, holder: str = "h") -> None:
    """Acquire pages for `tokens` (+ extra), then commit `tokens` as computed."""
    lease = core.acquire("exec-0", tokens, len(tokens) + extra, holder)
    core.commit(lease.lease_id, tokens)


def snapshot(core: CacheCore) -> tuple:
    pool = core._pools["exec-0"]
    return (
        core.stats("exec-0")[0].num_free_pages,
        pool.allocator.free_page_ids(),
        sorted(map(tuple, cached_sequences(core))),
        [(n.lock_count, n.last_access) for n in pool.tree.iter_nodes()],
        dict(core._leases),
    )


# ---- register / unregister ----


def test_register_is_idempotent_for_same_geometry(make_core):
    core = make_core()
    committed(core, seq(100, 8))
    core.register_pool("exec-0", "m", 16, PS)
    assert core.match(seq(100, 8)) == {"exec-0": 8}


def test_register_with_new_geometry_resets_pool_and_drops_leases(make_core):
    core = make_core()
    committed(core, seq(100, 8))
    lease = core.acquire("exec-0", seq(100, 8), 12, "h")
    core.register_pool("exec-0", "m", 32, PS)
    assert core.match(seq(100, 8)) == {"exec-0": 0}
    assert core.stats("exec-0")[0].num_free_pages == 32
    with pytest.raises(NotFound, match="lease_id"):
        core.release(lease.lease_id)


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (("", "m", 8, 4), "executor_id"),
        (("e", "", 8, 4), "model"),
        (("e", "m", 0, 4), "num_pages"),
        (("e", "m", 8, 0), "page_size"),
    ],
)
def test_register_rejects_bad_arguments_naming_the_field(make_core, args, field):
    with pytest.raises(InvalidArgument, match=field):
        make_core(num_pages=0).register_pool(*args)


def test_unregister_drops_leases_and_unknown_pool_is_not_found(make_core):
    core = make_core()
    core.acquire("exec-0", seq(0, 8), 8, "h")
    core.acquire("exec-0", seq(50, 8), 8, "h")
    assert core.unregister_pool("exec-0") == 2
    assert core.heartbeat("h") == 0
    for call in (
        lambda: core.unregister_pool("exec-0"),
        lambda: core.stats("exec-0"),
        lambda: core.acquire("exec-0", [1], 1, "h"),
    ):
        with pytest.raises(NotFound, match="exec-0"):
            call()


def test_config_rejects_unknown_policy_and_bad_ttl():
    with pytest.raises(InvalidArgument, match="eviction_policy"):
        CacheConfig(eviction_policy="random")
    with pytest.raises(InvalidArgument, match="lease_ttl_s"):
        CacheConfig(lease_ttl_s=0)


# ---- match ----


def test_match_reports_what_acquire_reuses_and_filters_by_model(make_core):
    core = make_core()
    core.register_pool("exec-1", "other", 16, PS)
    committed(core, seq(100, 10))  # 2 full pages + a partial tail of 2 tokens
    assert core.match(seq(100, 10)) == {"exec-0": 10, "exec-1": 0}  # 8 in place, 2 copied
    assert core.match([*seq(100, 9), 0, 0]) == {"exec-0": 9, "exec-1": 0}  # 1 of the tail
    # inside an edge: the whole page in place, the agreeing slots of the next page copied
    assert core.match(seq(100, 7)) == {"exec-0": 7, "exec-1": 0}
    assert core.match([*seq(100, 5), 0, 0, 0]) == {"exec-0": 5, "exec-1": 0}
    assert core.match(seq(100, 10), model="m") == {"exec-0": 10}
    assert core.match(seq(100, 3)) == {"exec-0": 0, "exec-1": 0}


@pytest.mark.parametrize(
    "tokens",
    [seq(100, 10), [*seq(100, 9), 0, 0], seq(100, 9), seq(100, 8), seq(100, 7), [100, 0]],
    ids=["whole-tail", "part-of-tail", "tail-prefix", "at-node", "in-edge", "diverged"],
)
def test_match_equals_the_tokens_an_acquire_reuses(make_core, tokens):
    core = make_core()
    committed(core, seq(100, 10))
    matched = core.match(tokens)["exec-0"]
    lease = core.acquire("exec-0", tokens, len(tokens) + 1, "h2")
    assert matched == lease.num_reused_tokens
    assert lease.num_cached_tokens % PS == 0  # in place: whole pages only


def test_match_without_kept_partial_pages_reports_whole_pages(make_core):
    core = make_core(keep_partial_pages=False)
    committed(core, seq(100, 10))
    assert core.match(seq(100, 10)) == {"exec-0": 8}


def test_match_changes_no_tree_state_but_counts_queries(make_core):
    core = make_core()
    committed(core, seq(100, 8))
    before, stats_before = snapshot(core), core.stats("exec-0")[0]
    core.match([*seq(100, 6), 1, 2])
    assert snapshot(core) == before
    stats = core.stats("exec-0")[0]
    assert stats.num_prefix_queries == stats_before.num_prefix_queries + 1
    assert stats.num_query_tokens == stats_before.num_query_tokens + 8
    # a page in place and the 2 agreeing slots of the next one (an acquire copies them)
    assert stats.num_prefix_hit_tokens == stats_before.num_prefix_hit_tokens + 6


# ---- acquire ----


def test_acquire_locks_cached_prefix_and_leases_the_rest(make_core):
    core = make_core()
    first = core.acquire("exec-0", seq(100, 12), 12, "h")
    assert (first.num_cached_tokens, len(first.page_ids)) == (0, 3)
    core.commit(first.lease_id, seq(100, 12))
    lease = core.acquire("exec-0", seq(100, 12), 18, "h")
    assert lease.num_cached_tokens == 12
    assert lease.page_ids[:3] == first.page_ids
    assert len(lease.page_ids) == 5  # ceil(18 / 4)
    stats = core.stats("exec-0")[0]
    assert (stats.num_locked_pages, stats.num_leased_pages, stats.num_leases) == (3, 2, 1)
    check_pool(core)


def test_acquire_on_a_partial_edge_locks_only_the_matched_pages(make_core):
    core = make_core()
    committed(core, seq(100, 16))
    lease = core.acquire("exec-0", [*seq(100, 8), 7, 7, 7, 7], 12, "h")
    assert lease.num_cached_tokens == 8
    assert core.stats("exec-0")[0].num_locked_pages == 2
    check_pool(core)


def test_acquire_rejects_bad_arguments(make_core):
    core = make_core()
    with pytest.raises(InvalidArgument, match="num_tokens"):
        core.acquire("exec-0", seq(0, 8), 7, "h")
    with pytest.raises(InvalidArgument, match="holder"):
        core.acquire("exec-0", seq(0, 8), 8, "")
    with pytest.raises(NotFound, match="nope"):
        core.acquire("nope", seq(0, 8), 8, "h")


def test_acquire_when_full_raises_and_changes_nothing(make_core):
    core = make_core(num_pages=8)
    committed(core, seq(100, 16))  # 4 cached pages, evictable
    held = core.acquire("exec-0", seq(100, 16), 24, "h")  # locks 4, leases 2
    before = snapshot(core)
    with pytest.raises(ResourceExhausted, match="pages needed"):
        core.acquire("exec-0", seq(100, 8), 8 + 4 * PS, "h")  # needs 4 new, only 2 free
    assert snapshot(core) == before
    with pytest.raises(ResourceExhausted):
        core.extend(held.lease_id, 3)
    assert snapshot(core) == before
    check_pool(core)


def test_acquire_evicts_least_recently_used_unlocked_leaves(make_core, clock):
    core = make_core(num_pages=8)
    a, b = seq(100, 8), seq(200, 8)
    committed(core, a)
    clock.advance(1)
    committed(core, b)
    clock.advance(1)
    committed(core, a)  # a is used again: b is now the least recently used
    clock.advance(1)
    lease = core.acquire("exec-0", seq(300, 8), 4 * PS + 8, "h")  # 6 pages: 4 free + evict 2
    assert core.match(a)["exec-0"] == 8
    assert core.match(b)["exec-0"] == 0
    assert core.stats("exec-0")[0].num_evicted_pages == 2
    core.release(lease.lease_id)
    check_pool(core)


def test_locked_prefix_is_never_evicted(make_core, clock):
    core = make_core(num_pages=8)
    committed(core, seq(100, 8))
    clock.advance(1)
    committed(core, seq(200, 8))
    held = core.acquire("exec-0", seq(100, 8), 8, "h")  # locks the older prefix
    clock.advance(1)
    with pytest.raises(ResourceExhausted):
        core.acquire("exec-0", [], 7 * PS, "h")
    lease = core.acquire("exec-0", [], 6 * PS, "h")
    assert core.match(seq(100, 8))["exec-0"] == 8
    assert core.match(seq(200, 8))["exec-0"] == 0
    check_pool(core)
    core.release(held.lease_id)
    core.release(lease.lease_id)
    check_pool(core)


# ---- extend ----


def test_extend_appends_new_pages(make_core):
    core = make_core()
    lease = core.acquire("exec-0", seq(0, 4), 4, "h")
    pages = core.extend(lease.lease_id, 2)
    assert len(pages) == 2 and not set(pages) & set(lease.page_ids)
    assert core.lease(lease.lease_id).page_ids == lease.page_ids + pages
    assert core.stats("exec-0")[0].num_leased_pages == 3
    with pytest.raises(InvalidArgument, match="num_pages"):
        core.extend(lease.lease_id, 0)
    with pytest.raises(NotFound, match="lease_id"):
        core.extend("no-such-lease", 1)
    check_pool(core)


# ---- commit ----


def test_commit_inserts_full_pages_and_frees_tail_and_unused_pages(make_core):
    core = make_core(keep_partial_pages=False)  # a partial last page is freed
    lease = core.acquire("exec-0", seq(100, 6), 20, "h")  # 5 pages
    result = core.commit(lease.lease_id, seq(100, 10))  # 2 full pages + 2 tokens
    assert (result.num_cached_tokens, result.num_new_pages, result.num_freed_pages) == (8, 2, 3)
    assert cached_sequences(core) == [seq(100, 8)]
    stats = core.stats("exec-0")[0]
    assert (stats.num_free_pages, stats.num_cached_pages, stats.num_leases) == (14, 2, 0)
    with pytest.raises(NotFound):
        core.commit(lease.lease_id, seq(100, 10))
    check_pool(core)


def test_commit_deduplicates_pages_inserted_by_another_lease(make_core):
    core = make_core(keep_partial_pages=False)  # a partial last page is freed
    tokens = seq(100, 12)
    first = core.acquire("exec-0", tokens, 12, "h")
    second = core.acquire("exec-0", tokens, 14, "h")  # nothing cached yet: computes it too
    core.commit(first.lease_id, tokens)
    result = core.commit(second.lease_id, [*tokens, 1, 2])  # its own copy is a duplicate
    assert (result.num_deduplicated_pages, result.num_new_pages, result.num_cached_tokens) == (
        3,
        0,
        12,
    )
    assert result.num_freed_pages == 4  # the three duplicates and the partial tail
    assert core.acquire("exec-0", tokens, 12, "h").page_ids == first.page_ids
    assert core.stats("exec-0")[0].num_cached_pages == 3
    check_pool(core)


def test_commit_that_diverges_inside_an_edge_splits_it(make_core):
    core = make_core()
    committed(core, seq(100, 16))
    lease = core.acquire("exec-0", [], 16, "h")
    other = [*seq(100, 8), *seq(900, 8)]
    result = core.commit(lease.lease_id, other)
    assert (result.num_new_pages, result.num_deduplicated_pages) == (2, 2)
    assert sorted(cached_sequences(core)) == sorted([seq(100, 16), other])
    assert core.match(other)["exec-0"] == 16
    check_pool(core)


def test_commit_rejects_tokens_outside_the_lease(make_core):
    core = make_core()
    committed(core, seq(100, 8))
    lease = core.acquire("exec-0", seq(100, 8), 12, "h")
    with pytest.raises(InvalidArgument, match="exceed"):
        core.commit(lease.lease_id, seq(100, 13))
    with pytest.raises(InvalidArgument, match="cached prefix"):
        core.commit(lease.lease_id, seq(100, 4))
    with pytest.raises(InvalidArgument, match="do not start with"):
        core.commit(lease.lease_id, [*seq(100, 4), 0, 0, 0, 0, 1])
    core.commit(lease.lease_id, seq(100, 12))
    check_pool(core)


# ---- release ----


def test_release_frees_own_pages_and_unlocks_without_inserting(make_core):
    core = make_core()
    committed(core, seq(100, 8))
    lease = core.acquire("exec-0", seq(100, 8), 16, "h")
    core.release(lease.lease_id)
    stats = core.stats("exec-0")[0]
    assert (stats.num_free_pages, stats.num_locked_pages, stats.num_leased_pages) == (14, 0, 0)
    assert cached_sequences(core) == [seq(100, 8)]
    with pytest.raises(NotFound):
        core.release(lease.lease_id)
    check_pool(core)


# ---- heartbeat / expire ----


def test_expire_frees_leases_of_a_silent_holder_only(make_core, clock):
    core = make_core(lease_ttl_s=10)
    committed(core, seq(100, 8))
    quiet = core.acquire("exec-0", seq(100, 8), 16, "quiet")
    alive = core.acquire("exec-0", seq(200, 8), 8, "alive")
    free_before = set(core._pools["exec-0"].allocator.free_page_ids())
    clock.advance(6)
    assert core.heartbeat("alive") == 1
    assert core.expire() == []
    clock.advance(6)  # quiet: 12 s since acquire; alive: 6 s since its heartbeat
    assert core.expire() == [quiet.lease_id]
    freed = set(core._pools["exec-0"].allocator.free_page_ids()) - free_before
    assert freed == set(quiet.page_ids[2:])  # its own pages, not the shared prefix
    assert core.lease(alive.lease_id).page_ids == alive.page_ids
    assert core.heartbeat("quiet") == 0
    assert core.expire(now=clock.now + 100) == [alive.lease_id]
    assert core.stats("exec-0")[0].num_leases == 0
    check_pool(core)


def test_heartbeat_rejects_empty_holder(make_core):
    with pytest.raises(InvalidArgument, match="holder"):
        make_core().heartbeat("")


# ---- stats / policy ----


def test_stats_of_every_pool(make_core):
    core = make_core()
    core.register_pool("exec-1", "m", 8, 2)
    ids = [(s.executor_id, s.num_pages, s.page_size, s.num_free_pages) for s in core.stats()]
    assert ids == [("exec-0", 16, 4, 16), ("exec-1", 8, 2, 8)]


class _MostRecentFirst(LRUPolicy):
    def priority(self, node):
        return -node.last_access


def test_eviction_policy_plugs_in_by_name(clock, monkeypatch):
    monkeypatch.setitem(EVICTION_POLICIES, "mru", _MostRecentFirst)
    core = CacheCore(CacheConfig(eviction_policy="mru"), clock=clock)
    core.register_pool("exec-0", "m", 4, PS)
    committed(core, seq(100, 8))
    clock.advance(1)
    committed(core, seq(200, 8))
    core.acquire("exec-0", [], 2 * PS, "h")
    assert core.match(seq(100, 8))["exec-0"] == 8
    assert core.match(seq(200, 8))["exec-0"] == 0


def test_eviction_trims_only_the_tail_pages_it_needs(make_core):
    core = make_core(num_pages=8)
    committed(core, seq(100, 24))  # one leaf of 6 pages; 2 pages free
    lease = core.acquire("exec-0", [], 3 * PS, "h")  # needs 1 page more than is free
    assert core.match(seq(100, 24))["exec-0"] == 20
    assert core.stats("exec-0")[0].num_evicted_pages == 1
    check_pool(core)
    core.release(lease.lease_id)
    assert core.acquire("exec-0", seq(100, 24), 24, "h").num_cached_tokens == 20
    check_pool(core)


# ---- token ids: packed edges ----


def test_ids_outside_uint32_are_cached_and_meet_uint32_edges_by_value(make_core):
    core = make_core()
    wide = [*seq(100, 4), -1, 2**32, 2**63 - 1, 7]  # packed as int64
    committed(core, wide)
    assert cached_sequences(core) == [wide]
    assert core.match(wide)["exec-0"] == 8
    narrow = [*seq(100, 4), *seq(200, 4)]  # packed as uint32: shares the first page
    lease = core.acquire("exec-0", narrow, 8, "h")
    assert lease.num_cached_tokens == 4
    core.commit(lease.lease_id, narrow)
    assert sorted(cached_sequences(core)) == sorted([wide, narrow])
    assert core.match(narrow)["exec-0"] == 8  # through the split edge, still packed as int64
    # the whole page in place, then the 3 agreeing slots of the next page copied
    assert core.match([*seq(100, 4), -1, 2**32, 2**63 - 1, 8])["exec-0"] == 7
    check_pool(core)


def test_token_ids_that_are_not_int64_integers_are_invalid_and_change_nothing(make_core):
    core = make_core()
    committed(core, seq(100, 8))
    lease = core.acquire("exec-0", seq(100, 4), 12, "h")
    before = snapshot(core)
    for bad in ([*seq(100, 4), 1.5, 0, 0, 0], [*seq(100, 4), 2**63, 0, 0, 0], [*seq(100, 3), "x"]):
        with pytest.raises(InvalidArgument, match="token_ids"):
            core.commit(lease.lease_id, bad)
        assert snapshot(core) == before
    with pytest.raises(InvalidArgument, match="token_ids"):
        core.match([*seq(100, 3), 103.0])  # equal to the cached page's key, then packed
    core.commit(lease.lease_id, seq(100, 12))
    check_pool(core)


def test_tokens_given_as_arrays_act_as_lists(make_core):
    from array import array

    as_list, as_array = make_core(), make_core()
    for tokens in ([*seq(100, 8), 5, 6, 7, 8], [*seq(100, 6), -3, 4]):
        committed(as_list, tokens)
        packed = array("q", tokens)
        lease = as_array.acquire("exec-0", packed, len(packed), "h")
        as_array.commit(lease.lease_id, packed)
        assert as_array.match(array("q", tokens)) == as_list.match(tokens)
    assert sorted(cached_sequences(as_array)) == sorted(cached_sequences(as_list))
    check_pool(as_array)
