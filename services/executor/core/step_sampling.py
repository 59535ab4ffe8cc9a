"""Sampling a step's rows: inputs built from the sequences' state, the sample itself, and
each row's token and log probabilities; the sampled tokens stay on the device for the
next decode."""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from radixmesh.step import TokenLogprobs
from services.executor.core.grammar import StepMasks
from services.executor.core.sampling import Sampler, SampleResult, SamplingInputs
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
    _kept: tuple[list[SequenceState], SamplingInputs] | None = None
    """The last inputs that depend on nothing but their rows' parameters, with their rows."""

    def inputs(
        self,
        seqs: list[SequenceState],
        output_lens: list[int],
        grammar_ends: frozenset[int] = _NONE,
    ) -> SamplingInputs:
        """`grammar_ends`: rows whose grammar allows only stop tokens; min_tokens is lifted
        there (the grammar wins: it ends the sequence with "stop").

        Inputs that read neither output lengths nor token histories (every row greedy, no
        penalty, no row short of min_tokens, which output lengths only leave) are kept and
        given again to the same sequences in the same order: the steps of a decode batch
        that does not change (a multi-step plan's) build them once."""
        kept = self._kept
        if (
            kept is not None
            and not grammar_ends
            and len(kept[0]) == len(seqs)
            and all(map(operator.is_, kept[0], seqs))
        ):
            return kept[1]
        inputs = self._build(seqs, output_lens, grammar_ends)
        static = inputs.all_greedy and not inputs.needs_processing and not grammar_ends
        self._kept = (list(seqs), inputs) if static else None
        return inputs

    def _build(
        self, seqs: list[SequenceState], output_lens: list[int], grammar_ends: frozenset[int]
    ) -> SamplingInputs:
        # Token histories matter only to penalties: other rows pass empty lists (no copies).
        penalised = [s.sampling.has_penalties for s in seqs]
        num_prompt = [s.num_prompt_tokens for s in seqs]
        return self.sampler.prepare(
            [
                dataclasses.replace(s.sampling, min_tokens=0) if i in grammar_ends else s.sampling
                for i, s in enumerate(seqs)
            ],
            [s.seed for s in seqs],
            output_lens,
            [
                s.token_ids[:k] if p else []
                for s, k, p in zip(seqs, num_prompt, penalised, strict=True)
            ],
            [
                s.token_ids[k : k + o] if p else []
                for s, k, o, p in zip(seqs, num_prompt, output_lens, penalised, strict=True)
            ],
            self.eos_token_ids,
        )

    def sample(
        self,
        seqs: list[SequenceState],
        output_lens: list[int],
        inputs: SamplingInputs | None,
        sample_rows: torch.Tensor,
        logits: torch.Tensor,
        live: list[bool],
        masks: StepMasks,
    ) -> list[Sampled | None]:
        """(token_id, logprobs) per sampler row; None where the row is not live.
        `inputs` None (or rows with min_tokens lifted): built here."""
        if inputs is None or masks.lifted:
            inputs = self.inputs(seqs, output_lens, masks.lifted)
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
        result = self.sampler.sample(logits, inputs, bitmask)
        if all(live):
            self.last_tokens[sample_rows] = result.token_ids
        else:  # a finished sequence's row may have a new owner already
            kept = [i for i, ok in enumerate(live) if ok]
            keep = torch.tensor(kept, dtype=torch.int64, device=self.last_tokens.device)
            self.last_tokens[sample_rows[keep]] = result.token_ids[keep]
        return result
