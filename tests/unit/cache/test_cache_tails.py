"""A committed sequence's partial last page (tail): kept, matched, copied, locked, evicted."""

from __future__ import annotations

import pytest
from cache_checks import check_pool

from radixmesh.cache_types import PageCopy
from radixmesh.errors import ResourceExhausted

PS = 4


def seq(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def tail_of(core, tokens: list[int]):
    """The tail kept after the whole pages of `tokens` (None when there is none)."""
    tree = core._pools["exec-0"].tree
    match = tree.walk(tokens)
    assert match.partial is None
    return match.node.tail


def test_commit_keeps_the_partial_page_as_the_tail_of_its_node(make_core):
    core = make_core()
    lease = core.acquire("exec-0", seq(100, 6), 20, "h")  # 5 pages
    tail_page = lease.page_ids[2]
    result = core.commit(lease.lease_id, seq(100, 10))  # 2 full pages + 2 tokens
    assert (result.num_cached_tokens, result.num_new_pages, result.num_freed_pages) == (8, 2, 2)
    tail = tail_of(core, seq(100, 8))
    assert (tail.tokens.tolist(), tail.page_id, tail.num_sources) == ([108, 109], tail_page, 0)
    stats = core.stats("exec-0")[0]
    assert (stats.num_free_pages, stats.num_cached_pages, stats.num_leased_pages) == (13, 3, 0)
    check_pool(core)


def test_a_sequence_shorter_than_a_page_keeps_no_tail(make_core):
    core = make_core()
    lease = core.acquire("exec-0", seq(100, 3), 4, "h")
    result = core.commit(lease.lease_id, seq(100, 3))
    assert result.num_freed_pages == 1
    assert core.stats("exec-0")[0].num_cached_pages == 0
    check_pool(core)


def test_a_match_into_the_tail_gets_a_copy_into_its_first_new_page(make_core):
    core = make_core()
    first = core.acquire("exec-0", seq(100, 10), 12, "h")
    tail_page = first.page_ids[2]
    core.commit(first.lease_id, seq(100, 10))
    before = core.stats("exec-0")[0].num_prefix_hit_tokens

    one = core.acquire("exec-0", seq(100, 9), 12, "h")  # agrees with 1 of the 2 tail tokens
    assert one.num_cached_tokens == 8 and one.num_reused_tokens == 9
    assert one.page_copy == PageCopy(tail_page, one.page_ids[2], 1)
    both = core.acquire("exec-0", [*seq(100, 10), 7, 7], 14, "h")
    assert both.page_copy == PageCopy(tail_page, both.page_ids[2], 2)
    other = core.acquire("exec-0", [*seq(100, 8), 1, 2], 12, "h")  # differs at once
    assert other.page_copy is None and other.num_reused_tokens == 8
    # never shared in place: the tail page is in no lease's page table
    for lease in (one, both, other):
        assert tail_page not in lease.page_ids
    assert core.stats("exec-0")[0].num_prefix_hit_tokens - before == 9 + 10 + 8
    assert tail_of(core, seq(100, 8)).num_sources == 2
    check_pool(core)
    core.release(one.lease_id)
    core.commit(both.lease_id, seq(100, 12))
    assert tail_of(core, seq(100, 8)).num_sources == 0
    check_pool(core)


def test_a_partial_edge_match_copies_nothing(make_core):
    core = make_core()
    first = core.acquire("exec-0", seq(100, 14), 16, "h")
    core.commit(first.lease_id, seq(100, 14))  # 3 pages + tail [112, 113]
    lease = core.acquire("exec-0", [*seq(100, 8), 9, 9, 9], 12, "h")  # stops inside the edge
    assert lease.num_cached_tokens == 8 and lease.page_copy is None
    check_pool(core)


def test_the_source_tail_is_not_replaced_while_a_lease_copies_from_it(make_core):
    core = make_core()
    first = core.acquire("exec-0", seq(100, 10), 12, "h")
    tail_page = first.page_ids[2]
    core.commit(first.lease_id, seq(100, 10))
    reader = core.acquire("exec-0", [*seq(100, 10), 5], 12, "h")
    assert reader.page_copy is not None and reader.page_copy.src_page_id == tail_page
    # another sequence ends at the same node with other text: its page is freed instead
    writer = core.acquire("exec-0", seq(100, 8), 12, "h")
    offered = writer.page_ids[2]
    result = core.commit(writer.lease_id, [*seq(100, 8), 1, 2, 3])
    assert offered in core._pools["exec-0"].allocator.free_page_ids()
    assert result.num_freed_pages == 1  # its only page
    assert tail_of(core, seq(100, 8)).page_id == tail_page
    check_pool(core)
    core.release(reader.lease_id)
    # with no reader left, the newer text replaces it and the old page is freed
    writer = core.acquire("exec-0", seq(100, 8), 12, "h")
    offered = writer.page_ids[2]
    core.commit(writer.lease_id, [*seq(100, 8), 1, 2, 3])
    assert tail_of(core, seq(100, 8)).tokens.tolist() == [1, 2, 3]
    assert tail_of(core, seq(100, 8)).page_id == offered
    assert tail_page in core._pools["exec-0"].allocator.free_page_ids()
    check_pool(core)


def test_a_shorter_tail_of_the_same_text_is_a_duplicate(make_core):
    core = make_core()
    first = core.acquire("exec-0", seq(100, 11), 12, "h")
    core.commit(first.lease_id, seq(100, 11))  # tail [108, 109, 110]
    second = core.acquire("exec-0", seq(100, 8), 12, "h")
    core.commit(second.lease_id, seq(100, 9))  # tail [108]: already covered
    assert tail_of(core, seq(100, 8)).tokens.tolist() == [108, 109, 110]
    check_pool(core)


def test_eviction_takes_a_leafs_tail_first_with_exact_accounting(make_core):
    core = make_core(num_pages=8)
    lease = core.acquire("exec-0", seq(100, 10), 12, "h")
    tail_page = lease.page_ids[2]
    core.commit(lease.lease_id, seq(100, 10))  # 2 pages + tail: 3 cached, 5 free
    grab = core.acquire("exec-0", seq(500, 2), 6 * PS, "h2")  # 6 pages: one eviction
    assert tail_page in grab.page_ids
    assert tail_of(core, seq(100, 8)) is None
    stats = core.stats("exec-0")[0]
    assert (stats.num_evicted_pages, stats.num_cached_pages, stats.num_free_pages) == (1, 2, 0)
    check_pool(core)
    core.release(grab.lease_id)
    grab = core.acquire("exec-0", seq(500, 2), 8 * PS, "h2")  # the rest of the leaf goes too
    assert core.stats("exec-0")[0].num_evicted_pages == 3
    check_pool(core)


def test_a_tail_being_copied_is_locked_against_eviction(make_core):
    core = make_core(num_pages=8)
    lease = core.acquire("exec-0", seq(100, 10), 12, "h")
    tail_page = lease.page_ids[2]
    core.commit(lease.lease_id, seq(100, 10))
    reader = core.acquire("exec-0", seq(100, 10), 12, "h")  # 1 new page, copies the tail
    assert reader.page_copy is not None
    stats = core.stats("exec-0")[0]
    assert (stats.num_locked_pages, stats.num_free_pages) == (3, 4)
    with pytest.raises(ResourceExhausted):
        core.acquire("exec-0", seq(500, 2), 5 * PS, "h2")
    grab = core.acquire("exec-0", seq(500, 2), 4 * PS, "h2")
    assert tail_page not in grab.page_ids
    assert tail_of(core, seq(100, 8)).page_id == tail_page
    check_pool(core)


def test_a_held_context_keeps_its_tail_locked_for_its_continuations(make_core):
    core = make_core()
    lease = core.acquire("exec-0", [], 4 * PS, "sched")
    tail_page = lease.page_ids[3]
    result = core.commit(lease.lease_id, seq(100, 14), keep_locked=True)
    assert result.num_cached_tokens == 12
    stats = core.stats("exec-0")[0]
    assert (stats.num_locked_pages, stats.num_cached_pages, stats.num_leased_pages) == (4, 4, 0)
    branches = [core.acquire("exec-0", [*seq(100, 14), b], 16, "sched") for b in range(3)]
    assert {b.page_copy.src_page_id for b in branches} == {tail_page}  # type: ignore[union-attr]
    assert all(b.page_copy.num_tokens == 2 for b in branches)  # type: ignore[union-attr]
    check_pool(core)
    for b in branches:
        core.release(b.lease_id)
    core.release(lease.lease_id)
    assert core.stats("exec-0")[0].num_locked_pages == 0
    check_pool(core)


def test_a_commit_ending_inside_an_edge_splits_it_for_its_tail(make_core):
    core = make_core()
    first = core.acquire("exec-0", seq(100, 16), 16, "h")
    core.commit(first.lease_id, seq(100, 16))  # one edge of 4 pages
    second = core.acquire("exec-0", seq(100, 8), 12, "h")
    core.commit(second.lease_id, [*seq(100, 8), 1, 2])  # ends after page 2 with its tail
    assert tail_of(core, seq(100, 8)).tokens.tolist() == [1, 2]
    reader = core.acquire("exec-0", [*seq(100, 8), 1, 2, 3], 12, "h")
    assert reader.num_cached_tokens == 8 and reader.page_copy.num_tokens == 2  # type: ignore[union-attr]
    check_pool(core)


def test_tails_off_frees_the_partial_page(make_core):
    core = make_core(keep_partial_pages=False)
    lease = core.acquire("exec-0", seq(100, 10), 12, "h")
    core.commit(lease.lease_id, seq(100, 10))
    assert tail_of(core, seq(100, 8)) is None
    assert core.acquire("exec-0", seq(100, 10), 12, "h").page_copy is None
    check_pool(core)
