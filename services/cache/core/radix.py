"""A page-granular radix tree over token sequences.

Every node holds whole pages: `tokens` is a multiple of `page_size` long and `page_ids`
has one id per page of it. Children are keyed by the tuple of their first page's tokens,
so walking costs one dict lookup per node plus one comparison per edge (C speed), never a
Python loop over tokens. Match lengths are multiples of `page_size`.

Edges keep their tokens packed (`array`, 4 bytes a token id when ids are in [0, 2**32)),
not as lists of int objects: comparing a request with an edge packs the request's tokens
once and compares machine words, and evicting an edge frees one buffer instead of one int
object per token. Arrays of different type codes compare by value, so the rare edge
packed as int64 (a negative id) still matches correctly.

A node's `lock_count` is the number of leases holding it (a lease locks its whole path
to the root), so an unlocked node has only unlocked descendants. Only unlocked leaves
are evicted; the tree keeps `num_cached_pages` and `num_locked_pages` up to date
incrementally.

A node may also keep a partial page after its whole pages (`tail`: one page holding the
first t < page_size tokens that followed it in a committed sequence). A tail is never
shared in place: the next sequence writes into the rest of its page. A sequence that
matches the node and then agrees with i >= 1 tokens of its tail copies those tokens' KV
into its own first new page instead of computing them (`tail_match`). A tail counts as
one of its node's pages (cached, locked with the node, evicted first when the node is a
victim) and is never freed while a lease still has to copy from it (`num_sources`).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

from radixmesh.errors import InvalidArgument
from services.cache.core.eviction import EvictionPolicy


def pack_tokens(tokens: Sequence[int]) -> array:
    """Read-only: `tokens` (a list or an array) packed as uint32, or as int64 when an id
    does not fit. InvalidArgument names `token_ids` when an id is not an integer in int64."""
    try:
        if type(tokens) is not list:
            return array("I", tokens)  # a copy without conversion from a uint32 array
        packed = array("I")
        packed.fromlist(tokens)  # a quarter faster than array("I", tokens) on a list
        return packed
    except OverflowError:
        pass  # a negative id or one >= 2**32: the slower signed 64-bit packing
    except TypeError as exc:
        raise InvalidArgument(f"token_ids must be integers: {exc}") from None
    try:
        return array("q", tokens)
    except (OverflowError, TypeError):
        raise InvalidArgument("token_ids must be integers in [-2**63, 2**63)") from None


@dataclass(slots=True, eq=False)
class Tail:
    """A node's partial last page: `tokens` (1 to page_size - 1 of them) fill its first
    slots of page `page_id`."""

    tokens: array
    page_id: int
    num_sources: int = 0
    """Leases that copy from this page and have not ended: it is kept while any does."""


@dataclass(slots=True, eq=False)
class RadixNode:
    parent: RadixNode | None
    """None for the root and for a node that was evicted (detached)."""
    key: tuple[int, ...]
    """The first page's tokens: this node's key in `parent.children`."""
    tokens: array
    """Packed token ids (see `pack_tokens`), whole pages."""
    page_ids: list[int]
    last_access: float
    children: dict[tuple[int, ...], RadixNode] = field(default_factory=dict)
    lock_count: int = 0
    tail: Tail | None = None
    """The partial page after `tokens`, if kept (never on the root)."""

    @property
    def num_pages(self) -> int:
        """Pages this node holds: its whole pages and its tail's."""
        return len(self.page_ids) + (self.tail is not None)


@dataclass(slots=True)
class TreeMatch:
    """Where a walk stopped (read-only result of `RadixTree.walk`)."""

    node: RadixNode
    """The deepest node matched in full."""
    num_tokens: int
    """Tokens matched in total (a multiple of page_size), including `partial_pages`."""
    partial: RadixNode | None = None
    """A child of `node` whose first `partial_pages` pages also match, if any."""
    partial_pages: int = 0


MAX_COPY_CHILDREN = 64
"""Children compared token by token for a partial-page copy (`RadixTree.copy_source`);
past this many only the node's tail is (a bound on the cost of an acquire at a wide node)."""


