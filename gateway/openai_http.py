"""The OpenAI-compatible HTTP server (aiohttp): /v1/chat/completions, /v1/completions, /v1/models.

A thin shell: parse and validate (`gateway.core.openai`), tokenize
(`gateway.core.prepare`), run the choices against the scheduler
(`gateway.core.generate`), and answer with OpenAI's JSON shapes or, when
`stream` is true, server-sent events ending in `data: [DONE]`. Errors answer
with OpenAI's error body and the HTTP status of its code (`radixmesh.status`), as do
the app's own HTTP errors (no such route, a method a route does not take); an
error after a stream has started is sent as one last `data: {"error": ...}`
event. A client that disconnects aborts its request at the scheduler.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web

from gateway.core import openai_responses as resp
from gateway.core.auth import Admission, client_address
from gateway.core.capacity import CapacityGate
from gateway.core.generate import ChoiceEvent, Upstream, collect, total_usage
from gateway.core.limits import OFF_LOOP_BODY_BYTES, OFF_LOOP_CHARS, input_chars, off_loop
from gateway.core.memory import GatewayMemory
from gateway.core.models import ModelRegistry
from gateway.core.openai import parse_chat_request, parse_completion_request, parse_json_body
from gateway.core.output import ChoiceDelta
from gateway.core.prepare import PreparedRequest, prepare_request
from gateway.core.request import GatewayRequest
from gateway.core.structured import schema_fields
from gateway.core.tokenizer import Tokenizer
from gateway.envoy import HTTP_HEALTH_PATH
from gateway.programs.core.plugins import PluginChain
from gateway.tracing import request_trace, timed_event
from radixmesh.errors import Unavailable
from radixmesh.retry_after import retry_after_of
from services.common.logging import get_logger

log = get_logger(__name__)

MAX_BODY_BYTES = 32 * 1024 * 1024


class OpenAIHttpServer:
    """Serves the OpenAI-compatible API for the models of a registry."""

    def __init__(
        self,
        models: ModelRegistry,
        upstream: Upstream,
        admission: Admission = Admission(),
        ready: Callable[[], bool] = lambda: True,
        memory: GatewayMemory | None = None,
        plugins: PluginChain | None = None,
        capacity: CapacityGate | None = None,
    ) -> None:
        self._memory = memory or GatewayMemory()
        self._capacity = capacity
        """The scheduler's published headroom: a request over it is refused on arrival."""
        self._plugins = plugins or PluginChain()
        """Their pre_request rewrites prompts and message texts, their post_response the
        output (whole, or streamed: `PluginChain.apply_to_events`)."""
        self._models = models
        self._upstream = upstream
        self._admission = admission
        self._ready = ready
        self._created = resp.now_s()
        self.num_in_flight = 0
        """Completion requests being answered now (a drain waits for none)."""
        self._idle = asyncio.Event()
        self._idle.set()

    async def wait_idle(self) -> None:
        """Return once no completion request is being answered."""
        await self._idle.wait()

    def build_app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[_json_errors])
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/v1/models", self._list_models)
        app.router.add_get("/v1/models/{model:.+}", self._get_model)  # ids like org/model
        app.router.add_get(HTTP_HEALTH_PATH, self._health)  # Envoy's health check
        return app

    # --- handlers -------------------------------------------------------------------------

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, parse_chat_request)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, parse_completion_request)

    async def _list_models(self, request: web.Request) -> web.Response:
        try:
            await self._admit(request)
        except Exception as exc:
            return _error(exc)
        models = [(m, self._models.resolve(m)[1].max_model_len) for m in self._models.ids]
        return web.json_response(resp.model_list(models, self._created))

    async def _get_model(self, request: web.Request) -> web.Response:
        model_id = request.match_info["model"]
        try:
            await self._admit(request)
            _, tokenizer = self._models.resolve(model_id)
        except Exception as exc:
            return _error(exc)
        card = resp.model_list([(model_id, tokenizer.max_model_len)], self._created)
        return web.json_response(card["data"][0])

    async def _admit(self, request: web.Request) -> None:
        forwarded = ",".join(request.headers.getall("X-Forwarded-For", ()))
        client = client_address(forwarded, request.remote or "")
        await self._admission.admit(request.headers.get("Authorization", ""), client)

    async def _health(self, request: web.Request) -> web.Response:
        return (
            web.Response(text="ok") if self._ready() else web.Response(status=503, text="not ready")
        )

    async def _complete(
        self, request: web.Request, parse: Callable[[Any], GatewayRequest]
    ) -> web.StreamResponse:
        if not self._ready():
            return _error(Unavailable("the gateway is not serving (stopping, or its scheduler "
                                      "is unreachable); retry later"))  # fmt: skip
        self.num_in_flight += 1
        self._idle.clear()
        try:
            traceparent = request.headers.get("traceparent")
            with request_trace(f"gateway.POST {request.path}", traceparent, ""):
                return await self._answer(request, parse)
        finally:
            self.num_in_flight -= 1
            if not self.num_in_flight:
                self._idle.set()

    async def _answer(
        self, request: web.Request, parse: Callable[[Any], GatewayRequest]
    ) -> web.StreamResponse:
        try:
            await self._admit(request)
            raw = await request.read()
            body = await off_loop(len(raw) > OFF_LOOP_BODY_BYTES, parse_json_body, raw)
            gateway_request = self._plugins.apply_to_request(parse(body))
            model_id, tokenizer = self._models.resolve(gateway_request.model)
            if self._capacity is not None:  # over the published headroom: refused at once
                self._capacity.admit(model_id, gateway_request.priority, gateway_request.sampling.n)
                await asyncio.sleep(0)  # and before the admitted ones of a burst tokenize
            response_id = resp.new_response_id(gateway_request.chat)
            session_id = gateway_request.session_id
            history = await self._memory.history(session_id)
            large = input_chars(gateway_request.input) > OFF_LOOP_CHARS
            with timed_event("gateway.prepare"):
                prepared = await off_loop(
                    large, prepare_request, gateway_request, tokenizer, response_id, 0, history
                )
        except web.HTTPRequestEntityTooLarge:
            return _too_large()
        except Exception as exc:
            return _error(exc)
        events = self._plugins.apply_to_events(
            self._memory.generate(prepared, tokenizer, self._upstream, session_id),
            streamed=gateway_request.stream,
        )
        reply = _Reply(gateway_request, prepared, model_id, response_id, tokenizer)
        async with contextlib.aclosing(events):
            if gateway_request.stream:
                try:  # wait for the first event: a failure before any output gets its own status
                    first = await anext(events, None)
                except Exception as exc:
                    return _error(exc)
                return await reply.stream(request, first, events)
            try:
                merged = await collect(events, prepared.sampling.n)
            except Exception as exc:
                return _error(exc)
        return web.json_response(reply.whole(merged), headers={"x-request-id": response_id})


