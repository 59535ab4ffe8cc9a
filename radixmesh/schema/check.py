"""A finished output checked against the request's own JSON Schema.

The grammar enforces a rewritten schema; this validates the text the caller
gets against the schema the caller sent (its every keyword, formats included),
so a grammar gap shows as `INVALID` instead of passing unseen. Numbers must be
finite: JSON has no infinity, and a digit run that parses as one is invalid.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from enum import Enum
from typing import Any

import jsonschema

from radixmesh.schema.formats import FORMAT_CHECKS

FORMAT_CHECKER = jsonschema.FormatChecker()
for _name, _check in FORMAT_CHECKS.items():
    # a format constrains strings only; any other value passes it
    FORMAT_CHECKER.checks(_name)(lambda v, check=_check: not isinstance(v, str) or check(v))


class SchemaCheck(Enum):
    VALID = "valid"
    INVALID = "invalid"
    TRUNCATED = "truncated"
    """The output did not finish ("length" or "abort"): not a schema failure."""


@dataclass(frozen=True, slots=True)
class SchemaResult:
    check: SchemaCheck
    error: str = ""
    """Why an INVALID output failed, naming the JSON path of the failing value."""


class _NonFinite(ValueError):
    pass


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NonFinite(f"number {text[:20]}... is not finite")
    return value


def _no_constant(text: str) -> Any:
    raise _NonFinite(f"{text} is not JSON")


def schema_hash(schema_text: str) -> str:
    """A short stable id of a schema for logs: sha256 of its canonical JSON, 16 hex digits."""
    try:
        canonical = json.dumps(json.loads(schema_text), sort_keys=True, separators=(",", ":"))
    except json.JSONDecodeError:
        canonical = schema_text
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def check_output(schema: Any, text: str, finish_reason: str) -> SchemaResult:
    """VALID / INVALID (with the reason) for a "stop" output; TRUNCATED for the others."""
    if finish_reason != "stop":
        return SchemaResult(SchemaCheck.TRUNCATED)
    try:
        instance = json.loads(text, parse_float=_finite_float, parse_constant=_no_constant)
    except (json.JSONDecodeError, _NonFinite) as exc:
        return SchemaResult(SchemaCheck.INVALID, f"not valid JSON: {exc}")
    validator_cls = jsonschema.validators.validator_for(schema)
    try:
        error = jsonschema.exceptions.best_match(
            validator_cls(schema, format_checker=FORMAT_CHECKER).iter_errors(instance)
        )
    except (jsonschema.exceptions.SchemaError, jsonschema.exceptions._RefResolutionError) as exc:
        return SchemaResult(SchemaCheck.INVALID, f"schema could not be applied: {exc}")
    if error is None:
        return SchemaResult(SchemaCheck.VALID)
    where = error.json_path
    return SchemaResult(SchemaCheck.INVALID, f"{where}: {error.message}"[:300])
