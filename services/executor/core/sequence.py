"""Per-sequence state the executor keeps between steps, and its stop rules."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from radixmesh.sampling import Constraint, SamplingParams


class TokenMatcher(Protocol):
    """The grammar hook: one per constrained sequence, built by the executor's matcher factory.

    Before sampling, the executor asks for the row of allowed tokens. The
    sampled token is reported to the matcher at the start of the sequence's
    next step, beside that step's forward and before its bitmask is filled
    (`SequenceState.pending_token`), so the grammar's work per token stays off
    the path between two forwards. A sampled token the bitmask allowed that is
    one of the grammar's stop tokens ends the grammar (`is_stop_token`): the
    sequence finishes with "stop" in the step that sampled it. A matcher that
    refuses a sampled token (which the bitmask should have made impossible)
    ends the sequence with "abort" in the step that reports it.
    `grammar_matcher.ConstraintMatcher` is the implementation. Its jump-forward
    (forced continuation) is not used: forced tokens are not the tokenizer's
    own encoding of the text, so the output would differ from plain sampling,
    and the step contract returns one token per sequence and step.
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

    def is_stop_token(self, token_id: int) -> bool:
        """Accepting token_id (one the bitmask allowed) ends the grammar."""
        ...

    @property
    def is_terminated(self) -> bool: ...


MatcherFactory = Callable[[Constraint], TokenMatcher]


def accept_tokens(matchers: Sequence[TokenMatcher], token_ids: Sequence[int]) -> list[bool]:
    """matchers[i].accept(token_ids[i]) for each i; in one call when every matcher is of
    one class that has a static `accept_many(matchers, token_ids)` (one trip into the
    grammar library for the whole batch)."""
    kinds = {type(m) for m in matchers}
    many = getattr(next(iter(kinds)), "accept_many", None) if len(kinds) == 1 else None
    if many is not None:
        return many(matchers, token_ids)
    return [m.accept(t) for m, t in zip(matchers, token_ids, strict=True)]


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
    pending_token: int | None = None
    """The token sampled last, not yet accepted by `matcher`: the next step that samples
    the sequence accepts it before filling its bitmask."""
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
    if seq.matcher is not None and seq.matcher.is_stop_token(token_id):
        return "stop", None
    if params.max_tokens is not None and seq.num_output_tokens >= params.max_tokens:
        return "length", None
    if len(seq.token_ids) >= max_model_len:
        return "length", None
    return None, None
