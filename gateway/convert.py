"""Protobuf <-> gateway core objects, at the edge only (inference.proto).

Sampling parameters, constraints and priority go through the contract's one
converter (`radixmesh.wire`), with the same rules as in every other room.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from gateway.core.generate import ChoiceEvent
from gateway.core.openai_responses import MIN_LOGPROB, PositionLogprobs, TokenLogprob
from gateway.core.request import ChatMessage, GatewayRequest, GenerateInput
from radixmesh import wire
from radixmesh.errors import InvalidArgument
from radixmesh.schema import SchemaCheck
from radixmesh.v1 import inference_pb2

_SCHEMA_CHECKS = {
    SchemaCheck.VALID: inference_pb2.SCHEMA_CHECK_VALID,
    SchemaCheck.INVALID: inference_pb2.SCHEMA_CHECK_INVALID,
    SchemaCheck.TRUNCATED: inference_pb2.SCHEMA_CHECK_TRUNCATED,
}


def generate_request_from_proto(request: inference_pb2.GenerateRequest) -> GatewayRequest:
    """A public GenerateRequest -> GatewayRequest; bad fields raise InvalidArgument naming them."""
    which = request.WhichOneof("input")
    if which is None:
        raise InvalidArgument("input: one of prompt, token_ids or messages is required")
    if which == "prompt":
        given = GenerateInput(prompt=request.prompt)
    elif which == "token_ids":
        given = GenerateInput(token_ids=tuple(request.token_ids.ids))
    else:
        messages = tuple(ChatMessage(m.role, m.content) for m in request.messages.messages)
        given = GenerateInput(messages=messages)
    return GatewayRequest(
        model=request.model,
        input=given,
        sampling=wire.sampling_from_proto(request.sampling),
        constraint=wire.constraint_from_proto(request, oneof="constraint"),
        priority=wire.priority_from_proto(request.priority),
        stream=True,
        chat=which == "messages",
        session_id=request.session_id,
    )


def event_to_responses(request_id: str, event: ChoiceEvent) -> list[inference_pb2.GenerateResponse]:
    """A chunk when the event carries text or tokens, then a Complete when the choice finished.

    The prompt's log probabilities go on the chunk, or on the Complete when the event
    has no chunk (max_tokens 0: no token generated)."""
    delta = event.delta
    responses = []
    prompt_logprobs = delta.prompt_logprobs or ()
    if delta.text or delta.token_ids:
        response = inference_pb2.GenerateResponse(request_id=request_id)
        chunk = response.chunk  # filled in place: no copy of a separate Chunk
        chunk.index = delta.index
        chunk.text = delta.text
        chunk.token_ids.extend(delta.token_ids)
        _add_positions(chunk.logprobs, delta.logprobs or ())
        _add_positions(chunk.prompt_logprobs, prompt_logprobs)
        prompt_logprobs = ()
        responses.append(response)
    if delta.finish_reason is not None:
        usage = event.usage
        complete = inference_pb2.Complete(
            index=delta.index,
            finish_reason=delta.finish_reason,
            matched_stop=delta.matched_stop or "",
            usage=inference_pb2.Usage(
                prompt_tokens=usage.prompt_tokens if usage else 0,
                completion_tokens=usage.completion_tokens if usage else 0,
                cached_tokens=usage.cached_tokens if usage else 0,
            ),
        )
        _add_positions(complete.prompt_logprobs, prompt_logprobs)
        if usage is not None and usage.speculation is not None:
            wire.speculation_to_proto(usage.speculation, complete.usage.speculation)
        if event.schema is not None:
            complete.schema_check = _SCHEMA_CHECKS[event.schema.check]
            complete.schema_error = event.schema.error
            complete.unenforced_keywords.extend(event.schema.unenforced)
        responses.append(inference_pb2.GenerateResponse(request_id=request_id, complete=complete))
    return responses


def _add_positions(out, positions: Sequence[PositionLogprobs]) -> None:
    """Append positions to a repeated PositionLogprobs field."""
    for p in positions:
        out.add(sampled=_token_logprob(p.sampled), top=[_token_logprob(t) for t in p.top])


def _token_logprob(token: TokenLogprob) -> inference_pb2.TokenLogprob:
    return inference_pb2.TokenLogprob(
        token_id=token.token_id, logprob=max(token.logprob, MIN_LOGPROB), token=token.token
    )


_ID_PATTERN = re.compile(r"^[\w.:/-]{1,128}$")


def check_request_id(request_id: str) -> str:
    """A caller-chosen request id: 1-128 of letters, digits and . _ : / -."""
    if not _ID_PATTERN.match(request_id):
        raise InvalidArgument("request_id: 1-128 characters of letters, digits and . _ : / -")
    return request_id
