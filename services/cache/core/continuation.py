"""What follows a prefix in a radix tree: the tokens cached after the longest match.

Read-only. A walk matches whole pages (`RadixTree.walk`); the tokens of the request after
that (at most a page short of a full one, or where it diverged) are then compared token by
token with the edge the walk stopped in, or with the children of the node it ended at (where less than a page
of the request is left), so
the match reaches as far into the cached text as the request agrees with it. From there
the continuation follows the tree downwards, at each branch the child used most recently
(`last_access`), until `max_tokens` tokens are taken or a leaf ends.

Drafts for speculative decoding read it: a request whose prefix an earlier one had (the
same prompt, a later turn of a conversation) probably continues as the earlier one did.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter

from services.cache.core.radix import RadixNode, RadixTree

MAX_SCANNED_CHILDREN = 4096
"""Children whose first token is compared at a node where less than a page of the request
is left; past this many the match stops at the node (a bound on the cost of a read-only
lookup at a wide root)."""

_LAST_ACCESS = attrgetter("last_access")


@dataclass(frozen=True, slots=True)
class TreeContinuation:
    num_matched_tokens: int
    """Leading tokens of the request found in the tree (any count, not only whole pages)."""
    token_ids: list[int]
    """The cached tokens after them, along the most recently used branch."""


def continuation(tree: RadixTree, tokens: Sequence[int], max_tokens: int) -> TreeContinuation:
    """Read-only: the tokens the tree holds after the longest cached prefix of `tokens`."""
    match = tree.walk(tokens)
    pos = match.num_tokens
    if match.partial is not None:
        node, offset = match.partial, match.partial_pages * tree.page_size
    else:
        node, offset = match.node, len(match.node.tokens)
    node, offset, pos = _match_tail(node, offset, tokens, pos, tree.page_size)
    if not pos:
        return TreeContinuation(0, [])  # nothing matched: no text continues this one
    return TreeContinuation(pos, _follow(node, offset, max_tokens))


def _match_tail(
    node: RadixNode, offset: int, tokens: Sequence[int], pos: int, page_size: int
) -> tuple[RadixNode, int, int]:
    """Token-wise match of tokens[pos:] from `offset` into `node`'s edge (or, at its end,
    into the child that agrees longest): where it stops, as (node, offset, pos)."""
    while pos < len(tokens):
        if offset == len(node.tokens):
            child = _best_child(node, tokens, pos, page_size)
            if child is None:
                break
            node, offset = child, 0
        edge = node.tokens
        start = offset
        while offset < len(edge) and pos < len(tokens) and edge[offset] == tokens[pos]:
            offset += 1
            pos += 1
        if offset == start or (offset < len(edge) and pos < len(tokens)):
            break  # diverged inside the edge
    return node, offset, pos


def _best_child(node: RadixNode, tokens: Sequence[int], pos: int, ps: int) -> RadixNode | None:
    """The child whose edge starts with the most of tokens[pos:] (at least one token; ties
    to the most recently used), looked for only where fewer than a page of tokens is left
    (a whole page would have matched a child's key in the walk)."""
    children = node.children
    if not children or len(tokens) - pos >= ps or len(children) > MAX_SCANNED_CHILDREN:
        return None
    first = tokens[pos]
    best, best_len = None, 0
    for key, child in children.items():
        if key[0] != first:
            continue
        edge = child.tokens
        n, limit = 1, min(len(edge), len(tokens) - pos)
        while n < limit and edge[n] == tokens[pos + n]:
            n += 1
        if n > best_len or (n == best_len and best is not None and child.last_access > best.last_access):
            best, best_len = child, n
    return best


def _follow(node: RadixNode, offset: int, max_tokens: int) -> list[int]:
    """Up to `max_tokens` tokens from `offset` into `node`'s edge on, taking the most
    recently used child at each branch."""
    out: list[int] = []
    while len(out) < max_tokens:
        out += node.tokens[offset : offset + max_tokens - len(out)].tolist()
        if len(out) >= max_tokens or not node.children:
            break
        node = max(node.children.values(), key=_LAST_ACCESS)
        offset = 0
    return out
