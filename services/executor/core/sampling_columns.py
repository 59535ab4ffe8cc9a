"""Sampling parameters as columns: one array entry per row, so a step's sampling inputs
are built with array operations instead of a Python pass over its rows.

`SamplingColumns` holds B rows' parameters (what each row's `SamplingParams` and seed
say, in the form `Sampler.prepare_columns` reads, with the row's prompt length: where
its outputs start), and or-ed flags saying which parts of sampling any row uses.
`SamplingRows` keeps them for every buffer row of the executor, written once when a
sequence takes its row: a step whose batch changes (sequences admitted, ended, moved)
gathers its rows' parameters with one indexing per array, and nothing is rebuilt for
the sequences that stayed. A row's entries belong to the sequence holding the row, so
they are gathered while it holds it: when its step is prepared (a step whose inputs are
built at execute keeps what its prepare gathered).

Seeds are kept hashed (`seed_key`): a row's draw key at an output position is
`row_keys(seed_key, position)`, the same integers as the sampler's noise expects.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from radixmesh.sampling import SamplingParams

T = TypeVar("T", int, np.ndarray)

MASK32 = 0xFFFFFFFF
FMIX_C1 = 0x85EBCA6B
FMIX_C2 = 0xC2B2AE35
GOLDEN = 0x9E3779B9
"""The draw keys' hash constants (the sampler's noise mixes token ids with the same)."""

# flags: which parts of sampling a row uses (one bit each)
SAMPLED = 1
"""Not greedy (temperature > 0): the row draws at random."""
TOP_K = 2
TOP_P = 4
MIN_P = 8
REPETITION = 16
"""A repetition penalty (over prompt and output tokens)."""
ADDITIVE = 32
"""A frequency or presence penalty (over output tokens)."""
LOGPROBS = 64
"""Log probabilities asked (logprobs or top_logprobs)."""
SCORES_PROMPT = 128
"""Prompt tokens scored (prompt_logprobs_start)."""
MIN_TOKENS = 256
"""min_tokens set: EOS and stop ids are held back while the output is shorter."""
PENALTIES = REPETITION | ADDITIVE
"""Penalties read the row's token history."""

# the float32 columns
TEMPERATURE, TOP_P_VALUE, MIN_P_VALUE = 0, 1, 2
REPETITION_PENALTY, FREQUENCY_PENALTY, PRESENCE_PENALTY = 3, 4, 5
NUM_FLOATS = 6
# the int64 columns
FLAGS, TOP_K_VALUE, SEED_KEY, MIN_TOKENS_VALUE, TOP_LOGPROBS, NUM_PROMPT_TOKENS = range(6)
NUM_INTS = 6


def _fmix32(h: T) -> T:
    """The sampler's 32-bit avalanche mix (`sampling._fmix32`) on a Python int or a uint32
    array in [0, 2**32) (the array's products wrap by themselves, an int's are masked)."""
    h = h ^ (h >> 16)
    h = (h * FMIX_C1) & MASK32
    h = h ^ (h >> 13)
    h = (h * FMIX_C2) & MASK32
    return h ^ (h >> 16)


def seed_key(seed: int) -> int:
    """A 64-bit seed mixed from its two halves into [0, 2**32): the part of its draw keys
    that does not move with the output position (`row_keys`)."""
    return _fmix32(_fmix32(((seed & MASK32) + GOLDEN) & MASK32) ^ (seed >> 32))


def row_keys(keys: np.ndarray, output_lens: np.ndarray) -> np.ndarray:
    """[B] int64 in [0, 2**32): one draw key per (seed key, output position)."""
    mixed = keys.astype(np.uint32) ^ (output_lens & MASK32).astype(np.uint32)
    return _fmix32(mixed).astype(np.int64)


def row_values(
    params: SamplingParams, seed: int, vocab_size: int, num_prompt_tokens: int = 0
) -> tuple[tuple[float, ...], tuple[int, ...]]:
    """One row's float32 and int64 columns."""
    top_k = params.top_k if 0 < params.top_k < vocab_size else vocab_size
    top_p = params.top_p if params.top_p < 1.0 else float("inf")
    flags = (
        (SAMPLED if not params.greedy else 0)
        | (TOP_K if top_k < vocab_size else 0)
        | (TOP_P if params.top_p < 1.0 else 0)
        | (MIN_P if params.min_p > 0.0 else 0)
        | (REPETITION if params.repetition_penalty != 1.0 else 0)
        | (ADDITIVE if params.frequency_penalty != 0 or params.presence_penalty != 0 else 0)
        | (LOGPROBS if params.logprobs or params.top_logprobs > 0 else 0)
        | (SCORES_PROMPT if params.prompt_logprobs_start is not None else 0)
        | (MIN_TOKENS if params.min_tokens > 0 else 0)
    )
    floats = (
        params.temperature, top_p, params.min_p, params.repetition_penalty,
        params.frequency_penalty, params.presence_penalty,
    )  # fmt: skip
    ints = (
        flags, top_k, seed_key(seed), params.min_tokens, params.top_logprobs, num_prompt_tokens
    )
    return floats, ints


