"""Stateful property test: random verb sequences keep the cache core's invariants.

Tokens come from a tiny alphabet with a small page size, so prefixes are shared,
edges split and merge-points appear often; the pool is small, so eviction and
ResourceExhausted happen often.
"""

from __future__ import annotations

import hypothesis.strategies as st
from cache_checks import cached_sequences, check_pool
from hypothesis import HealthCheck, settings
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    multiple,
    precondition,
    rule,
)

from radixmesh.errors import ResourceExhausted
from services.cache.core import CacheConfig, CacheCore

PS = 2
NUM_PAGES = 24
TTL = 10.0
HOLDERS = ("h0", "h1")

token_lists = st.lists(st.integers(0, 1), max_size=12)


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def common_full_pages(a: list[int], b: list[int]) -> int:
    return common_prefix(a, b) // PS * PS


class CacheMachine(RuleBasedStateMachine):
    leases = Bundle("leases")

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.core = CacheCore(CacheConfig(lease_ttl_s=TTL), clock=lambda: self.now)
        self.core.register_pool("exec-0", "m", NUM_PAGES, PS)
        self.committed: list[list[int]] = []  # model: every sequence ever committed
        self.live: dict[str, tuple[list[int], str]] = {}  # lease_id -> (acquired tokens, holder)

    def _state(self) -> tuple:
        pool = self.core._pools["exec-0"]
        return (
            pool.allocator.free_page_ids(),
            sorted(map(tuple, cached_sequences(self.core))),
            [n.lock_count for n in pool.tree.iter_nodes()],
            sorted(self.core._leases),
            self.core.stats("exec-0")[0].num_evicted_pages,
        )

    @rule(
        target=leases, tokens=token_lists, extra=st.integers(0, 6), holder=st.sampled_from(HOLDERS)
    )
    def acquire(self, tokens, extra, holder):
        return self._acquire(tokens, extra, holder)

    @precondition(lambda self: self.committed)
    @rule(
        target=leases,
        data=st.data(),
        tail=token_lists,
        extra=st.integers(0, 4),
        holder=st.sampled_from(HOLDERS),
    )
    def acquire_shared(self, data, tail, extra, holder):
        """Acquire a cut of a committed sequence plus new tokens: shared and split prefixes."""
        base = data.draw(st.sampled_from(self.committed))
        cut = data.draw(st.integers(0, len(base)))
        return self._acquire(base[:cut] + tail[:4], extra, holder)

    @rule(
        target=leases,
        data=st.data(),
        tokens=token_lists,
        wide=st.sampled_from([-1, 2**32]),
        extra=st.integers(0, 4),
        holder=st.sampled_from(HOLDERS),
    )
    def acquire_wide(self, data, tokens, wide, extra, holder):
        """Acquire tokens with one id outside uint32: edges packed as int64 then share
        prefixes with (and split against) edges packed as uint32."""
        at = data.draw(st.integers(0, len(tokens)))
        return self._acquire([*tokens[:at], wide, *tokens[at:]], extra, holder)

    def _acquire(self, tokens, extra, holder):
        expected_cached = self.core.match(tokens)["exec-0"]
        before = self._state()
        try:
            lease = self.core.acquire("exec-0", tokens, max(1, len(tokens) + extra), holder)
        except ResourceExhausted:
            assert self._state() == before, "a refused acquire changed state"
            return multiple()
        # match says what acquire reuses (a copy whose page would have to be locked is
        # left out when the pool has no room for that)
        assert lease.num_cached_tokens == expected_cached // PS * PS
        assert lease.num_reused_tokens in (expected_cached, lease.num_cached_tokens)
        assert len(lease.page_ids) * PS >= len(tokens) + extra
        self.live[lease.lease_id] = (tokens, holder)
        return lease.lease_id

    @rule(lease_id=leases, num_pages=st.integers(1, 4))
    def extend(self, lease_id, num_pages):
        if lease_id not in self.live:
            return
        before = self._state()
        try:
            pages = self.core.extend(lease_id, num_pages)
        except ResourceExhausted:
            assert self._state() == before, "a refused extend changed state"
            return
        assert len(pages) == num_pages

    @rule(lease_id=consumes(leases), tail=token_lists, data=st.data())
    def commit(self, lease_id, tail, data):
        if lease_id not in self.live:
            return
        tokens, _ = self.live.pop(lease_id)
        lease = self.core.lease(lease_id)
        capacity = len(lease.page_ids) * PS
        computed = (tokens + tail)[:capacity]
        computed = computed[: data.draw(st.integers(lease.num_cached_tokens, len(computed)))]
        result = self.core.commit(lease_id, computed)
        assert result.num_cached_tokens == len(computed) // PS * PS
        self.committed.append(computed)
        # its full pages, and of its partial last page what the node's tail agrees with
        assert result.num_cached_tokens <= self.core.match(computed)["exec-0"] <= len(computed)

    @rule(lease_id=consumes(leases))
    def release(self, lease_id):
        if lease_id in self.live:
            del self.live[lease_id]
            self.core.release(lease_id)

    @rule(holder=st.sampled_from(HOLDERS))
    def heartbeat(self, holder):
        expected = sum(1 for _, h in self.live.values() if h == holder)
        assert self.core.heartbeat(holder) == expected

    @rule(seconds=st.sampled_from([1.0, 1.0, 4.0, 11.0]))
    def advance_and_expire(self, seconds):
        self.now += seconds
        pool = self.core._pools["exec-0"]
        free_before = set(pool.allocator.free_page_ids())
        own = {lid: set(s.page_ids[s.num_prefix_pages :]) for lid, s in self.core._leases.items()}
        evicted_before = pool.num_evicted_pages
        expired = self.core.expire()
        for lease_id in expired:
            del self.live[lease_id]
        freed = set(pool.allocator.free_page_ids()) - free_before
        assert freed == set().union(*(own[lid] for lid in expired)), "expiry freed other pages"
        assert pool.num_evicted_pages == evicted_before

    @rule(tokens=token_lists)
    def match(self, tokens):
        before = self._state()
        found = self.core.match(tokens)["exec-0"]
        assert self._state() == before, "match changed state"
        # in place whole pages of a committed prefix, then at most a kept partial page
        assert found // PS * PS <= max(
            (common_full_pages(tokens, s) for s in self.committed), default=0
        )
        assert found <= max((common_prefix(tokens, s) for s in self.committed), default=0)

    @invariant()
    def structure_is_consistent(self):
        check_pool(self.core)

    @invariant()
    def tree_holds_only_committed_prefixes(self):
        for cached in cached_sequences(self.core):
            assert any(common_full_pages(cached, s) == len(cached) for s in self.committed)

    @invariant()
    def live_leases_are_known(self):
        assert set(self.core._leases) == set(self.live)


CacheMachine.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestCacheInvariants = CacheMachine.TestCase
