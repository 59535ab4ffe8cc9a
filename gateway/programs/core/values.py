"""Variables: templates over them, JSON paths into them, and the conditions of If.

A variable holds a string (Gen without a JSON constraint, Select, inputs) or a JSON
value (Gen under a JSON constraint, Call, a Fork's joined lists). `{name}` and
`{name.key.0}` in a template are replaced by the value's text: a string as is, any
other value as compact JSON. `{{` and `}}` are literal braces.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from gateway.programs.core.model import Condition, ConditionKind
from radixmesh.errors import FailedPrecondition, InvalidArgument

NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_FIELD = re.compile(r"\{\{|\}\}|\{([^{}]*)\}")
_REF = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_-]+)*$")


def check_name(name: str, field: str) -> None:
    if not NAME.match(name):
        raise InvalidArgument(f"{field}: {name!r} is not a variable name ([A-Za-z_][A-Za-z0-9_]*)")


def check_ref(ref: str, field: str) -> str:
    """A variable reference (`name` or `name.json.path`); returns the variable's name."""
    if not _REF.match(ref):
        raise InvalidArgument(f"{field}: {ref!r} is not a variable or a JSON path into one")
    return ref.split(".", 1)[0]


def template_refs(template: str, field: str) -> list[str]:
    """The references of a template, in order; a malformed one raises InvalidArgument."""
    refs = []
    for match in _FIELD.finditer(template):
        if match.group(0) in ("{{", "}}"):
            continue
        refs.append(match.group(1))
        check_ref(match.group(1), field)
    rest = _FIELD.sub("", template)
    if "{" in rest or "}" in rest:
        raise InvalidArgument(f"{field}: unbalanced brace (write {{{{ or }}}} for a literal one)")
    return refs


def text_of(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def resolve(ref: str, variables: Mapping[str, Any], field: str) -> Any:
    """The value at a reference; a missing key or index fails the program at run time."""
    name, *keys = ref.split(".")
    if name not in variables:
        raise FailedPrecondition(f"{field}: variable {name!r} is not set")
    value = variables[name]
    for key in keys:
        if isinstance(value, Mapping) and key in value:
            value = value[key]
        elif isinstance(value, list) and key.lstrip("-").isdigit() and -len(value) <= int(key) < len(value):
            value = value[int(key)]
        else:
            raise FailedPrecondition(f"{field}: {ref!r} has no {key!r}")
    return value


def render(template: str, variables: Mapping[str, Any], field: str) -> str:
    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "{{":
            return "{"
        if match.group(0) == "}}":
            return "}"
        return text_of(resolve(match.group(1), variables, field))

    return _FIELD.sub(replace, template)


def holds(condition: Condition, variables: Mapping[str, Any], field: str) -> bool:
    text = text_of(resolve(condition.var, variables, field))
    if condition.kind is ConditionKind.CONTAINS:
        result = condition.value in text
    elif condition.kind is ConditionKind.EQUALS:
        result = text == condition.value
    else:
        result = re.search(condition.value, text) is not None
    return result != condition.negate
