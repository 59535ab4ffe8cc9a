"""Draft proposers: guesses of a sequence's next tokens from text already seen.

`PromptLookup` matches the longest suffix of the sequence (min_match_len to
max_match_len tokens) against its own earlier tokens, prompt and output, and
proposes what followed the latest earlier occurrence: right where the output
quotes or edits its input (code editing, summaries that quote, extraction).
A sequence's `NgramIndex` (kept on it by the executor) makes that a few
searches of its packed tokens a step, extended by the tokens added since the last.
`SuffixIndex` keeps the outputs of recent finished sequences of the executor with
every n-gram of those lengths mapped to where it last occurred, so a sequence can
continue as another one did (multi-turn repeats, agents re-emitting a plan);
`SuffixProposer` asks its own context first and takes the longer match.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from services.executor.core.spec.config import SpeculativeConfig

MAX_INDEXED_TOKENS_PER_SEQ = 4096
"""At most a finished sequence's last this many tokens go into the suffix index."""
TAKE_IN_TOKENS_PER_STEP = 128
"""Finished sequences' tokens the suffix index takes in after a step (at least one
sequence's): indexing costs about 2.5 us a token on the build VM (an entry for every n-gram
length), and a batch that ends together would otherwise pay for all its outputs in the
step that ends it (128 outputs of 128 tokens: some 40 ms)."""
MAX_WAITING_SEQS = 8
"""Finished sequences waiting to be indexed; past this the oldest waiting one is left out
(where that many end faster than the steps take them in, the batch is large and drafts
seldom pay there)."""


@dataclass(frozen=True, slots=True)
class Draft:
    token_ids: list[int]
    match_len: int
    """Length of the context suffix the draft continues (0: no draft)."""


NO_DRAFT = Draft([], 0)


class NgramIndex:
    """One sequence's tokens packed as 32-bit ids, extended as the sequence grows: a prompt
    lookup is then a few searches of those bytes for the sequence's last n tokens, in C.
    Taking in a long prompt, or the tokens of many steps at once, costs a copy, not Python
    work per token and n-gram (a dictionary of every n-gram took 0.6 ms for a 512-token
    prompt, paid in the first step that drafted)."""

    __slots__ = ("_packed", "max_match_len", "min_match_len", "num_indexed")

    def __init__(self, min_match_len: int, max_match_len: int) -> None:
        self.min_match_len = min_match_len
        self.max_match_len = max_match_len
        self.num_indexed = 0
        """The tokens packed so far (the sequence's first this many)."""
        self._packed = bytearray()

    def extend(self, token_ids: Sequence[int]) -> None:
        """Pack the tokens added since the last call (the sequence's tokens only grow; a
        shorter one starts the index again)."""
        if len(token_ids) < self.num_indexed:
            self._packed.clear()
            self.num_indexed = 0
        if len(token_ids) > self.num_indexed:
            self._packed += array(_TOKEN, token_ids[self.num_indexed :]).tobytes()
            self.num_indexed = len(token_ids)

    def lookup(self, token_ids: Sequence[int], max_tokens: int) -> Draft:
        """`PromptLookup.propose` over these tokens, the index first extended to them. An
        n-gram's occurrence implies its shorter suffixes', so the lengths are tried from
        the shortest up, and a miss at the shortest (most steps of text that does not
        repeat) costs one search."""
        n_tokens = len(token_ids)
        if max_tokens < 1 or n_tokens <= self.min_match_len:
            return NO_DRAFT
        self.extend(token_ids)
        packed = self._packed
        end = _TOKEN_BYTES * (n_tokens - 1)  # an occurrence with a token after it
        found = match_len = 0
        for n in range(self.min_match_len, min(self.max_match_len, n_tokens - 1) + 1):
            at = _rfind_token_aligned(packed, packed[-_TOKEN_BYTES * n :], end)
            if at < 0:
                break
            found, match_len = at // _TOKEN_BYTES + n, n
        if not match_len:
            return NO_DRAFT
        return Draft(list(token_ids[found : found + max_tokens]), match_len)


