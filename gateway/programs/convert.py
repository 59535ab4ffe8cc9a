"""program.proto <-> the runtime's plain objects, at the edge only.

Every statement gets its path ("body[2].fork.branches[1].body[0]"); a malformed
message raises InvalidArgument naming it.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from typing import Any, TypeVar

from google.protobuf import json_format

from gateway.programs.core import events as ev
from gateway.programs.core import model as m
from radixmesh import wire
from radixmesh.errors import InvalidArgument
from radixmesh.sampling import SamplingParams
from radixmesh.v1 import inference_pb2, program_pb2

DEFAULT_MAX_TOKENS = 128
"""max_tokens of a Gen that sets none."""
E = TypeVar("E", bound=enum.Enum)


def limits_from_proto(bound: m.Limits, message: program_pb2.Limits) -> m.Limits:
    def get(name: str) -> int | None:
        return getattr(message, name) if message.HasField(name) else None

    wall_ms = get("max_wall_time_ms")
    if wall_ms is not None and not 0 < wall_ms <= bound.max_wall_time_s * 1000:
        raise InvalidArgument(
            f"limits.max_wall_time_ms: must be in (0, {bound.max_wall_time_s * 1000:.0f}], got {wall_ms}"
        )
    return bound.lowered(
        max_statements=get("max_statements"),
        max_fork_width=get("max_fork_width"),
        max_depth=get("max_depth"),
        max_total_tokens=get("max_total_tokens"),
        max_wall_time_s=None if wall_ms is None else wall_ms / 1000,
    )


def program_from_proto(message: program_pb2.Program, bound: m.Limits) -> m.Program:
    return m.Program(
        body=body_from_proto(message.body, "body"),
        name=message.name,
        model=message.model,
        limits=limits_from_proto(bound, message.limits),
    )


def body_from_proto(body, where: str) -> tuple[m.Statement, ...]:
    return tuple(statement_from_proto(s, f"{where}[{i}]") for i, s in enumerate(body))


def statement_from_proto(s: program_pb2.Statement, where: str) -> m.Statement:
    which = s.WhichOneof("kind")
    if which is None:
        raise InvalidArgument(f"{where}: empty statement (set one of append, gen, select, ...)")
    path = f"{where}.{which}"
    part = getattr(s, which)
    try:
        return _CONVERTERS[which](part, path)
    except InvalidArgument as exc:
        message = str(exc)
        raise InvalidArgument(message if message.startswith(where) else f"{path}: {message}") from None


def _enum(cls: type[E], number: int, field: str) -> E:
    """The member a wire enum's number stands for; InvalidArgument naming the field for a
    number this version does not know (a newer client's, or a wrong one)."""
    try:
        return cls(number)
    except ValueError:
        known = ", ".join(f"{member.value} ({member.name.lower()})" for member in cls)
        raise InvalidArgument(f"{field}: {number} is not one of {known}") from None


def _append(a: program_pb2.Append, path: str) -> m.Append:
    content = a.WhichOneof("content")
    if content is None:
        raise InvalidArgument(f"{path}: one of text or template is required")
    part = _enum(m.RolePart, a.part, f"{path}.part")
    return m.Append(path, getattr(a, content), content == "template", a.role, part)


def _sampling(message: inference_pb2.SamplingParams, path: str) -> SamplingParams:
    sampling = wire.sampling_from_proto(message, f"{path}.")
    if sampling.max_tokens is None:
        sampling = dataclasses.replace(sampling, max_tokens=DEFAULT_MAX_TOKENS)
    if sampling.prompt_logprobs_start is not None:
        raise InvalidArgument(f"{path}.sampling.prompt_logprobs_start: not used in programs")
    return sampling


def _gen(g: program_pb2.Gen, path: str) -> m.Gen:
    constraint = wire.constraint_from_proto(g.constraint, f"{path}.")
    return m.Gen(path, g.var, _sampling(g.sampling, path), constraint, g.model)


def _select(s: program_pb2.Select, path: str) -> m.Select:
    return m.Select(path, s.var, tuple(s.choices), _enum(m.SelectMethod, s.method, f"{path}.method"), s.model)


def _fork(f: program_pb2.Fork, path: str) -> m.Fork:
    if f.branches and (f.HasField("each") or f.copies):
        raise InvalidArgument(f"{path}: give branches, or each with copies, not both")
    if f.branches:
        bodies = [body_from_proto(b.body, f"{path}.branches[{i}].body") for i, b in enumerate(f.branches)]
    else:
        if f.copies < 1 or not f.HasField("each"):
            raise InvalidArgument(f"{path}: needs branches, or each with copies >= 1")
        if f.copies > 1024:
            raise InvalidArgument(f"{path}.copies: {f.copies} is too many")
        bodies = [body_from_proto(f.each.body, f"{path}.branches[{i}].body") for i in range(f.copies)]
    return m.Fork(path, tuple(bodies), f.index_var)


def _if(i: program_pb2.If, path: str) -> m.If:
    kind = i.condition.WhichOneof("kind")
    if kind is None:
        raise InvalidArgument(f"{path}.condition: one of contains, equals or regex is required")
    operand = getattr(i.condition, kind)
    condition = m.Condition(m.ConditionKind(kind), operand.var, operand.value, i.condition.negate)
    return m.If(
        path,
        condition,
        body_from_proto(i.then, f"{path}.then"),
        body_from_proto(i.otherwise, f"{path}.otherwise"),
    )


def _call(c: program_pb2.Call, path: str) -> m.Call:
    json_args = integral_json(json_format.MessageToDict(c.json_args)) if c.HasField("json_args") else {}
    return m.Call(
        path,
        c.tool,
        c.var,
        args=tuple(sorted(c.args.items())),
        json_args=tuple(sorted(json_args.items())),
        timeout_s=c.timeout_ms / 1000 if c.timeout_ms else None,
        on_error=_enum(m.OnError, c.on_error, f"{path}.on_error"),
        fallback=c.fallback,
    )


def integral_json(value: Any) -> Any:
    """protobuf's Struct carries every number as a double: 2.0 back to 2."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {k: integral_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [integral_json(v) for v in value]
    return value


def _return(r: program_pb2.Return, path: str) -> m.Return:
    which = r.WhichOneof("value")
    if which is None:
        raise InvalidArgument(f"{path}: one of var or template is required")
    return m.Return(path, getattr(r, which), which == "template", r.output_schema)


_CONVERTERS: dict[str, Any] = {
    "append": _append,
    "gen": _gen,
    "select": _select,
    "fork": _fork,
    "branch": _if,
    "call": _call,
    "result": _return,
}


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _usage(usage: ev.Usage) -> inference_pb2.Usage:
    return inference_pb2.Usage(
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        cached_tokens=usage.cached_tokens,
    )


def event_to_proto(event: ev.Event, statement_prefix: str = "") -> program_pb2.ProgramEvent:
    out = program_pb2.ProgramEvent(statement=statement_prefix + event.statement)
    if isinstance(event, ev.TextDelta):
        out.text.CopyFrom(program_pb2.TextDelta(var=event.var, text=event.text))
    elif isinstance(event, ev.VarSet):
        out.var_set.CopyFrom(program_pb2.VarSet(var=event.var, value_json=_json(event.value)))
    elif isinstance(event, ev.BranchTaken):
        out.branch.CopyFrom(
            program_pb2.BranchTaken(then=event.then, prediction=event.prediction.value)  # type: ignore[arg-type]
        )
    elif isinstance(event, ev.ToolStarted):
        out.tool_started.CopyFrom(program_pb2.ToolStarted(tool=event.tool, args_json=_json(event.args)))
    elif isinstance(event, ev.ToolFinished):
        out.tool_finished.CopyFrom(
            program_pb2.ToolFinished(
                tool=event.tool, cached=event.cached, error=event.error, duration_ms=event.duration_ms
            )
        )
    elif isinstance(event, ev.SelectScores):
        scores = [
            program_pb2.ChoiceScore(
                choice=c.choice,
                score=c.score,
                logprob_sum=c.logprob_sum,
                num_tokens=c.num_tokens,
                tokens=[inference_pb2.TokenLogprob(token_id=t.token_id, logprob=t.logprob, token=t.text) for t in c.tokens],
            )
            for c in event.scores
        ]
        out.select.CopyFrom(program_pb2.SelectScores(var=event.var, scores=scores))
    elif isinstance(event, ev.ProgramError):
        out.error.CopyFrom(program_pb2.ProgramError(code=event.code, message=event.message))
    elif isinstance(event, ev.ProgramResult):
        out.result.CopyFrom(
            program_pb2.ProgramResult(
                value_json=_json(event.value),
                vars_json={k: _json(v) for k, v in event.variables.items()},
                usage=[
                    program_pb2.StatementUsage(statement=u.statement, model=u.model, usage=_usage(u.usage))
                    for u in event.usage
                ],
                total=_usage(event.total),
            )
        )
    else:
        out.done.CopyFrom(
            program_pb2.StatementDone(
                vars_json={k: _json(v) for k, v in event.variables.items()}, returned=event.returned
            )
        )
    return out
