"""Per-sequence state the executor keeps between steps, and its stop rules."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from services.common.sampling import Constraint, SamplingParams


class TokenMatcher(Protocol):
    """The grammar hook: one per constrained sequence, built by the executor's matcher factory.

    Before sampling, the executor asks for the row of allowed tokens; after
    sampling, it reports the chosen token. A matcher that has reached the
    grammar's end finishes the sequence with "stop"; one that refuses the
    sampled token (which the bitmask should have made impossible) ends it with
    "abort", without the token. `grammar_matcher.ConstraintMatcher` is the
    implementation. Its jump-forward (forced continuation) is not used: forced
    tokens are not the tokenizer's own encoding of the text, so the output
    would differ from plain sampling, and the step contract returns one token
    per sequence and step.
    """

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Writes allowed tokens into row `row` of a host int32 [B, ceil(V / 32)] bitmask."""
        ...

    def accept(self, token_id: int) -> bool:
        """Advances by one sampled token; False if the grammar refuses it (the core aborts)."""
        ...

    def replay(self, token_ids: Sequence[int]) -> None:
        """Resets, then accepts token_ids: the state of a resumed sequence."""
        ...

    @property
    def is_terminated(self) -> bool: ...


MatcherFactory = Callable[[Constraint], TokenMatcher]


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
    matcher: TokenMatcher | None = None
    has_device_token: bool = False
    """The last known token is sampled here: the device buffer holds it at `row` (or will,
    in stream order, when the prepared step that samples it runs)."""
    finished: bool = False
    """The core ended the sequence in an executed step; later prepared steps skip it."""
    released: bool = False
    """Its buffer row went back to the free list (when dropped or finished)."""

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]


def check_finish(
    seq: SequenceState, token_id: int, eos_token_ids: list[int], max_model_len: int
) -> tuple[str | None, int | None]:
    """(finish_reason, matched_stop_token_id) after `token_id` was appended to `seq`."""
    params = seq.sampling
    may_stop = seq.num_output_tokens > params.min_tokens
    if may_stop and token_id in params.stop_token_ids:
        return "stop", token_id
    if may_stop and not params.ignore_eos and token_id in eos_token_ids:
        return "stop", token_id
    if seq.matcher is not None and seq.matcher.is_terminated:
        return "stop", None
    if params.max_tokens is not None and seq.num_output_tokens >= params.max_tokens:
        return "length", None
    if len(seq.token_ids) >= max_model_len:
        return "length", None
    return None, None
