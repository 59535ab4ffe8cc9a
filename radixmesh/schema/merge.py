"""The conjunction of two JSON Schemas as one schema, where that is exact.

`merge(a, b)` returns a schema whose instances are exactly those valid against
both `a` and `b` (used to fold `allOf`, and to push a schema's sibling keywords
into each `anyOf` branch). It raises `Unsatisfiable` when no instance can satisfy
both (a branch that can be dropped), and `Inexpressible` when the conjunction has
no exact single-schema form here (two different patterns, say): the caller then
reports the combinator as not enforced.
"""

from __future__ import annotations

import json
import math
from typing import Any

Schema = dict[str, Any] | bool

ANNOTATIONS = frozenset(
    {
        "title", "description", "default", "examples", "$schema", "$id", "$comment",
        "deprecated", "readOnly", "writeOnly", "$anchor", "$vocabulary", "contentEncoding",
        "contentMediaType", "contentSchema", "$defs", "definitions",
    }
)  # fmt: skip
"""Keywords that never change whether an instance is valid."""
_LOWER = ("minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties")
_UPPER = ("maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties")
_TYPES = ("string", "number", "integer", "object", "array", "boolean", "null")
_OBJECT_SHAPE = ("properties", "additionalProperties", "patternProperties")


class Unsatisfiable(ValueError):
    """No instance is valid against both schemas."""


class Inexpressible(ValueError):
    """The conjunction exists but has no exact form here; `keyword` is where it failed."""

    def __init__(self, keyword: str, reason: str) -> None:
        super().__init__(f"{keyword}: {reason}")
        self.keyword = keyword
        self.reason = reason


def canonical(value: Any) -> str:
    """One text per JSON value (object keys sorted; 1 and 1.0 alike), for comparisons."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def type_set(schema: dict[str, Any]) -> frozenset[str] | None:
    """The schema's `type` as a set, or None when it has none."""
    value = schema.get("type")
    if value is None:
        return None
    return frozenset([value] if isinstance(value, str) else value)


def _merge_types(a: frozenset[str], b: frozenset[str]) -> list[str]:
    both = set(a & b)
    if ("integer" in a and "number" in b) or ("number" in a and "integer" in b):
        both.add("integer")
    if not both:
        raise Unsatisfiable("type")
    return [t for t in _TYPES if t in both]


def merge(a: Schema, b: Schema) -> Schema:
    """The exact conjunction of a and b; see the module docstring."""
    if a is True or a == {}:
        return b
    if b is True or b == {}:
        return a
    if a is False or b is False:
        raise Unsatisfiable("false")
    assert isinstance(a, dict) and isinstance(b, dict)
    if "$ref" in a or "$ref" in b:
        raise Inexpressible("$ref", "a recursive reference cannot be combined with siblings")
    out = dict(a)
    if any(k in a or k in b for k in _OBJECT_SHAPE):
        _merge_object_shape(out, a, b)
    for key, value in b.items():
        if key in _OBJECT_SHAPE:
            continue
        if key not in out or key in ANNOTATIONS:
            out.setdefault(key, value)
            continue
        out[key] = _merge_keyword(key, out[key], value)
    if "const" in out and "enum" in out:
        out["enum"] = _intersect_values([out.pop("const")], out["enum"])
    _check_bounds(out)
    return out


