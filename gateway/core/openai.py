"""OpenAI-compatible request parsing: JSON bodies of /v1/completions and /v1/chat/completions.

`parse_chat_request(body)` and `parse_completion_request(body)` turn a decoded
JSON body into a `GatewayRequest`. Every problem raises `ParamError` (an
`InvalidArgument`) whose `param` names the field as the client spelled it, so
the HTTP layer answers 400 with OpenAI's error body (see `openai_responses`).

Beyond OpenAI's fields the bodies accept the extensions top_k, min_p,
repetition_penalty, ignore_eos, min_tokens, stop_token_ids, priority
("interactive", "batch", "sheddable"), and the constraints regex, ebnf and
choices (at most one constraint, counting response_format).
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.core.limits import check_unicode
from gateway.core.request import (
    CHAT_ROLES,
    ChatMessage,
    GatewayRequest,
    GenerateInput,
)
from radixmesh.errors import InvalidArgument
from radixmesh.sampling import (
    MAX_JSON_SCHEMA_CHARS,
    MAX_N,
    Constraint,
    ConstraintKind,
    Priority,
    SamplingParams,
)

DEFAULT_COMPLETION_MAX_TOKENS = 16
"""OpenAI's default max_tokens for /v1/completions (chat defaults to the context limit)."""
MAX_STOP_STRINGS = 16

_PRIORITIES = {p.name.lower(): p for p in Priority}
# Accepted for compatibility; they change nothing here.
_IGNORED = frozenset({"store", "metadata", "service_tier", "parallel_tool_calls"})
_COMMON = frozenset(
    {
        "model",
        "max_tokens",
        "temperature",
        "top_p",
        "n",
        "stream",
        "stream_options",
        "stop",
        "seed",
        "logprobs",
        "presence_penalty",
        "frequency_penalty",
        "user",
        "response_format",
        "logit_bias",
        # extensions
        "top_k",
        "min_p",
        "priority",
        "repetition_penalty",
        "ignore_eos",
        "min_tokens",
        "stop_token_ids",
        "regex",
        "ebnf",
        "choices",
        "session_id",
    }
)
_CHAT_ONLY = frozenset(
    {"messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice"}
)
_COMPLETION_ONLY = frozenset({"prompt", "echo", "suffix", "best_of"})
REQUEST_FIELDS = _COMMON | _CHAT_ONLY | _COMPLETION_ONLY | _IGNORED
"""Every top-level field of either body: the names an error's `param` may start with."""
_STREAM_OPTIONS = frozenset({"include_usage", "continuous_usage_stats"})


class ParamError(InvalidArgument):
    """A request field is missing, of the wrong type or out of range."""

    def __init__(self, param: str | None, message: str) -> None:
        super().__init__(f"{param}: {message}" if param else message)
        self.param = param


