"""Per-sequence state the executor keeps between steps, and its stop rules."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from radixmesh.sampling import SamplingParams
from services.executor.core.grammar.interface import SequenceGrammar
from services.executor.core.spec.adaptive import DraftLength
from services.executor.core.spec.proposers import NgramIndex


@dataclass(slots=True)
class SequenceState:
    """One held sequence. `ExecutorCore.prepare` advances the planned fields, `execute` the rest."""

    req_id: str
    token_ids: list[int]
    """Every token on the host: prompt, earlier outputs, then each token this executor sampled
    in an executed step (it lags num_known_tokens while a prepared step is not executed)."""
    num_prompt_tokens: int
    num_computed_tokens: int
    """Tokens whose KV is in the pages once every prepared step has run (advanced by prepare)."""
    num_known_tokens: int
    """len(token_ids) plus the tokens that prepared, not yet executed, steps will sample."""
    num_pages: int
    """Pages the scheduler gave the sequence (their ids live in the core's host page tables)."""
    sampling: SamplingParams
    seed: int
    """The request's seed, or one drawn by the executor at admission."""
    row: int
    """Row of this sequence in the executor's device buffer of last sampled tokens."""
    grammar: SequenceGrammar | None = None
    """Its constraint's state (None: unconstrained)."""
    has_device_token: bool = False
    """The last known token is sampled here: the device buffer holds it at `row` (or will,
    in stream order, when the prepared step that samples it runs)."""
    finished: bool = False
    """The core ended the sequence in an executed step; later prepared steps skip it."""
    released: bool = False
    """Its buffer row went back to the free list (when dropped or finished)."""
    draft_length: DraftLength | None = None
    """Speculative decoding: its adaptive draft length (made at its first draft)."""
    ngram_index: NgramIndex | None = None
    """Speculative decoding: its own n-grams for prompt lookup (made at its first draft,
    extended by the tokens added since)."""
    num_forced_tokens: int = 0
    """Jump-forward: leading tokens of the draft a prepared step verifies that its grammar
    forced (spec/forced.py; set with the draft, read when the step executes)."""
    stopped: bool = False
    """The scheduler aborted it (`ExecutorCore.stop`): the remaining steps of a multi-step
    plan skip it; the plan that names it drops it."""
    verifying: bool = False
    """A prepared step verifies a draft of it and has not executed: until then its
    position is unknown, so no later step may be prepared with it."""

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens


def check_finish(
    seq: SequenceState, token_id: int, eos_token_ids: Sequence[int], max_model_len: int
) -> tuple[str | None, int | None]:
    """(finish_reason, matched_stop_token_id) after `token_id` was appended to `seq`."""
    params = seq.sampling
    num_tokens = len(seq.token_ids)
    num_output = num_tokens - seq.num_prompt_tokens
    if num_output > params.min_tokens:
        if token_id in params.stop_token_ids:
            return "stop", token_id
        if not params.ignore_eos and token_id in eos_token_ids:
            return "stop", token_id
    if seq.grammar is not None and seq.grammar.matcher.is_stop_token(token_id):
        return "stop", None
    if params.max_tokens is not None and num_output >= params.max_tokens:
        return "length", None
    if num_tokens >= max_model_len:
        return "length", None
    return None, None
