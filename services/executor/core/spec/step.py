"""The speculative path through an executor step, beside the plain one.

At prepare: the step drafts only when every step prepared before has executed
(a draft continues the sequence's known tokens), each drafted decode runs its
token and its draft as one extend of k + 1 positions with k + 1 logits rows,
and the sequence is marked verifying. At execute: the grammar rows and output
lengths are spread over those rows, and the verifier (verifier.py) samples and
keeps what the model agrees with.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from radixmesh.step import SequenceOutput
from services.executor.core.spec.drafting import (
    NO_DRAFTS,
    DraftChoice,
    DraftLimits,
    expand_rows,
    plan_drafts,
)
from services.executor.core.spec.forced import ForcedTokens
from services.executor.core.spec.proposers import Proposer
from services.executor.core.spec.switch import SpecSwitch, request_gain

if TYPE_CHECKING:
    from services.executor.core.sequence import SequenceState
    from services.executor.core.step_types import PreparedStep

T = TypeVar("T")


def step_drafts(
    proposer: Proposer | None,
    all_executed: bool,
    seqs: Sequence[SequenceState],
    num_tokens: Sequence[int],
    allowed: Sequence[int],
    limits: DraftLimits,
    forced: ForcedTokens | None = None,
    switch: SpecSwitch | None = None,
    forced_switch: SpecSwitch | None = None,
    choice: DraftChoice | None = None,
) -> list[list[int]] | None:
    """Each scheduled sequence's draft (most empty); None when the step drafts nothing:
    speculation and jump-forward (`forced`) off, a prepared step not executed yet, the
    step's `choice` (drafting.choose_drafting; None: decided here) NO_DRAFTS, or no
    decode drafts. `switch` / `forced_switch`: whether the step's decodes get the
    proposer's drafts / their forced runs."""
    if (proposer is None and forced is None) or not all_executed or choice == NO_DRAFTS:
        return None
    return plan_drafts(
        proposer, seqs, num_tokens, allowed, limits, forced, switch, forced_switch, choice
    )


def record_gain(
    switch: SpecSwitch, drafts: Sequence[Sequence[int]], outputs: Sequence[SequenceOutput]
) -> None:
    """Tells the switch what a drafted step emitted per decode; a step with forced runs
    is left out (it verifies, and pays for the padded rows, whatever the proposer does)."""
    if not any(drafts) or any(o.num_forced_tokens for o in outputs):
        return
    emitted = [1 + len(o.accepted_token_ids) for o in outputs if o.token_id is not None]
    gain = request_gain(emitted, len(emitted)) if emitted else None
    switch.record(gain, sum(emitted) - len(emitted))


def record_gains(
    switch: SpecSwitch | None,
    forced_switch: SpecSwitch | None,
    drafts: Sequence[Sequence[int]],
    outputs: Sequence[SequenceOutput],
) -> None:
    """A drafted step's gains: the proposer's to `switch`, the forced runs' to
    `forced_switch` (either None: not on)."""
    if switch is not None:
        record_gain(switch, drafts, outputs)
    if forced_switch is not None:
        record_forced_gain(forced_switch, drafts, outputs)


def timed_kind(prepared: PreparedStep) -> bool | None:
    """Which side of the switch's ratio a step is timed for: True for a decode step of a
    plan that offered drafts (verifying them or not), False for one of a plan that offered
    none; None for anything else (a prefill chunk, prompt scoring, an empty step)."""
    batch = prepared.batch
    if batch is None or prepared.scoring is not None:
        return None
    drafts = prepared.drafts
    if drafts is None:
        return prepared.offered if batch.is_decode else None
    if len(prepared.samplers) != len(prepared.seqs) or batch.max_q_len > 1 + max(map(len, drafts)):
        return None
    return True


class StepClock:
    """The wall clock between timed decode steps (switch.py): a step is timed from the end
    of the step before when that one was timed too and, for a plain step, plain too."""

    def __init__(self) -> None:
        self.end = 0.0
        self.kind: bool | None = None
        """timed_kind of the step that ended at `end`."""

    def tick(
        self, prepared: PreparedStep, end: float, switches: Sequence[SpecSwitch | None]
    ) -> None:
        """A step ended at `end` (perf_counter): the switches learn its time if timed."""
        kind, last = timed_kind(prepared), self.kind
        if kind is not None and last is not None and (kind or not last):
            for switch in switches:
                if switch is not None:
                    switch.observe_step(len(prepared.seqs), end - self.end, kind)
        self.end, self.kind = end, kind


def record_forced_gain(
    switch: SpecSwitch, drafts: Sequence[Sequence[int]], outputs: Sequence[SequenceOutput]
) -> None:
    """Tells jump-forward's switch what a step with forced runs emitted per decode: a
    token each, and the forced tokens kept (a proposer's accepted guesses left out)."""
    if not any(o.num_forced_tokens for o in outputs):
        return
    emitted = [1 + o.num_forced_tokens for o in outputs if o.token_id is not None]
    switch.record(request_gain(emitted, len(emitted)) if emitted else None)


def drafted_lengths(
    num_tokens: Sequence[int], drafts: Sequence[Sequence[int]]
) -> tuple[list[int], np.ndarray]:
    """A drafted step's query length per sequence (its planned tokens plus its draft) and
    its number of logits rows (k + 1 for a draft of k, else 1)."""
    q_lens = [q + len(d) for q, d in zip(num_tokens, drafts, strict=True)]
    num_logits = np.fromiter((len(d) + 1 for d in drafts), dtype=np.int64, count=len(drafts))
    return q_lens, num_logits


def start_verifying(seqs: Sequence[SequenceState], drafts: Sequence[Sequence[int]]) -> None:
    """Changes state: a sequence with a draft is verifying until the step executes, and
    its position leaves the draft out (prepare adds the query length, draft included; the
    verification adds back the accepted tokens)."""
    for seq, draft in zip(seqs, drafts, strict=True):
        seq.verifying = bool(draft)
        seq.num_computed_tokens -= len(draft)


def rows_over_drafts(
    rows: Sequence[T | None], output_lens: Sequence[int], drafts: Sequence[Sequence[int]] | None
) -> tuple[list[T | None], list[int]]:
    """Per-sampler values (grammar rows) and output lengths over the step's logits rows:
    as they are without drafts, else spread over each draft's k + 1 rows."""
    if drafts is None:
        return list(rows), list(output_lens)
    return expand_rows(rows, output_lens, drafts)