def _check_bounds(s: dict[str, Any]) -> None:
    """Unsatisfiable when the merged bounds leave no value (e.g. minimum above maximum)."""
    for low, high in (("minLength", "maxLength"), ("minItems", "maxItems"),
                      ("minProperties", "maxProperties")):  # fmt: skip
        if low in s and high in s and s[low] > s[high]:
            raise Unsatisfiable(low)
    numeric = [s.get(k) for k in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum")]
    if any(isinstance(v, bool) for v in numeric):
        return  # draft 4's boolean exclusive bounds: left to the planner
    lows = [(s["minimum"], False)] if "minimum" in s else []
    lows += [(s["exclusiveMinimum"], True)] if "exclusiveMinimum" in s else []
    highs = [(s["maximum"], False)] if "maximum" in s else []
    highs += [(s["exclusiveMaximum"], True)] if "exclusiveMaximum" in s else []
    if not lows or not highs:
        return
    low, low_open = max(lows, key=lambda b: (b[0], b[1]))
    high, high_open = min(highs, key=lambda b: (b[0], not b[1]))
    if low > high or (low == high and (low_open or high_open)):
        raise Unsatisfiable("maximum")
    if type_set(s) == frozenset({"integer"}):
        first = math.floor(low) + 1 if low_open or low != math.floor(low) else low
        last = math.ceil(high) - 1 if high_open or high != math.ceil(high) else high
        if first > last:
            raise Unsatisfiable("maximum")


def _merge_keyword(key: str, x: Any, y: Any) -> Any:
    if canonical(x) == canonical(y):
        return x
    if key == "type":
        return _merge_types(type_set({"type": x}) or frozenset(), type_set({"type": y}) or frozenset())
    if key in _LOWER:
        return max(x, y)
    if key in _UPPER:
        return min(x, y)
    if key == "required":
        return [*x, *(k for k in y if k not in x)]
    if key == "enum":
        return _intersect_values(x, y)
    if key == "const":
        raise Unsatisfiable("const")
    if key == "items" and not isinstance(x, list) and not isinstance(y, list):
        return merge(x, y)
    if key == "prefixItems" and len(x) == len(y):
        return [merge(p, q) for p, q in zip(x, y, strict=True)]
    if key == "uniqueItems":
        return bool(x) or bool(y)
    if key == "multipleOf" and isinstance(x, int) and isinstance(y, int):
        return x * y // math.gcd(x, y)
    if key == "anyOf":
        return _cross(x, y)
    raise Inexpressible(key, "two different values cannot be combined exactly")


def _intersect_values(x: list[Any], y: list[Any]) -> list[Any]:
    keep = {canonical(v) for v in y}
    both = [v for v in x if canonical(v) in keep]
    if not both:
        raise Unsatisfiable("enum")
    return both


def _cross(x: list[Schema], y: list[Schema]) -> list[Schema]:
    """anyOf(x) and anyOf(y) as one anyOf of pairwise conjunctions (impossible pairs dropped)."""
    if len(x) * len(y) > 32:
        raise Inexpressible("anyOf", "too many combined branches")
    out: list[Schema] = []
    for p in x:
        for q in y:
            try:
                out.append(merge(p, q))
            except Unsatisfiable:
                continue
    if not out:
        raise Unsatisfiable("anyOf")
    return out


def _merge_object_shape(out: dict[str, Any], a: dict[str, Any], b: dict[str, Any]) -> None:
    """properties / additionalProperties of a and b, key by key."""
    a_patterns, b_patterns = a.get("patternProperties"), b.get("patternProperties")
    if (a_patterns or b_patterns) and canonical(a_patterns) != canonical(b_patterns):
        raise Inexpressible("patternProperties", "cannot be combined exactly")
    a_props, b_props = a.get("properties", {}), b.get("properties", {})
    a_rest, b_rest = a.get("additionalProperties", True), b.get("additionalProperties", True)
    props: dict[str, Schema] = {}
    for key in [*a_props, *(k for k in b_props if k not in a_props)]:
        left, right = a_props.get(key, a_rest), b_props.get(key, b_rest)
        try:
            props[key] = merge(left, right)
        except Unsatisfiable:
            props[key] = False  # the key cannot appear; a required one makes it all impossible
    required = {*a.get("required", ()), *b.get("required", ())}
    if any(props.get(k) is False for k in required):
        raise Unsatisfiable("required")
    if props:
        out["properties"] = props
    try:
        rest = merge(a_rest, b_rest)
    except Unsatisfiable:
        rest = False
    if rest is not True:
        out["additionalProperties"] = rest
    else:
        out.pop("additionalProperties", None)
    if "patternProperties" in a or "patternProperties" in b:
        out["patternProperties"] = a.get("patternProperties", b.get("patternProperties"))
