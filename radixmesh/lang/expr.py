"""The frontend's pieces: variables, conditions, and the statements `s += ...` adds.

Strings are templates over the program's variables: `"Answer from: {docs}"`; a
variable put in an f-string (`f"Q: {query}"`) becomes the same `{query}`. Write
`{{` and `}}` for literal braces; `text("...")` is literal as is.
"""

from __future__ import annotations

import contextvars
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from radixmesh.v1 import inference_pb2 as ipb
from radixmesh.v1 import program_pb2 as pb

_MARK = "\x00var:"
_MARKED = re.compile(re.escape(_MARK) + r"([^\x00]+)\x00")


class Var:
    """A program variable (or a JSON path into one). What a comparison or `in` gives is a
    condition; what the variable holds is known only in interactive mode (`.value`)."""

    def __init__(self, ref: str, resolve: Callable[[str], Any] | None = None) -> None:
        self.ref = ref
        self._resolve = resolve

    def __getitem__(self, key: str | int) -> Var:
        return Var(f"{self.ref}.{key}", self._resolve)

    @property
    def value(self) -> Any:
        if self._resolve is None:
            raise TypeError(
                f"the value of {self.ref!r} is known only when the program runs interactively"
            )
        return self._resolve(self.ref)

    def __format__(self, spec: str) -> str:
        return f"{_MARK}{self.ref}\x00"

    __str__ = __format__  # type: ignore[assignment]

    def __eq__(self, other: object) -> Cond:  # type: ignore[override]
        return Cond("equals", self, _operand(other))

    def __ne__(self, other: object) -> Cond:  # type: ignore[override]
        return Cond("equals", self, _operand(other), negate=True)

    def __contains__(self, item: str) -> bool:
        return bool(Cond("contains", self, _operand(item)))

    def contains(self, item: str) -> Cond:
        return Cond("contains", self, _operand(item))

    def matches(self, pattern: str) -> Cond:
        """The regular expression matches somewhere in the variable's text."""
        return Cond("regex", self, pattern)

    def __hash__(self) -> int:
        return hash(self.ref)

    def __repr__(self) -> str:
        return f"Var({self.ref!r})"


def _operand(value: object) -> str:
    if isinstance(value, Var):
        raise TypeError("compare a variable with a constant, not with another variable")
    return value if isinstance(value, str) else json.dumps(value)


Decide = Callable[["Cond"], bool]


@dataclass
class Cond:
    kind: str
    var: Var
    value: str
    negate: bool = False

    def __invert__(self) -> Cond:
        return Cond(self.kind, self.var, self.value, not self.negate)

    def __bool__(self) -> bool:
        decide = _current_decider()
        if decide is None:
            raise TypeError("a condition on a program variable is only meaningful inside @program")
        return decide(self)

    def to_proto(self) -> pb.Condition:
        operand = pb.VarValue(var=self.var.ref, value=self.value)
        return pb.Condition(negate=self.negate, **{self.kind: operand})


_DECIDER: contextvars.ContextVar[Decide | None] = contextvars.ContextVar("decider", default=None)


def _current_decider() -> Decide | None:
    return _DECIDER.get()


class deciding:
    """Within the block, `bool(cond)` asks `decide` (the tracer, or the live session)."""

    def __init__(self, decide: Decide) -> None:
        self.decide = decide
        self._token: contextvars.Token | None = None

    def __enter__(self) -> None:
        self._token = _DECIDER.set(self.decide)

    def __exit__(self, *exc: object) -> None:
        assert self._token is not None
        _DECIDER.reset(self._token)


def template_of(value: str | Var) -> str:
    """A string with variables put in it, as program.proto's template."""
    if isinstance(value, Var):
        return "{" + value.ref + "}"
    return _MARKED.sub(lambda m: "{" + m.group(1) + "}", value)


def literal(value: str) -> str:
    """Literal text (braces doubled) for a template."""
    return value.replace("{", "{{").replace("}", "}}")


@dataclass(frozen=True)
class Piece:
    """Statements `s += piece` appends (a role block may hold several)."""

    statements: tuple[pb.Statement, ...]

    def __add__(self, other: Piece | str) -> Piece:
        return Piece(self.statements + as_piece(other).statements)

    def __radd__(self, other: str) -> Piece:
        return as_piece(other) + self


def as_piece(value: Piece | str | Var) -> Piece:
    if isinstance(value, Piece):
        return value
    if isinstance(value, str | Var):
        return Piece((_append(template_of(value)),))
    raise TypeError(f"cannot add {type(value).__name__} to a program")


