"""The `s` a @program function writes to: traced into a Program, or run live on a session.

`TraceState` records statements; Python `if` on a condition is answered by the tracer,
which runs the function once per path and merges the paths into If statements.
`LiveState` sends each statement to a program session and waits for it, so `if` sees
real values and any Python control flow works.

Fork branches (`BranchState`) record their items until the join: statements, forks of
their own (`ForkTrace`), and, when tracing, the decisions taken while they were open
(the tracer merges those into If statements inside the branch bodies).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from radixmesh.lang.expr import Cond, Piece, Var, as_piece, template_of
from radixmesh.v1 import program_pb2 as pb


@dataclass(eq=False)
class ForkTrace:
    """A joined fork as its branches recorded it: per branch, a list of statements,
    nested ForkTraces and (when tracing) decision markers `(Cond, taken)`."""

    index_var: str
    branches: list[list[Any]]

    def to_proto(self) -> pb.Statement:
        """The Fork statement (a trace without decisions: interactive mode, one path)."""
        bodies = [pb.Body(body=[_plain(item) for item in items]) for items in self.branches]
        return pb.Statement(fork=pb.Fork(branches=bodies, index_var=self.index_var))


def _plain(item: Any) -> pb.Statement:
    if isinstance(item, ForkTrace):
        return item.to_proto()
    if not isinstance(item, pb.Statement):
        raise TypeError("@program: a traced decision outside the compiler")
    return item


def open_branches(forks: Forks) -> Iterator[BranchState]:
    """The innermost branches open under forks (a branch with a fork of its own pending
    stands for that fork's branches)."""
    for branch in forks:
        if branch._pending is not None:
            yield from open_branches(branch._pending)
        else:
            yield branch


def sets_variable(items: list[Any], name: str) -> bool:
    """Whether any statement among items (nested bodies included) sets `name`."""
    for item in items:
        if isinstance(item, ForkTrace):
            if any(sets_variable(b, name) for b in item.branches):
                return True
        elif isinstance(item, pb.Statement):
            kind = item.WhichOneof("kind")
            if kind in ("gen", "select", "call") and getattr(item, kind).var == name:
                return True
            if kind == "branch" and sets_variable([*item.branch.then, *item.branch.otherwise], name):
                return True
            if kind == "fork":
                bodies = [*item.fork.branches, item.fork.each]
                if any(sets_variable(list(b.body), name) for b in bodies):
                    return True
    return False


class Forks(list):
    """The branch states of `s.fork(n)`; `join()` (or the parent's next statement) runs them."""

    def __init__(self, parent: State, states: list[BranchState], index_var: str) -> None:
        super().__init__(states)
        self.parent = parent
        self.index_var = index_var
        self.joined = False
        self.decisions: list[tuple[Cond, bool]] = []
        """Tracing: conditions decided while this fork was open."""

    def note_decision(self, cond: Cond, taken: bool) -> None:
        """Tracing: a condition decided while the fork is open. Each open branch records an
        "open" marker where it stands; the join leaves a "late" one in the parent after
        the fork (the statements after the join may depend on it too)."""
        self.decisions.append((cond, taken))
        for branch in self:
            if branch._pending is not None:
                branch._pending.note_decision(cond, taken)
            else:
                branch.items.append((cond, taken, "open"))

    def join(self) -> None:
        if self.joined:
            return
        self.joined = True
        for branch in self:
            branch._before()  # a fork the branch left open joins first
        self.parent._pending = None
        self.parent._emit_fork(ForkTrace(self.index_var, [b.items for b in self]))
        for cond, taken in self.decisions:
            name = cond.var.ref.split(".")[0]
            set_here = any(sets_variable(b.items, name) for b in self)
            self.parent._note_late(cond, taken, "late-branch-var" if set_here else "late")


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

    def _emit_fork(self, fork: ForkTrace) -> None:
        self._emit(fork.to_proto())

    def _note_late(self, cond: Cond, taken: bool, kind: str) -> None:
        """Tracing: a decision taken inside a fork this state just joined."""

    _resolve: Callable[[str], Any] | None = None


class BranchState(State):
    def __init__(self, parent: State, index: int, index_var: str) -> None:
        super().__init__()
        self.parent = parent
        self.items: list[Any] = []
        """Statements, nested ForkTraces and, when tracing, decision markers."""
        self.index = index
        self.index_var = index_var

    def __getitem__(self, name: str) -> Var:
        if name == self.index_var:
            return Var(name, lambda ref: str(self.index))
        return Var(name)  # values inside a branch are known only after the join

    def _emit(self, statement: pb.Statement) -> None:
        if statement.WhichOneof("kind") == "result":
            raise TypeError("a fork branch cannot return")
        self.items.append(statement)

    def _emit_fork(self, fork: ForkTrace) -> None:
        self.items.append(fork)  # decisions inside it are merged by the compiler

    def _note_late(self, cond: Cond, taken: bool, kind: str) -> None:
        self.items.append((cond, taken, kind))


class TraceState(State):
    def __init__(self) -> None:
        super().__init__()
        self.items: list[Any] = []
        """Statements, ForkTraces and decision markers `(Cond, taken)`."""

    def _emit(self, statement: pb.Statement) -> None:
        self.items.append(statement)

    def _emit_fork(self, fork: ForkTrace) -> None:
        self.items.append(fork)

    def _note_late(self, cond: Cond, taken: bool, kind: str) -> None:
        self.items.append((cond, taken, kind))


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
        name = cond.var.ref.split(".")[0]
        if self._pending is not None and any(
            sets_variable(b.items, name) for b in open_branches(self._pending)
        ):
            raise TypeError(
                f"an if on {name!r} inside fork branches: its value is known only after the"
                " join in interactive mode; compile the program (mode='compiled') instead"
            )
        own = cond.var._resolve
        if own is not None and own != self._resolve:  # a branch's index variable
            return holds(cond, {name: own(name)})
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
