"""OpenAI-compatible response shapes: completions, chunks, usage, logprobs, errors and SSE.

Builders return plain dicts ready for `json.dumps`; `sse(obj)` frames one
server-sent event and `SSE_DONE` ends a stream, as OpenAI's clients expect.
"""

from __future__ import annotations

import codecs
import json
import re
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.core.openai import REQUEST_FIELDS
from radixmesh.errors import RadixmeshError
from radixmesh.speculation import SpecUsage
from radixmesh.status import status_of

_FIELD_PATH = re.compile(r"([A-Za-z_]\w*)(?:\[\d+\]|\.\w+)*")
"""A request field and any path inside it, as cores write it: "messages[0].content"."""

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


class TextOffsets:
    """Where each token of one choice stands in the choice's returned text: its
    text_offset, in characters, kept across the chunks of a stream.

    The tokens' bytes are decoded in order, as the text was: a token that completes no
    character yet (part of a UTF-8 character) stands where that character will, and a
    token whose text decoding drops (`skipped`: a special token such as BOS or EOS)
    stands where the next text starts."""

    def __init__(self, start: int = 0, skipped: Callable[[TokenLogprob], bool] = lambda t: False):
        self.position = start
        """The offset the next token gets: `start` is where the choice's tokens begin."""
        self._skipped = skipped
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def take(self, tokens: Iterable[TokenLogprob]) -> list[int]:
        """The offsets of the choice's next tokens."""
        offsets = []
        for token in tokens:
            offsets.append(self.position)
            if not self._skipped(token):
                self.position += len(self._decoder.decode(token.token_bytes))
        return offsets


def completion_logprobs_json(
    entries: Sequence[PositionLogprobs],
    offsets: TextOffsets,
    first: TokenLogprob | None = None,
) -> dict[str, Any]:
    """Completions shape: parallel arrays tokens, token_logprobs, top_logprobs, text_offset.

    `offsets` places the tokens in the choice's text (and moves past them). `first`: an
    echoed prompt's first token, which has no log probability: it leads the arrays with
    null logprob and null top_logprobs, as OpenAI and vLLM report it."""
    sampled = [e.sampled for e in entries]
    tokens = [t.token for t in sampled]
    token_logprobs: list[float | None] = [_logprob(t.logprob) for t in sampled]
    top_logprobs: list[dict[str, float] | None] = [
        {t.token: _logprob(t.logprob) for t in e.top} for e in entries
    ]
    if first is not None:
        sampled.insert(0, first)
        tokens.insert(0, first.token)
        token_logprobs.insert(0, None)
        top_logprobs.insert(0, None)
    return {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": top_logprobs,
        "text_offset": offsets.take(sampled),
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
    response_id: str,
    model: str,
    created: int,
    choices: Sequence[ChoiceOutput],
    usage: Usage,
    skipped: Callable[[TokenLogprob], bool] = lambda t: False,
) -> dict[str, Any]:
    """`skipped`: the tokens whose text decoding drops (see `TextOffsets`)."""
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
                    else completion_logprobs_json(
                        c.logprobs, TextOffsets(0, skipped), first=c.echo_first
                    )
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
    offsets: TextOffsets | None = None,
    echo_first: TokenLogprob | None = None,
) -> dict[str, Any]:
    """`offsets`: where the choice's tokens stand so far (a stream's chunks continue it)."""
    choice = {
        "index": index,
        "text": text,
        "logprobs": (
            None
            if logprobs is None
            else completion_logprobs_json(logprobs, offsets or TextOffsets(), echo_first)
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


def usage_so_far_json(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    """stream_options.continuous_usage_stats: a chunk's usage so far, as vLLM reports it
    (its choice's completion tokens; the last chunk's usage counts every choice)."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


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
    if param is None and error_type == "invalid_request_error":
        blamed = blamed_field(message)
        if blamed is not None:
            param, rest = blamed
            message = f"{param}: {rest}"
    return status, error_body(message, error_type, param, exc.code.lower())


def blamed_field(message: str) -> tuple[str, str] | None:
    """The request field a core's message starts with, as the client's body spells it, and
    the rest of the message: "messages[0].role: ..." or, from the executor's grammar
    compiler, "constraint.json_schema.properties.my-field.not: ..." (a path inside the
    schema may hold any character but ": "). None when the message starts with no request
    field: "overloaded: ..." and the like name no param."""
    path, found, rest = message.partition(": ")
    if not found:
        return None
    for internal, public in OPENAI_CONSTRAINT_PARAMS.items():
        inside = path.removeprefix(internal)
        if inside != path and inside[:1] in ("", ".", "["):
            return public + inside, rest
    match = _FIELD_PATH.fullmatch(path)
    if match is not None and match[1] in REQUEST_FIELDS:
        return path, rest
    return None


def sse(obj: dict[str, Any]) -> bytes:
    """One server-sent event carrying a JSON object."""
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"
