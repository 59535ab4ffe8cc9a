"""The executor's side of a step that verifies drafts: sample every verified row as without
speculation, keep what the model agrees with, and move each sequence past what it kept."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from radixmesh.step import SequenceOutput
from services.executor.core.grammar import StepGrammar, StepMasks
from services.executor.core.sampling import Sampler, SamplingInputs
from services.executor.core.sampling_columns import SamplingColumns
from services.executor.core.sequence import SequenceState, check_finish
from services.executor.core.spec.drafting import expand_rows, verify_draft
from services.executor.core.spec.stats import SpecStats

if TYPE_CHECKING:
    from services.executor.core.step_types import PreparedStep

SamplingInputsFn = Callable[
    [list[SequenceState], list[int], SamplingColumns, frozenset[int]], SamplingInputs
]
"""`StepSampler.inputs`: rows, their output lengths, parameters and grammar ends."""
Verified = tuple[list[int], int]
"""(emitted tokens, draft tokens its grammar accepted)."""


@dataclasses.dataclass(slots=True)
class Verifier:
    sampler: Sampler
    grammar: StepGrammar
    last_tokens: torch.Tensor
    """The core's device buffer of each row's last sampled token."""
    stats: SpecStats
    eos_token_ids: Sequence[int]
    max_model_len: int

    def sample(
        self,
        prepared: PreparedStep,
        logits: torch.Tensor,
        masks: StepMasks,
        sampling_inputs: SamplingInputsFn,
    ) -> tuple[StepMasks, list[Verified | None]]:
        """Every row sampled as without speculation (each position with its own
        counter-based key and its own grammar row), then per sampler (emitted tokens, draft
        tokens its grammar accepted), None where not live. The masks come back with
        `refused` by sampler index; the device buffer holds each sampler's last token."""
        seqs, drafts = prepared.samplers, prepared.drafts
        assert drafts is not None
        counts = [len(d) + 1 for d in drafts]
        firsts = list(itertools.accumulate(counts, initial=0))[:-1]
        groups = [
            (firsts[i], s.grammar, d)
            for i, (s, d) in enumerate(zip(seqs, drafts, strict=True))
            if d and s.grammar is not None and not s.finished
        ]
        bitmask, cuts = self.grammar.fill_drafts(groups, masks)
        cut_of = {first: cut for (first, _, _), cut in zip(groups, cuts, strict=True)}
        row_seqs = [s for s, count in zip(seqs, counts, strict=True) for _ in range(count)]
        _, row_lens = expand_rows(seqs, prepared.output_lens, drafts)
        assert prepared.sampling_columns is not None
        columns = prepared.sampling_columns.take(np.repeat(np.arange(len(seqs)), counts))
        inputs = sampling_inputs(row_seqs, row_lens, columns, masks.lifted)
        targets = self.sampler.sample(logits, inputs, bitmask).token_ids.tolist()
        refused = frozenset(i for i, first in enumerate(firsts) if first in masks.refused)
        out: list[Verified | None] = []
        rows, last = [], []
        for i, (seq, draft) in enumerate(zip(seqs, drafts, strict=True)):
            if seq.finished or i in refused:
                out.append(None)
                continue
            first = firsts[i]
            cut = cut_of.get(first, len(draft))
            emitted = verify_draft(draft, targets[first : first + len(draft) + 1], cut)
            out.append((emitted, cut if seq.grammar is not None else 0))
            rows.append(seq.row)
            last.append(emitted[-1])
        if rows:  # one upload of (rows, tokens) (two cost a verifying step 6 us on the CPU)
            update = torch.from_numpy(np.array((rows, last), dtype=np.int64))
            update = update.to(self.last_tokens.device, non_blocking=True)
            self.last_tokens.index_copy_(0, update[0], update[1])
        if refused == masks.refused:  # the same rows (most often none)
            return masks, out
        return dataclasses.replace(masks, refused=refused), out

    def finish(
        self,
        seq: SequenceState,
        draft: list[int],
        emitted: list[int],
        grammar_accepted: int,
        end: Callable[[SequenceState], None],
    ) -> SequenceOutput:
        """Appends the verified run (accepted draft tokens, then the model's token) up to
        the first stop, moves the sequence's position past what it kept (the KV of rejected
        positions is written over later) and rolls its grammar back to the kept tokens;
        `end` ends a sequence that stopped."""
        seq.verifying = False
        reason = stop_id = None
        kept: list[int] = []
        for token_id in emitted:
            seq.token_ids.append(token_id)
            kept.append(token_id)
            reason, stop_id = check_finish(seq, token_id, self.eos_token_ids, self.max_model_len)
            if reason is not None:
                break
        extra = len(kept) - 1  # prepare advanced the sequence by one token
        seq.num_computed_tokens += extra
        seq.num_known_tokens += extra
        num_accepted = len(emitted) - 1
        num_forced, seq.num_forced_tokens = min(seq.num_forced_tokens, len(draft)), 0
        if seq.draft_length is not None and len(draft) > num_forced:  # the proposer's part
            seq.draft_length.update(len(draft) - num_forced, max(0, num_accepted - num_forced))
        num_forced = min(num_forced, num_accepted, len(kept) - 1)  # a stop or length cuts it
        if draft:  # a row of a drafted step may have had no guess: no draft to count
            self.stats.record(len(draft), num_accepted, num_forced)
        if seq.grammar is not None:
            seq.grammar.matcher.rollback(grammar_accepted - min(extra, num_accepted))
            seq.grammar.pending_token = kept[-1] if len(kept) == len(emitted) else None
        if reason is not None:
            end(seq)
        return SequenceOutput(
            seq.req_id, kept[-1], None, reason, stop_id,
            accepted_token_ids=kept[:-1], num_draft_tokens=len(draft),
            num_forced_tokens=num_forced,
        )  # fmt: skip
