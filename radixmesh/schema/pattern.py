"""JSON Schema `pattern`s as the grammar can hold them inside a JSON string.

A `pattern` constrains the string's decoded characters, but the grammar writes
its JSON text: a quote, a backslash or a control character appears there as an
escape (`\\"`, `\\\\`, `\\n`, `\\u001f`). The grammar library (xgrammar 0.2.9)
takes a pattern that names such a character literally and emits the raw
character, which is not JSON; and it reads `(...)?` around a group holding a
repetition as if the group's first part were optional too (`(\\.[0-9]+)?`
admits `5`). `json_string_pattern` therefore rewrites every pattern over the
JSON text: each literal the text must escape becomes its escape sequence, each
character class (`.`, `[^/]`, `\\D`, ...) is narrowed to characters JSON writes
raw (printable ASCII and the class's own explicit non-ASCII members), and
`?` is written `{0,1}`. Whatever the grammar emits is then valid JSON whose
decoded text the original pattern matches. A pattern the grammar cannot hold
exactly (lookaround, back references, word boundaries, case-insensitive flags)
raises `UnsupportedPattern` with the reason.
"""

from __future__ import annotations

import re
from re import _constants as sre  # type: ignore[attr-defined]
from re import _parser as sre_parse  # type: ignore[attr-defined]
from typing import Any

MAX_CODEPOINT = 0x10FFFF
PRINTABLE = ((0x20, 0x7E),)
"""The characters a narrowed class keeps (besides its explicit non-ASCII members)."""
JSON_ESCAPED = frozenset({0x22, 0x5C, *range(0x20)})
"""Characters JSON text never holds raw inside a string."""
_SHORT_ESCAPES = {0x22: '"', 0x5C: "\\\\", 0x08: "b", 0x0C: "f", 0x0A: "n", 0x0D: "r", 0x09: "t"}
_REGEX_META = frozenset(".^$*+?()[]{}|\\/")
_CLASS_META = frozenset("]\\^-[")
_UNSUPPORTED = {
    sre.ASSERT: "lookahead/lookbehind",
    sre.ASSERT_NOT: "negative lookahead/lookbehind",
    sre.GROUPREF: "back reference",
    sre.GROUPREF_EXISTS: "conditional group",
}
_ANCHORS = {sre.AT_BEGINNING: "^", sre.AT_END: "$"}
_ASCII_CATEGORIES: dict[Any, tuple[tuple[int, int], ...]] = {
    sre.CATEGORY_DIGIT: ((0x30, 0x39),),
    sre.CATEGORY_WORD: ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)),
    sre.CATEGORY_SPACE: ((0x09, 0x0D), (0x1C, 0x20)),
}
_NEGATED_CATEGORIES = {
    sre.CATEGORY_NOT_DIGIT: sre.CATEGORY_DIGIT,
    sre.CATEGORY_NOT_WORD: sre.CATEGORY_WORD,
    sre.CATEGORY_NOT_SPACE: sre.CATEGORY_SPACE,
}


class UnsupportedPattern(ValueError):
    """The pattern uses a construct the grammar cannot enforce; the message says which."""


def json_string_pattern(pattern: str) -> str:
    """The pattern to give the grammar for a string whose decoded text must match `pattern`."""
    try:
        parsed = sre_parse.parse(pattern)
    except re.error as exc:
        raise UnsupportedPattern(f"not a valid regular expression: {exc}") from None
    if parsed.state.flags & (re.IGNORECASE | re.DOTALL | re.MULTILINE):
        raise UnsupportedPattern("inline flags (?i) (?s) (?m) cannot be enforced")
    _check_supported(parsed)
    return _emit(parsed)


def pattern_lengths(pattern: str) -> tuple[int, int | None, bool]:
    """(shortest, longest or None when unbounded, anchored) over the strings `pattern`
    matches in full, in characters; anchored: it begins with ^ and ends with $, so a
    string it matches is one of those (the bounds are the string's length). For a
    pattern `json_string_pattern` takes."""
    parsed = sre_parse.parse(pattern)
    shortest, longest = parsed.getwidth()
    items = list(parsed)
    anchored = (
        len(items) >= 2
        and items[0] == (sre.AT, sre.AT_BEGINNING)
        and items[-1] == (sre.AT, sre.AT_END)
    )
    return shortest, None if longest >= sre.MAXREPEAT else longest, anchored


