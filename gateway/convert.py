"""Protobuf <-> gateway core objects, at the edge only (inference.proto and scheduler.proto)."""

from __future__ import annotations

import re

from gateway.core.generate import ChoiceEvent, UpstreamUpdate
from gateway.core.openai_responses import MIN_LOGPROB, TokenLogprob
from gateway.core.prepare import PreparedRequest
from gateway.core.request import ChatMessage, GatewayRequest, GenerateInput, Priority
from radixmesh.errors import InvalidArgument
from radixmesh.sampling import Constraint, ConstraintKind, SamplingParams
from radixmesh.step import TokenLogprobs
from radixmesh.v1 import inference_pb2, scheduler_pb2
from services.common.interceptor import error_from_status

# SamplingParams fields whose proto field is `optional` (unset -> the core default).
_OPTIONAL_SAMPLING = (
    "max_tokens",
    "min_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "repetition_penalty",
    "frequency_penalty",
    "presence_penalty",
    "ignore_eos",
    "logprobs",
    "top_logprobs",
    "n",
)
_FLOAT_SAMPLING = (
    "temperature",
    "top_p",
    "min_p",
    "repetition_penalty",
    "frequency_penalty",
    "presence_penalty",
)
_PRIORITY_FROM_PROTO = {
    inference_pb2.PRIORITY_UNSPECIFIED: Priority.INTERACTIVE,
    inference_pb2.PRIORITY_INTERACTIVE: Priority.INTERACTIVE,
    inference_pb2.PRIORITY_BATCH: Priority.BATCH,
    inference_pb2.PRIORITY_SHEDDABLE: Priority.SHEDDABLE,
}
_PRIORITY_TO_PROTO = {
    Priority.INTERACTIVE: inference_pb2.PRIORITY_INTERACTIVE,
    Priority.BATCH: inference_pb2.PRIORITY_BATCH,
    Priority.SHEDDABLE: inference_pb2.PRIORITY_SHEDDABLE,
}
_CODE_NAMES = {
    0: "OK", 1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED",
    5: "NOT_FOUND", 6: "ALREADY_EXISTS", 7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED",
    9: "FAILED_PRECONDITION", 10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED",
    13: "INTERNAL", 14: "UNAVAILABLE", 15: "DATA_LOSS", 16: "UNAUTHENTICATED",
}  # fmt: skip


def _float32(value: float) -> float:
    """Proto floats are float32: 0.9 arrives as 0.8999999762; keep what the client wrote."""
    return float(f"{value:.7g}")


def sampling_from_proto(message: inference_pb2.SamplingParams) -> SamplingParams:
    fields = {name: getattr(message, name) for name in _OPTIONAL_SAMPLING if message.HasField(name)}
    for name in _FLOAT_SAMPLING:
        if name in fields:
            fields[name] = _float32(fields[name])
    return SamplingParams(
        **fields, stop=tuple(message.stop), stop_token_ids=tuple(message.stop_token_ids)
    )


def sampling_to_proto(sampling: SamplingParams) -> inference_pb2.SamplingParams:
    message = inference_pb2.SamplingParams(
        stop=sampling.stop, stop_token_ids=sampling.stop_token_ids
    )
    for name in _OPTIONAL_SAMPLING:
        value = getattr(sampling, name)
        if value is not None:
            setattr(message, name, value)
    return message


def constraint_from_proto(
    message: inference_pb2.GenerateRequest | inference_pb2.Constraint, oneof: str
) -> Constraint | None:
    """The constraint oneof of a GenerateRequest ("constraint") or a Constraint ("kind")."""
    which = message.WhichOneof(oneof)
    if which is None:
        return None
    if which == "choices":
        return Constraint(ConstraintKind.CHOICES, choices=tuple(message.choices.choices))
    if which == "json_object":
        return Constraint(ConstraintKind.JSON_OBJECT)
    return Constraint(ConstraintKind(which), value=getattr(message, which))


def constraint_to_proto(constraint: Constraint | None) -> inference_pb2.Constraint | None:
    if constraint is None:
        return None
    if constraint.kind is ConstraintKind.CHOICES:
        return inference_pb2.Constraint(choices=inference_pb2.Choices(choices=constraint.choices))
    if constraint.kind is ConstraintKind.JSON_OBJECT:
        return inference_pb2.Constraint(json_object=True)
    message = inference_pb2.Constraint()
    setattr(message, constraint.kind.value, constraint.value)
    return message


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
    sampling = sampling_from_proto(request.sampling)
    priority = _PRIORITY_FROM_PROTO.get(request.priority)
    if priority is None:
        raise InvalidArgument(f"priority: unknown value {request.priority}")
    return GatewayRequest(
        model=request.model,
        input=given,
        sampling=sampling,
        constraint=constraint_from_proto(request, "constraint"),
        priority=priority,
        stream=True,
        chat=which == "messages",
        session_id=request.session_id,
    )


def submit_to_proto(prepared: PreparedRequest) -> scheduler_pb2.StreamRequest:
    submit = scheduler_pb2.SubmitRequest(
        req_id=prepared.req_id,
        model=prepared.model,
        token_ids=prepared.prompt_token_ids,
        sampling=sampling_to_proto(prepared.sampling),
        constraint=constraint_to_proto(prepared.constraint),
        priority=_PRIORITY_TO_PROTO[prepared.priority],
        deadline_unix_ms=prepared.deadline_unix_ms,
    )
    return scheduler_pb2.StreamRequest(submit=submit)


def abort_to_proto(req_id: str) -> scheduler_pb2.StreamRequest:
    return scheduler_pb2.StreamRequest(abort=scheduler_pb2.AbortRequest(req_id=req_id))


def update_from_proto(update: scheduler_pb2.TokenUpdate) -> UpstreamUpdate:
    error = None
    if update.error_code:
        name = _CODE_NAMES.get(update.error_code, "UNKNOWN")
        error = error_from_status(name, update.error_message or name)
    return UpstreamUpdate(
        token_ids=list(update.token_ids),
        logprobs=[
            TokenLogprobs(
                token_id=p.sampled.token_id,
                logprob=p.sampled.logprob,
                top=[(t.token_id, t.logprob) for t in p.top],
            )
            for p in update.logprobs
        ],
        finish_reason=update.finish_reason,
        matched_stop_token_id=(
            update.matched_stop_token_id if update.HasField("matched_stop_token_id") else None
        ),
        num_prompt_tokens=update.num_prompt_tokens
        if update.HasField("num_prompt_tokens")
        else None,
        num_cached_tokens=update.num_cached_tokens
        if update.HasField("num_cached_tokens")
        else None,
        error=error,
    )


def event_to_responses(request_id: str, event: ChoiceEvent) -> list[inference_pb2.GenerateResponse]:
    """A chunk when the event carries text or tokens, then a Complete when the choice finished."""
    delta = event.delta
    responses = []
    if delta.text or delta.token_ids:
        chunk = inference_pb2.Chunk(index=delta.index, text=delta.text, token_ids=delta.token_ids)
        for p in delta.logprobs or ():
            chunk.logprobs.add(
                sampled=_token_logprob(p.sampled),
                top=[_token_logprob(t) for t in p.top],
            )
        responses.append(inference_pb2.GenerateResponse(request_id=request_id, chunk=chunk))
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
        responses.append(inference_pb2.GenerateResponse(request_id=request_id, complete=complete))
    return responses


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
