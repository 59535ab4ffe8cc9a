"""Clients that send one chat request and time it: OpenAI HTTP (SSE) and radixmesh.v1 gRPC.

Both take a `ChatRequest` and return a `RequestResult` with the client-side
times (first content, every content chunk, end) and the server-reported usage.
A failure is a result too (`ok=False`, `status` says why: `http_429`,
`RESOURCE_EXHAUSTED`, `timeout`, `connection_error`, ...); nothing raises.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlparse

from mesh.loadgen.workloads import schema_text


@dataclass(frozen=True, slots=True)
class ChatRequest:
    messages: tuple[dict[str, str], ...]
    max_tokens: int
    json_schema: dict[str, Any] | None = None
    priority: str = "interactive"
    session_id: str = ""
    """Sent as the `session_id` body field (OpenAI) or GenerateRequest.session_id (gRPC)."""
    ignore_eos: bool = False
    """Ask the server to generate max_tokens (a radixmesh/vLLM extension; off for OpenAI itself)."""
    temperature: float | None = None


@dataclass(slots=True)
class RequestResult:
    start_s: float
    """Send time, seconds on the run's clock (time.perf_counter)."""
    ok: bool = False
    status: str = "ok"
    error: str = ""
    ttft_s: float | None = None
    """First content chunk after send (None when none came)."""
    e2e_s: float = 0.0
    chunk_times_s: list[float] = field(default_factory=list)
    """Arrival of each content chunk, seconds after send."""
    text: str = ""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    finish_reason: str = ""
    # Filled by the load loop:
    script_id: int = -1
    turn_index: int = 0
    group: str = ""
    priority: str = "interactive"
    is_json: bool = False
    json_valid: bool | None = None
    """Output parsed and validated against the schema (None for unconstrained requests)."""
    held_s: float = 0.0
    """At an offered rate: how long after its Poisson arrival time the load loop sent the
    request when every concurrency slot was busy then (0 otherwise: a late client loop is
    not the server's wait). Its TTFT and e2e start at the send, so they leave this out;
    goodput counts it (the user would have waited)."""

    def mark_chunk(self, now: float, text: str, has_tokens: bool = False) -> None:
        """A chunk arrived: it counts when it carries text (or token ids, on gRPC, where a
        chunk that ends inside a UTF-8 character has ids but no text yet)."""
        if not text and not has_tokens:
            return
        elapsed = now - self.start_s
        if self.ttft_s is None:
            self.ttft_s = elapsed
        self.chunk_times_s.append(elapsed)
        self.text += text

    def fail(self, status: str, error: str) -> None:
        self.ok, self.status, self.error = False, status, error[:300]


class Client(Protocol):
    async def send(self, request: ChatRequest) -> RequestResult: ...

    async def close(self) -> None: ...


class OpenAIClient:
    """POST /v1/chat/completions with stream=true; usage from the final chunk (include_usage)."""

    def __init__(
        self, target: str, model: str, api_key: str = "", timeout_s: float = 600.0
    ) -> None:
        import aiohttp

        self._url = target.rstrip("/") + "/v1/chat/completions"
        self._model = model
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._session = aiohttp.ClientSession(
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=timeout_s),
            connector=aiohttp.TCPConnector(limit=0),
        )

    def body(self, request: ChatRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self._model,
            "messages": list(request.messages),
            "max_tokens": request.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.priority != "interactive":
            body["priority"] = request.priority
        if request.session_id:
            body["session_id"] = request.session_id
        if request.ignore_eos:
            body["ignore_eos"] = True
        if request.temperature is not None:
            body["temperature"] = request.temperature
        if request.json_schema is not None:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "ticket", "schema": request.json_schema, "strict": True},
            }
        return body

    async def send(self, request: ChatRequest) -> RequestResult:
        import aiohttp

        result = RequestResult(start_s=time.perf_counter())
        try:
            async with self._session.post(self._url, json=self.body(request)) as response:
                if response.status != 200:
                    result.fail(f"http_{response.status}", await response.text())
                else:
                    await self._read_events(response, result)
        except TimeoutError:
            result.fail("timeout", "no answer within the client timeout")
        except aiohttp.ClientError as exc:
            result.fail("connection_error", repr(exc))
        except ValueError as exc:  # an event that is not JSON
            result.fail("bad_response", repr(exc))
        result.e2e_s = time.perf_counter() - result.start_s
        return result

    async def _read_events(self, response: Any, result: RequestResult) -> None:
        done = False
        async for raw in response.content:
            line = raw.decode("utf-8").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                break
            event = json.loads(data)
            if "error" in event:
                error = event["error"]
                result.fail(f"stream_{error.get('type', 'error')}", error.get("message", ""))
                return
            now = time.perf_counter()
            for choice in event.get("choices") or ():
                delta = choice.get("delta") or {}
                result.mark_chunk(now, delta.get("content") or choice.get("text") or "")
                result.finish_reason = choice.get("finish_reason") or result.finish_reason
            usage = event.get("usage")
            if usage:
                result.prompt_tokens = usage.get("prompt_tokens")
                result.completion_tokens = usage.get("completion_tokens")
                details = usage.get("prompt_tokens_details") or {}
                result.cached_tokens = details.get("cached_tokens")
        if done:
            result.ok, result.status = True, "ok"
        else:
            result.fail("incomplete_stream", "the stream ended without [DONE]")

    async def close(self) -> None:
        await self._session.close()