def _walk(items: Any):
    for op, av in items:
        yield op, av
        if op in (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT):
            yield from _walk(av[2])
        elif op is sre.SUBPATTERN:
            yield from _walk(av[3])
        elif op is sre.ATOMIC_GROUP:
            yield from _walk(av)
        elif op is sre.BRANCH:
            for alternative in av[1]:
                yield from _walk(alternative)


def _check_supported(parsed: Any) -> None:
    for op, av in _walk(parsed):
        if op in _UNSUPPORTED:
            raise UnsupportedPattern(f"{_UNSUPPORTED[op]} cannot be enforced")
        if op is sre.AT and av not in _ANCHORS:
            raise UnsupportedPattern(f"anchor {str(av).lower()} cannot be enforced")
        if op is sre.SUBPATTERN and (av[1] or av[2]):
            raise UnsupportedPattern("inline flags cannot be enforced")


# -- emitting the rewritten pattern ---------------------------------------------------------


def _emit(items: Any) -> str:
    return "".join(_emit_one(op, av) for op, av in items)


def _emit_one(op: Any, av: Any) -> str:
    if op is sre.LITERAL:
        return _literal(av)
    if op is sre.NOT_LITERAL:
        return _class(_subtract(PRINTABLE, ((av, av),)))
    if op is sre.ANY:
        return _class(PRINTABLE)
    if op is sre.IN:
        return _class(_class_ranges(av))
    if op is sre.AT:
        return _ANCHORS[av]
    if op is sre.BRANCH:
        return "(" + "|".join(_emit(alt) for alt in av[1]) + ")"
    if op is sre.SUBPATTERN:
        return "(" + _emit(av[3]) + ")"
    if op is sre.ATOMIC_GROUP:
        return "(" + _emit(av) + ")"
    if op in (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT):
        low, high, body = av
        return "(" + _emit(body) + ")" + _quantifier(low, high)
    raise UnsupportedPattern(f"regular expression construct {str(op).lower()} cannot be enforced")


def _quantifier(low: int, high: int) -> str:
    unbounded = high is sre.MAXREPEAT
    if (low, unbounded) == (0, True):
        return "*"
    if (low, unbounded) == (1, True):
        return "+"
    if unbounded:
        return f"{{{low},}}"
    return f"{{{low}}}" if low == high else f"{{{low},{high}}}"


def _literal(code: int) -> str:
    if code in JSON_ESCAPED:  # the JSON text holds a backslash, then the escape's letters
        return "\\\\" + _SHORT_ESCAPES.get(code, f"u{code:04x}")
    char = chr(code)
    return "\\" + char if char in _REGEX_META else char


def _class_ranges(members: Any) -> tuple[tuple[int, int], ...]:
    """The characters a class keeps: exact within printable ASCII, explicit members beyond."""
    negate = bool(members) and members[0][0] is sre.NEGATE
    ranges: list[tuple[int, int]] = []
    for op, av in members[1:] if negate else members:
        if op is sre.LITERAL:
            ranges.append((av, av))
        elif op is sre.RANGE:
            ranges.append(av)
        elif op is sre.CATEGORY and av in _ASCII_CATEGORIES:
            ranges += _ASCII_CATEGORIES[av]
        elif op is sre.CATEGORY and av in _NEGATED_CATEGORIES:
            ranges += _subtract(PRINTABLE, _ASCII_CATEGORIES[_NEGATED_CATEGORIES[av]])
        else:
            raise UnsupportedPattern(f"character class member {op} {av} cannot be enforced")
    if negate:
        return _subtract(PRINTABLE, tuple(ranges))
    return tuple(ranges)


def _subtract(
    ranges: tuple[tuple[int, int], ...], removed: tuple[tuple[int, int], ...]
) -> tuple[tuple[int, int], ...]:
    out: list[tuple[int, int]] = []
    for lo, hi in ranges:
        pieces = [(lo, hi)]
        for rlo, rhi in removed:
            pieces = [
                part
                for plo, phi in pieces
                for part in ((plo, min(phi, rlo - 1)), (max(plo, rhi + 1), phi))
                if part[0] <= part[1]
            ]
        out += pieces
    return tuple(out)


def _class(ranges: tuple[tuple[int, int], ...]) -> str:
    safe = _subtract(ranges, tuple((c, c) for c in sorted(JSON_ESCAPED)))
    if not safe:
        raise UnsupportedPattern("a character class holds only characters JSON must escape")
    return "[" + "".join(_class_char(lo) + ("-" + _class_char(hi) if hi > lo else "") for lo, hi in safe) + "]"


def _class_char(code: int) -> str:
    char = chr(code)
    return "\\" + char if char in _CLASS_META else char