_MARKER = "\x00text\x00"
_MARKER_JSON = json.dumps(_MARKER, ensure_ascii=False).encode()
_NO_TEMPLATE: Any = object()


class _Reply:
    """Builds one request's response, whole or streamed."""

    def __init__(
        self,
        request: GatewayRequest,
        prepared: PreparedRequest,
        model_id: str,
        response_id: str,
        tokenizer: Tokenizer,
    ) -> None:
        self.request = request
        self.prepared = prepared
        self.model_id = model_id
        self.response_id = response_id
        self.created = resp.now_s()
        self.continuous_usage = request.stream and request.continuous_usage
        """stream_options.continuous_usage_stats: every chunk carries the usage so far."""
        self._num_prompt_tokens = len(prepared.prompt_token_ids)
        self._num_tokens = [0] * prepared.sampling.n
        """Per choice: its completion tokens streamed so far (see `count`)."""
        self._tokenizer = tokenizer
        self._skips: dict[int, bool] = {}
        """Token id -> whether decoding drops its text (see `skipped`)."""
        self.echo_text = ""
        if request.echo:
            self.echo_text = request.input.prompt or tokenizer.decode(prepared.prompt_token_ids)
        self._templates: dict[int, tuple[bytes, bytes] | None] = {}
        """Per choice: its plain text chunk's SSE bytes around the text (see chunk_sse)."""
        self.echo_first: resp.TokenLogprob | None = None
        """With echo and logprobs: the prompt's first token (its logprob is null)."""
        if request.echo and prepared.sampling.logprobs:
            first = prepared.prompt_token_ids[0]
            self.echo_first = resp.TokenLogprob(
                tokenizer.token_text(first), 0.0, tokenizer.token_bytes(first), first
            )

    def whole(self, merged: list[ChoiceEvent]) -> dict[str, Any]:
        choices = [
            resp.ChoiceOutput(
                index=e.delta.index,
                text=self.echo_text + e.delta.text,
                finish_reason=e.delta.finish_reason or "abort",
                logprobs=self._logprobs(e),
                matched_stop=e.delta.matched_stop,
                echo_first=self.echo_first,
            )
            for e in merged
        ]
        usage = total_usage(merged)
        if self.request.chat:
            body = resp.chat_completion(
                self.response_id, self.model_id, self.created, choices, usage
            )
        else:
            body = resp.text_completion(
                self.response_id, self.model_id, self.created, choices, usage, self.skipped
            )
        for choice, event in zip(body["choices"], merged, strict=True):
            choice.update(schema_fields(event.schema))
        return body

    async def stream(
        self,
        http_request: web.Request,
        first: ChoiceEvent | None,
        events: AsyncIterator[ChoiceEvent],
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "x-request-id": self.response_id,
            }
        )
        await response.prepare(http_request)
        finals: list[ChoiceEvent] = []
        offsets = self.new_offsets()
        echoed: set[int] = set()
        try:
            if self.request.chat or (self.echo_text and self.echo_first is None):
                for index in range(self.prepared.sampling.n):
                    await response.write(resp.sse(self._first_chunk(index)))
            async for event in _chain(first, events):
                if self.echo_first is not None and event.delta.index not in echoed:
                    echoed.add(event.delta.index)  # the echo, with the prompt's logprobs
                    await response.write(resp.sse(self._echo_chunk(event, offsets)))
                self.count(event)
                await response.write(self.chunk_sse(event, offsets))
                if event.usage is not None:
                    finals.append(event)
            if self.request.include_usage:
                usage = total_usage(finals)
                chunk = resp.usage_chunk(
                    self.response_id, self.model_id, self.created, self.request.chat, usage
                )
                await response.write(resp.sse(chunk))
        except ConnectionError:
            return response  # the client left; closing `events` aborts the request upstream
        except Exception as exc:
            await response.write(resp.sse(resp.error_response(exc)[1]))
        await response.write(resp.SSE_DONE)
        await response.write_eof()
        return response

    def new_offsets(self) -> list[resp.TextOffsets]:
        """Per choice: where its tokens stand in its text, kept across a stream's chunks.
        The echoed prompt's tokens, when scored, come first; else the echo comes before
        the first token."""
        start = 0 if self.echo_first is not None else len(self.echo_text)
        return [resp.TextOffsets(start, self.skipped) for _ in range(self.prepared.sampling.n)]

    def skipped(self, token: resp.TokenLogprob) -> bool:
        """Decoding drops the token's text (a special token: BOS, EOS), so it takes no
        room in the returned text."""
        if token.token_id < 0:
            return False
        skipped = self._skips.get(token.token_id)
        if skipped is None:
            skipped = not self._tokenizer.decode([token.token_id])
            self._skips[token.token_id] = skipped
        return skipped

    def count(self, event: ChoiceEvent) -> None:
        """Changes state: the event's choice has streamed its tokens (its usage, once it
        carries one, is the exact count: tokens past a stop string included)."""
        index = event.delta.index
        if event.usage is not None:
            self._num_prompt_tokens = event.usage.prompt_tokens
            self._num_tokens[index] = event.usage.completion_tokens
        else:
            self._num_tokens[index] += len(event.delta.token_ids)

    def chunk_sse(self, event: ChoiceEvent, offsets: list[resp.TextOffsets]) -> bytes:
        """The event's chunk as a server-sent event. A plain text delta (no finish,
        logprobs or schema outcome: most of a stream) fills the choice's chunk template,
        written once per choice, with the JSON string of its text: the same bytes."""
        d = event.delta
        if d.finish_reason is None and d.logprobs is None and event.schema is None:
            template = self._templates.get(d.index, _NO_TEMPLATE)
            if template is _NO_TEMPLATE:
                template = self._templates[d.index] = self._template(d.index)
            if template is not None:
                text = json.dumps(d.text, ensure_ascii=False).encode()
                return template[0] + text + template[1]
        return resp.sse(self._chunk(event, offsets))

    def _template(self, index: int) -> tuple[bytes, bytes] | None:
        """The SSE bytes of choice index's plain chunk before and after its text's JSON
        string (None where the marker text is not found exactly once, or where every chunk
        carries the usage so far)."""
        if self.continuous_usage:
            return None
        event = ChoiceEvent(ChoiceDelta(index, text=_MARKER))
        data = resp.sse(self._plain_chunk(event, self.new_offsets()))
        head, found, tail = data.partition(_MARKER_JSON)
        if not found or _MARKER_JSON in tail:
            return None
        return head, tail

    def _logprobs(self, event: ChoiceEvent) -> list[resp.PositionLogprobs] | None:
        """The choice's logprobs; with echo, the prompt's lead (after `echo_first`)."""
        d = event.delta
        if self.echo_first is None or d.logprobs is None:
            return d.logprobs
        return [*(d.prompt_logprobs or ()), *d.logprobs]

    def _echo_chunk(self, event: ChoiceEvent, offsets: list[resp.TextOffsets]) -> dict[str, Any]:
        index = event.delta.index
        chunk = resp.text_completion_chunk(
            self.response_id,
            self.model_id,
            self.created,
            index,
            self.echo_text,
            logprobs=event.delta.prompt_logprobs or [],
            offsets=offsets[index],
            echo_first=self.echo_first,
        )
        return self._with_usage(chunk, index)

    def _first_chunk(self, index: int) -> dict[str, Any]:
        if self.request.chat:
            chunk = resp.chat_completion_chunk(
                self.response_id, self.model_id, self.created, index, role="assistant", content=""
            )
        else:
            chunk = resp.text_completion_chunk(
                self.response_id, self.model_id, self.created, index, self.echo_text
            )
        return self._with_usage(chunk, index)

    def _chunk(self, event: ChoiceEvent, offsets: list[resp.TextOffsets]) -> dict[str, Any]:
        chunk = self._plain_chunk(event, offsets)
        chunk["choices"][0].update(schema_fields(event.schema))
        return self._with_usage(chunk, event.delta.index)

    def _with_usage(self, chunk: dict[str, Any], index: int) -> dict[str, Any]:
        """With continuous_usage: the chunk with its choice's usage so far, as vLLM sends it."""
        if self.continuous_usage:
            chunk["usage"] = resp.usage_so_far_json(
                self._num_prompt_tokens, self._num_tokens[index]
            )
        return chunk

    def _plain_chunk(self, event: ChoiceEvent, offsets: list[resp.TextOffsets]) -> dict[str, Any]:
        d = event.delta
        if self.request.chat:
            return resp.chat_completion_chunk(
                self.response_id,
                self.model_id,
                self.created,
                d.index,
                content=d.text if d.text or d.finish_reason is None else None,
                finish_reason=d.finish_reason,
                matched_stop=d.matched_stop,
                logprobs=d.logprobs,
            )
        return resp.text_completion_chunk(
            self.response_id,
            self.model_id,
            self.created,
            d.index,
            d.text,
            finish_reason=d.finish_reason,
            matched_stop=d.matched_stop,
            logprobs=d.logprobs,
            offsets=offsets[d.index],
        )


