"""OpenAI-compatible response shapes: completions, chunks, usage, logprobs, errors and SSE.

Builders return plain dicts ready for `json.dumps`; `sse(obj)` frames one
server-sent event and `SSE_DONE` ends a stream, as OpenAI's clients expect.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from radixmesh.errors import RadixmeshError
from radixmesh.speculation import SpecUsage
from radixmesh.status import status_of

_LEADING_FIELD = re.compile(r"^([A-Za-z_][\w.\[\]]*): ")

OPENAI_CONSTRAINT_PARAMS = {
    "constraint.json_schema": "response_format.json_schema.schema",
    "constraint.json_object": "response_format",
    "constraint.regex": "regex",
    "constraint.ebnf": "ebnf",
    "constraint.choices": "choices",
}
"""The executor's constraint fields (in its compile errors) -> the OpenAI body's fields."""

MIN_LOGPROB = -9999.0
"""-inf (a token the sampler could not pick) is reported as this, as OpenAI does; JSON has no inf."""



@dataclass(frozen=True, slots=True)
class TokenLogprob:
    token: str
    """The token's text (U+FFFD for a partial character)."""
    logprob: float
    token_bytes: bytes
    """The token's raw bytes, which may be part of a UTF-8 character."""
    token_id: int = -1
    """The token's id, for clients of the gRPC API (-1 when unknown)."""


@dataclass(frozen=True, slots=True)
class PositionLogprobs:
    sampled: TokenLogprob
    top: tuple[TokenLogprob, ...] = ()
    """The top_logprobs most likely tokens, most likely first."""


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    speculation: SpecUsage | None = None
    """Speculative decoding counters, when the request verified any draft."""


@dataclass(frozen=True, slots=True)
class ChoiceOutput:
    """One finished choice of a non-streaming response."""

    index: int
    text: str
    finish_reason: str
    logprobs: Sequence[PositionLogprobs] | None = None
    matched_stop: str | None = None
    echo_first: TokenLogprob | None = None
    """An echoed, scored prompt's first token: it leads `logprobs` with a null logprob."""


def new_response_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex


def now_s() -> int:
    return int(time.time())


def usage_json(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        **({"speculation": speculation_json(usage.speculation)} if usage.speculation else {}),
    }


def speculation_json(usage: SpecUsage) -> dict[str, Any]:
    """The `usage.speculation` extension of OpenAI responses."""
    return {
        "num_drafts": usage.num_drafts,
        "num_draft_tokens": usage.num_draft_tokens,
        "num_accepted_tokens": usage.num_accepted_tokens,
        "accepted_by_position": list(usage.accepted_by_position),
        "mean_acceptance_length": round(usage.mean_acceptance_length, 4),
        "num_forced_tokens": usage.num_forced_tokens,
    }


def sum_speculation(usages: Sequence[SpecUsage | None]) -> SpecUsage | None:
    """Counters of several choices added up; None when none verified a draft."""
    present = [u for u in usages if u is not None]
    if not present:
        return None
    total = SpecUsage()
    for u in present:
        total.num_drafts += u.num_drafts
        total.num_draft_tokens += u.num_draft_tokens
        total.num_accepted_tokens += u.num_accepted_tokens
        total.num_forced_tokens += u.num_forced_tokens
        for j, count in enumerate(u.accepted_by_position):
            if j == len(total.accepted_by_position):
                total.accepted_by_position.append(0)
            total.accepted_by_position[j] += count
    return total


def _logprob(value: float) -> float:
    return value if value >= MIN_LOGPROB else MIN_LOGPROB  # also maps -inf


def chat_logprobs_json(entries: Sequence[PositionLogprobs]) -> dict[str, Any]:
    """Chat shape: {"content": [{token, logprob, bytes, top_logprobs: [...]}, ...]}."""

    def one(t: TokenLogprob) -> dict[str, Any]:
        return {"token": t.token, "logprob": _logprob(t.logprob), "bytes": list(t.token_bytes)}

    return {
        "content": [{**one(e.sampled), "top_logprobs": [one(t) for t in e.top]} for e in entries]
    }


def completion_logprobs_json(
    entries: Sequence[PositionLogprobs],
    text_offset: int = 0,
    first: TokenLogprob | None = None,
) -> dict[str, Any]:
    """Completions shape: parallel arrays tokens, token_logprobs, top_logprobs, text_offset.

    `first`: an echoed prompt's first token, which has no log probability: it leads the
    arrays with null logprob and null top_logprobs, as OpenAI and vLLM report it."""
    offsets = []
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    top_logprobs: list[dict[str, float] | None] = []
    if first is not None:
        offsets.append(text_offset)
        text_offset += len(first.token)
        tokens.append(first.token)
        token_logprobs.append(None)
        top_logprobs.append(None)
    for e in entries:
        offsets.append(text_offset)
        text_offset += len(e.sampled.token)
        tokens.append(e.sampled.token)
        token_logprobs.append(_logprob(e.sampled.logprob))
        top_logprobs.append({t.token: _logprob(t.logprob) for t in e.top})
    return {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": top_logprobs,
        "text_offset": offsets,
    }