def _append(
    template: str, role: str = "", part: pb.RolePart = pb.ROLE_PART_WHOLE
) -> pb.Statement:
    return pb.Statement(append=pb.Append(template=template, role=role, part=part))


def text(value: str) -> Piece:
    """Literal text: braces are not templates."""
    return Piece((pb.Statement(append=pb.Append(text=value)),))


def _role(role: str, content: Any) -> Piece:
    parts: list[Any] = list(content) if isinstance(content, list | tuple) else [content]
    inner: list[pb.Statement] = []
    for part in parts:
        inner += as_piece(part).statements
    appends = all(s.WhichOneof("kind") == "append" and not s.append.role for s in inner)
    if appends:  # one whole block: its texts joined
        joined = "".join(
            s.append.template if s.append.WhichOneof("content") == "template" else literal(s.append.text)
            for s in inner
        )
        return Piece((_append(joined, role),))
    return Piece(
        (_append("", role, pb.ROLE_PART_BEGIN), *inner, _append("", role, pb.ROLE_PART_END))
    )


def system(content: Any) -> Piece:
    return _role("system", content)


def user(content: Any) -> Piece:
    return _role("user", content)


def assistant(content: Any) -> Piece:
    return _role("assistant", content)


_SAMPLING = {
    "max_tokens", "min_tokens", "temperature", "top_p", "top_k", "min_p", "seed",
    "repetition_penalty", "frequency_penalty", "presence_penalty", "stop", "stop_token_ids",
    "ignore_eos",
}  # fmt: skip


def gen(
    name: str,
    *,
    json_schema: dict | str | None = None,
    regex: str | None = None,
    ebnf: str | None = None,
    choices: Sequence[str] | None = None,
    json_object: bool = False,
    model: str = "",
    **sampling: Any,
) -> Piece:
    """Generate into variable `name`; sampling fields as in SamplingParams (greedy unless
    temperature is given)."""
    unknown = set(sampling) - _SAMPLING
    if unknown:
        raise TypeError(f"gen: unknown sampling fields {sorted(unknown)}")
    if isinstance(sampling.get("stop"), str):
        sampling["stop"] = [sampling["stop"]]
    sampling.setdefault("temperature", 0.0)
    constraint = ipb.Constraint()
    given = [x is not None for x in (json_schema, regex, ebnf, choices)] + [json_object]
    if sum(given) > 1:
        raise TypeError("gen: at most one of json_schema, regex, ebnf, choices, json_object")
    if json_schema is not None:
        constraint.json_schema = json_schema if isinstance(json_schema, str) else json.dumps(json_schema)
    elif regex is not None:
        constraint.regex = regex
    elif ebnf is not None:
        constraint.ebnf = ebnf
    elif choices is not None:
        constraint.choices.choices.extend(choices)
    elif json_object:
        constraint.json_object = True
    statement = pb.Gen(
        var=name, sampling=ipb.SamplingParams(**sampling), constraint=constraint, model=model
    )
    return Piece((pb.Statement(gen=statement),))


_METHODS = {
    "mean": pb.SELECT_METHOD_TOKEN_LENGTH_NORMALIZED,
    "greedy": pb.SELECT_METHOD_GREEDY_TOKEN,
    "unconditional": pb.SELECT_METHOD_UNCONDITIONAL_LIKELIHOOD_NORMALIZED,
}


def select(name: str, choices: Sequence[str], method: str = "mean", model: str = "") -> Piece:
    """Choose among strings by likelihood: method "mean" (token-length normalized),
    "greedy" or "unconditional"."""
    if method not in _METHODS:
        raise TypeError(f"select: method must be one of {sorted(_METHODS)}")
    statement = pb.Select(var=name, choices=list(choices), method=_METHODS[method], model=model)
    return Piece((pb.Statement(select=statement),))


def tool(
    name: str,
    *,
    out: str,
    timeout_s: float | None = None,
    fallback: str | None = None,
    **args: Any,
) -> Piece:
    """Call a server tool; its JSON result goes to variable `out`. With `fallback`, a
    failing tool sets `out` to it instead of failing the program."""
    call = pb.Call(tool=name, var=out, timeout_ms=int((timeout_s or 0) * 1000))
    for key, value in args.items():
        if isinstance(value, str | Var):
            call.args[key] = template_of(value)
        else:
            call.json_args.update({key: value})
    if fallback is not None:
        call.on_error = pb.ON_ERROR_FALLBACK
        call.fallback = fallback
    return Piece((pb.Statement(call=call),))
