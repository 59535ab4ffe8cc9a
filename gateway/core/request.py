"""Requests as the gateway core sees them, after the HTTP or gRPC layer has parsed them."""

from __future__ import annotations

from dataclasses import dataclass

from radixmesh.sampling import Constraint, Priority, SamplingParams

CHAT_ROLES = frozenset({"system", "user", "assistant", "tool"})


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: str
    """One of CHAT_ROLES."""
    content: str


@dataclass(frozen=True, slots=True)
class GenerateInput:
    """Exactly one of prompt (raw text), token_ids or messages (chat-templated) is set."""

    prompt: str | None = None
    token_ids: tuple[int, ...] | None = None
    messages: tuple[ChatMessage, ...] | None = None


@dataclass(frozen=True, slots=True)
class GatewayRequest:
    """One validated request of /v1/completions or /v1/chat/completions."""

    model: str
    """The requested model name; empty selects the default model."""
    input: GenerateInput
    sampling: SamplingParams
    constraint: Constraint | None = None
    priority: Priority = Priority.INTERACTIVE
    stream: bool = False
    include_usage: bool = False
    """stream_options.include_usage: one last chunk carries the usage."""
    continuous_usage: bool = False
    """stream_options.continuous_usage_stats (with include_usage): every chunk also
    carries its choice's usage so far, as vLLM sends it."""
    user: str = ""
    chat: bool = False
    """True for chat.completion shapes, False for text_completion."""
    echo: bool = False
    """Completions only: the prompt text is prepended to each choice."""
    session_id: str = ""
    """Conversation id: the session's tokens so far come before this request's input."""