_TOKEN = "i"
_TOKEN_BYTES = array(_TOKEN).itemsize
assert _TOKEN_BYTES == 4, "token ids are packed as 32-bit integers"


def _rfind_token_aligned(packed: bytearray, pattern: bytes | bytearray, end: int) -> int:
    """The byte offset of the latest occurrence of `pattern` that lies before `end` and
    starts on a token boundary; -1 when none does."""
    while True:
        at = packed.rfind(pattern, 0, end)
        if at < 0 or at % _TOKEN_BYTES == 0:
            return at
        end = at + len(pattern) - 1  # an unaligned hit: look before it


class Proposer(Protocol):
    def propose(
        self, token_ids: Sequence[int], max_tokens: int, own: NgramIndex | None = None
    ) -> Draft:
        """At most max_tokens guessed next tokens of a sequence with these tokens. `own`:
        the sequence's n-gram index (`index_for`), kept by the caller between calls and
        given only the sequence's own tokens; None: they are scanned."""
        ...

    def index_for(self) -> NgramIndex | None:
        """A new sequence's n-gram index for `propose` (None: the proposer keeps none)."""
        ...

    def observe(self, token_ids: Sequence[int], num_prompt_tokens: int = 0) -> None:
        """A sequence ended with these tokens (its prompt's first, then its output)."""
        ...

    def take_in(self) -> None:
        """After a step: index some of what `observe` was given (a bounded share a step)."""
        ...


class PromptLookup:
    """Suffix match over the sequence's own tokens (a `Proposer`; observes nothing)."""

    def __init__(self, min_match_len: int, max_match_len: int) -> None:
        self.min_match_len = min_match_len
        self.max_match_len = max_match_len

    def index_for(self) -> NgramIndex:
        """A new sequence's n-gram index, for `propose(..., own=)`."""
        return NgramIndex(self.min_match_len, self.max_match_len)

    def propose(
        self, token_ids: Sequence[int], max_tokens: int, own: NgramIndex | None = None
    ) -> Draft:
        if own is not None:
            return own.lookup(token_ids, max_tokens)
        n_tokens = len(token_ids)
        if max_tokens < 1 or n_tokens <= self.min_match_len:
            return NO_DRAFT
        tokens = np.asarray(token_ids, dtype=np.int64)
        for n in range(min(self.max_match_len, n_tokens - 1), self.min_match_len - 1, -1):
            # windows starting at i < n_tokens - n: each has a token after it
            windows = sliding_window_view(tokens[: n_tokens - 1], n)
            hits = np.flatnonzero((windows == tokens[n_tokens - n :]).all(axis=1))
            if hits.size:
                start = int(hits[-1]) + n
                return Draft(tokens[start : start + max_tokens].tolist(), n)
        return NO_DRAFT

    def observe(self, token_ids: Sequence[int], num_prompt_tokens: int = 0) -> None:
        return None

    def take_in(self) -> None:
        return None


