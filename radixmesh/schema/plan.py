"""What of a JSON Schema the grammar enforces, and the schema the grammar compiles.

`plan_json_schema(schema)` walks every keyword and returns a `SchemaPlan`: the
schema rewritten so the grammar (xgrammar 0.2.9's JSON-schema converter, strict
mode) enforces it exactly, and the keywords it cannot enforce, each with its
JSON path. Rewrites are exact or narrowing (every value the rewritten schema
admits is valid against the original): local `$ref`s inlined; `allOf` folded
into one schema; sibling keywords pushed into each `anyOf` branch; `oneOf` with
provably disjoint branches written as `anyOf`; `enum`/`const` filtered by their
siblings; a missing `type` inferred from the keywords; required properties the
`properties` map lacks added; numbers bounded (finite, bounded digit runs);
enforced `format`s written as patterns; patterns rewritten over JSON text
(radixmesh.schema.pattern). The walker is pure data: the gateway and the
executor run the same one, so they agree on what is refused.
"""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import dataclass
from typing import Any

import jsonschema

from radixmesh.errors import InvalidArgument
from radixmesh.schema.check import FORMAT_CHECKER
from radixmesh.schema.formats import FORMAT_PATTERNS
from radixmesh.schema.merge import (
    ANNOTATIONS,
    Inexpressible,
    Schema,
    Unsatisfiable,
    canonical,
    merge,
    type_set,
)
from radixmesh.schema.pattern import UnsupportedPattern, json_string_pattern, pattern_lengths
from radixmesh.schema.refs import RefError, inline_refs, pointer_path

INT_LIMIT = 10**15 - 1
"""Integers without a bound get this one (15 digits: exact in every JSON parser)."""
FLOAT_LIMIT = 1e15
"""Numbers without a bound get this one, so every number the grammar writes is finite."""
MAX_MULTIPLES = 1000
"""An integer multipleOf is enforced when at most this many multiples are in range."""
ANY_DEF = "radixmesh_any"
"""The $defs entry an unconstrained value ({} or true) is rewritten to."""

FAMILIES = {
    "string": ("minLength", "maxLength", "pattern", "format"),
    "number": ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"),
    "object": (
        "properties", "required", "additionalProperties", "patternProperties", "propertyNames",
        "minProperties", "maxProperties", "dependentRequired", "dependentSchemas",
        "dependencies", "unevaluatedProperties",
    ),
    "array": (
        "items", "prefixItems", "additionalItems", "contains", "minContains", "maxContains",
        "minItems", "maxItems", "uniqueItems", "unevaluatedItems",
    ),
}  # fmt: skip
"""Type-specific keywords, by the type they constrain."""
NEVER_ENFORCED = {
    "not": "negation",
    "if": "conditionals (if/then/else)",
    "dependentRequired": "property dependencies",
    "dependentSchemas": "property dependencies",
    "dependencies": "property dependencies",
    "contains": "array containment",
    "minContains": "array containment",
    "maxContains": "array containment",
    "$dynamicRef": "dynamic references",
    "$recursiveRef": "dynamic references",
}
"""Keywords the grammar cannot hold, and why (the reason in the error)."""
_PASS_THROUGH = frozenset(
    {"type", "enum", "const", "minLength", "maxLength", "minimum", "maximum",
     "exclusiveMinimum", "exclusiveMaximum", "minItems", "maxItems", "minProperties",
     "maxProperties", "required"}
)  # fmt: skip
_NO_EFFECT = frozenset({"then", "else", "$dynamicAnchor", "$recursiveAnchor", "additionalItems"})
_ANY_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {"type": "string"},
        {"type": "number", "minimum": -FLOAT_LIMIT, "maximum": FLOAT_LIMIT},
        {"type": "boolean"},
        {"type": "null"},
        {"type": "array", "items": {"$ref": f"#/$defs/{ANY_DEF}"}},
        {"type": "object", "additionalProperties": {"$ref": f"#/$defs/{ANY_DEF}"}},
    ]
}


@dataclass(frozen=True, slots=True)
class Unenforced:
    """One keyword the grammar does not enforce."""

    path: str
    """JSON path of the schema holding it, "" at the root (e.g. "properties.a")."""
    keyword: str
    reason: str

    def describe(self, root: str = "") -> str:
        """'<root>.<path>.<keyword>: keyword "<keyword>" cannot be enforced (<reason>)'."""
        where = ".".join(p for p in (root, self.path, self.keyword) if p)
        return f'{where}: keyword "{self.keyword}" cannot be enforced ({self.reason})'