@dataclass(slots=True)
class SamplingColumns:
    """B rows' sampling parameters, one array entry per row (see the column indices); not
    changed once made (`take` and `without_min_tokens` make new ones)."""

    floats: np.ndarray
    """[B, NUM_FLOATS] float32: temperature, top_p (+inf where off), min_p and the
    repetition, frequency and presence penalties."""
    ints: np.ndarray
    """[B, NUM_INTS] int64: flags (SAMPLED, TOP_K, ...), top_k (the vocab size where off),
    seed key (`seed_key`), min_tokens, top_logprobs and num_prompt_tokens."""
    stop_token_ids: np.ndarray
    """[B] object: each row's stop_token_ids (a tuple)."""
    present: int = field(init=False)
    """The flags of any row (or-ed): what the inputs of these rows hold at all."""

    def __post_init__(self) -> None:
        flags = self.ints[:, FLAGS]
        self.present = int(np.bitwise_or.reduce(flags)) if len(flags) else 0

    @classmethod
    def of(
        cls, params: Sequence[SamplingParams], seeds: Sequence[int], vocab_size: int
    ) -> SamplingColumns:
        """The columns of rows given as parameters and seeds (num_prompt_tokens 0)."""
        n = len(params)
        values = [row_values(p, s, vocab_size) for p, s in zip(params, seeds, strict=True)]
        floats = np.array([v[0] for v in values], dtype=np.float32).reshape(n, NUM_FLOATS)
        ints = np.array([v[1] for v in values], dtype=np.int64).reshape(n, NUM_INTS)
        stop_token_ids = np.empty(n, dtype=object)
        for i, p in enumerate(params):  # one by one: a tuple is one entry
            stop_token_ids[i] = p.stop_token_ids
        return cls(floats, ints, stop_token_ids)

    @property
    def num_rows(self) -> int:
        return int(self.ints.shape[0])

    @property
    def flags(self) -> np.ndarray:
        return self.ints[:, FLAGS]

    @property
    def num_prompt_tokens(self) -> np.ndarray:
        return self.ints[:, NUM_PROMPT_TOKENS]

    def take(self, index: np.ndarray) -> SamplingColumns:
        """The rows at `index` (repeats allowed), in its order."""
        return SamplingColumns(self.floats[index], self.ints[index], self.stop_token_ids[index])

    def without_min_tokens(self, rows: frozenset[int]) -> SamplingColumns:
        """A copy with min_tokens lifted (0) at `rows`."""
        if not rows:
            return self
        ints = self.ints.copy()
        ints[list(rows), MIN_TOKENS_VALUE] = 0
        return SamplingColumns(self.floats, ints, self.stop_token_ids)


class SamplingRows:
    """Every buffer row's sampling parameters, written when a sequence takes the row
    (`write`) and gathered for a step's rows (`gather`) while their sequences hold them."""

    def __init__(self, num_rows: int, vocab_size: int) -> None:
        self._vocab_size = vocab_size
        self._floats = np.zeros((num_rows, NUM_FLOATS), dtype=np.float32)
        self._ints = np.zeros((num_rows, NUM_INTS), dtype=np.int64)
        self._stop_token_ids = np.empty(num_rows, dtype=object)
        self._stop_token_ids.fill(())

    def write(self, row: int, params: SamplingParams, seed: int, num_prompt_tokens: int) -> None:
        """The row's new holder samples with `params` and `seed`; its outputs start after
        `num_prompt_tokens`."""
        self._floats[row], self._ints[row] = row_values(
            params, seed, self._vocab_size, num_prompt_tokens
        )
        self._stop_token_ids[row] = params.stop_token_ids

    def gather(self, rows: np.ndarray) -> SamplingColumns:
        """The columns of these buffer rows, in order (a copy: later writes do not reach it)."""
        return SamplingColumns(self._floats[rows], self._ints[rows], self._stop_token_ids[rows])