def _finish_fields(finish_reason: str | None, matched_stop: str | None) -> dict[str, Any]:
    fields: dict[str, Any] = {"finish_reason": finish_reason}
    if matched_stop is not None:
        fields["stop_reason"] = matched_stop  # extension: which stop string or token ended it
    return fields


def chat_completion(
    response_id: str, model: str, created: int, choices: Sequence[ChoiceOutput], usage: Usage
) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": c.index,
                "message": {"role": "assistant", "content": c.text},
                "logprobs": None if c.logprobs is None else chat_logprobs_json(c.logprobs),
                **_finish_fields(c.finish_reason, c.matched_stop),
            }
            for c in choices
        ],
        "usage": usage_json(usage),
    }


def chat_completion_chunk(
    response_id: str,
    model: str,
    created: int,
    index: int,
    *,
    content: str | None = None,
    role: str | None = None,
    finish_reason: str | None = None,
    matched_stop: str | None = None,
    logprobs: Sequence[PositionLogprobs] | None = None,
) -> dict[str, Any]:
    """One choice's delta; the first chunk of a choice carries role "assistant"."""
    delta: dict[str, Any] = {}
    if role is not None:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    choice = {
        "index": index,
        "delta": delta,
        "logprobs": None if logprobs is None else chat_logprobs_json(logprobs),
        **_finish_fields(finish_reason, matched_stop),
    }
    return _chunk(response_id, "chat.completion.chunk", model, created, [choice])


def text_completion(
    response_id: str, model: str, created: int, choices: Sequence[ChoiceOutput], usage: Usage
) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": c.index,
                "text": c.text,
                "logprobs": (
                    None
                    if c.logprobs is None
                    else completion_logprobs_json(c.logprobs, first=c.echo_first)
                ),
                **_finish_fields(c.finish_reason, c.matched_stop),
            }
            for c in choices
        ],
        "usage": usage_json(usage),
    }


def text_completion_chunk(
    response_id: str,
    model: str,
    created: int,
    index: int,
    text: str,
    *,
    finish_reason: str | None = None,
    matched_stop: str | None = None,
    logprobs: Sequence[PositionLogprobs] | None = None,
    text_offset: int = 0,
    echo_first: TokenLogprob | None = None,
) -> dict[str, Any]:
    choice = {
        "index": index,
        "text": text,
        "logprobs": (
            None
            if logprobs is None
            else completion_logprobs_json(logprobs, text_offset, echo_first)
        ),
        **_finish_fields(finish_reason, matched_stop),
    }
    return _chunk(response_id, "text_completion", model, created, [choice])


def usage_chunk(
    response_id: str, model: str, created: int, chat: bool, usage: Usage
) -> dict[str, Any]:
    """The last chunk when stream_options.include_usage is set: no choices, the usage."""
    kind = "chat.completion.chunk" if chat else "text_completion"
    return {**_chunk(response_id, kind, model, created, []), "usage": usage_json(usage)}


def _chunk(
    response_id: str, kind: str, model: str, created: int, choices: list[dict[str, Any]]
) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": kind,
        "created": created,
        "model": model,
        "choices": choices,
    }


def model_list(
    models: Sequence[tuple[str, int]], created: int, owned_by: str = "radixmesh"
) -> dict[str, Any]:
    """/v1/models of (model id, the context its executors serve) pairs; `max_model_len` is
    an extension field, as other OpenAI-compatible servers report it."""
    return {
        "object": "list",
        "data": [
            {
                "id": m,
                "object": "model",
                "created": created,
                "owned_by": owned_by,
                "max_model_len": max_model_len,
            }
            for m, max_model_len in models
        ],
    }


# --- errors and SSE -------------------------------------------------------------------------


def error_body(
    message: str, error_type: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def error_response(exc: BaseException) -> tuple[int, dict[str, Any]]:
    """HTTP status and OpenAI error body for an exception a core raised.

    Anything that is not a RadixmeshError is an internal error whose details stay in the logs.
    """
    if not isinstance(exc, RadixmeshError):
        return 500, error_body("internal error", "server_error", code="internal_error")
    row = status_of(exc.code)  # the contract's one table: gRPC code -> HTTP status and type
    status, error_type = row.http_status, row.error_type
    param, message = getattr(exc, "param", None), " | ".join(
        line.strip() for line in str(exc).splitlines() if line.strip()
    )
    if param is None and status < 500:
        # Cores start messages with the field they blame: "messages[0].role: ...".
        match = _LEADING_FIELD.match(message)
        if match is not None:
            param = match[1]
            base = next((k for k in OPENAI_CONSTRAINT_PARAMS if param.startswith(k)), None)
            if base is not None and param[len(base) : len(base) + 1] in ("", "."):
                # named as the client's body spells it, with any path inside the schema
                param = OPENAI_CONSTRAINT_PARAMS[base] + param[len(base) :]
                message = f"{param}: {message[match.end() :]}"
    return status, error_body(message, error_type, param, exc.code.lower())


def sse(obj: dict[str, Any]) -> bytes:
    """One server-sent event carrying a JSON object."""
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"