@dataclass(slots=True)
class CopySource:
    """Where the tokens after a match are found in the first slots of a cached page."""

    num_tokens: int
    """Tokens after the match that agree with the page's first slots (1 to page_size - 1)."""
    page_id: int
    tail: Tail | None = None
    """The page is the match's node's kept partial page..."""
    node: RadixNode | None = None
    """...or the first page of this node's edge after the match (a child of the match's
    node, or the node a partial match ends inside, which `split_match` makes a child)."""


@dataclass(slots=True)
class InsertResult:
    """What `RadixTree.insert` did with the pages it was offered."""

    num_new_pages: int
    """Pages that became part of the tree."""
    duplicate_page_ids: list[int]
    """Offered pages whose tokens the tree already held; the caller frees them."""
    end: RadixNode | None = None
    """With `split_end`: the node whose path ends exactly at the inserted tokens."""


class RadixTree:
    """The cached prefixes of one pool. Not thread-safe; the core runs on one event loop."""

    def __init__(self, page_size: int, policy: EvictionPolicy, now: float = 0.0) -> None:
        self.page_size = page_size
        self.policy = policy
        self.root = RadixNode(parent=None, key=(), tokens=array("I"), page_ids=[], last_access=now)
        self.num_cached_pages = 0
        self.num_locked_pages = 0
        self.num_nodes = 0

    # ---- read-only ----

    def walk(self, tokens: Sequence[int]) -> TreeMatch:
        """Read-only: the longest cached prefix of `tokens` (a list or an array; full
        pages only). Packs only the tokens it compares with an edge."""
        ps = self.page_size
        end = len(tokens) // ps * ps
        node = self.root
        pos = 0
        while pos < end:
            child = node.children.get(tuple(tokens[pos : pos + ps]))
            if child is None:
                break
            edge = child.tokens
            num_tokens = min(len(edge), end - pos)
            packed = pack_tokens(tokens[pos : pos + num_tokens])
            if num_tokens == len(edge) and packed == edge:
                node = child
                pos += num_tokens
                continue
            num_pages = _num_equal_pages(packed, 0, edge, num_tokens // ps, ps)
            return TreeMatch(node, pos + num_pages * ps, child, num_pages)
        return TreeMatch(node, pos)

    def path_page_ids(self, node: RadixNode) -> list[int]:
        """Read-only: the page ids from the root down to the end of `node`."""
        parts = []
        while node.parent is not None:
            parts.append(node.page_ids)
            node = node.parent
        out: list[int] = []
        for part in reversed(parts):
            out += part
        return out

    def num_unlocked_pages(self, match: TreeMatch) -> int:
        """Read-only: pages of the matched prefix that no lease holds yet."""
        num = (
            match.partial_pages if match.partial is not None and not match.partial.lock_count else 0
        )
        node = match.node
        while node.parent is not None and not node.lock_count:
            num += node.num_pages
            node = node.parent
        return num

    @staticmethod
    def tail_match(node: RadixNode, tokens: Sequence[int], pos: int) -> int:
        """Read-only: how many of tokens[pos:] agree with `node`'s tail (0 without one);
        `pos` is where `node`'s path ends."""
        tail = node.tail
        if tail is None:
            return 0
        edge = tail.tokens
        n, limit = 0, min(len(edge), len(tokens) - pos)
        while n < limit and edge[n] == tokens[pos + n]:
            n += 1
        return n

    def num_tail_tokens(self, match: TreeMatch, tokens: Sequence[int]) -> int:
        """Read-only: tokens after `match` that a cached page holds in its first slots
        (`copy_source`; 0 when none does)."""
        found = self.copy_source(match, tokens)
        return found.num_tokens if found is not None else 0

    def copy_source(self, match: TreeMatch, tokens: Sequence[int]) -> CopySource | None:
        """Read-only: the cached page whose first slots agree longest with the tokens after
        `match` (at least one, fewer than a page), or None. Looked at: inside an edge, the
        page of the edge the match stopped at; at a node, its kept tail and the first page
        of each child (up to MAX_COPY_CHILDREN of them), the tail first on a tie."""
        pos, ps = match.num_tokens, self.page_size
        if pos >= len(tokens):
            return None
        if match.partial is not None:
            child, index = match.partial, match.partial_pages
            n = _num_agreeing(child.tokens, index * ps, tokens, pos, ps - 1)
            return CopySource(n, child.page_ids[index], node=child) if n else None
        node = match.node
        best: CopySource | None = None
        n = self.tail_match(node, tokens, pos)
        if n and node.tail is not None:
            best = CopySource(n, node.tail.page_id, tail=node.tail)
        if node.parent is None or len(node.children) > MAX_COPY_CHILDREN:
            return best
        first = tokens[pos]
        for key, child in node.children.items():
            if key[0] != first:
                continue
            n = _num_agreeing(child.tokens, 0, tokens, pos, ps - 1)
            if best is None or n > best.num_tokens:
                best = CopySource(n, child.page_ids[0], node=child)
        return best

    @staticmethod
    def num_path_pages(node: RadixNode) -> int:
        """Read-only: pages from the root down to the end of `node`, every kept partial
        page on the path included (the pages a lock on `node` holds)."""
        num = 0
        while node.parent is not None:
            num += node.num_pages
            node = node.parent
        return num

    @staticmethod
    def is_evictable(node: RadixNode) -> bool:
        return node.parent is not None and not node.lock_count and not node.children

    def iter_nodes(self):
        """Read-only: every node except the root, parents before children."""
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    # ---- changing state ----

    def split_match(self, match: TreeMatch) -> RadixNode:
        """Changes state: splits a partial match so that a node ends exactly at it."""
        if match.partial is None:
            return match.node
        return self._split(match.partial, match.partial_pages)

    def lock(self, node: RadixNode, now: float) -> None:
        """Changes state: one more lease holds `node` and its ancestors; touches them."""
        while node.parent is not None:
            if not node.lock_count:
                self.num_locked_pages += node.num_pages
            node.lock_count += 1
            node.last_access = now
            node = node.parent

    def unlock(self, node: RadixNode) -> None:
        """Changes state: one lease less holds `node` and its ancestors."""
        while node.parent is not None:
            node.lock_count -= 1
            if node.lock_count < 0:
                raise AssertionError("radix node lock_count went negative")
            if not node.lock_count:
                self.num_locked_pages -= node.num_pages
                if not node.children:
                    self.policy.push(node)
            node = node.parent

    def insert(
        self,
        node: RadixNode,
        tokens: array,
        page_ids: list[int],
        now: float,
        split_end: bool = False,
    ) -> InsertResult:
        """Changes state: inserts packed `tokens` (full pages, from `pack_tokens`) below
        `node`, where they continue its path; `page_ids` are their pages, one per page.
        The tree may keep `tokens` itself as a new leaf's edge: the caller hands it over.

        Pages whose tokens are already in the tree are not inserted; they come back in
        `duplicate_page_ids` for the caller to free. The walked path is touched. With
        `split_end`, an edge the tokens end inside is split there, and `end` is the node
        that ends at them (for `attach_tail`).
        """
        ps = self.page_size
        end = len(tokens)
        pos = 0
        duplicates: list[int] = []
        while pos < end:
            key = tuple(tokens[pos : pos + ps])
            child = node.children.get(key)
            if child is None:
                edge = tokens[pos:] if pos else tokens
                leaf = RadixNode(node, key, edge, page_ids[pos // ps :], now)
                node.children[key] = leaf
                self.num_nodes += 1
                self.num_cached_pages += len(leaf.page_ids)
                self.policy.push(leaf)
                self._maybe_compact()
                return InsertResult(len(leaf.page_ids), duplicates, leaf)
            edge = child.tokens
            num_pages = _num_equal_pages(tokens, pos, edge, min(len(edge), end - pos) // ps, ps)
            if num_pages * ps < len(edge) and (split_end or pos + num_pages * ps < end):
                child = self._split(child, num_pages)  # the sequence leaves or ends inside
            first = pos // ps
            duplicates += page_ids[first : first + num_pages]
            pos += num_pages * ps
            child.last_access = now
            if self.is_evictable(child):
                self.policy.push(child)
            node = child
        return InsertResult(0, duplicates, node)

    def attach_tail(self, node: RadixNode, tokens: array, page_id: int) -> int | None:
        """Changes state: keeps page `page_id`, whose first slots hold the KV of packed
        `tokens` (1 to page_size - 1 of them, continuing `node`'s path), as `node`'s tail.
        Returns the page the caller frees, if any: `page_id` itself when the tree does
        not take it (at the root, when the tail kept already starts with `tokens`, or
        when a lease still copies from the tail kept), else the replaced tail's page (the
        newer text wins)."""
        if node.parent is None or not 0 < len(tokens) < self.page_size:
            return page_id
        old = node.tail
        if old is not None and (old.num_sources or old.tokens[: len(tokens)] == tokens):
            return page_id
        node.tail = Tail(tokens, page_id)
        if old is not None:
            return old.page_id
        self.num_cached_pages += 1
        if node.lock_count:
            self.num_locked_pages += 1
        if self.is_evictable(node):
            self.policy.push(node)
        return None

    def evict(self, num_pages: int) -> list[int]:
        """Changes state: frees pages of unlocked leaves, least valuable leaf first, until
        `num_pages` pages are freed or nothing is left to evict. A leaf at least twice as
        long as what is still needed loses only its tail pages (its prefix stays cached).
        Returns the freed page ids."""
        freed: list[int] = []
        policy = self.policy
        while len(freed) < num_pages:
            victim = policy.pop_victim(self.is_evictable)
            if victim is None:
                break
            if victim.tail is not None:  # the partial last page goes first
                freed.append(victim.tail.page_id)
                victim.tail = None
                self.num_cached_pages -= 1
                if len(freed) >= num_pages:
                    policy.push(victim)
                    break
            need = num_pages - len(freed)
            keep = len(victim.page_ids) - need
            if keep >= need:  # a long leaf: cut its tail; a short one goes whole (cheaper)
                freed += victim.page_ids[keep:]
                self.num_cached_pages -= len(victim.page_ids) - keep
                del victim.page_ids[keep:]
                del victim.tokens[keep * self.page_size :]
                policy.push(victim)  # still an evictable leaf, now shorter
                break
            parent = victim.parent
            del parent.children[victim.key]  # type: ignore[union-attr]
            victim.parent = None
            self.num_nodes -= 1
            self.num_cached_pages -= len(victim.page_ids)
            freed += victim.page_ids
            if self.is_evictable(parent):  # type: ignore[arg-type]
                policy.push(parent)  # type: ignore[arg-type]
        return freed

    def _split(self, child: RadixNode, num_pages: int) -> RadixNode:
        """Changes state: cuts `child` after `num_pages` pages; returns the new upper node.

        The lower part stays the same object, so a lease holding it still ends at the
        same depth; the upper part copies its lock count (every lease that locks the
        lower part also locks the upper one)."""
        cut = num_pages * self.page_size
        parent = child.parent
        upper = RadixNode(
            parent,
            child.key,
            child.tokens[:cut],
            child.page_ids[:num_pages],
            child.last_access,
            lock_count=child.lock_count,
        )
        child.tokens = child.tokens[cut:]
        child.page_ids = child.page_ids[num_pages:]
        child.key = tuple(child.tokens[: self.page_size])
        child.parent = upper
        upper.children[child.key] = child
        parent.children[upper.key] = upper  # type: ignore[union-attr]
        self.num_nodes += 1
        return upper

    def _maybe_compact(self) -> None:
        if len(self.policy) > 4 * self.num_nodes + 1024:
            self.policy.compact(self.is_evictable)


def _num_agreeing(edge: array, offset: int, tokens: Sequence[int], pos: int, limit: int) -> int:
    """How many of tokens[pos:] equal edge[offset:], at most `limit`."""
    n, limit = 0, min(limit, len(edge) - offset, len(tokens) - pos)
    while n < limit and edge[offset + n] == tokens[pos + n]:
        n += 1
    return n


def _num_equal_pages(tokens: array, pos: int, edge: array, num_pages: int, ps: int) -> int:
    """How many leading pages of `edge` equal `tokens[pos:]`, up to `num_pages`.

    Binary search over slice comparisons of packed arrays: about one pass over the
    compared tokens in total, at C speed. The first page is known to match (it is the
    child's key)."""
    if num_pages and tokens[pos : pos + num_pages * ps] == edge[: num_pages * ps]:
        return num_pages
    lo, hi = min(1, num_pages), num_pages - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if tokens[pos + lo * ps : pos + mid * ps] == edge[lo * ps : mid * ps]:
            lo = mid
        else:
            hi = mid - 1
    return lo
