"""What the executor core needs of a grammar: a matcher per constrained sequence, and
one call that accepts a step's sampled tokens.

`GrammarService` (service.py) is the implementation; tests plug in their own. Nothing
here imports the grammar library.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import torch

from radixmesh.sampling import Constraint


class TokenMatcher(Protocol):
    """One constrained sequence's grammar state.

    Before sampling, the executor asks for the row of allowed tokens. The
    sampled token is reported to the matcher at the start of the sequence's
    next step, beside that step's forward and before its bitmask is filled
    (`SequenceGrammar.pending_token`), so the grammar's work per token stays off
    the path between two forwards. A sampled token the bitmask allowed that is
    one of the grammar's stop tokens ends the grammar (`is_stop_token`): the
    sequence finishes with "stop" in the step that sampled it. A matcher that
    refuses a sampled token (which the bitmask should have made impossible)
    ends the sequence with "abort" in the step that reports it.
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

    def rollback(self, num_tokens: int) -> None:
        """Undoes the last num_tokens accepts (draft tokens the verification rejected)."""
        ...


M = TypeVar("M", bound=TokenMatcher)


class Grammar(Protocol[M]):
    """The executor core's grammar backend: one per tokenizer, shared by its cores."""

    def matcher_for(self, constraint: Constraint) -> M:
        """A fresh matcher for one sequence; may compile (blocking), raises InvalidArgument
        naming the constraint field for a grammar it refuses."""
        ...

    def accept_batch(self, matchers: Sequence[M], token_ids: Sequence[int]) -> list[bool]:
        """matchers[i].accept(token_ids[i]) for each i, in one call for the step."""
        ...


@dataclass(slots=True)
class SequenceGrammar:
    """A constrained sequence's grammar in the executor, made by `StepGrammar.admit`."""

    matcher: TokenMatcher
    min_tokens: int
    """The request's min_tokens: below it, a grammar that allows only stop tokens wins."""
    stop_token_ids: tuple[int, ...]
    """EOS and the request's stop token ids: what min_tokens holds back."""
    pending_token: int | None = None
    """The token sampled last, not yet accepted by `matcher`: the next step that samples
    the sequence accepts it before filling its bitmask row."""
