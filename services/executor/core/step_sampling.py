"""Sampling a step's rows: inputs built from each buffer row's sampling parameters (kept
per row, `sampling_columns.SamplingRows`) and the sequences' state, the sample itself, and
each row's token and log probabilities; the sampled tokens stay on the device for the
next decode."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from radixmesh.step import TokenLogprobs
from services.executor.core.grammar import StepMasks
from services.executor.core.sampling import Sampler, SampleResult, SamplingInputs
from services.executor.core.sampling_columns import SamplingColumns, SamplingRows
from services.executor.core.sequence import SequenceState

_NONE: frozenset[int] = frozenset()

Sampled = tuple[int, TokenLogprobs | None]
"""A row's token id and, when its sampling asks, its log probabilities."""


@dataclass(slots=True)
class StepSampler:
    sampler: Sampler
    last_tokens: torch.Tensor
    """The core's device buffer of each row's last sampled token (written here)."""
    eos_token_ids: Sequence[int]
    rows: SamplingRows = field(init=False)
    """Each buffer row's sampling parameters, written as a sequence takes the row."""

    def __post_init__(self) -> None:
        self.rows = SamplingRows(self.last_tokens.shape[0], self.sampler.vocab_size)

    def admit(self, seq: SequenceState) -> None:
        """`seq` took its buffer row: its sampling parameters are the row's from now on."""
        self.rows.write(seq.row, seq.sampling, seq.seed, seq.num_prompt_tokens)

    def columns(self, rows: np.ndarray) -> SamplingColumns:
        """The sampling parameters of the sequences at these buffer rows, in order; gather
        them while those sequences hold their rows (when their step is prepared: a row
        ended since may have a new holder by the time the step executes)."""
        return self.rows.gather(rows)

    def inputs(
        self,
        seqs: list[SequenceState],
        output_lens: Sequence[int] | np.ndarray,
        columns: SamplingColumns,
        grammar_ends: frozenset[int] = _NONE,
        pending: Sequence[int] = (),
    ) -> SamplingInputs:
        """The inputs of the rows `seqs`, whose parameters are `columns` (as `columns` gave
        them when the step was prepared). `grammar_ends`: rows whose grammar allows only
        stop tokens; min_tokens is lifted there (the grammar wins: it ends the sequence
        with "stop"). Token histories are read for the penalised rows only. `pending`:
        penalised rows whose history lacks its last token, sampled by a step not finished
        yet: `draw` adds it from this sampler's last-token buffer, where that step left it."""

        def history(i: int) -> tuple[list[int], list[int]]:
            seq = seqs[i]
            tokens, start = seq.token_ids, seq.num_prompt_tokens
            return tokens[:start], tokens[start : start + output_lens[i]]

        return self.sampler.prepare_columns(
            columns.without_min_tokens(grammar_ends),
            np.asarray(output_lens, dtype=np.int64),
            history,
            self.eos_token_ids,
            (
                (np.asarray(pending, dtype=np.int64), np.array([seqs[i].row for i in pending]))
                if pending
                else None
            ),
        )

    def sample(
        self,
        seqs: list[SequenceState],
        output_lens: list[int],
        inputs: SamplingInputs | None,
        columns: SamplingColumns,
        sample_rows: torch.Tensor,
        logits: torch.Tensor,
        live: list[bool],
        masks: StepMasks,
    ) -> list[Sampled | None]:
        """(token_id, logprobs) per sampler row; None where the row is not live.
        `inputs` None (or rows with min_tokens lifted): built here, from `columns`."""
        if inputs is None or masks.lifted:
            inputs = self.inputs(seqs, output_lens, columns, masks.lifted)
        result = self.draw(inputs, sample_rows, logits, live, masks.bitmask)
        token_ids = result.token_ids.tolist()
        if result.logprobs is None:  # no row asked for them
            return [(t, None) if ok else None for t, ok in zip(token_ids, live, strict=True)]
        logprobs = result.logprobs_by_row([s.sampling for s in seqs], token_ids)
        return [(token_ids[i], logprobs[i]) if live[i] else None for i in range(len(seqs))]

    def draw(
        self,
        inputs: SamplingInputs,
        sample_rows: torch.Tensor,
        logits: torch.Tensor,
        live: list[bool],
        bitmask: torch.Tensor | None = None,
    ) -> SampleResult:
        """Samples every row on the device and keeps the live rows' tokens as their
        buffer rows' last tokens; reads nothing back."""
        if inputs.pending_slots is not None:  # the step before has sampled them by now
            inputs = self.sampler.with_last_tokens(inputs, self.last_tokens[inputs.pending_slots])
        result = self.sampler.sample(logits, inputs, bitmask)
        if all(live):
            self.last_tokens[sample_rows] = result.token_ids
        else:  # a finished sequence's row may have a new owner already
            kept = [i for i, ok in enumerate(live) if ok]
            keep = torch.tensor(kept, dtype=torch.int64, device=self.last_tokens.device)
            self.last_tokens[sample_rows[keep]] = result.token_ids[keep]
        return result
