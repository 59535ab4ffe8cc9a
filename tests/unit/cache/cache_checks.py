"""Structural checks of a cache core, computed from its parts (not from its own counters)."""

from __future__ import annotations

from services.cache.core import CacheCore


def check_pool(core: CacheCore, executor_id: str = "exec-0") -> None:
    pool = core._pools[executor_id]
    tree = pool.tree
    ps = pool.page_size
    free = pool.allocator.free_page_ids()
    cached: list[int] = []
    locked_pages = 0
    expected_locks: dict[int, int] = {}
    sources: dict[int, int] = {}
    for state in pool.leases.values():
        if state.source is not None:
            assert state.node.tail is state.source, "a lease copies from a tail not of its node"
            sources[id(state.source)] = sources.get(id(state.source), 0) + 1
            assert state.page_copy is not None
            assert state.page_copy.src_page_id == state.source.page_id
            assert state.page_copy.dst_page_id == state.page_ids[state.num_prefix_pages]
        if state.source_node is not None:  # it copies the first page of this node's edge
            assert state.source is None and state.page_copy is not None
            assert state.page_copy.dst_page_id == state.page_ids[state.num_prefix_pages]
            # below the prefix (a later split may put a node between): its next page
            path = tree.path_page_ids(state.source_node)
            assert path[: state.num_prefix_pages] == state.page_ids[: state.num_prefix_pages]
            assert path[state.num_prefix_pages] == state.page_copy.src_page_id
        for locked in (state.node, state.source_node):
            node = locked
            while node is not None and node.parent is not None:
                expected_locks[id(node)] = expected_locks.get(id(node), 0) + 1
                node = node.parent
            assert node is None or node is tree.root, "a locked node was detached (evicted)"
        assert tree.path_page_ids(state.node) == state.page_ids[: state.num_prefix_pages]
        assert state.num_cached_tokens == state.num_prefix_pages * ps
    for node in tree.iter_nodes():
        assert node.lock_count >= 0
        assert node.lock_count == expected_locks.get(id(node), 0)
        assert len(node.tokens) == len(node.page_ids) * ps and node.page_ids
        assert node.key == tuple(node.tokens[:ps])
        assert node.parent.children[node.key] is node
        cached += node.page_ids
        if node.tail is not None:
            assert 0 < len(node.tail.tokens) < ps
            assert node.tail.num_sources == sources.get(id(node.tail), 0)
            cached.append(node.tail.page_id)
        if node.lock_count:
            locked_pages += node.num_pages
    leased = [p for s in pool.leases.values() for p in s.page_ids[s.num_prefix_pages :]]
    everything = free + cached + leased
    assert len(everything) == len(set(everything)), "a page is in two places"
    assert sorted(everything) == list(range(pool.num_pages)), "pages are not conserved"
    stats = core.stats(executor_id)[0]
    assert stats.num_free_pages == len(free)
    assert stats.num_cached_pages == len(cached)
    assert stats.num_leased_pages == len(leased)
    assert stats.num_locked_pages == locked_pages
    assert stats.num_leases == len(pool.leases)


def cached_sequences(core: CacheCore, executor_id: str = "exec-0") -> list[list[int]]:
    """Every root-to-leaf token sequence in the pool's tree."""
    tree = core._pools[executor_id].tree
    out = []
    stack = [(tree.root, [])]
    while stack:
        node, prefix = stack.pop()
        tokens = prefix + node.tokens.tolist()
        if not node.children and node is not tree.root:
            out.append(tokens)
        stack.extend((child, tokens) for child in node.children.values())
    return out
