"""What follows a prefix in a radix tree: the tokens cached after the longest match.

Read-only. A walk matches whole pages (`RadixTree.walk`); the tokens of the request after
that (at most a page short of a full one, or where it diverged) are then compared token by
token with the edge the walk stopped in, or with the children of the node it ended at, so
the match reaches as far into the cached text as the request agrees with it. From there
the continuation follows the tree downwards, at each branch the child used most recently
(`last_access`), until `max_tokens` tokens are taken or a leaf ends.

Drafts for speculative decoding read it: a request whose prefix an earlier one had (the
same prompt, a later turn of a conversation) probably continues as the earlier one did.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from services.cache.core.radix import RadixNode, RadixTree

MAX_SCANNED_CHILDREN = 256
"""Children compared token by token at a node where the request's page does not match a
child's key exactly; past this many the match stops at the node (a bound on the cost of a
read-only lookup at a wide root)."""


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
    node, offset, pos = _match_tail(node, offset, tokens, pos)
    if not pos:
        return TreeContinuation(0, [])  # nothing matched: no text continues this one
    return TreeContinuation(pos, _follow(node, offset, max_tokens))


def _match_tail(
    node: RadixNode, offset: int, tokens: Sequence[int], pos: int
) -> tuple[RadixNode, int, int]:
    """Token-wise match of tokens[pos:] from `offset` into `node`'s edge (or, at its end,
    into the child that agrees longest): where it stops, as (node, offset, pos)."""
    while pos < len(tokens):
        if offset == len(node.tokens):
            child = _best_child(node, tokens, pos)
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


def _best_child(node: RadixNode, tokens: Sequence[int], pos: int) -> RadixNode | None:
    """The child whose edge starts with the most of tokens[pos:] (at least one token);
    ties go to the most recently used one."""
    children = node.children
    if not children or len(children) > MAX_SCANNED_CHILDREN:
        return None
    best, best_len = None, 0
    for child in children.values():
        edge = child.tokens
        n = 0
        limit = min(len(edge), len(tokens) - pos)
        while n < limit and edge[n] == tokens[pos + n]:
            n += 1
        if n > best_len or (
            n and n == best_len and best is not None and child.last_access > best.last_access
        ):
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
        node = max(node.children.values(), key=lambda child: child.last_access)
        offset = 0
    return out
