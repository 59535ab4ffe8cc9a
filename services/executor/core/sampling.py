"""Vectorised sampling of one step's batch: penalties, masks, filters, the draw, logprobs.

`Sampler.prepare_columns` turns the rows' parameters as columns
(`sampling_columns.SamplingColumns`: the executor keeps them per buffer row and
gathers a step's), their output lengths and the penalised rows' token histories
into device tensors (`SamplingInputs`) with array operations, no Python pass over
the rows; `Sampler.prepare` does so for rows given as `SamplingParams`.
`Sampler.sample` then runs with no Python loop over requests, in the order
Hugging Face and vLLM use:

1. repetition penalty (HF: over prompt and output tokens, positive logits
   divided, negative multiplied), then frequency and presence penalties
   (OpenAI: over output tokens), on the raw logits;
2. min_tokens: EOS and stop token ids get -inf while the output is shorter;
3. the grammar bitmask, if any;
4. temperature, then top-k, top-p and min-p (skipped when no row filters);
   each keeps a prefix of the tokens by logit, found among the top
   `MAX_FILTER_CANDIDATES` (a full sort only for rows whose prefix is longer);
5. the draw: argmax for greedy rows, otherwise the exponential race
   argmax(p / E) with E ~ Exp(1), whose winner is distributed as p.

The race's uniforms come from a counter-based hash of (seed, output_len,
token id), so a request's draw does not depend on the batch around it. On
CUDA the race is compiled with `torch.compile` into one fused kernel (same
integers, same tokens); `Sampler.warmup()` compiles it ahead of traffic.
Logprobs are taken from the raw logits, before any processing.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from radixmesh.errors import InvalidArgument
from radixmesh.sampling import SamplingParams
from radixmesh.step import TokenLogprobs
from radixmesh_kernels import get_ops
from services.common.logging import get_logger
from services.executor.core.sampling_columns import (
    ADDITIVE,
    FMIX_C1,
    FMIX_C2,
    FREQUENCY_PENALTY,
    GOLDEN,
    LOGPROBS,
    MASK32,
    MIN_P,
    MIN_P_VALUE,
    MIN_TOKENS,
    MIN_TOKENS_VALUE,
    PENALTIES,
    PRESENCE_PENALTY,
    REPETITION,
    REPETITION_PENALTY,
    SAMPLED,
    SEED_KEY,
    TEMPERATURE,
    TOP_K,
    TOP_K_VALUE,
    TOP_LOGPROBS,
    TOP_P,
    TOP_P_VALUE,
    SamplingColumns,
    row_keys,
)

log = get_logger(__name__)

MAX_FILTER_CANDIDATES = 4096
"""Top-k/top-p/min-p look for their cut among this many best tokens of a row."""

_TOKEN_SALT = 0x6A09E667
_NUMPY_DTYPES = {torch.int64: np.int64, torch.float32: np.float32}


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for x in [0, 2**32), split so no int64 product exceeds 2**49."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & MASK32


def _fmix32(h: torch.Tensor) -> torch.Tensor:
    """A 32-bit avalanche mix (a bijection of [0, 2**32)) on int64 tensors."""
    h = h ^ (h >> 16)
    h = _mul32(h, FMIX_C1)
    h = h ^ (h >> 13)
    h = _mul32(h, FMIX_C2)
    return h ^ (h >> 16)


UNIFORM_BITS = 23
"""Bits of each uniform draw: (bits + 0.5) needs 24 significant bits, float32's all, so the
draw is exact and strictly inside (0, 1). With 24 bits the largest draw rounded up to 1.0,
its noise to -inf, and a token the mask had set to -inf won the race as NaN."""


def noise_from_bits(bits: torch.Tensor) -> torch.Tensor:
    """float32 log(E), E ~ Exp(1), from integers bits in [0, 2**UNIFORM_BITS): v = (bits +
    0.5) / 2**UNIFORM_BITS is exact and inside (0, 1), and E = -log(1 - v) goes through
    log1p so it stays above 0 for the smallest v; the result is finite for every bits."""
    v = (bits.to(torch.float32) + 0.5) * (1.0 / (1 << UNIFORM_BITS))
    return torch.log(-torch.log1p(-v))


def exponential_noise(keys: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[B, V] float32 log(E) with E ~ Exp(1), a pure function of (row key, token id),
    finite everywhere."""
    token_ids = torch.arange(vocab_size, dtype=torch.int64, device=keys.device)
    token_mix = _fmix32(_mul32(token_ids, GOLDEN) ^ _TOKEN_SALT)
    return noise_from_bits(_fmix32(keys[:, None] ^ token_mix[None, :]) >> (32 - UNIFORM_BITS))