class SuffixIndex:
    """Recent finished sequences, with each n-gram (min..max_match_len tokens) mapped to
    the sequence and position right after its latest occurrence."""

    def __init__(self, min_match_len: int, max_match_len: int, max_tokens: int) -> None:
        self.min_match_len = min_match_len
        self.max_match_len = max_match_len
        self.max_tokens = max_tokens
        self._seqs: dict[int, list[int]] = {}
        self._order: deque[int] = deque()
        self._next_id = 0
        self._num_tokens = 0
        self._index: dict[tuple[int, ...], tuple[int, int]] = {}
        self._waiting: deque[tuple[Sequence[int], int]] = deque(maxlen=MAX_WAITING_SEQS)

    @property
    def num_tokens(self) -> int:
        return self._num_tokens

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def defer(self, token_ids: Sequence[int], num_prompt_tokens: int = 0) -> None:
        """`add` later, from `take_in` (the oldest waiting sequence left out past
        MAX_WAITING_SEQS)."""
        self._waiting.append((token_ids, num_prompt_tokens))

    def take_in(self, max_tokens: int = TAKE_IN_TOKENS_PER_STEP) -> None:
        """`add` waiting sequences, oldest first, until `max_tokens` of them (at least one)."""
        taken = 0
        while self._waiting and taken < max(1, max_tokens):
            token_ids, num_prompt_tokens = self._waiting.popleft()
            taken += max(1, len(token_ids) - num_prompt_tokens)
            self.add(token_ids, num_prompt_tokens)

    def add(self, token_ids: Sequence[int], num_prompt_tokens: int = 0) -> None:
        """Index a finished sequence's output, with the last max_match_len tokens of its
        prompt before it (so a match can reach the output's first tokens). The prompt is
        left out: it is the request's own (prompt lookup reads it) and, shared, the radix
        cache's; indexing it cost the step that ended a batch a millisecond a sequence."""
        context = num_prompt_tokens - self.max_match_len
        start = max(0, context, len(token_ids) - MAX_INDEXED_TOKENS_PER_SEQ)
        tokens = list(token_ids[start:])
        if len(tokens) <= self.min_match_len:
            return
        seq_id = self._next_id
        self._next_id += 1
        self._seqs[seq_id] = tokens
        self._order.append(seq_id)
        self._num_tokens += len(tokens)
        self._insert(seq_id, tokens)
        while self._num_tokens > self.max_tokens and len(self._order) > 1:
            old = self._order.popleft()
            self._num_tokens -= len(self._seqs.pop(old))
        if len(self._index) > 2 * (self.max_match_len - self.min_match_len + 1) * max(
            self._num_tokens, 1
        ):  # stale entries of dropped sequences outnumber live ones: rebuild
            self._index.clear()
            for sid in self._order:
                self._insert(sid, self._seqs[sid])

    def _insert(self, seq_id: int, tokens: list[int]) -> None:
        index = self._index
        for n in range(self.min_match_len, self.max_match_len + 1):
            for end in range(n, len(tokens)):  # an n-gram with a token after it
                index[tuple(tokens[end - n : end])] = (seq_id, end)

    def lookup(self, token_ids: Sequence[int], max_tokens: int) -> Draft:
        n_tokens = len(token_ids)
        for n in range(min(self.max_match_len, n_tokens), self.min_match_len - 1, -1):
            hit = self._index.get(tuple(token_ids[n_tokens - n :]))
            if hit is None:
                continue
            tokens = self._seqs.get(hit[0])
            if tokens is None:
                continue  # its sequence left the index
            return Draft(tokens[hit[1] : hit[1] + max_tokens], n)
        return NO_DRAFT


class SuffixProposer:
    """Prompt lookup, else (or where it matches longer) the suffix index (a `Proposer`)."""

    def __init__(self, lookup: PromptLookup, index: SuffixIndex) -> None:
        self.lookup = lookup
        self.index = index

    def propose(
        self, token_ids: Sequence[int], max_tokens: int, own: NgramIndex | None = None
    ) -> Draft:
        mine = self.lookup.propose(token_ids, max_tokens, own)
        if mine.match_len >= self.lookup.max_match_len:
            return mine
        other = self.index.lookup(token_ids, max_tokens)
        return other if other.match_len > mine.match_len else mine

    def index_for(self) -> NgramIndex:
        return self.lookup.index_for()

    def observe(self, token_ids: Sequence[int], num_prompt_tokens: int = 0) -> None:
        self.index.defer(token_ids, num_prompt_tokens)

    def take_in(self) -> None:
        self.index.take_in()


def make_proposer(config: SpeculativeConfig) -> Proposer | None:
    """The method's proposer; None when speculation is off."""
    lookup = PromptLookup(config.min_match_len, config.max_match_len)
    if config.method == "ngram":
        return lookup
    index = SuffixIndex(config.min_match_len, config.max_match_len, config.max_suffix_tokens)
    if config.method == "suffix":
        return SuffixProposer(lookup, index)
    if config.method == "radix":
        from services.executor.core.spec.radix import RadixProposer

        tree = SuffixIndex(config.min_match_len, config.max_match_len, config.max_suffix_tokens)
        return RadixProposer(lookup, tree, index)
    return None