@dataclass(frozen=True, slots=True)
class SchemaPlan:
    grammar_schema: Schema
    """What the grammar compiles: exact or narrower than the request's schema."""
    unenforced: tuple[Unenforced, ...] = ()
    """Keywords of the request's schema the grammar does not hold (empty: all enforced)."""

    @property
    def grammar_text(self) -> str:
        return json.dumps(self.grammar_schema, ensure_ascii=False, sort_keys=False)

    def unenforced_names(self, root: str = "") -> tuple[str, ...]:
        """Each unenforced keyword as its full path, e.g. "properties.a.not"."""
        return tuple(".".join(p for p in (root, u.path, u.keyword) if p) for u in self.unenforced)


def plan_json_schema(schema: Schema) -> SchemaPlan:
    """Classify and rewrite `schema`; see the module docstring."""
    if not isinstance(schema, dict | bool):
        raise InvalidArgument(f"must be a JSON object or boolean, got {type(schema).__name__}")
    try:
        inlined, recursive = inline_refs(schema)
    except RefError as exc:
        raise InvalidArgument(f"$ref {exc}") from None
    except RecursionError:
        raise InvalidArgument("is nested too deeply") from None
    planner = _Planner()
    out = planner.visit(inlined, "")
    defs: dict[str, Any] = {}
    for pointer, target in recursive.items():
        if pointer == "#":
            continue
        if not pointer.startswith(("#/$defs/", "#/definitions/")):
            planner.note(pointer_path(pointer), "$ref", "a recursive reference outside $defs")
            continue
        _place(defs, pointer, planner.visit(target, pointer_path(pointer)))
    if planner.uses_any:
        defs.setdefault("$defs", {})[ANY_DEF] = _ANY_SCHEMA
    if defs and isinstance(out, dict):
        for key, value in defs.items():
            out[key] = {**out.get(key, {}), **value}
    return SchemaPlan(out, tuple(planner.notes.values()))


@functools.lru_cache(maxsize=1024)
def plan_schema_text(text: str) -> SchemaPlan:
    """plan_json_schema of a schema given as JSON text, cached by that text (requests repeat
    their schemas; the plan is read-only). InvalidArgument for text that is not JSON."""
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"not valid JSON: {exc}") from None
    return plan_json_schema(schema)


def check_enforceable(plan: SchemaPlan, field: str) -> None:
    """InvalidArgument naming the first unenforced keyword (and how many more), if any."""
    if plan.unenforced:
        first = plan.unenforced[0].describe(field)
        more = len(plan.unenforced) - 1
        raise InvalidArgument(first + (f"; and {more} more unenforced keyword(s)" if more else ""))


def _place(out: dict[str, Any], pointer: str, value: Schema) -> None:
    parts = [p.replace("~1", "/").replace("~0", "~") for p in pointer[2:].split("/")]
    node = out
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


def _join(path: str, *parts: str) -> str:
    return ".".join(p for p in (path, *parts) if p)


