"""The `s` a @program function writes to: traced into a Program, or run live on a session.

`TraceState` records statements; Python `if` on a condition is answered by the tracer,
which runs the function once per path and merges the paths into If statements.
`LiveState` sends each statement to a program session and waits for it, so `if` sees
real values and any Python control flow works.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from radixmesh.lang.expr import Cond, Piece, Var, as_piece, template_of
from radixmesh.v1 import program_pb2 as pb


class Forks(list):
    """The branch states of `s.fork(n)`; `join()` (or the parent's next statement) runs them."""

    def __init__(self, parent: State, states: list[BranchState], index_var: str) -> None:
        super().__init__(states)
        self.parent = parent
        self.index_var = index_var
        self.joined = False

    def join(self) -> None:
        if self.joined:
            return
        self.joined = True
        fork = pb.Fork(branches=[pb.Body(body=b.statements) for b in self], index_var=self.index_var)
        self.parent._pending = None
        self.parent._emit(pb.Statement(fork=fork))


class State:
    def __init__(self) -> None:
        self._pending: Forks | None = None

    def __iadd__(self, piece: Piece | str | Var) -> State:
        for statement in as_piece(piece).statements:
            self._before()
            self._emit(statement)
        return self

    def __getitem__(self, name: str) -> Var:
        return Var(name, self._resolve)

    def fork(self, n: int, index_var: str = "") -> Forks:
        """n branches on copies of the context; after `join()` each variable they set is a
        list here, one entry per branch."""
        self._before()
        if n < 1:
            raise ValueError("fork: n must be >= 1")
        forks = Forks(self, [BranchState(self, i, index_var) for i in range(n)], index_var)
        self._pending = forks
        return forks

    def ret(self, value: str | Var, output_schema: dict | str | None = None) -> None:
        """End the program with a variable's value or a template."""
        self._before()
        result = pb.Return(output_schema=_schema_text(output_schema))
        if isinstance(value, Var):
            result.var = value.ref
        else:
            result.template = template_of(value)
        self._emit(pb.Statement(result=result))

    def _before(self) -> None:
        if self._pending is not None:
            self._pending.join()

    def _emit(self, statement: pb.Statement) -> None:
        raise NotImplementedError

    _resolve: Callable[[str], Any] | None = None


class BranchState(State):
    def __init__(self, parent: State, index: int, index_var: str) -> None:
        super().__init__()
        self.parent = parent
        self.statements: list[pb.Statement] = []
        self.index = index
        self.index_var = index_var

    def __getitem__(self, name: str) -> Var:
        if name == self.index_var:
            return Var(name, lambda ref: str(self.index))
        return Var(name)  # values inside a branch are known only after the join

    def fork(self, n: int, index_var: str = "") -> Forks:
        raise TypeError("fork inside a fork branch is not supported by the frontend")

    def _emit(self, statement: pb.Statement) -> None:
        if statement.WhichOneof("kind") == "result":
            raise TypeError("a fork branch cannot return")
        self.statements.append(statement)


class TraceState(State):
    def __init__(self) -> None:
        super().__init__()
        self.items: list[pb.Statement | tuple[Cond, bool]] = []

    def _emit(self, statement: pb.Statement) -> None:
        self.items.append(statement)


def _schema_text(schema: dict | str | None) -> str:
    if schema is None:
        return ""
    return schema if isinstance(schema, str) else json.dumps(schema)


def text_of(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def resolve(ref: str, variables: dict[str, Any]) -> Any:
    """As the runtime resolves `name.key.0` (gateway/programs/core/values.py)."""
    name, *keys = ref.split(".")
    if name not in variables:
        raise KeyError(f"variable {name!r} is not set")
    value = variables[name]
    for key in keys:
        if isinstance(value, dict) and key in value:
            value = value[key]
        elif isinstance(value, list) and key.lstrip("-").isdigit():
            value = value[int(key)]
        else:
            raise KeyError(f"{ref!r} has no {key!r}")
    return value


def holds(cond: Cond, variables: dict[str, Any]) -> bool:
    value = text_of(resolve(cond.var.ref, variables))
    if cond.kind == "contains":
        result = cond.value in value
    elif cond.kind == "equals":
        result = value == cond.value
    else:
        result = re.search(cond.value, value) is not None
    return result != cond.negate


class LiveState(State):
    """Interactive mode: each statement runs on the server before the function goes on."""

    def __init__(self, send: Callable[[pb.Statement], list[pb.ProgramEvent]], inputs: dict[str, str]) -> None:
        super().__init__()
        self._send = send
        self.variables: dict[str, Any] = dict(inputs)
        self.returned: pb.ProgramResult | None = None

    def _resolve(self, ref: str) -> Any:  # type: ignore[override]
        return resolve(ref, self.variables)

    def decide(self, cond: Cond) -> bool:
        return holds(cond, self.variables)

    def _emit(self, statement: pb.Statement) -> None:
        if self.returned is not None:
            raise TypeError("the program has returned: no more statements")
        for event in self._send(statement):
            kind = event.WhichOneof("event")
            if kind == "done":
                self.variables.update({k: json.loads(v) for k, v in event.done.vars_json.items()})
            elif kind == "result":
                self.returned = event.result
