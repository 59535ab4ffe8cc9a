"""Commit with keep_locked: the lease lives on as a lock on the committed path (a hold)."""

from __future__ import annotations

import pytest
from cache_checks import check_pool

from radixmesh.errors import NotFound, ResourceExhausted

PS = 4


def seq(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def test_a_kept_lease_locks_exactly_the_committed_pages(make_core):
    core = make_core(num_pages=16, keep_partial_pages=False)
    lease = core.acquire("exec-0", [], 20, "sched")  # 5 pages
    result = core.commit(lease.lease_id, seq(100, 14), keep_locked=True)
    assert result.num_cached_tokens == 12
    stats = core.stats("exec-0")[0]
    # 3 full pages in the tree and locked; the partial tail page and the unused one freed
    assert (stats.num_leases, stats.num_locked_pages, stats.num_leased_pages) == (1, 3, 0)
    assert (stats.num_cached_pages, stats.num_free_pages) == (3, 13)
    kept = core.lease(lease.lease_id)
    assert kept.num_cached_tokens == 12 and len(kept.page_ids) == 3
    check_pool(core)
    core.release(lease.lease_id)
    stats = core.stats("exec-0")[0]
    assert (stats.num_leases, stats.num_locked_pages, stats.num_cached_pages) == (0, 0, 3)
    check_pool(core)


def test_held_pages_are_never_evicted(make_core):
    core = make_core(num_pages=8)
    hold = core.acquire("exec-0", [], 16, "sched")
    core.commit(hold.lease_id, seq(0, 16), keep_locked=True)  # 4 pages held
    other = core.acquire("exec-0", [], 8, "sched")
    core.commit(other.lease_id, seq(500, 8))  # 2 evictable pages
    big = core.acquire("exec-0", [], 16, "sched")  # needs the 2 free and the 2 evictable
    assert core.match(seq(0, 16)) == {"exec-0": 16}
    assert core.match(seq(500, 8)) == {"exec-0": 0}
    with pytest.raises(ResourceExhausted):
        core.acquire("exec-0", [], 4, "sched")  # only held or leased pages are left
    core.release(big.lease_id)
    check_pool(core)


def test_a_hold_over_a_shared_prefix_and_a_replacement(make_core):
    """A second hold extends the first one's path; the new lock is taken before the old
    one is dropped, and dropping the old one leaves the new path locked."""
    core = make_core(num_pages=16)
    first = core.acquire("exec-0", [], 8, "sched")
    core.commit(first.lease_id, seq(0, 8), keep_locked=True)
    second = core.acquire("exec-0", seq(0, 8), 16, "sched")
    assert second.num_cached_tokens == 8
    core.commit(second.lease_id, seq(0, 16), keep_locked=True)
    assert core.stats("exec-0")[0].num_locked_pages == 4
    core.release(first.lease_id)
    assert core.stats("exec-0")[0].num_locked_pages == 4  # the longer hold covers the prefix
    check_pool(core)
    core.release(second.lease_id)
    assert core.stats("exec-0")[0].num_locked_pages == 0


def test_a_kept_lease_expires_with_its_holder(make_core, clock):
    core = make_core(num_pages=16, lease_ttl_s=10.0)
    lease = core.acquire("exec-0", [], 8, "sched")
    clock.advance(8)
    core.commit(lease.lease_id, seq(0, 8), keep_locked=True)  # renews the holder
    clock.advance(8)
    assert core.expire() == []
    assert core.heartbeat("sched") == 1
    clock.advance(11)
    assert core.expire() == [lease.lease_id]
    with pytest.raises(NotFound):
        core.release(lease.lease_id)
    assert core.stats("exec-0")[0].num_locked_pages == 0
    check_pool(core)


def test_a_kept_lease_reports_the_pages_it_locks_its_partial_page_included(make_core):
    core = make_core(num_pages=16)
    lease = core.acquire("exec-0", [], 20, "sched")  # 5 pages
    result = core.commit(lease.lease_id, seq(100, 14), keep_locked=True)
    assert result.num_cached_tokens == 12
    stats = core.stats("exec-0")[0]
    # 3 full pages and the 2 tokens' partial page kept and locked; the unused page freed
    assert (stats.num_locked_pages, stats.num_cached_pages, stats.num_free_pages) == (4, 4, 12)
    assert result.num_locked_pages == stats.num_locked_pages == 4
    assert core.commit(core.acquire("exec-0", [], 4, "s2").lease_id, seq(0, 3)).num_locked_pages == 0
    check_pool(core)


def test_a_hold_over_a_held_context_counts_the_partial_pages_on_its_path(make_core):
    """A context held with a partial page, then a longer hold over it (its own partial
    page too): the longer lock holds both tails, which the result counts."""
    core = make_core(num_pages=16)
    first = core.acquire("exec-0", [], 8, "sched")
    assert core.commit(first.lease_id, seq(0, 6), keep_locked=True).num_locked_pages == 2
    # a branch that leaves the context after its whole page: the context's tail stays
    second = core.acquire("exec-0", seq(0, 4), 12, "sched")
    branch = [*seq(0, 4), *seq(50, 6)]
    result = core.commit(second.lease_id, branch, keep_locked=True)
    # the shared page, the context's tail (on the node both paths go through) and the
    # branch's whole page and tail
    assert result.num_locked_pages == 4
    assert core.stats("exec-0")[0].num_locked_pages == 4
    core.release(first.lease_id)
    assert core.stats("exec-0")[0].num_locked_pages == 4  # the second lock holds them all
    core.release(second.lease_id)
    assert core.stats("exec-0")[0].num_locked_pages == 0
    check_pool(core)