class GrpcClient:
    """radixmesh.v1.Inference/Generate (server streaming) on host:port."""

    def __init__(
        self, target: str, model: str, api_key: str = "", timeout_s: float = 600.0
    ) -> None:
        import grpc

        from radixmesh.v1 import inference_pb2_grpc

        parsed = urlparse(target if "://" in target else f"grpc://{target}")
        self._channel = grpc.aio.insecure_channel(parsed.netloc)
        self._stub = inference_pb2_grpc.InferenceStub(self._channel)
        self._model = model
        self._metadata = (("authorization", f"Bearer {api_key}"),) if api_key else ()
        self._timeout_s = timeout_s

    def message(self, request: ChatRequest) -> Any:
        from radixmesh import wire
        from radixmesh.sampling import Priority
        from radixmesh.v1 import inference_pb2 as pb

        sampling = pb.SamplingParams(max_tokens=request.max_tokens)
        if request.ignore_eos:
            sampling.ignore_eos = True
        if request.temperature is not None:
            sampling.temperature = request.temperature
        message = pb.GenerateRequest(
            model=self._model,
            messages=pb.ChatMessages(
                messages=[
                    pb.ChatMessage(role=m["role"], content=m["content"]) for m in request.messages
                ]
            ),
            sampling=sampling,
            priority=wire.priority_to_proto(Priority[request.priority.upper()]),
            session_id=request.session_id,
        )
        if request.json_schema is not None:
            message.json_schema = schema_text(request.json_schema)
        return message

    async def send(self, request: ChatRequest) -> RequestResult:
        import grpc

        result = RequestResult(start_s=time.perf_counter())
        call = self._stub.Generate(
            self.message(request), metadata=self._metadata, timeout=self._timeout_s
        )
        try:
            async for response in call:
                if response.HasField("chunk"):
                    chunk = response.chunk
                    result.mark_chunk(time.perf_counter(), chunk.text, bool(chunk.token_ids))
                elif response.HasField("complete"):
                    complete = response.complete
                    result.finish_reason = complete.finish_reason
                    result.prompt_tokens = complete.usage.prompt_tokens
                    result.completion_tokens = complete.usage.completion_tokens
                    result.cached_tokens = complete.usage.cached_tokens
            result.ok, result.status = True, "ok"
        except grpc.aio.AioRpcError as exc:
            result.fail(exc.code().name, exc.details() or "")
        except asyncio.CancelledError:
            call.cancel()
            raise
        result.e2e_s = time.perf_counter() - result.start_s
        return result

    async def close(self) -> None:
        await self._channel.close()


APIS: dict[str, Callable[[str, str, str], Client]] = {
    "openai": OpenAIClient,
    "grpc": GrpcClient,
}


def make_client(api: str, target: str, model: str, api_key: str = "") -> Client:
    return APIS[api](target, model, api_key)
