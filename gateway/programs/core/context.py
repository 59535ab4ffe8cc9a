"""A program's context: one growing token sequence (and its text), held by the scheduler.

The tokens are those of the model the last statement ran on; a statement on a model
with another tokenizer re-encodes the text once. Chat roles are written with the
markers the model's chat template puts around a message of that role.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.core.request import ChatMessage
from gateway.core.tokenizer import Tokenizer
from gateway.programs.core.model import RolePart
from radixmesh.errors import FailedPrecondition

_SENTINEL = "\u2063RADIXMESH\u2063"
# What comes before a message of each role when the markers are read off the template.
_BEFORE = {"system": (), "user": (("system", "s"),), "assistant": (("system", "s"), ("user", "u"))}


@dataclass(frozen=True, slots=True)
class RoleMarkers:
    begin: str
    end: str


@functools.lru_cache(maxsize=64)
def _markers(tokenizer: Tokenizer, role: str) -> RoleMarkers:
    if not tokenizer.has_chat_template:
        raise FailedPrecondition(f"model {tokenizer.name!r} has no chat template for role {role!r}")
    before = [ChatMessage(r, c) for r, c in _BEFORE[role]]
    try:
        head = tokenizer.render_template(before, False) if before else ""
        full = tokenizer.render_template([*before, ChatMessage(role, _SENTINEL)], False)
    except Exception:  # a template that wants another order: read the role on its own
        head, full = "", tokenizer.render_template([ChatMessage(role, _SENTINEL)], False)
    if not full.startswith(head) or _SENTINEL not in full:
        head, full = "", tokenizer.render_template([ChatMessage(role, _SENTINEL)], False)
    begin, end = full[len(head) :].split(_SENTINEL, 1)
    bos = tokenizer.bos_text
    if bos and begin.startswith(bos):
        begin = begin[len(bos) :]
    return RoleMarkers(begin, end)


def role_text(tokenizer: Tokenizer, role: str, part: RolePart, text: str) -> str:
    if not role:
        return text
    markers = _markers(tokenizer, role)
    begin = markers.begin if part in (RolePart.WHOLE, RolePart.BEGIN) else ""
    end = markers.end if part in (RolePart.WHOLE, RolePart.END) else ""
    return begin + text + end


def start_tokens(tokenizer: Tokenizer) -> list[int]:
    """What the tokenizer puts before a prompt (e.g. BOS)."""
    with_special = tokenizer.encode_prompt("a")
    plain = tokenizer.encode_text("a")
    return with_special[: len(with_special) - len(plain)] if with_special[-len(plain) :] == plain else []


class Context:
    def __init__(self, hold_id: str, model: str, tokenizer: Tokenizer) -> None:
        self.hold_id = hold_id
        self.model = model
        self.tokenizer = tokenizer
        self.text = ""
        self.tokens: list[int] = start_tokens(tokenizer)

    def fork(self, hold_id: str) -> Context:
        child = Context.__new__(Context)
        child.hold_id, child.model, child.tokenizer = hold_id, self.model, self.tokenizer
        child.text, child.tokens = self.text, list(self.tokens)
        return child

    def on_model(self, model: str, tokenizer: Tokenizer) -> list[int]:
        """The context's tokens for model (re-encoded when its tokenizer differs)."""
        if tokenizer is not self.tokenizer:
            self.tokens = start_tokens(tokenizer) + (tokenizer.encode_text(self.text) if self.text else [])
            self.tokenizer = tokenizer
        self.model = model
        return self.tokens

    def append_text(self, text: str) -> None:
        self.text += text
        self.tokens += self.tokenizer.encode_text(text)

    def append_tokens(self, token_ids: Sequence[int], text: str) -> None:
        """Generated tokens (their text already known)."""
        self.text += text
        self.tokens += token_ids

    def continue_at(self, keep: int, token_ids: Sequence[int], text: str) -> None:
        """Text tokenized with the context's end (a select's choice): the first `keep`
        tokens stay and token_ids replace the rest (they spell the rest's text, then text)."""
        if not 0 <= keep <= len(self.tokens):
            raise ValueError(f"keep {keep} is outside the context's {len(self.tokens)} tokens")
        self.text += text
        del self.tokens[keep:]
        self.tokens += token_ids
