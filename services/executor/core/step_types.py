"""What a step is between the executor core's calls: `PreparedStep` (its host work done,
by `ExecutorCore.prepare`) and `LaunchedStep` (its device work queued, by `launch`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from radixmesh.step import StepResult

if TYPE_CHECKING:
    from services.executor.core.forward_batch import ForwardBatch
    from services.executor.core.page_copy import SlotCopies
    from services.executor.core.prompt_scoring import PromptScoring
    from services.executor.core.sampling import SamplingInputs
    from services.executor.core.sampling_columns import SamplingColumns
    from services.executor.core.sequence import SequenceState


@dataclass(slots=True)
class PreparedStep:
    """A plan with its host work done, for `ExecutorCore.execute`; opaque beyond step_id."""

    step_id: int
    index: int
    """Order of preparation: steps execute in this order."""
    seqs: list[SequenceState] = field(default_factory=list)
    """The scheduled sequences, in batch order."""
    batch: ForwardBatch | None = None
    """None when nothing is scheduled."""
    samplers: list[SequenceState] = field(default_factory=list)
    """The sequences that sample, in batch (and logits row) order."""
    sampler_rows: list[int] = field(default_factory=list)
    """Each of `seqs`' row among the samplers, or -1 if it does not sample."""
    output_lens: list[int] = field(default_factory=list)
    """Each sampler's number of output tokens before this step's sample."""
    sampling_columns: SamplingColumns | None = None
    """The samplers' sampling parameters, gathered at prepare (for inputs built later)."""
    sampling_inputs: SamplingInputs | None = None
    """None: built at execute time (a penalised history lacked more than one token)."""
    scoring: PromptScoring | None = None
    """Rows whose logits score prompt tokens (sampling.prompt_logprobs_start); None: none."""
    scored_to_end: list[SequenceState] = field(default_factory=list)
    """Score-only sequences (max_tokens 0) whose prompt this step finishes: they end here."""
    drafts: list[list[int]] | None = None
    """Speculative decoding: each sampler's draft, verified after its token (k + 1 logits
    rows, most empty); None when the step verifies none."""
    prepare_seconds: float = 0.0
    copies: SlotCopies | None = None
    """KV slots the new sequences' `page_copy`s copy before the forward."""
    substep: int = 0
    """Which step of its plan this is (a multi-step plan prepares one per step)."""
    offered: bool = False  # the plan offered decodes draft tokens (drafted or not)
    plain: bool = False
    """Filled by prepare (`is_plain`): the step may be launched before the steps prepared
    ahead of it are finished."""


@dataclass(slots=True)
class LaunchedStep:
    """A step whose device work is queued (`ExecutorCore.launch`), for `finish`."""

    prepared: PreparedStep
    start: float
    """perf_counter() when the launch began."""
    result: StepResult | None = None
    """Set when the launch ran the whole step (not a plain one)."""
    token_ids: torch.Tensor | None = None
    """The sampled ids, one per sampler row, on the host once `ready` has fired (None: the
    step samples nothing)."""
    ready: torch.cuda.Event | None = None
    """Recorded after the ids' copy to the host (None on the CPU: already there)."""


def is_plain(prepared: PreparedStep) -> bool:
    """The step needs nothing of the host but its prepared inputs until its sampled ids
    are read back: no grammar, drafts, prompt scoring, page copies or log probabilities,
    and its sampling inputs built at prepare. Such a step may be launched before the steps
    prepared ahead of it are finished (their tokens stay on the device), and its own
    finish waits only for its own ids."""
    inputs = prepared.sampling_inputs
    return (
        prepared.batch is not None
        and inputs is not None
        and not inputs.want_logprobs
        and prepared.scoring is None
        and not prepared.scored_to_end
        and prepared.drafts is None
        and prepared.copies is None
        and all(s.grammar is None for s in prepared.samplers)
    )
