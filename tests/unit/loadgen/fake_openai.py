"""A fake OpenAI-compatible chat server (aiohttp) with a metrics endpoint, for the bench's tests.

Each request's prompt is its messages' words; the reply streams `reply_words`
one SSE chunk per word, `token_delay_s` apart, then a usage chunk and [DONE].
cached_tokens is the longest word prefix shared with an earlier prompt, and
the same numbers feed radixmesh-named counters on `/metrics`, so the report's
client-side and server-side numbers can be checked against each other.
Every `fail_every`-th request gets HTTP 429; JSON requests are answered with
`VALID_TICKET` except every `bad_json_every`-th, which gets `BAD_TICKET`.
"""

from __future__ import annotations

import asyncio
import json

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

VALID_TICKET = (
    '{"customer": "ann", "category": "billing", "urgency": 2, "refund": false, "tags": ["late"]}'
)
BAD_TICKET = '{"customer": "ann", "category": "pets"}'
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0)


class FakeOpenAI:
    def __init__(
        self,
        reply_words: int = 4,
        token_delay_s: float = 0.0,
        fail_every: int = 0,
        bad_json_every: int = 0,
    ) -> None:
        self.reply_words = reply_words
        self.token_delay_s = token_delay_s
        self.fail_every = fail_every
        self.bad_json_every = bad_json_every
        self.bodies: list[dict] = []
        self.prompts: list[list[str]] = []
        self.num_json = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.registry = CollectorRegistry()
        self.query_tokens = Counter(
            "radixmesh_cache_prefix_query_tokens", "", registry=self.registry
        )
        self.hit_tokens = Counter("radixmesh_cache_prefix_hit_tokens", "", registry=self.registry)
        self.ttft = Histogram(
            "radixmesh_scheduler_time_to_first_token_seconds",
            "",
            buckets=TTFT_BUCKETS,
            registry=self.registry,
        )
        self.running = Gauge(
            "radixmesh_scheduler_running_requests", "", ["executor_id"], registry=self.registry
        )
        self.running.labels("e0").set(0)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/metrics", self._metrics)
        return app

    async def _models(self, _request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake-model"}]})

    async def _metrics(self, _request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry), content_type="text/plain")

    def _cached(self, words: list[str]) -> int:
        best = 0
        for earlier in self.prompts:
            n = 0
            for a, b in zip(earlier, words, strict=False):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        return best

    def _reply(self, body: dict) -> list[str]:
        if "response_format" not in body:
            return [f"w{i} " for i in range(self.reply_words)]
        self.num_json += 1
        bad = self.bad_json_every and self.num_json % self.bad_json_every == 0
        text = BAD_TICKET if bad else VALID_TICKET
        return [text[i : i + 8] for i in range(0, len(text), 8)]

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        if self.fail_every and len(self.bodies) % self.fail_every == 0:
            error = {"error": {"message": "queue full", "type": "rate_limit_error"}}
            return web.json_response(error, status=429)
        words = " ".join(m["content"] for m in body["messages"]).split()
        cached = self._cached(words)
        self.prompts.append(words)
        self.query_tokens.inc(len(words))
        self.hit_tokens.inc(cached)
        pieces = self._reply(body)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.running.labels("e0").set(self.in_flight)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            for i, piece in enumerate(pieces):
                await asyncio.sleep(self.token_delay_s)
                if i == 0:
                    self.ttft.observe(self.token_delay_s)
                chunk = {"choices": [{"index": 0, "delta": {"content": piece}}]}
                await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
            usage = {
                "prompt_tokens": len(words),
                "completion_tokens": len(pieces),
                "prompt_tokens_details": {"cached_tokens": cached},
            }
            # a JSON reply is a whole document (as the grammar ends it); the others run to length
            finish = "stop" if "response_format" in body else "length"
            final = {"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}
            await response.write(f"data: {json.dumps(final)}\n\n".encode())
            await response.write(
                f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode()
            )
            await response.write(b"data: [DONE]\n\n")
        finally:
            self.in_flight -= 1
            self.running.labels("e0").set(self.in_flight)
        await response.write_eof()
        return response
