"""Structured output in the executor: constraints compiled into token masks, and the
grammar's part of each step.

The modules, each importing only those before it:

- `interface`: what the core needs of a grammar backend (`Grammar`: `matcher_for`,
  `accept_batch`), a sequence's matcher (`TokenMatcher`) and its grammar state in the
  core (`SequenceGrammar`). No grammar library here.
- `compiler`: a `Constraint` to an xgrammar grammar (`CompiledConstraint`), per kind.
- `matcher`: `ConstraintMatcher` over xgrammar, and its batch calls.
- `service`: `GrammarService`, the compile cache of one tokenizer (`GrammarConfig`,
  `GrammarMetrics`); it is the `Grammar` backend.
- `step`: `StepGrammar`, one core's per-step work: `admit` a new sequence, `start` its
  accepts and mask fill beside the forward, then `PendingMasks.result` (`StepMasks`).

`interface` and `step` import no grammar library; the others load on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from services.executor.core.grammar.interface import Grammar, SequenceGrammar, TokenMatcher
from services.executor.core.grammar.step import (
    UNCONSTRAINED,
    PendingMasks,
    StepGrammar,
    StepMasks,
)

if TYPE_CHECKING:
    from services.executor.core.grammar.compiler import CompiledConstraint
    from services.executor.core.grammar.matcher import (
        ConstraintMatcher,
        accept_batch,
        fill_batch_bitmask,
    )
    from services.executor.core.grammar.service import (
        GrammarConfig,
        GrammarMetrics,
        GrammarService,
    )

_ON_XGRAMMAR = {
    "CompiledConstraint": "compiler",
    "ConstraintMatcher": "matcher",
    "accept_batch": "matcher",
    "fill_batch_bitmask": "matcher",
    "GrammarConfig": "service",
    "GrammarMetrics": "service",
    "GrammarService": "service",
}
"""Names of the modules over xgrammar, imported on first use (xgrammar takes seconds to
import, and a core without a grammar backend never needs it)."""


def __getattr__(name: str) -> Any:
    module = _ON_XGRAMMAR.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


__all__ = [
    "UNCONSTRAINED",
    "CompiledConstraint",
    "ConstraintMatcher",
    "Grammar",
    "GrammarConfig",
    "GrammarMetrics",
    "GrammarService",
    "PendingMasks",
    "SequenceGrammar",
    "StepGrammar",
    "StepMasks",
    "TokenMatcher",
    "accept_batch",
    "fill_batch_bitmask",
]