def race(x: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """argmax(p / E) over rows of logits x [S, V]: log p differs from x by a row constant."""
    return (x - exponential_noise(keys, x.shape[1])).argmax(dim=-1)


def filter_logits(
    x: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    min_p: torch.Tensor | None,
    max_candidates: int = MAX_FILTER_CANDIDATES,
) -> None:
    """In place on scaled logits x [S, V]: top-k, top-p of what top-k keeps, then min-p.

    Each filter keeps a prefix of the row sorted by logit, so the result is a
    per-row threshold: logits below it become -inf (ties with it are kept, as
    in Hugging Face's top-k). The cut is looked for among the row's best
    `max_candidates`; rows whose cut lies further are redone with a full sort.
    Off values: top_k = V, top_p = +inf, min_p = 0.
    """
    num_rows, vocab = x.shape
    k = min(vocab, max_candidates)
    candidates = x.topk(k, dim=-1).values  # sorted, best first
    cut = torch.zeros(num_rows, k, dtype=torch.bool, device=x.device)
    active = torch.zeros(num_rows, dtype=torch.bool, device=x.device)
    inexact = torch.zeros(num_rows, dtype=torch.bool, device=x.device)
    if top_k is not None:
        cut |= torch.arange(k, device=x.device)[None, :] >= top_k[:, None]
        active |= top_k < vocab
    if top_p is not None:
        kept = candidates.masked_fill(cut, float("-inf"))
        norm = kept.logsumexp(dim=-1)
        if k < vocab:
            if top_k is None:
                norm = x.logsumexp(dim=-1)  # top-p over the whole row
            else:  # the top-k kept are all candidates only where top_k <= k
                norm = torch.where(top_k <= k, norm, x.logsumexp(dim=-1))
                inexact |= (top_k > k) & (top_k < vocab) & torch.isfinite(top_p)
        probs = (kept - norm[:, None]).exp()
        cut |= (probs.cumsum(dim=-1) - probs) >= top_p[:, None]  # the best is always kept
        active |= torch.isfinite(top_p)
    if min_p is not None:
        # p_i >= min_p * p_max  <=>  x_i >= x_max + log(min_p)
        cut |= candidates < candidates[:, :1] + torch.log(min_p)[:, None]
        active |= min_p > 0
    num_kept = (~cut).sum(dim=-1)  # every filter cuts a suffix, so this is the kept prefix
    threshold = candidates.gather(1, (num_kept - 1).clamp(min=0)[:, None])[:, 0]
    if k < vocab:
        inexact |= num_kept >= k  # the cut may lie beyond the candidates
    threshold = torch.where(active & ~inexact, threshold, float("-inf"))
    x.masked_fill_(x < threshold[:, None], float("-inf"))
    if k < vocab:
        rows = (active & inexact).nonzero().squeeze(1)
        if rows.numel():
            sub = x[rows]
            filter_logits(
                sub,
                _take_rows(top_k, rows),
                _take_rows(top_p, rows),
                _take_rows(min_p, rows),
                max_candidates=vocab,
            )
            x[rows] = sub


def _take_rows(t: torch.Tensor | None, rows: torch.Tensor) -> torch.Tensor | None:
    """t[rows] for an optional per-row tensor; None stays None."""
    return t[rows] if t is not None else None


@dataclass(slots=True)
class SamplingInputs:
    """Device tensors for one step's batch of B rows, built by `Sampler.prepare`.

    Per-row tensors of the sampled (non-greedy) rows have S entries, in the
    order of `sample_rows`. (row, token) pair lists may repeat a pair.
    """

    num_rows: int
    all_greedy: bool
    want_logprobs: bool
    max_top_logprobs: int
    sample_rows: torch.Tensor | None = None
    """[S] int64 rows that draw at random; None when every row does (S == B)."""
    temperature: torch.Tensor | None = None
    """[S] float32."""
    top_k: torch.Tensor | None = None
    """[S] int64, vocab size where off; None when no sampled row uses top-k."""
    top_p: torch.Tensor | None = None
    """[S] float32, +inf where off; None when no sampled row uses top-p."""
    min_p: torch.Tensor | None = None
    """[S] float32, 0 where off; None when no sampled row uses min-p."""
    keys: torch.Tensor | None = None
    """[S] int64 hash keys of (seed, output_len)."""
    repetition_rows: torch.Tensor | None = None
    repetition_token_ids: torch.Tensor | None = None
    """Prompt and output tokens of rows with a repetition penalty."""
    repetition_penalty: torch.Tensor | None = None
    """[P] float32 per pair: the row's penalty."""
    penalty_rows: torch.Tensor | None = None
    penalty_token_ids: torch.Tensor | None = None
    """Output tokens, one pair per occurrence, of rows with frequency/presence penalties."""
    frequency_penalty: torch.Tensor | None = None
    """[Q] float32 per pair; subtracted once per occurrence."""
    presence_penalty: torch.Tensor | None = None
    """[Q] float32 per pair; subtracted once per distinct token."""
    suppress_rows: torch.Tensor | None = None
    suppress_token_ids: torch.Tensor | None = None
    """Pairs set to -inf: EOS and stop ids of rows still short of min_tokens."""
    pending_rows: torch.Tensor | None = None
    """[R] int64 penalised rows whose history above lacks its last output token: the token
    a step not yet finished sampled, on the device only (`with_last_tokens` adds it)."""
    pending_slots: torch.Tensor | None = None
    """[R] int64: where each pending token is, a row of the caller's last-token buffer."""
    pending_penalties: torch.Tensor | None = None
    """[R, 3] float32: each pending row's repetition (1 where none), frequency and presence
    penalties (0 where none)."""

    @property
    def needs_processing(self) -> bool:
        """Whether any penalty or suppression touches the logits."""
        return any(
            t is not None
            for t in (self.repetition_rows, self.penalty_rows, self.suppress_rows, self.pending_rows)
        )


@dataclass(slots=True)
class SampleResult:
    token_ids: torch.Tensor
    """[B] int64, on device."""
    logprobs: torch.Tensor | None
    """[B] float32: log-prob of the sampled token under the raw logits."""
    top_ids: torch.Tensor | None
    """[B, k] int64 (k = max top_logprobs in the batch)."""
    top_logprobs: torch.Tensor | None
    """[B, k] float32."""

    def logprobs_by_row(
        self, params: Sequence[SamplingParams], token_ids: list[int]
    ) -> list[TokenLogprobs | None]:
        """Each row's sampled token (`token_ids`: `self.token_ids` read to the host) with its
        log probability and top_logprobs alternatives, for the rows whose `params` ask for
        them (None elsewhere)."""
        wanted = [p.logprobs or p.top_logprobs > 0 for p in params]
        if not any(wanted) or self.logprobs is None:
            return [None] * len(params)
        chosen = self.logprobs.tolist()
        top_ids = self.top_ids.tolist() if self.top_ids is not None else None
        top_lps = self.top_logprobs.tolist() if self.top_logprobs is not None else None
        out: list[TokenLogprobs | None] = []
        for i, p in enumerate(params):
            if not wanted[i]:
                out.append(None)
                continue
            k = p.top_logprobs
            top = list(zip(top_ids[i][:k], top_lps[i][:k], strict=True)) if top_ids and top_lps else []
            out.append(TokenLogprobs(token_ids[i], chosen[i], top))
        return out


def _pairs(
    rows: Sequence[int] | np.ndarray, token_lists: Sequence[Sequence[int]], vocab_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """(row, token) for every token of every list; ids outside the vocab are dropped."""
    lengths = np.fromiter((len(t) for t in token_lists), dtype=np.int64, count=len(token_lists))
    tokens = np.fromiter(
        itertools.chain.from_iterable(token_lists), dtype=np.int64, count=int(lengths.sum())
    )
    row_of = np.repeat(np.asarray(rows, dtype=np.int64), lengths)
    valid = (tokens >= 0) & (tokens < vocab_size)
    return row_of[valid], tokens[valid]


class Sampler:
    """Samples one token per row of a step's logits; see the module docstring."""

    def __init__(
        self,
        vocab_size: int,
        device: torch.device,
        *,
        max_filter_candidates: int = MAX_FILTER_CANDIDATES,
        apply_bitmask: Callable | None = None,
    ):
        """`apply_bitmask`: the op masking refused tokens (default: the device's)."""
        if vocab_size < 1:
            raise InvalidArgument(f"vocab_size must be >= 1, got {vocab_size}")
        if max_filter_candidates < 1:
            raise InvalidArgument(
                f"max_filter_candidates must be >= 1, got {max_filter_candidates}"
            )
        self.vocab_size = vocab_size
        self.max_filter_candidates = max_filter_candidates
        self.device = torch.device(device)
        self._apply_bitmask = apply_bitmask or get_ops(self.device).apply_bitmask
        self._race = torch.compile(race, dynamic=True) if self.device.type == "cuda" else race

    @torch.inference_mode()
    def warmup(self) -> None:
        """Compiles the race for this device now (a few seconds on CUDA), not on first use:
        one row (a size of 1 is its own specialization) and two (any number from then on),
        in inference mode as steps run (the compiled code is guarded on the grad mode)."""
        for rows in (1, 2):
            x = torch.zeros(rows, self.vocab_size, device=self.device)
            self._draw_race(x, torch.zeros(rows, dtype=torch.int64, device=self.device))

    def _tensor(self, values, dtype: torch.dtype) -> torch.Tensor:
        array = np.ascontiguousarray(values, dtype=_NUMPY_DTYPES[dtype])
        return torch.from_numpy(array).to(self.device, non_blocking=True)

    def prepare(
        self,
        params: list[SamplingParams],
        seeds: list[int],
        output_lens: list[int],
        prompt_token_ids: list[list[int]],
        output_token_ids: list[list[int]],
        eos_token_ids: Sequence[int],
    ) -> SamplingInputs:
        """The inputs of rows given as parameters, seeds, output lengths and token
        histories (read for the penalised rows only): `prepare_columns` of their columns."""
        num_rows = len(params)
        for name, values in (
            ("seeds", seeds),
            ("output_lens", output_lens),
            ("prompt_token_ids", prompt_token_ids),
            ("output_token_ids", output_token_ids),
        ):
            if len(values) != num_rows:
                raise InvalidArgument(f"{name} has {len(values)} rows, params has {num_rows}")
        columns = SamplingColumns.of(params, seeds, self.vocab_size)
        return self.prepare_columns(
            columns,
            np.array(output_lens, dtype=np.int64).reshape(num_rows),
            lambda i: (prompt_token_ids[i], output_token_ids[i]),
            eos_token_ids,
        )

    def prepare_columns(
        self,
        columns: SamplingColumns,
        output_lens: np.ndarray,
        history: Callable[[int], tuple[Sequence[int], Sequence[int]]],
        eos_token_ids: Sequence[int],
        pending: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> SamplingInputs:
        """Device tensors for the B rows of `columns`: `output_lens` [B] int64, each row's
        output tokens before its sample; `history(i)`: row i's prompt and output tokens,
        asked of the rows with a penalty only. Array operations over the rows, no Python
        pass over them. `pending`: (rows, slots), penalised rows whose history lacks its
        last output token and where it is in the caller's last-token buffer
        (`SamplingInputs.pending_rows`)."""
        num_rows, present = columns.num_rows, columns.present
        inputs = SamplingInputs(
            num_rows=num_rows,
            all_greedy=not present & SAMPLED,
            want_logprobs=bool(present & LOGPROBS),
            max_top_logprobs=int(columns.ints[:, TOP_LOGPROBS].max()) if present & LOGPROBS else 0,
        )
        if present & SAMPLED:
            self._prepare_draw(inputs, columns, output_lens)
        if present & PENALTIES:
            self._prepare_penalties(inputs, columns, history)
            if pending is not None and len(pending[0]):
                self._prepare_pending(inputs, columns, *pending)
        if present & MIN_TOKENS:
            self._prepare_suppression(inputs, columns, output_lens, eos_token_ids)
        return inputs

    def _prepare_draw(
        self, inputs: SamplingInputs, columns: SamplingColumns, output_lens: np.ndarray
    ) -> None:
        rows = np.flatnonzero(columns.flags & SAMPLED)
        if len(rows) < inputs.num_rows:
            inputs.sample_rows = self._tensor(rows, torch.int64)
            columns, output_lens = columns.take(rows), output_lens[rows]
        floats, ints, present = columns.floats, columns.ints, columns.present
        inputs.temperature = self._tensor(floats[:, TEMPERATURE], torch.float32)
        if present & TOP_K:
            inputs.top_k = self._tensor(ints[:, TOP_K_VALUE], torch.int64)
        if present & TOP_P:
            inputs.top_p = self._tensor(floats[:, TOP_P_VALUE], torch.float32)
        if present & MIN_P:
            inputs.min_p = self._tensor(floats[:, MIN_P_VALUE], torch.float32)
        inputs.keys = self._tensor(row_keys(ints[:, SEED_KEY], output_lens), torch.int64)

    def _prepare_penalties(
        self,
        inputs: SamplingInputs,
        columns: SamplingColumns,
        history: Callable[[int], tuple[Sequence[int], Sequence[int]]],
    ) -> None:
        flags, floats = columns.flags, columns.floats
        penalised = np.flatnonzero(flags & PENALTIES).tolist()
        histories = dict(zip(penalised, map(history, penalised), strict=True))
        rep = np.flatnonzero(flags & REPETITION).tolist()
        if rep:
            lists = [t for i in rep for t in histories[i]]  # prompt, then output tokens
            rows, tokens = _pairs([i for i in rep for _ in range(2)], lists, self.vocab_size)
            inputs.repetition_rows = self._tensor(rows, torch.int64)
            inputs.repetition_token_ids = self._tensor(tokens, torch.int64)
            inputs.repetition_penalty = self._tensor(
                floats[rows, REPETITION_PENALTY], torch.float32
            )
        additive = np.flatnonzero(flags & ADDITIVE).tolist()
        if additive:
            rows, tokens = _pairs(additive, [histories[i][1] for i in additive], self.vocab_size)
            inputs.penalty_rows = self._tensor(rows, torch.int64)
            inputs.penalty_token_ids = self._tensor(tokens, torch.int64)
            inputs.frequency_penalty = self._tensor(floats[rows, FREQUENCY_PENALTY], torch.float32)
            inputs.presence_penalty = self._tensor(floats[rows, PRESENCE_PENALTY], torch.float32)

    def _prepare_pending(
        self, inputs: SamplingInputs, columns: SamplingColumns, rows: np.ndarray, slots: np.ndarray
    ) -> None:
        flags, floats = columns.flags[rows], columns.floats[rows]
        penalties = np.empty((len(rows), 3), dtype=np.float32)
        penalties[:, 0] = np.where(flags & REPETITION, floats[:, REPETITION_PENALTY], 1.0)
        additive = (flags & ADDITIVE) != 0
        penalties[:, 1] = np.where(additive, floats[:, FREQUENCY_PENALTY], 0.0)
        penalties[:, 2] = np.where(additive, floats[:, PRESENCE_PENALTY], 0.0)
        inputs.pending_rows = self._tensor(rows, torch.int64)
        inputs.pending_slots = self._tensor(slots, torch.int64)
        inputs.pending_penalties = self._tensor(penalties, torch.float32)

    def with_last_tokens(self, inputs: SamplingInputs, tokens: torch.Tensor) -> SamplingInputs:
        """`inputs` with each pending row's last output token (`tokens` [R], on the device,
        in `pending_rows` order) added to its penalties' pairs, as its history would hold
        it once the step that sampled it is finished: nothing is read back. A pending row
        without one of the penalties gets a pair that changes nothing (a repetition
        penalty of 1, frequency and presence penalties of 0)."""
        rows, penalties = inputs.pending_rows, inputs.pending_penalties
        if rows is None:
            return inputs
        assert penalties is not None, "set with pending_rows"

        def cat(old: torch.Tensor | None, new: torch.Tensor) -> torch.Tensor:
            return new if old is None else torch.cat((old, new))

        return dataclasses.replace(
            inputs,
            repetition_rows=cat(inputs.repetition_rows, rows),
            repetition_token_ids=cat(inputs.repetition_token_ids, tokens),
            repetition_penalty=cat(inputs.repetition_penalty, penalties[:, 0]),
            penalty_rows=cat(inputs.penalty_rows, rows),
            penalty_token_ids=cat(inputs.penalty_token_ids, tokens),
            frequency_penalty=cat(inputs.frequency_penalty, penalties[:, 1]),
            presence_penalty=cat(inputs.presence_penalty, penalties[:, 2]),
            pending_rows=None,
            pending_slots=None,
            pending_penalties=None,
        )

    def _prepare_suppression(
        self,
        inputs: SamplingInputs,
        columns: SamplingColumns,
        output_lens: np.ndarray,
        eos_token_ids: Sequence[int],
    ) -> None:
        short = np.flatnonzero(output_lens < columns.ints[:, MIN_TOKENS_VALUE])
        if not len(short):
            return
        eos = list(eos_token_ids)
        lists = [eos + list(stop) for stop in columns.stop_token_ids[short].tolist()]
        rows, tokens = _pairs(short, lists, self.vocab_size)
        if len(rows):
            inputs.suppress_rows = self._tensor(rows, torch.int64)
            inputs.suppress_token_ids = self._tensor(tokens, torch.int64)

    def sample(
        self, logits: torch.Tensor, inputs: SamplingInputs, bitmask: torch.Tensor | None = None
    ) -> SampleResult:
        """Draws one token per row of `logits` [B, >= vocab_size]; `logits` is not modified."""
        if logits.dim() != 2 or logits.shape[0] != inputs.num_rows:
            raise InvalidArgument(
                f"logits must be [{inputs.num_rows}, vocab], got {tuple(logits.shape)}"
            )
        if logits.shape[1] < self.vocab_size:
            raise InvalidArgument(f"logits have {logits.shape[1]} < {self.vocab_size} columns")
        logits = logits[:, : self.vocab_size]
        if inputs.all_greedy and bitmask is None and not inputs.needs_processing:
            token_ids = logits.argmax(dim=-1)
        else:
            token_ids = self._process_and_draw(logits, inputs, bitmask)
        return self._with_logprobs(logits, token_ids, inputs)

    def process(
        self, logits: torch.Tensor, inputs: SamplingInputs, bitmask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Steps 1-3 (penalties, min_tokens, bitmask) on a float32 copy of logits [B, V].

        Pairs may repeat: a repeated pair reads the same old value and writes
        the same new one, so the repetition and presence penalties apply once
        per distinct token; the frequency penalty accumulates per occurrence.
        """
        x = logits[:, : self.vocab_size].to(torch.float32, copy=True)
        if inputs.repetition_rows is not None:
            penalty = inputs.repetition_penalty
            assert penalty is not None, "set together with repetition_rows"
            index = (inputs.repetition_rows, inputs.repetition_token_ids)
            values = x[index]
            x[index] = torch.where(values > 0, values / penalty, values * penalty)
        if inputs.penalty_rows is not None:
            presence, frequency = inputs.presence_penalty, inputs.frequency_penalty
            assert presence is not None and frequency is not None, "set with penalty_rows"
            index = (inputs.penalty_rows, inputs.penalty_token_ids)
            x[index] = x[index] - presence
            x.index_put_(index, -frequency, accumulate=True)
        if inputs.suppress_rows is not None:
            x[inputs.suppress_rows, inputs.suppress_token_ids] = float("-inf")
        if bitmask is not None:
            self._apply_bitmask(x, bitmask)
        return x

    def _process_and_draw(
        self, logits: torch.Tensor, inputs: SamplingInputs, bitmask: torch.Tensor | None
    ) -> torch.Tensor:
        x = self.process(logits, inputs, bitmask)
        if inputs.all_greedy:
            return x.argmax(dim=-1)
        if inputs.sample_rows is None:
            return self._draw(x, inputs)
        token_ids = x.argmax(dim=-1)
        token_ids[inputs.sample_rows] = self._draw(x[inputs.sample_rows], inputs)
        return token_ids

    def _draw(self, x: torch.Tensor, inputs: SamplingInputs) -> torch.Tensor:
        """Temperature, filters and the race over the sampled rows' logits x [S, V] (modified)."""
        temperature, keys = inputs.temperature, inputs.keys
        assert temperature is not None and keys is not None, "set when any row samples"
        x.div_(temperature[:, None])
        if inputs.top_k is not None or inputs.top_p is not None or inputs.min_p is not None:
            filter_logits(x, inputs.top_k, inputs.top_p, inputs.min_p, self.max_filter_candidates)
        return self._draw_race(x, keys)

    def _draw_race(self, x: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        try:
            return self._race(x, keys)
        except Exception as exc:  # the compiler is missing or failed: same integers, eagerly
            if self._race is race:
                raise
            log.warning("sampler_compile_failed", error=repr(exc))
            self._race = race
            return race(x, keys)

    def _with_logprobs(
        self, logits: torch.Tensor, token_ids: torch.Tensor, inputs: SamplingInputs
    ) -> SampleResult:
        if not inputs.want_logprobs:
            return SampleResult(token_ids, None, None, None)
        raw = torch.log_softmax(logits.to(torch.float32), dim=-1)
        chosen = raw.gather(1, token_ids[:, None]).squeeze(1)
        if inputs.max_top_logprobs == 0:
            return SampleResult(token_ids, chosen, None, None)
        top_logprobs, top_ids = raw.topk(inputs.max_top_logprobs, dim=-1)
        return SampleResult(token_ids, chosen, top_ids, top_logprobs)
