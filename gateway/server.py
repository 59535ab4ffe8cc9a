"""The public gRPC API (`radixmesh.v1.Inference`): convert, call the core, convert.

Errors are core exceptions; the runtime's ErrorInterceptor maps them to status
codes. Every call, ListModels included, passes admission (API key, rate limit);
a keyless caller is limited by the client address Envoy forwards in
`x-forwarded-for` (see `gateway.core.auth`). A client that cancels its Generate
call closes the event stream, which aborts its choices at the scheduler.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncIterator

from gateway import convert
from gateway.core.auth import Admission, client_address
from gateway.core.capacity import CapacityGate
from gateway.core.generate import Upstream
from gateway.core.limits import OFF_LOOP_CHARS, check_input_size, input_chars, off_loop
from gateway.core.memory import GatewayMemory
from gateway.core.models import ExecutorCounts, ModelRegistry
from gateway.core.prepare import prepare_request
from gateway.core.request import ChatMessage, GenerateInput
from gateway.programs.core.plugins import PluginChain
from gateway.tracing import request_trace, timed_event
from radixmesh.errors import InvalidArgument
from radixmesh.v1 import inference_pb2, inference_pb2_grpc
from services.common.tracing import traceparent_from_metadata


class InferenceServicer(inference_pb2_grpc.InferenceServicer):
    def __init__(
        self,
        models: ModelRegistry,
        upstream: Upstream,
        admission: Admission = Admission(),
        memory: GatewayMemory | None = None,
        executor_counts: ExecutorCounts | None = None,
        plugins: PluginChain | None = None,
        capacity: CapacityGate | None = None,
    ) -> None:
        """executor_counts: fills ListModels' num_executors (None: reported as 0).
        plugins: their pre_request rewrites prompts and message texts, their post_response
        the streamed output (`PluginChain.apply_to_events`).
        capacity: the scheduler's published headroom; a request over it is refused on
        arrival (None: every request goes to the scheduler)."""
        self._capacity = capacity
        self._plugins = plugins or PluginChain()
        self._models = models
        self._executor_counts = executor_counts
        self._upstream = upstream
        self._admission = admission
        self._memory = memory or GatewayMemory()

    async def _admit(self, context) -> None:
        metadata = context.invocation_metadata() or ()
        authorization = ""
        forwarded: list[str] = []
        for key, value in metadata:
            if key == "authorization":
                authorization = str(value)
            elif key == "x-forwarded-for":
                forwarded.append(str(value))
        client = client_address(",".join(forwarded), context.peer() or "")
        await self._admission.admit(authorization, client)

    async def Generate(
        self, request: inference_pb2.GenerateRequest, context
    ) -> AsyncIterator[inference_pb2.GenerateResponse]:
        request_id = (
            convert.check_request_id(request.request_id) if request.request_id else uuid.uuid4().hex
        )
        traceparent = traceparent_from_metadata(context.invocation_metadata())
        with request_trace("gateway.Generate", traceparent, request_id):
            with timed_event("gateway.validate"):
                await self._admit(context)
                gateway_request = convert.generate_request_from_proto(request)
                gateway_request = self._plugins.apply_to_request(gateway_request)
                model_id, tokenizer = self._models.resolve(gateway_request.model)
                if self._capacity is not None:  # over the published headroom: refused at once
                    self._capacity.admit(
                        model_id, gateway_request.priority, gateway_request.sampling.n
                    )
            session_id = gateway_request.session_id
            history = await self._memory.history(session_id)
            large = input_chars(gateway_request.input) > OFF_LOOP_CHARS
            with timed_event("gateway.prepare"):
                prepared = await off_loop(
                    large,
                    prepare_request,
                    gateway_request,
                    tokenizer,
                    request_id,
                    _deadline_unix_ms(context),
                    history,
                )
            events = self._plugins.apply_to_events(
                self._memory.generate(prepared, tokenizer, self._upstream, session_id),
                streamed=True,  # Generate always streams its chunks
            )
            with timed_event("gateway.stream"):
                async with contextlib.aclosing(events):
                    async for event in events:
                        for response in convert.event_to_responses(request_id, event):
                            yield response

    async def Tokenize(
        self, request: inference_pb2.TokenizeRequest, context
    ) -> inference_pb2.TokenizeResponse:
        await self._admit(context)
        _, tokenizer = self._models.resolve(request.model)
        which = request.WhichOneof("input")
        if which == "prompt":
            given = GenerateInput(prompt=request.prompt)
            check_input_size(given, tokenizer.max_model_len)
            large = input_chars(given) > OFF_LOOP_CHARS
            token_ids = await off_loop(large, tokenizer.encode_prompt, request.prompt)
        elif which == "messages":
            messages = tuple(ChatMessage(m.role, m.content) for m in request.messages.messages)
            given = GenerateInput(messages=messages)
            check_input_size(given, tokenizer.max_model_len)
            large = input_chars(given) > OFF_LOOP_CHARS
            token_ids = await off_loop(large, tokenizer.encode_messages, list(messages))
        else:
            raise InvalidArgument("input: one of prompt or messages is required")
        return inference_pb2.TokenizeResponse(
            token_ids=token_ids, max_model_len=tokenizer.max_model_len
        )

    async def ListModels(
        self, request: inference_pb2.ListModelsRequest, context
    ) -> inference_pb2.ListModelsResponse:
        await self._admit(context)
        counts = await self._executor_counts.get() if self._executor_counts else {}
        cards = []
        for model_id in self._models.ids:
            _, tokenizer = self._models.resolve(model_id)
            cards.append(
                inference_pb2.ModelCard(
                    id=model_id,
                    max_model_len=tokenizer.max_model_len,
                    num_executors=counts.get(model_id, 0),
                )
            )
        return inference_pb2.ListModelsResponse(models=cards)


def _deadline_unix_ms(context) -> int:
    """The call's gRPC deadline as absolute Unix milliseconds (0: none)."""
    remaining = context.time_remaining()
    if remaining is None:
        return 0
    return int((time.time() + remaining) * 1000)
