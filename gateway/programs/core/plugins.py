"""Pre/post-processing plugins: `pre_request` rewrites text before it reaches the model,
`post_response` rewrites a result before it reaches the client (e.g. redaction).

A plugin is any object with one or more of these methods; the chain applies them in order:

    pre_request(text) -> text          every prompt, message and appended program text
    post_response(value) -> value      a plain request's whole output text (a str), a
                                       program's returned value (any JSON value)
    post_response_stream() -> stream   optional: a per-choice object with push(text) -> text
                                       and flush() -> text, for streamed outputs

They are registered like tools (the `radixmesh.plugins` entry-point group, or a config
file) and apply to programs and to plain requests alike. A streamed plain response goes
through every plugin's `post_response_stream` when each plugin with a `post_response` has
one (the stream holds back what it may still change, like a stop-string matcher);
otherwise the gateway holds the choice's whole text and sends it, rewritten by
`post_response`, with the choice's last chunk. Either way the client never receives text a
plugin would have removed, and while any `post_response` plugin is installed the output's
token ids and logprobs are withheld (they would spell the text before the rewrite).
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.core.generate import ChoiceEvent
from gateway.core.output import ChoiceDelta
from gateway.core.request import ChatMessage, GatewayRequest
from radixmesh.errors import InvalidArgument


class TextStream(Protocol):
    """One choice's streamed output through one plugin."""

    def push(self, text: str) -> str:
        """Take the next piece of text; return what is safe to send now."""
        ...

    def flush(self) -> str:
        """The choice ended: return the rest."""
        ...


@dataclass(frozen=True, slots=True)
class PluginChain:
    plugins: Sequence[Any] = ()

    def pre_request(self, text: str) -> str:
        for plugin in self.plugins:
            hook = getattr(plugin, "pre_request", None)
            if hook is not None:
                text = hook(text)
        return text

    def post_response(self, value: Any) -> Any:
        for plugin in self.plugins:
            hook = getattr(plugin, "post_response", None)
            if hook is not None:
                value = hook(value)
        return value

    @property
    def rewrites_responses(self) -> bool:
        return any(hasattr(p, "post_response") for p in self.plugins)

    def text_streams(self) -> list[TextStream] | None:
        """One choice's streams through every post_response plugin, in order; None when one
        of them cannot stream (its output must then be rewritten whole)."""
        posts = [p for p in self.plugins if hasattr(p, "post_response")]
        if not all(hasattr(p, "post_response_stream") for p in posts):
            return None
        return [p.post_response_stream() for p in posts]

    def apply_to_events(
        self, events: AsyncGenerator[ChoiceEvent, None], streamed: bool
    ) -> AsyncGenerator[ChoiceEvent, None]:
        """A plain request's choice events with post_response applied: whole texts (not
        streamed, or a plugin that cannot stream: each choice's text comes with its last
        event), else through the plugins' text streams. Without post_response plugins the
        events pass unchanged."""
        if not self.rewrites_responses:
            return events
        return self._rewritten(events, streamed)

    async def _rewritten(
        self, events: AsyncGenerator[ChoiceEvent, None], streamed: bool
    ) -> AsyncGenerator[ChoiceEvent, None]:
        choices: dict[int, _ChoiceRewrite] = {}
        async with contextlib.aclosing(events):
            async for event in events:
                d = event.delta
                choice = choices.get(d.index)
                if choice is None:
                    choice = choices[d.index] = _ChoiceRewrite(self.text_streams() if streamed else None)
                out = choice.rewrite(self, event)
                if out is not None:
                    yield out

    def apply_to_request(self, request: GatewayRequest) -> GatewayRequest:
        """A plain request with pre_request applied to its prompt text and every message's
        content (token ids pass unchanged)."""
        if not self.plugins:
            return request
        given = request.input
        if given.prompt is not None:
            given = dataclasses.replace(given, prompt=self.pre_request(given.prompt))
        elif given.messages is not None:
            messages = tuple(ChatMessage(m.role, self.pre_request(m.content)) for m in given.messages)
            given = dataclasses.replace(given, messages=messages)
        return dataclasses.replace(request, input=given)


@dataclass(slots=True)
class _ChoiceRewrite:
    streams: list[TextStream] | None
    """None: hold the whole text and rewrite it at the choice's end."""
    held: list[str] = field(default_factory=list)
    prompt_logprobs: Any = None

    def rewrite(self, chain: PluginChain, event: ChoiceEvent) -> ChoiceEvent | None:
        d = event.delta
        if d.prompt_logprobs is not None:
            self.prompt_logprobs = d.prompt_logprobs
        last = d.finish_reason is not None
        if self.streams is None:
            self.held.append(d.text)
            if not last:
                return None
            text = chain.post_response("".join(self.held))
        else:
            text = d.text
            for stream in self.streams:
                text = stream.push(text) + (stream.flush() if last else "")
            if not text and not last and d.prompt_logprobs is None:
                return None
        delta = ChoiceDelta(
            d.index,
            text=text,
            finish_reason=d.finish_reason,
            matched_stop=d.matched_stop,
            abort_upstream=d.abort_upstream,
            prompt_logprobs=self.prompt_logprobs if last or self.streams is not None else None,
        )
        if self.streams is not None:
            self.prompt_logprobs = None  # sent with this event
        return ChoiceEvent(delta, event.usage, event.schema)


class RegexRedaction:
    """A redaction plugin: every match of the patterns becomes `replacement`, in plain
    outputs and program results (strings inside JSON values too).

    Streamed, it holds back the last `max_match_chars` characters of text (and any match
    that reaches into them), so the streamed text equals the whole text redacted whenever
    no match is longer than that; a longer one is still redacted, in pieces.

        {"plugins": ["mypkg.plugins:REDACT"]}   with REDACT = RegexRedaction([r"\\d{3}-\\d{4}"])
    """

    def __init__(
        self, patterns: Sequence[str], replacement: str = "[redacted]", max_match_chars: int = 64
    ) -> None:
        if not patterns:
            raise InvalidArgument("RegexRedaction.patterns: give at least one pattern")
        if max_match_chars < 1:
            raise InvalidArgument(f"RegexRedaction.max_match_chars: must be >= 1, got {max_match_chars}")
        try:
            self.pattern = re.compile("|".join(f"(?:{p})" for p in patterns))
        except re.error as exc:
            raise InvalidArgument(f"RegexRedaction.patterns: {exc}") from None
        self.replacement = replacement
        self.max_match_chars = max_match_chars

    def redact(self, text: str) -> str:
        return self.pattern.sub(self.replacement, text)

    def post_response(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, list):
            return [self.post_response(v) for v in value]
        if isinstance(value, dict):
            return {k: self.post_response(v) for k, v in value.items()}
        return value

    def post_response_stream(self) -> TextStream:
        return _RedactionStream(self)


@dataclass(slots=True)
class _RedactionStream:
    redaction: RegexRedaction
    pending: str = ""

    def push(self, text: str) -> str:
        self.pending += text
        cut = len(self.pending) - self.redaction.max_match_chars
        if cut <= 0:
            return ""
        for match in self.redaction.pattern.finditer(self.pending):
            if match.start() >= cut:
                break
            if match.end() > cut:  # a match reaching past the cut: keep all of it back
                cut = match.start()
                break
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return self.redaction.redact(out)

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return self.redaction.redact(out)
