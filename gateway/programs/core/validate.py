"""Static checks of a program, before any token: names, variables, tools, models, limits.

Every error is InvalidArgument naming the statement's path and field
("body[3].gen.var: ..."). A variable must be set on every path before it is used:
after an If, the variables both bodies set (a body that returns sets "everything");
after a Fork, every variable any branch set (as a list).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from gateway.programs.core.model import (
    Append,
    Call,
    Fork,
    Gen,
    If,
    Limits,
    Program,
    Return,
    Select,
    Statement,
)
from gateway.programs.core.values import check_name, check_ref, template_refs
from radixmesh.errors import InvalidArgument
from radixmesh.sampling import ConstraintKind

ROLES = frozenset({"", "system", "user", "assistant"})


class _Everything(frozenset):
    """The variables after a body that always returns: any name counts as set."""

    def __contains__(self, item: object) -> bool:
        return True


EVERYTHING = _Everything()


@dataclass(slots=True)
class _Count:
    statements: int = 0
    tokens: int = 0


@dataclass(frozen=True, slots=True)
class Checker:
    limits: Limits
    tools: Collection[str]
    check_model: Callable[[str, str], None]
    """check_model(model, field): raises NotFound for a model the mesh does not serve."""

    def program(self, program: Program, inputs: Collection[str]) -> None:
        for name in inputs:
            check_name(name, f"inputs[{name!r}]")
        count = _Count()
        if program.model:
            self.check_model(program.model, "program.model")
        self.body(program.body, "body", frozenset(inputs), 1, 1, count, may_return=True)
        if count.tokens > self.limits.max_total_tokens:
            raise InvalidArgument(
                f"body: the Gens may generate {count.tokens} tokens, over limits.max_total_tokens"
                f" ({self.limits.max_total_tokens})"
            )

    def body(
        self,
        body: Sequence[Statement],
        where: str,
        defined: frozenset[str],
        depth: int,
        copies: int,
        count: _Count,
        may_return: bool,
    ) -> frozenset[str]:
        if depth > self.limits.max_depth:
            raise InvalidArgument(f"{where}: nesting depth over limits.max_depth ({self.limits.max_depth})")
        for statement in body:
            if defined is EVERYTHING:
                raise InvalidArgument(f"{statement.path}: unreachable (after a return)")
            count.statements += 1
            if count.statements > self.limits.max_statements:
                raise InvalidArgument(
                    f"{statement.path}: over limits.max_statements ({self.limits.max_statements})"
                )
            defined = self.statement(statement, defined, depth, copies, count, may_return)
        return defined

    def statement(
        self,
        s: Statement,
        defined: frozenset[str],
        depth: int,
        copies: int,
        count: _Count,
        may_return: bool,
    ) -> frozenset[str]:
        if isinstance(s, Append):
            if s.role not in ROLES:
                raise InvalidArgument(f"{s.path}.role: {s.role!r} is not one of system, user, assistant")
            if s.is_template:
                self.refs(template_refs(s.text, f"{s.path}.template"), defined, f"{s.path}.template")
            return defined
        if isinstance(s, Gen):
            check_name(s.var, f"{s.path}.var")
            self.model(s.model, f"{s.path}.model")
            if s.sampling.n != 1:
                raise InvalidArgument(f"{s.path}.sampling.n: programs generate one choice per Gen")
            count.tokens += copies * (s.sampling.max_tokens or 0)
            if s.constraint is not None and s.constraint.kind is ConstraintKind.JSON_SCHEMA:
                _json_schema(s.constraint.value, f"{s.path}.constraint.json_schema")
            return defined | {s.var}
        if isinstance(s, Select):
            check_name(s.var, f"{s.path}.var")
            self.model(s.model, f"{s.path}.model")
            if len(s.choices) < 1 or any(not c for c in s.choices):
                raise InvalidArgument(f"{s.path}.choices: must be one or more non-empty strings")
            return defined | {s.var}
        if isinstance(s, Call):
            return self.call(s, defined)
        if isinstance(s, Return):
            if not may_return:
                raise InvalidArgument(f"{s.path}: a fork branch cannot return")
            if s.is_template:
                self.refs(template_refs(s.text, f"{s.path}.template"), defined, f"{s.path}.template")
            else:
                self.refs([s.text], defined, f"{s.path}.var")
            if s.output_schema:
                _json_schema(s.output_schema, f"{s.path}.output_schema")
            return EVERYTHING
        if isinstance(s, If):
            self.refs([s.condition.var], defined, f"{s.path}.condition.var")
            if s.condition.kind.value == "regex":
                try:
                    re.compile(s.condition.value)
                except re.error as exc:
                    raise InvalidArgument(f"{s.path}.condition.regex.value: {exc}") from None
            then = self.body(s.then, f"{s.path}.then", defined, depth + 1, copies, count, may_return)
            other = self.body(
                s.otherwise, f"{s.path}.otherwise", defined, depth + 1, copies, count, may_return
            )
            if then is EVERYTHING:
                return other
            if other is EVERYTHING:
                return then
            return then & other
        return self.fork(s, defined, depth, copies, count)

    def fork(
        self, s: Fork, defined: frozenset[str], depth: int, copies: int, count: _Count
    ) -> frozenset[str]:
        if not s.branches:
            raise InvalidArgument(f"{s.path}: needs branches, or each with copies >= 1")
        if len(s.branches) > self.limits.max_fork_width:
            raise InvalidArgument(
                f"{s.path}: {len(s.branches)} branches, over limits.max_fork_width"
                f" ({self.limits.max_fork_width})"
            )
        inner = defined
        if s.index_var:
            check_name(s.index_var, f"{s.path}.index_var")
            inner = defined | {s.index_var}
        joined: set[str] = set()
        for b, branch in enumerate(s.branches):
            where = f"{s.path}.branches[{b}]"
            after = self.body(branch, where, inner, depth + 1, copies, count, may_return=False)
            joined |= after - inner
        return defined | joined

    def call(self, s: Call, defined: frozenset[str]) -> frozenset[str]:
        if s.tool not in self.tools:
            known = ", ".join(sorted(self.tools)) or "none"
            raise InvalidArgument(f"{s.path}.tool: unknown tool {s.tool!r} (registered: {known})")
        check_name(s.var, f"{s.path}.var")
        names = [name for name, _ in s.args]
        for name, _ in s.json_args:
            if name in names:
                raise InvalidArgument(f"{s.path}.json_args.{name}: also given in args")
        for name, template in s.args:
            field = f"{s.path}.args[{name!r}]"
            self.refs(template_refs(template, field), defined, field)
        if s.timeout_s is not None and s.timeout_s <= 0:
            raise InvalidArgument(f"{s.path}.timeout_ms: must be > 0")
        return defined | {s.var}

    def refs(self, refs: Sequence[str], defined: frozenset[str], field: str) -> None:
        for ref in refs:
            name = check_ref(ref, field)
            if name not in defined:
                raise InvalidArgument(f"{field}: variable {name!r} is not set on every path before here")

    def model(self, model: str, field: str) -> None:
        if model:
            self.check_model(model, field)


def _json_schema(text: str, field: str) -> None:
    import jsonschema

    try:
        schema = json.loads(text)
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except (ValueError, jsonschema.SchemaError) as exc:
        raise InvalidArgument(f"{field}: not a valid JSON Schema: {str(exc).splitlines()[0]}") from None
