"""JSON-schema requests at the gateway: refused before any token, checked after the last.

`schema_spec(constraint)` plans the schema (radixmesh.schema): with a strict
constraint a keyword the grammar cannot enforce is an `InvalidArgument` naming
the keyword and its JSON path; a best-effort one keeps the list to report.
`SchemaWatch` gathers one choice's text and, when the choice finishes, checks
it against the caller's own schema: the result goes on the choice's last event,
into `radixmesh_gateway_structured_outputs_total{result}`, and an invalid "stop"
output (a grammar gap) is logged with the schema's hash.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from radixmesh.errors import InvalidArgument
from radixmesh.sampling import Constraint, ConstraintKind
from radixmesh.schema import SchemaCheck, check_enforceable, check_output, plan_schema_text
from radixmesh.schema import schema_hash as hash_schema
from services.common.logging import get_logger
from services.common.metrics import counter

FIELD = "constraint.json_schema"
log = get_logger(__name__)
STRUCTURED_OUTPUTS = counter(
    "gateway",
    "structured_outputs_total",
    "Finished choices of JSON-schema requests checked against their schema: valid, invalid "
    "(a stop output that fails it) or truncated (length or abort).",
    ["result"],
)


@dataclass(frozen=True, slots=True)
class SchemaSpec:
    """A request's JSON schema as the gateway checks outputs against it."""

    schema: Any
    """The caller's schema, parsed."""
    hash: str
    unenforced: tuple[str, ...] = ()
    """Best effort: JSON paths of the keywords the grammar does not enforce."""


@dataclass(frozen=True, slots=True)
class SchemaOutcome:
    """One finished choice checked against its schema."""

    check: SchemaCheck
    error: str = ""
    unenforced: tuple[str, ...] = ()


def schema_spec(constraint: Constraint | None) -> SchemaSpec | None:
    """The spec of a JSON_SCHEMA constraint (None for others); InvalidArgument when refused."""
    if constraint is None or constraint.kind is not ConstraintKind.JSON_SCHEMA:
        return None
    try:
        schema = json.loads(constraint.value)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"{FIELD}: not valid JSON: {exc}") from None
    try:
        plan = plan_schema_text(constraint.value)
    except InvalidArgument as exc:
        raise InvalidArgument(f"{FIELD}: {exc}") from None
    if not constraint.best_effort:
        check_enforceable(plan, FIELD)
    return SchemaSpec(schema, hash_schema(constraint.value), plan.unenforced_names())


@dataclass(slots=True)
class SchemaWatch:
    """One choice's output text, checked against its schema when the choice ends."""

    spec: SchemaSpec
    req_id: str = ""
    _parts: list[str] = field(default_factory=list)

    def push(self, text: str) -> None:
        if text:
            self._parts.append(text)

    def finish(self, finish_reason: str) -> SchemaOutcome:
        result = check_output(self.spec.schema, "".join(self._parts), finish_reason)
        STRUCTURED_OUTPUTS.labels(result=result.check.value).inc()
        if result.check is SchemaCheck.INVALID:
            log.warning(
                "structured_output_invalid",
                req_id=self.req_id,
                schema_hash=self.spec.hash,
                num_unenforced=len(self.spec.unenforced),
                error=result.error,
            )
        return SchemaOutcome(result.check, result.error, self.spec.unenforced)


def observe(watch: SchemaWatch | None, text: str, finish_reason: str | None) -> SchemaOutcome | None:
    """Feed one delta of a choice; the outcome when the delta ends the choice."""
    if watch is None:
        return None
    watch.push(text)
    return watch.finish(finish_reason) if finish_reason else None


def schema_fields(outcome: SchemaOutcome | None) -> dict[str, Any]:
    """The OpenAI extension fields of a finished choice (empty without a JSON schema)."""
    if outcome is None:
        return {}
    fields: dict[str, Any] = {"schema_check": outcome.check.value}
    if outcome.error:
        fields["schema_error"] = outcome.error
    if outcome.unenforced:
        fields["unenforced_keywords"] = list(outcome.unenforced)
    return fields
