"""What a running program reports, in order (`program.proto`'s ProgramEvent, as plain data)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.cached_tokens + other.cached_tokens,
        )


@dataclass(frozen=True, slots=True)
class TextDelta:
    statement: str
    var: str
    text: str


@dataclass(frozen=True, slots=True)
class VarSet:
    statement: str
    var: str
    value: Any


class Prediction(Enum):
    """What became of an If's branch prediction (`program.proto`'s BranchPrediction)."""

    NONE = 0
    HIT = 1
    MISS = 2


@dataclass(frozen=True, slots=True)
class BranchTaken:
    statement: str
    then: bool
    prediction: Prediction = Prediction.NONE


@dataclass(frozen=True, slots=True)
class ToolStarted:
    statement: str
    tool: str
    args: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ToolFinished:
    statement: str
    tool: str
    cached: bool
    error: str = ""
    duration_ms: int = 0


@dataclass(frozen=True, slots=True)
class ScoredToken:
    token_id: int
    logprob: float
    text: str


@dataclass(frozen=True, slots=True)
class ChoiceScore:
    choice: str
    score: float
    logprob_sum: float
    num_tokens: int
    tokens: tuple[ScoredToken, ...] = ()  # the choice's tokens in context, as scored


@dataclass(frozen=True, slots=True)
class SelectScores:
    statement: str
    var: str
    scores: tuple[ChoiceScore, ...]


@dataclass(frozen=True, slots=True)
class ProgramError:
    statement: str
    code: str
    message: str


@dataclass(frozen=True, slots=True)
class StatementUsage:
    statement: str
    model: str
    usage: Usage


@dataclass(frozen=True, slots=True)
class ProgramResult:
    statement: str
    value: Any
    """The Return's value; None when the program ended without one."""
    variables: dict[str, Any]
    usage: tuple[StatementUsage, ...] = field(default=())

    @property
    def total(self) -> Usage:
        total = Usage()
        for entry in self.usage:
            total = total + entry.usage
        return total


@dataclass(frozen=True, slots=True)
class StatementDone:
    statement: str
    variables: dict[str, Any]
    """The variables this statement set."""
    returned: bool = False


Event = (
    TextDelta
    | VarSet
    | BranchTaken
    | ToolStarted
    | ToolFinished
    | SelectScores
    | ProgramError
    | ProgramResult
    | StatementDone
)


def coalesce(events: list[Event]) -> list[Event]:
    """The events in order, each Gen's TextDeltas joined into its first one in the list.
    Only a Gen's own later events (its VarSet) follow its text, so moving text up past
    other statements' events (a fork's other branches) keeps every statement's order."""
    out: list[Event] = []
    open_text: dict[str, int] = {}  # statement -> index in out of its TextDelta
    for event in events:
        at = open_text.get(event.statement)
        if isinstance(event, TextDelta):
            if at is not None:
                first = out[at]
                assert isinstance(first, TextDelta)
                if first.var == event.var:
                    out[at] = TextDelta(first.statement, first.var, first.text + event.text)
                    continue
            open_text[event.statement] = len(out)
        elif at is not None:
            del open_text[event.statement]
        out.append(event)
    return out