def parse_json_body(raw: bytes) -> dict[str, Any]:
    """Decode a request body: UTF-8 JSON holding an object."""
    try:
        body = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ParamError(None, f"request body is not valid UTF-8 (byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise ParamError(None, f"request body is not valid JSON: {exc}") from None
    except ValueError:  # json's one other ValueError: int() refuses an integer this long
        raise ParamError(
            None,
            f"request body holds an integer of more than {sys.get_int_max_str_digits()} digits",
        ) from None
    except RecursionError:
        raise ParamError(None, "request body nests too deeply") from None
    if not isinstance(body, dict):
        raise ParamError(None, "request body must be a JSON object")
    check_unicode(body)
    return body


class _Fields:
    """Typed, checked access to one JSON object's fields; null means absent.

    `where` names a nested object (e.g. "stream_options"), so errors name its fields by
    their whole path; empty for the request body itself."""

    def __init__(self, body: Any, known: frozenset[str], where: str = "") -> None:
        if not isinstance(body, dict):
            if where:
                raise ParamError(where, f"expected an object, got {_type_and_value(body)}")
            raise ParamError(None, "request body must be a JSON object")
        self.where = where
        unknown = sorted(set(body) - known)
        if unknown:
            raise ParamError(self.path(unknown[0]), "unrecognized request argument")
        self.body = body

    def path(self, name: str) -> str:
        """A field's name as an error's param: with the nested object's path before it."""
        return f"{self.where}.{name}" if self.where else name

    def has(self, name: str) -> bool:
        return self.body.get(name) is not None

    def get(self, name: str, check: Callable[[Any], bool], what: str) -> Any:
        """The field's value (None when absent or null); ParamError when check refuses it."""
        value = self.body.get(name)
        if value is not None and not check(value):
            raise ParamError(self.path(name), f"expected {what}, got {_type_and_value(value)}")
        return value

    def string(self, name: str, default: str | None = None) -> str | None:
        value = self.get(name, lambda v: isinstance(v, str), "a string")
        return default if value is None else value

    def boolean(self, name: str, default: bool = False) -> bool:
        value = self.get(name, lambda v: isinstance(v, bool), "a boolean")
        return default if value is None else value

    def integer(self, name: str, lo: int | None = None, hi: int | None = None) -> int | None:
        value = self.get(name, _is_int, "an integer")
        if value is not None:
            _check_range(self.path(name), value, lo, hi)
        return value

    def number(self, name: str, lo: float | None = None, hi: float | None = None) -> float | None:
        value = self.get(name, _is_real, "a number")
        if value is None:
            return None
        number = _finite_float(value)
        if number is None:
            problem = "is not finite" if isinstance(value, float) else "is too large for a number"
            raise ParamError(self.path(name), f"{problem}, got {_short(value)}")
        _check_range(self.path(name), number, lo, hi)
        return number

    def object(self, name: str) -> dict[str, Any] | None:
        return self.get(name, lambda v: isinstance(v, dict), "an object")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_real(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _finite_float(v: int | float) -> float | None:
    """v as a float; None for NaN, an infinity, or an integer past the float range (JSON
    integers are unbounded: float() of one with over 308 digits overflows)."""
    try:
        number = float(v)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _check_range(name: str, value: float, lo: float | None, hi: float | None) -> None:
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        low = "-inf" if lo is None else lo
        high = "inf" if hi is None else hi
        raise ParamError(name, f"must be in [{low}, {high}], got {_short(value)}")


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 40 else text[:37] + "..."


def _type_and_value(value: Any) -> str:
    return f"{type(value).__name__} {_short(value)}"


# --- request parsers ------------------------------------------------------------------------


def parse_chat_request(body: Any) -> GatewayRequest:
    """A /v1/chat/completions body -> GatewayRequest (chat=True)."""
    f = _Fields(body, _COMMON | _CHAT_ONLY | _IGNORED)
    _refuse_tools(f)
    messages = parse_messages(body.get("messages"))
    max_tokens = f.integer("max_tokens", lo=1)
    max_completion_tokens = f.integer("max_completion_tokens", lo=1)
    if None not in (max_tokens, max_completion_tokens) and max_tokens != max_completion_tokens:
        raise ParamError("max_tokens", "conflicts with max_completion_tokens; send one")
    logprobs = f.boolean("logprobs")
    top_logprobs = f.integer("top_logprobs", lo=0, hi=20) or 0
    if top_logprobs and not logprobs:
        raise ParamError("top_logprobs", "requires logprobs to be true")
    names = {"max_tokens": "max_completion_tokens" if max_tokens is None else "max_tokens"}
    sampling = _sampling(
        f,
        max_tokens=max_completion_tokens or max_tokens,
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        names=names,
    )
    return _request(f, GenerateInput(messages=messages), sampling, chat=True, echo=False)


def parse_completion_request(body: Any) -> GatewayRequest:
    """A /v1/completions body -> GatewayRequest (chat=False).

    `echo` with `logprobs` also scores the prompt (its first token's logprob is null, as
    OpenAI reports it); `echo` allows `max_tokens: 0`: the prompt scored, nothing generated.
    """
    f = _Fields(body, _COMMON | _COMPLETION_ONLY | _IGNORED)
    prompt_input = _parse_prompt(body.get("prompt"))
    if f.has("suffix"):
        raise ParamError("suffix", "is not supported")
    echo = f.boolean("echo")
    max_tokens = f.integer("max_tokens", lo=0)
    if max_tokens == 0 and not echo:
        raise ParamError("max_tokens", "must be >= 1 (0 only with echo: score the prompt)")
    logprobs = f.integer("logprobs", lo=0, hi=20)
    names = {"top_logprobs": "logprobs"}
    sampling = _sampling(
        f,
        max_tokens=DEFAULT_COMPLETION_MAX_TOKENS if max_tokens is None else max_tokens,
        logprobs=logprobs is not None,
        top_logprobs=logprobs or 0,
        names=names,
        prompt_logprobs_start=1 if echo and (logprobs is not None or max_tokens == 0) else None,
    )
    best_of = f.integer("best_of", lo=1)
    if best_of is not None and best_of != sampling.n:
        raise ParamError("best_of", f"must equal n ({sampling.n}) when given")
    return _request(f, prompt_input, sampling, chat=False, echo=echo)


def parse_messages(value: Any, param: str = "messages") -> tuple[ChatMessage, ...]:
    """OpenAI messages -> ChatMessage tuple; content parts of type "text" are joined."""
    if not isinstance(value, list):
        raise ParamError(param, "expected a non-empty array of messages")
    if not value:
        raise ParamError(param, "must contain at least one message")
    messages = []
    for i, item in enumerate(value):
        where = f"{param}[{i}]"
        if not isinstance(item, dict):
            raise ParamError(where, "expected an object with role and content")
        role = item.get("role")
        if role == "developer":
            role = "system"  # OpenAI's newer name for the system role
        if role not in CHAT_ROLES:
            raise ParamError(
                f"{where}.role",
                f"unknown role {_short(role)}; expected one of {sorted(CHAT_ROLES)}",
            )
        if item.get("tool_calls"):
            raise ParamError(f"{where}.tool_calls", "tool calls are not supported")
        messages.append(ChatMessage(role, _message_content(item.get("content"), role, where)))
    return tuple(messages)


def _message_content(content: Any, role: str, where: str) -> str:
    if content is None and role == "assistant":
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ParamError(f"{where}.content", "expected a string or an array of text parts")
    texts = []
    for j, part in enumerate(content):
        part_where = f"{where}.content[{j}]"
        if not isinstance(part, dict) or part.get("type") != "text":
            raise ParamError(f"{part_where}.type", 'only parts of type "text" are supported')
        if not isinstance(part.get("text"), str):
            raise ParamError(f"{part_where}.text", "expected a string")
        texts.append(part["text"])
    return "".join(texts)


def _parse_prompt(prompt: Any) -> GenerateInput:
    """A completions prompt: a string, token ids, or a one-element array of either."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        if not prompt:
            raise ParamError("prompt", "must not be empty")
        return GenerateInput(prompt=prompt)
    if isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        if any(t < 0 for t in prompt):
            raise ParamError("prompt", "token ids must be non-negative")
        return GenerateInput(token_ids=tuple(prompt))
    if (
        isinstance(prompt, list)
        and len(prompt) > 1
        and all(isinstance(p, str | list) for p in prompt)
    ):
        raise ParamError(
            "prompt", "batches of prompts are not supported; send one request per prompt"
        )
    raise ParamError("prompt", "expected a non-empty string or a non-empty array of token ids")


def _refuse_tools(f: _Fields) -> None:
    """No tool calling: an empty tools array and tool_choice "none" or "auto" mean none."""
    if f.get("tools", lambda v: isinstance(v, list), "an array of tools"):
        raise ParamError("tools", "tool calling is not supported")
    tool_choice = f.get(
        "tool_choice", lambda v: isinstance(v, str | dict), '"none", "auto" or an object'
    )
    if tool_choice not in (None, "none", "auto"):
        raise ParamError("tool_choice", "tool calling is not supported")


def _sampling(
    f: _Fields,
    max_tokens: int | None,
    logprobs: bool,
    top_logprobs: int,
    names: dict[str, str],
    prompt_logprobs_start: int | None = None,
) -> SamplingParams:
    if f.object("logit_bias"):  # an empty object biases nothing
        raise ParamError("logit_bias", "is not supported")
    fields: dict[str, Any] = {
        "max_tokens": max_tokens,
        "min_tokens": f.integer("min_tokens", lo=0),
        "temperature": f.number("temperature", lo=0, hi=2),
        "top_p": f.number("top_p"),
        "top_k": f.integer("top_k", lo=-1),
        "min_p": f.number("min_p"),
        "seed": f.integer("seed"),
        "repetition_penalty": f.number("repetition_penalty"),
        "frequency_penalty": f.number("frequency_penalty", lo=-2, hi=2),
        "presence_penalty": f.number("presence_penalty", lo=-2, hi=2),
        "stop": _stop_strings(f.body.get("stop")),
        "stop_token_ids": _stop_token_ids(f.body.get("stop_token_ids")),
        "ignore_eos": f.boolean("ignore_eos"),
        "logprobs": logprobs,
        "top_logprobs": top_logprobs,
        "n": f.integer("n", lo=1, hi=MAX_N),
        "prompt_logprobs_start": prompt_logprobs_start,
    }
    if fields["seed"] is not None and fields["seed"] < 0:
        fields["seed"] %= 2**64  # OpenAI allows negative seeds; keep them distinct and valid
    given = {k: v for k, v in fields.items() if v is not None}
    try:
        return SamplingParams(**given)
    except InvalidArgument as exc:
        match = re.match(r"sampling\.(\w+) (.*)", str(exc), re.S)
        if match is None:
            raise
        raise ParamError(names.get(match[1], match[1]), match[2]) from None


def _stop_strings(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise ParamError("stop", "expected a string or an array of strings")
    if len(value) > MAX_STOP_STRINGS:
        raise ParamError("stop", f"at most {MAX_STOP_STRINGS} stop strings, got {len(value)}")
    if any(not s for s in value):
        raise ParamError("stop", "must not contain empty strings")
    return tuple(value)


def _stop_token_ids(value: Any) -> tuple[int, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(_is_int(t) and 0 <= t < 2**31 for t in value):
        raise ParamError("stop_token_ids", "expected an array of token ids in [0, 2^31)")
    return tuple(value)


def _request(
    f: _Fields, prompt_input: GenerateInput, sampling: SamplingParams, chat: bool, echo: bool
) -> GatewayRequest:
    stream = f.boolean("stream")
    options = parse_stream_options(f.body)
    priority_name = f.string("priority", "interactive")
    if priority_name not in _PRIORITIES:
        raise ParamError(
            "priority", f"expected one of {sorted(_PRIORITIES)}, got {priority_name!r}"
        )
    return GatewayRequest(
        model=f.string("model", "") or "",
        input=prompt_input,
        sampling=sampling,
        constraint=parse_constraint(f.body),
        priority=_PRIORITIES[priority_name],
        stream=stream,
        include_usage=options.include_usage,
        continuous_usage=options.continuous_usage_stats,
        user=f.string("user", "") or "",
        chat=chat,
        echo=echo,
        session_id=f.string("session_id", "") or "",
    )


@dataclass(frozen=True, slots=True)
class StreamOptions:
    """A streamed request's stream_options."""

    include_usage: bool = False
    """One last chunk, with no choices, carries the request's usage."""
    continuous_usage_stats: bool = False
    """vLLM's extension: every chunk of a choice also carries the usage so far (the
    prompt's tokens and that choice's completion tokens); implies include_usage."""


def parse_stream_options(body: dict[str, Any]) -> StreamOptions:
    """The body's stream_options, checked."""
    options = body.get("stream_options")
    if options is None:
        return StreamOptions()
    if body.get("stream") is not True:
        raise ParamError("stream_options", "is only allowed when stream is true")
    f = _Fields(options, _STREAM_OPTIONS, where="stream_options")
    continuous = f.boolean("continuous_usage_stats")
    # continuous usage implies the usage chunk (vLLM's include_usage defaults to true);
    # asking for it with include_usage false contradicts itself
    include_usage = f.boolean("include_usage", default=continuous)
    if continuous and not include_usage:
        raise ParamError(
            f.path("continuous_usage_stats"), "needs stream_options.include_usage, set false here"
        )
    return StreamOptions(include_usage, continuous)


# --- constraints ----------------------------------------------------------------------------


def parse_constraint(body: dict[str, Any]) -> Constraint | None:
    """response_format, regex, ebnf or choices -> one Constraint (or None)."""
    found: list[tuple[str, Constraint]] = []
    response_format = body.get("response_format")
    if response_format is not None:
        constraint = _response_format(response_format)
        if constraint is not None:
            found.append(("response_format", constraint))
    for name, kind in (("regex", ConstraintKind.REGEX), ("ebnf", ConstraintKind.EBNF)):
        value = body.get(name)
        if value is None:
            continue
        if not isinstance(value, str) or not value:
            raise ParamError(name, "expected a non-empty string")
        found.append((name, Constraint(kind, value=value)))
    choices = body.get("choices")
    if choices is not None:
        if (
            not isinstance(choices, list)
            or not choices
            or not all(isinstance(c, str) and c for c in choices)
        ):
            raise ParamError("choices", "expected a non-empty array of non-empty strings")
        found.append(("choices", Constraint(ConstraintKind.CHOICES, choices=tuple(choices))))
    if len(found) > 1:
        raise ParamError(found[1][0], f"conflicts with {found[0][0]}; give one constraint")
    return found[0][1] if found else None


def _response_format(value: Any) -> Constraint | None:
    if not isinstance(value, dict):
        raise ParamError("response_format", "expected an object with a type")
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return Constraint(ConstraintKind.JSON_OBJECT)
    if kind != "json_schema":
        raise ParamError(
            "response_format.type",
            f'expected "text", "json_object" or "json_schema", got {_short(kind)}',
        )
    spec = value.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
        raise ParamError("response_format.json_schema.schema", "expected a JSON Schema object")
    schema = spec["schema"]
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise ParamError("response_format.json_schema.strict", "expected a boolean")
    text = json.dumps(schema, ensure_ascii=False)
    if len(text) > MAX_JSON_SCHEMA_CHARS:  # before the schema check: it too grows with the text
        raise ParamError(
            "response_format.json_schema.schema",
            f"must be at most {MAX_JSON_SCHEMA_CHARS} characters as JSON, got {len(text)}",
        )
    _check_schema(schema)
    return Constraint(ConstraintKind.JSON_SCHEMA, value=text, best_effort=not strict)


def _check_schema(schema: dict[str, Any]) -> None:
    import jsonschema

    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise ParamError(
            "response_format.json_schema.schema", f"not a valid JSON Schema: {exc.message}"
        ) from None
