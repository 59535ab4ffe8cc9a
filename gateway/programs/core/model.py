"""A program as the runtime sees it: plain frozen dataclasses, one per statement kind.

Each statement carries `path`, its place in the program ("body[3].gen"), which every
error and event names. `convert.py` builds these from `program.proto`; the Python
frontend builds the proto.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from radixmesh.sampling import Constraint, SamplingParams


class RolePart(Enum):
    WHOLE = 0
    BEGIN = 1
    END = 2


class SelectMethod(Enum):
    TOKEN_LENGTH_NORMALIZED = 0
    GREEDY_TOKEN = 1
    UNCONDITIONAL_LIKELIHOOD_NORMALIZED = 2


class OnError(Enum):
    FAIL = 0
    FALLBACK = 1


class ConditionKind(Enum):
    CONTAINS = "contains"
    EQUALS = "equals"
    REGEX = "regex"


@dataclass(frozen=True, slots=True)
class Append:
    path: str
    text: str
    is_template: bool = False
    role: str = ""
    part: RolePart = RolePart.WHOLE


@dataclass(frozen=True, slots=True)
class Gen:
    path: str
    var: str
    sampling: SamplingParams
    constraint: Constraint | None = None
    model: str = ""


@dataclass(frozen=True, slots=True)
class Select:
    path: str
    var: str
    choices: tuple[str, ...]
    method: SelectMethod = SelectMethod.TOKEN_LENGTH_NORMALIZED
    model: str = ""


@dataclass(frozen=True, slots=True)
class Fork:
    path: str
    branches: tuple[tuple[Statement, ...], ...]
    """One body per branch (copies of one body are expanded by the converter)."""
    index_var: str = ""


@dataclass(frozen=True, slots=True)
class Condition:
    kind: ConditionKind
    var: str
    value: str
    negate: bool = False


@dataclass(frozen=True, slots=True)
class If:
    path: str
    condition: Condition
    then: tuple[Statement, ...]
    otherwise: tuple[Statement, ...] = ()


@dataclass(frozen=True, slots=True)
class Call:
    path: str
    tool: str
    var: str
    args: tuple[tuple[str, str], ...] = ()
    """String arguments as templates, in name order."""
    json_args: tuple[tuple[str, Any], ...] = ()
    timeout_s: float | None = None
    on_error: OnError = OnError.FAIL
    fallback: str = ""


@dataclass(frozen=True, slots=True)
class Return:
    path: str
    text: str
    """A variable name, or a template when is_template."""
    is_template: bool = False
    output_schema: str = ""


Statement = Append | Gen | Select | Fork | If | Call | Return


@dataclass(frozen=True, slots=True)
class Limits:
    """The limits of one program; the server's are the upper bounds of a request's."""

    max_statements: int = 256
    max_fork_width: int = 16
    max_depth: int = 8
    max_total_tokens: int = 8192
    max_wall_time_s: float = 300.0

    def __post_init__(self) -> None:
        from radixmesh.errors import InvalidArgument

        for name in Limits.__slots__:  # type: ignore[attr-defined]
            value = getattr(self, name)
            if not value > 0:
                raise InvalidArgument(f"limits.{name}: must be > 0, got {value}")

    def lowered(self, **requested: int | float | None) -> Limits:
        """These limits with the requested ones applied; a value above the bound is refused."""
        from radixmesh.errors import InvalidArgument

        values = {}
        for name, value in requested.items():
            if value is None:
                continue
            bound = getattr(self, name)
            if not 0 < value <= bound:
                raise InvalidArgument(f"limits.{name}: must be in (0, {bound}], got {value}")
            values[name] = value
        return Limits(**{**_fields(self), **values})


def _fields(limits: Limits) -> dict[str, Any]:
    return {name: getattr(limits, name) for name in Limits.__slots__}  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True)
class Program:
    body: tuple[Statement, ...]
    name: str = ""
    model: str = ""
    limits: Limits = field(default_factory=Limits)


def to_json(value: Any) -> str:
    """A variable's value as JSON text (a string variable is a JSON string)."""
    return json.dumps(value, ensure_ascii=False)