async def _chain(
    first: ChoiceEvent | None, rest: AsyncIterator[ChoiceEvent]
) -> AsyncIterator[ChoiceEvent]:
    if first is not None:
        yield first
        async for event in rest:
            yield event


async def start_http_server(app: web.Application, host: str, port: int) -> web.AppRunner:
    """Listen on host:port. A client that disconnects cancels its handler at once
    (handler_cancellation), so its request is aborted upstream even while no token flows."""
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner


_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_BODY_HEADERS = frozenset({"content-type", "content-length"})
_HTTP_ERROR_CODES = {404: "not_found", 413: "invalid_argument"}
"""An HTTP error's OpenAI `code` where one of the status table's names fits (as Envoy's
own 404 and 413 replies say); any other is the status's reason, e.g. "method_not_allowed"."""


@web.middleware
async def _json_errors(request: web.Request, handler: _Handler) -> web.StreamResponse:
    """An HTTP error the app itself raises (no such route, a method the route does not
    take, ...) answers with OpenAI's error body, as the handlers' own errors do; its
    headers (a 405's Allow) are kept."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _http_error(request, exc)


def _http_error(request: web.Request, exc: web.HTTPException) -> web.Response:
    if isinstance(exc, web.HTTPMethodNotAllowed):
        allowed = ", ".join(sorted(exc.allowed_methods))
        message = f"method {request.method} is not allowed on {request.path}; use {allowed}"
    elif isinstance(exc, web.HTTPNotFound):
        message = f"no such route: {request.method} {request.path}"
    else:
        message = f"{exc.reason.lower()}: {request.method} {request.path}"
    code = _HTTP_ERROR_CODES.get(exc.status, exc.reason.lower().replace(" ", "_"))
    error_type = "invalid_request_error" if exc.status < 500 else "server_error"
    headers = {k: v for k, v in exc.headers.items() if k.lower() not in _BODY_HEADERS}
    return web.Response(
        status=exc.status,
        text=json.dumps(resp.error_body(message, error_type, code=code)),
        content_type="application/json",
        headers=headers,
    )


def _too_large() -> web.Response:
    message = f"request body too large: at most {MAX_BODY_BYTES // (1024 * 1024)} MiB"
    body = resp.error_body(message, "invalid_request_error", code="invalid_argument")
    return web.Response(status=413, text=json.dumps(body), content_type="application/json")


def _error(exc: BaseException) -> web.Response:
    status, body = resp.error_response(exc)
    if status >= 500:
        log.error("request failed", error=repr(exc))
    retry = retry_after_of(str(exc)) if status in (429, 503) else None
    headers = {"Retry-After": str(retry)} if retry is not None else None
    return web.Response(
        status=status, text=json.dumps(body), content_type="application/json", headers=headers
    )
