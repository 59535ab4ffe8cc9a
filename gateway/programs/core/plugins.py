"""Pre/post-processing plugins: `pre_request` rewrites text before it reaches the model,
`post_response` rewrites a result before it reaches the client (e.g. redaction).

A plugin is any object with one or both methods; the chain applies them in order. They
are registered like tools (the `radixmesh.plugins` entry-point group, or a config file)
and apply to programs (every appended text, the returned value) and to plain requests
(prompt and message texts).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway.core.request import ChatMessage, GatewayRequest


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
