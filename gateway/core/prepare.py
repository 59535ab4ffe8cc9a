"""From a validated request to what the scheduler is sent: token ids, resolved limits, one per choice.

`prepare_request` tokenizes the input (chat template for messages), checks the
prompt and an explicit max_tokens against the context the model's executors serve.
`split_choices` turns a request with n choices into n scheduler requests that
share the prompt (so the prefix cache serves the copies) and differ in seed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.core.limits import check_input_size
from gateway.core.request import GatewayRequest
from gateway.core.structured import SchemaSpec, schema_spec
from gateway.core.tokenizer import Tokenizer
from radixmesh.errors import InvalidArgument
from radixmesh.sampling import Constraint, Priority, SamplingParams


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    """One scheduler submission (the fields of SubmitRequest): a gateway request's choice,
    or a program runtime's request continuing a context (gateway/programs)."""

    req_id: str
    model: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingParams
    """max_tokens: the request's, checked to fit beside the prompt; None where it set none,
    so the output may run to the context's end, which the scheduler knows exactly (the
    executors' own, which may be below the model folder's)."""
    constraint: Constraint | None = None
    priority: Priority = Priority.INTERACTIVE
    deadline_unix_ms: int = 0
    """Absolute deadline; 0 means none."""
    schema: SchemaSpec | None = None
    """A JSON-schema constraint as outputs are checked against it (set by prepare_request)."""
    hold_id: str = ""
    """Keep this request's tokens (prompt + output) held in the prefix cache under this name
    when it finishes normally ("": no hold; see gateway/programs/core/port.py)."""
    group_id: str = ""
    """Program group: the requests of one select or one fork share a name, so the scheduler
    admits them together and computes their shared pages once ("": none)."""
    group_size: int = 0
    """How many requests that group has in all, when known up front (a select's choices), so
    the scheduler can wait for every one of them; 0: not said."""


def prepare_request(
    request: GatewayRequest,
    tokenizer: Tokenizer,
    req_id: str,
    deadline_unix_ms: int = 0,
    history: Sequence[int] = (),
) -> PreparedRequest:
    """Tokenize and check one request; raises InvalidArgument naming the field.

    history: a session's token ids so far; the input's tokens follow them (without
    a leading BOS, which the history already starts with).
    """
    if not req_id:
        raise InvalidArgument("request_id: must not be empty")
    given = request.input
    check_input_size(given, tokenizer.max_model_len)  # before any tokenizing
    if sum(x is not None for x in (given.prompt, given.token_ids, given.messages)) != 1:
        raise InvalidArgument("input: exactly one of prompt, token_ids or messages must be set")
    if given.messages is not None:
        field, token_ids = "messages", tokenizer.encode_messages(given.messages)
    elif given.prompt is not None:
        field, token_ids = "prompt", tokenizer.encode_prompt(given.prompt)
    else:
        field, token_ids = "prompt", list(given.token_ids or ())
        tokenizer.validate_token_ids(token_ids, field)
    if history:
        if token_ids and token_ids[0] == tokenizer.bos_token_id:
            token_ids = token_ids[1:]
        token_ids = [*history, *token_ids]
    sampling = request.sampling
    tokenizer.check_length(len(token_ids), sampling.max_tokens, field, sampling.min_tokens)
    return PreparedRequest(
        req_id=req_id,
        model=request.model,
        prompt_token_ids=tuple(token_ids),
        sampling=sampling,
        constraint=request.constraint,
        priority=request.priority,
        deadline_unix_ms=deadline_unix_ms,
        schema=schema_spec(request.constraint),
    )


def choice_req_id(req_id: str, index: int) -> str:
    return f"{req_id}/{index}"


def split_choices(prepared: PreparedRequest) -> list[PreparedRequest]:
    """n scheduler requests of n=1 each; choice i of a seeded request uses seed + i."""
    n = prepared.sampling.n
    if n == 1:
        return [prepared]
    choices = []
    for index in range(n):
        seed = prepared.sampling.seed
        sampling = dataclasses.replace(
            prepared.sampling, n=1, seed=None if seed is None else (seed + index) % 2**64
        )
        choices.append(
            dataclasses.replace(
                prepared, req_id=choice_req_id(prepared.req_id, index), sampling=sampling
            )
        )
    return choices
