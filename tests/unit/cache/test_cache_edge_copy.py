"""A sequence that continues a cached prefix partway into a whole page (a child's first
page, or the page an edge's match stopped at) is granted a copy of the agreeing slots of
that page, which stays locked until the lease ends."""

from __future__ import annotations

from cache_checks import check_pool

from radixmesh.cache_types import PageCopy

PS = 4


def seq(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def commit(core, tokens: list[int], holder: str = "h") -> list[int]:
    lease = core.acquire("exec-0", tokens, len(tokens), holder)
    core.commit(lease.lease_id, tokens)
    return lease.page_ids


def test_a_prefix_that_ends_inside_an_edge_copies_the_agreeing_slots_of_its_next_page(make_core):
    core = make_core()
    pages = commit(core, seq(100, 12))  # one edge of 3 whole pages
    tokens = [*seq(100, 6), 7, 8]  # 1 page in place, then 2 of the second page agree
    assert core.match(tokens) == {"exec-0": 6}
    lease = core.acquire("exec-0", tokens, 9, "h2")
    assert lease.num_cached_tokens == 4 and lease.page_ids[0] == pages[0]
    assert lease.page_copy == PageCopy(pages[1], lease.page_ids[1], 2)
    assert lease.num_reused_tokens == 6
    # the edge was split after its first page and its rest (the copied page) is locked
    assert core.stats("exec-0")[0].num_locked_pages == 3
    check_pool(core)
    core.release(lease.lease_id)
    assert core.stats("exec-0")[0].num_locked_pages == 0
    check_pool(core)


def test_a_prefix_that_ends_at_a_node_copies_from_the_child_that_agrees_longest(make_core):
    """A fork's join: the context (6 tokens) ends inside the branches' second pages; a
    sequence that continues it otherwise copies the context's slots of one of them."""
    core = make_core()
    context = seq(100, 6)
    branch_pages = [commit(core, [*context, 50 + b, 60 + b, 70, 71]) for b in range(2)]
    joined = [*context, 90, 91, 92]  # leaves every branch after the context
    lease = core.acquire("exec-0", joined, 12, "h2")
    assert lease.num_cached_tokens == 4  # the shared first page in place
    assert lease.page_copy is not None and lease.page_copy.num_tokens == 2
    assert lease.page_copy.src_page_id in {p[1] for p in branch_pages}
    assert core.match(joined) == {"exec-0": 6}
    check_pool(core)
    core.commit(lease.lease_id, [*joined, 93])  # 2 whole pages; the copy's source let go
    assert core.stats("exec-0")[0].num_locked_pages == 0
    check_pool(core)


def test_a_copy_whose_page_would_need_room_to_lock_is_left_out(make_core):
    core = make_core(num_pages=4)
    commit(core, seq(100, 8))  # 2 pages cached, unlocked
    # 3 new pages: the 2 free ones and one evicted, which only the copied page can give
    lease = core.acquire("exec-0", [*seq(100, 5), 0], 16, "h2")
    assert lease.page_copy is None and lease.num_reused_tokens == 4
    assert core.stats("exec-0")[0].num_evicted_pages == 1
    check_pool(core)


def test_without_kept_partial_pages_no_slots_are_copied(make_core):
    core = make_core(keep_partial_pages=False)
    commit(core, seq(100, 12))
    assert core.match([*seq(100, 6), 7, 8]) == {"exec-0": 4}
    lease = core.acquire("exec-0", [*seq(100, 6), 7, 8], 9, "h2")
    assert lease.page_copy is None and lease.num_reused_tokens == 4