class _Planner:
    def __init__(self) -> None:
        self.notes: dict[tuple[str, str], Unenforced] = {}
        self.uses_any = False

    def note(self, path: str, keyword: str, reason: str) -> None:
        self.notes.setdefault((path, keyword), Unenforced(path, keyword, reason))

    def any_value(self) -> Schema:
        self.uses_any = True
        return {"$ref": f"#/$defs/{ANY_DEF}"}

    def visit(self, node: Any, path: str) -> Schema:
        if node is True or node == {}:
            return self.any_value()
        if node is False:
            return False
        if not isinstance(node, dict):
            raise InvalidArgument(f"{path or 'schema'}: a schema must be an object or a boolean")
        s: dict[str, Any] = node
        if "$ref" in s:  # a recursive reference (the others are inlined)
            return self._recursive_ref(s, path)
        if "allOf" in s:
            folded = self._fold_all_of(s, path)
            if not isinstance(folded, dict):
                return folded
            s = folded
            if "$ref" in s:
                return self._recursive_ref(s, path)
        s = self._filter_literals(s, path)
        s = _infer_type(s)
        if "anyOf" in s or "oneOf" in s:
            return self._branches(s, path)
        out = self._keywords(s, path)
        return out if out else self.any_value()

    def _recursive_ref(self, s: dict[str, Any], path: str) -> Schema:
        pointer = s["$ref"]
        if not pointer.startswith("#"):
            self.note(path, "$ref", "only references inside the schema (#/...) are resolved")
            return self.any_value()
        if any(k not in ANNOTATIONS for k in s if k != "$ref"):
            self.note(path, "$ref", "a recursive reference with sibling keywords")
        return {"$ref": pointer}

    def _fold_all_of(self, s: dict[str, Any], path: str) -> Schema:
        branches = s["allOf"]
        acc: Schema = {k: v for k, v in s.items() if k != "allOf"}
        for index, branch in enumerate(branches):
            if isinstance(branch, dict) and "allOf" in branch:
                branch = self._fold_all_of(branch, _join(path, f"allOf[{index}]"))
            try:
                acc = merge(acc, branch)
            except Unsatisfiable:
                self.note(path, "allOf", "no value satisfies every branch")
                return acc
            except Inexpressible as exc:
                self.note(path, "allOf", f"branch {index}: {exc}")
        return acc

    def _filter_literals(self, s: dict[str, Any], path: str) -> dict[str, Any]:
        if "enum" not in s and "const" not in s:
            return s
        values = [s["const"]] if "const" in s else list(s.get("enum", ()))
        if "const" in s and "enum" in s:
            values = [v for v in values if canonical(v) in {canonical(e) for e in s["enum"]}]
        rest = {k: v for k, v in s.items() if k not in ("enum", "const") and k not in ANNOTATIONS}
        if rest and "$ref" not in json.dumps(rest):
            # formats checked as outputs are (check_output): a listed "" beside format
            # "date" is not a date
            validator = jsonschema.validators.validator_for(rest)(rest, format_checker=FORMAT_CHECKER)
            values = [v for v in values if validator.is_valid(v)]
        if not values:
            self.note(path, "enum" if "enum" in s else "const", "no listed value satisfies the schema")
            return s
        return {"enum": values, **{k: v for k, v in s.items() if k in ANNOTATIONS}}

    def _branches(self, s: dict[str, Any], path: str) -> Schema:
        kind = "anyOf" if "anyOf" in s else "oneOf"
        if "anyOf" in s and "oneOf" in s:
            self.note(path, "oneOf", "beside anyOf")
        siblings = {k: v for k, v in s.items() if k not in ("anyOf", "oneOf")}
        has_siblings = any(k not in ANNOTATIONS for k in siblings)
        merged: list[tuple[int, Schema]] = []
        for index, branch in enumerate(s[kind]):
            if has_siblings:
                try:
                    branch = merge(siblings, branch)
                except Unsatisfiable:
                    continue  # no value of this branch satisfies the siblings: exact to drop
                except Inexpressible as exc:
                    self.note(_join(path, f"{kind}[{index}]"), exc.keyword, exc.reason)
            merged.append((index, branch))
        if not merged:
            self.note(path, kind, "no branch satisfies the schema beside it")
            return False
        if kind == "oneOf" and not _pairwise_disjoint([b for _, b in merged]):
            self.note(path, "oneOf", "branches may overlap; only anyOf semantics can be enforced")
        out = [self.visit(b, _join(path, f"{kind}[{i}]")) for i, b in merged]
        annotations = {k: v for k, v in siblings.items() if k in ANNOTATIONS}
        return {**annotations, "anyOf": out} if len(out) > 1 else out[0]

    def _keywords(self, s: dict[str, Any], path: str) -> Schema:
        out: dict[str, Any] = {}
        types = type_set(s)
        s = self._complete_required(s, path)
        for key, value in s.items():
            if key in ANNOTATIONS or key in _NO_EFFECT:
                continue
            if key in NEVER_ENFORCED:
                if key != "if" or "then" in s or "else" in s:
                    self.note(path, key, NEVER_ENFORCED[key])
            elif key in ("minLength", "maxLength") and ("pattern" in s or "format" in s):
                continue  # beside a pattern: `_string` decides
            elif key in _PASS_THROUGH:
                out[key] = value
            elif key == "properties":
                out[key] = self._properties(s, path)
            elif key == "patternProperties":
                self._pattern_properties(s, out, path)
            elif key == "additionalProperties":
                out[key] = value if value is False else self.visit(value, _join(path, key))
            elif key == "propertyNames":
                self._property_names(s, out, path)
            elif key == "items":
                if isinstance(value, list):
                    self.note(path, key, "an array of schemas (write prefixItems)")
                else:
                    out[key] = value if value is False else self.visit(value, _join(path, key))
            elif key == "prefixItems":
                out[key] = [self.visit(v, _join(path, f"{key}[{i}]")) for i, v in enumerate(value)]
            elif key in ("unevaluatedProperties", "unevaluatedItems"):
                self._unevaluated(key, value, s, out, path)
            elif key == "uniqueItems":
                if value and s.get("maxItems", 2) > 1:
                    self.note(path, key, "distinct array items")
            elif key == "multipleOf":
                if types != {"integer"} or not isinstance(value, int) or value < 1:
                    self.note(path, key, "multipleOf holds for integers (type integer) only")
                else:
                    out[key] = value
            elif key in ("pattern", "format"):
                self._string(key, s, out, path, types)
            else:
                out[key] = value  # a keyword of no vocabulary: the validator ignores it too
        _bound_numbers(out, types, self, path)
        self._close_containers(out, types)
        if "multipleOf" in out:
            return self._multiples(out, path)
        return out

    def _close_containers(self, out: dict[str, Any], types: Any) -> None:
        """An object or array with nothing said of its members holds any values: written
        out, so their numbers are bounded too (the grammar library writes raw JSON there)."""
        if types is None:
            return
        shape = ("properties", "additionalProperties", "patternProperties", "propertyNames")
        if "object" in types and not any(k in out for k in shape):
            out["additionalProperties"] = self.any_value()
        if "array" in types and "items" not in out and "prefixItems" not in out:
            out["items"] = self.any_value()

    def _multiples(self, out: dict[str, Any], path: str) -> dict[str, Any]:
        """An integer multipleOf as the enum of its multiples in range (the grammar library
        enforces multipleOf only over small ranges)."""
        step = out.pop("multipleOf")
        low = max(out.get("minimum", -INT_LIMIT), out.get("exclusiveMinimum", -INT_LIMIT - 1) + 1)
        high = min(out.get("maximum", INT_LIMIT), out.get("exclusiveMaximum", INT_LIMIT + 1) - 1)
        first, last = -(-math.ceil(low) // step) * step, math.floor(high) // step * step
        if last < first or (last - first) // step >= MAX_MULTIPLES:
            self.note(path, "multipleOf", f"more than {MAX_MULTIPLES} multiples in range")
            return out
        return {"enum": list(range(first, last + 1, step))}

    def _complete_required(self, s: dict[str, Any], path: str) -> dict[str, Any]:
        """Required names the properties map lacks get the schema that would apply to them."""
        props = s.get("properties", {})
        missing = [k for k in s.get("required", ()) if k not in props]
        if not missing:
            return s
        added = dict(props)
        rest = s.get("additionalProperties", True)
        for name in missing:
            matching = [v for p, v in s.get("patternProperties", {}).items() if re.search(p, name)]
            if matching:
                added[name] = matching[0]
            elif rest is False:
                self.note(path, "required", f"{name!r} is required but no property allows it")
            else:
                added[name] = rest
        return {**s, "properties": added}

    def _properties(self, s: dict[str, Any], path: str) -> dict[str, Schema]:
        out: dict[str, Schema] = {}
        for name, sub in s["properties"].items():
            if sub is False:
                if s.get("additionalProperties", False) is not False:
                    self.note(_join(path, "properties", name), "false", "a forbidden name")
                continue  # the grammar writes only listed names: a forbidden one is left out
            out[name] = self.visit(sub, _join(path, "properties", name))
        return out

    def _pattern_properties(self, s: dict[str, Any], out: dict[str, Any], path: str) -> None:
        patterns = s["patternProperties"]
        names = list(s.get("properties", {}))
        try:
            overlap = [n for n in names for p in patterns if re.search(p, n)]
        except re.error as exc:
            raise InvalidArgument(f"{_join(path, 'patternProperties')}: {exc}") from None
        if overlap:
            self.note(path, "patternProperties", f"pattern also matches property {overlap[0]!r}")
            return
        if s.get("additionalProperties", False) is not False:
            self.note(path, "patternProperties", "beside additionalProperties")
            return
        rewritten: dict[str, Schema] = {}
        for pattern, sub in patterns.items():
            try:
                key = json_string_pattern(pattern)
            except UnsupportedPattern as exc:
                self.note(path, "patternProperties", str(exc))
                return
            rewritten[key] = self.visit(sub, _join(path, "patternProperties", pattern))
        out["patternProperties"] = rewritten

    def _property_names(self, s: dict[str, Any], out: dict[str, Any], path: str) -> None:
        names = s["propertyNames"]
        allowed = {"type", "pattern", "minLength", "maxLength", *ANNOTATIONS}
        if not isinstance(names, dict) or set(names) - allowed or names.get("type", "string") != "string":
            self.note(path, "propertyNames", "only pattern/minLength/maxLength are enforced")
            return
        validator = jsonschema.validators.validator_for(names)(names, format_checker=FORMAT_CHECKER)
        if any(not validator.is_valid(n) for n in s.get("properties", {})):
            self.note(path, "propertyNames", "a listed property breaks it")
            return
        if "pattern" in names and ("minLength" in names or "maxLength" in names):
            self.note(path, "propertyNames", "a pattern with a length bound")
            return
        try:
            rewritten = {k: v for k, v in names.items() if k not in ANNOTATIONS}
            if "pattern" in names:
                rewritten["pattern"] = json_string_pattern(names["pattern"])
        except UnsupportedPattern as exc:
            self.note(path, "propertyNames", str(exc))
            return
        out["propertyNames"] = rewritten

    def _unevaluated(self, key: str, value: Any, s: dict[str, Any], out: dict, path: str) -> None:
        closing = "additionalProperties" if key == "unevaluatedProperties" else "items"
        if value is False and closing not in s:
            out[closing] = False
        elif value is not True:
            self.note(path, key, "only false (or true) is enforced")

    def _string(self, key: str, s: dict[str, Any], out: dict, path: str, types: Any) -> None:
        """A pattern or format, and the minLength/maxLength beside it: the pattern where
        every string it matches has a length within them (the pattern enforces both), else
        the lengths, the pattern noted (the grammar holds one or the other)."""
        if types is not None and "string" not in types:
            return  # applies to strings only, and this schema admits none
        if key == "format" and "pattern" in s:  # the pattern's call writes the lengths
            self.note(path, key, "a format beside a pattern")
            return
        rewritten = self._string_pattern(key, s, path)
        if rewritten is None:
            out.update((k, s[k]) for k in ("minLength", "maxLength") if k in s)
        else:
            out["pattern"] = rewritten

    def _string_pattern(self, key: str, s: dict[str, Any], path: str) -> str | None:
        """The grammar's pattern for `key` (a pattern, or a format's) where it holds the
        lengths beside it too; None where it cannot (noted why)."""
        if key == "format" and s["format"] not in FORMAT_PATTERNS:
            self.note(path, key, f'format "{s["format"]}" is not one of {sorted(FORMAT_PATTERNS)}')
            return None
        pattern = s["pattern"] if key == "pattern" else FORMAT_PATTERNS[s["format"]]
        try:
            rewritten = json_string_pattern(pattern)
        except UnsupportedPattern as exc:
            self.note(path, key, str(exc))
            return None
        reason = _lengths_beside(pattern, s.get("minLength", 0), s.get("maxLength"))
        if reason is not None:
            self.note(path, key, reason)
            return None
        return rewritten


def _lengths_beside(pattern: str, low: int, high: int | None) -> str | None:
    """None when every string `pattern` matches in full has a length in [low, high] (high
    None: unbounded), so the pattern alone enforces both; else why the grammar cannot hold
    them together (it takes a pattern or lengths, not their intersection)."""
    if low == 0 and high is None:
        return None
    shortest, longest, anchored = pattern_lengths(pattern)
    if (high is not None and shortest > high) or (
        anchored and longest is not None and longest < low
    ):
        return "no value satisfies the pattern and minLength/maxLength"
    if anchored and shortest >= low and (high is None or (longest is not None and longest <= high)):
        return None
    return "a pattern and a minLength/maxLength it does not imply cannot be combined exactly"


def _infer_type(s: dict[str, Any]) -> dict[str, Any]:
    """A schema without `type` gets the types its keywords constrain (narrowing, exact for them)."""
    if "type" in s or "enum" in s or "anyOf" in s or "oneOf" in s or "$ref" in s:
        return s
    families = [f for f, keys in FAMILIES.items() if any(k in s for k in keys)]
    if len(families) == 1:
        return {**s, "type": families[0]}
    if len(families) > 1:
        branches = [
            {"type": f, **{k: v for k, v in s.items() if k in FAMILIES[f]}} for f in families
        ]
        return {**{k: v for k, v in s.items() if k in ANNOTATIONS}, "anyOf": branches}
    return s


def _bound_numbers(out: dict[str, Any], types: Any, planner: _Planner, path: str) -> None:
    """Numbers the grammar writes are finite: a side without a bound gets one."""
    if types is None or not types & {"integer", "number"}:
        return
    for key in ("exclusiveMinimum", "exclusiveMaximum"):
        if isinstance(out.get(key), bool):
            planner.note(path, key, "the boolean form (draft 4); write a number")
            out.pop(key)
    if types == {"integer"}:
        _whole_bounds(out, planner, path)
    limit = FLOAT_LIMIT if "number" in types else INT_LIMIT
    low = max((out[k] for k in ("minimum", "exclusiveMinimum") if k in out), default=None)
    high = min((out[k] for k in ("maximum", "exclusiveMaximum") if k in out), default=None)
    if low is None and (high is None or high > -limit):
        out["minimum"] = -limit
    if high is None and (low is None or low < limit):
        out["maximum"] = limit


def _whole_bounds(out: dict[str, Any], planner: _Planner, path: str) -> None:
    """An integer's bounds as the whole numbers they admit, inclusive: the grammar library
    refuses a fractional integer bound (a maximum of 0.5, say from an allOf with a number)."""
    lows = [math.ceil(out.pop("minimum"))] if "minimum" in out else []
    lows += [math.floor(out.pop("exclusiveMinimum")) + 1] if "exclusiveMinimum" in out else []
    highs = [math.floor(out.pop("maximum"))] if "maximum" in out else []
    highs += [math.ceil(out.pop("exclusiveMaximum")) - 1] if "exclusiveMaximum" in out else []
    if lows:
        out["minimum"] = max(lows)
    if highs:
        out["maximum"] = min(highs)
    if lows and highs and out["minimum"] > out["maximum"]:
        planner.note(path, "maximum", "no value satisfies minimum and maximum as an integer")
        out.pop("minimum"), out.pop("maximum")


def _literal_set(s: Schema) -> set[str] | None:
    if isinstance(s, dict) and "const" in s:
        return {canonical(s["const"])}
    if isinstance(s, dict) and "enum" in s:
        return {canonical(v) for v in s["enum"]}
    return None


def _value_types(s: Schema) -> set[str] | None:
    if not isinstance(s, dict):
        return None
    literals = [s["const"]] if "const" in s else s.get("enum")
    if literals is not None:
        names = {"str": "string", "bool": "boolean", "NoneType": "null", "dict": "object",
                 "list": "array", "int": "integer", "float": "number"}  # fmt: skip
        return {names[type(v).__name__] for v in literals}
    found = type_set(s)
    return set(found) if found is not None else None


def _disjoint(a: Schema, b: Schema) -> bool:
    ta, tb = _value_types(a), _value_types(b)
    if ta is not None and tb is not None:
        widen = {"integer", "number"}
        if not (ta & tb) and not (ta & widen and tb & widen):
            return True
    la, lb = _literal_set(a), _literal_set(b)
    if la is not None and lb is not None and not la & lb:
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        shared = set(a.get("required", ())) & set(b.get("required", ()))
        for name in shared:
            pa = _literal_set(a.get("properties", {}).get(name, {}))
            pb = _literal_set(b.get("properties", {}).get(name, {}))
            if pa is not None and pb is not None and not pa & pb:
                return True
    return False


def _pairwise_disjoint(branches: list[Schema]) -> bool:
    return all(
        _disjoint(a, b) for i, a in enumerate(branches) for b in branches[i + 1 :]
    )
