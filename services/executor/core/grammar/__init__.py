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
"""

from services.executor.core.grammar.compiler import CompiledConstraint
from services.executor.core.grammar.interface import Grammar, SequenceGrammar, TokenMatcher
from services.executor.core.grammar.matcher import (
    ConstraintMatcher,
    accept_batch,
    fill_batch_bitmask,
)
from services.executor.core.grammar.service import GrammarConfig, GrammarMetrics, GrammarService
from services.executor.core.grammar.step import PendingMasks, StepGrammar, StepMasks

__all__ = [
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
