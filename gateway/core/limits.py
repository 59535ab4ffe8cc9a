"""The edge never blocks: size bounds checked before any work, large work off the event loop.

- An input longer than `MAX_CHARS_PER_TOKEN` characters per token of the model's context
  can never fit it: refused (INVALID_ARGUMENT naming the field) before tokenizing.
- Decoding a large body and tokenizing or templating a long input run in a worker thread
  (`off_loop`), so other requests on the gateway's event loop keep flowing meanwhile.
- A body that nests deeper than Python's parser can follow, or holds a lone UTF-16
  surrogate (valid JSON, not valid Unicode text), is refused naming the problem.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any, TypeVar

from gateway.core.request import GenerateInput
from radixmesh.errors import InvalidArgument

T = TypeVar("T")

MAX_CHARS_PER_TOKEN = 32
"""No tokenizer packs more characters than this into one token of ordinary text."""
OFF_LOOP_CHARS = 16 * 1024
"""Inputs with more characters are tokenized in a worker thread."""
OFF_LOOP_BODY_BYTES = 256 * 1024
"""Bodies larger than this are decoded in a worker thread."""


def input_chars(given: GenerateInput) -> int:
    """Characters of text the tokenizer would read (0 for token ids)."""
    if given.prompt is not None:
        return len(given.prompt)
    if given.messages is not None:
        return sum(len(m.content or "") for m in given.messages)
    return 0


def check_input_size(given: GenerateInput, max_model_len: int) -> None:
    """Raise InvalidArgument when the input's text cannot fit the model's context."""
    limit = max_model_len * MAX_CHARS_PER_TOKEN
    num_chars = input_chars(given)
    if num_chars > limit:
        field = "messages" if given.messages is not None else "prompt"
        raise InvalidArgument(
            f"{field}: {num_chars} characters cannot fit the model's {max_model_len}-token "
            f"context (at most {limit} characters are read)"
        )


async def off_loop(large: bool, fn: Callable[..., T], *args: Any) -> T:
    """fn(*args), in a worker thread when `large` (the event loop keeps serving)."""
    if large:
        return await asyncio.to_thread(fn, *args)
    return fn(*args)


def check_unicode(body: Any) -> None:
    """Raise InvalidArgument when a decoded JSON value holds a lone surrogate."""
    try:
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = exc.object[exc.start : exc.end]
        raise InvalidArgument(
            f"request body holds {bad!r}, a lone UTF-16 surrogate: not valid Unicode text"
        ) from None
