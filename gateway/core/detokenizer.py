"""Incremental detokenization of one choice's output tokens.

Decoding token by token breaks in two ways: a multi-byte UTF-8 character
(emoji, CJK) may be split across byte-level BPE tokens, and some tokenizers
(SentencePiece) drop or add a leading space depending on what precedes a
token. So each step decodes a short window twice, with and without the new
tokens, and emits the difference, keeping back text that still ends in an
incomplete character (U+FFFD). The window starts a few tokens before the last
emitted position and moves forward as text is emitted, so the cost per token is
constant, not proportional to the output's length.

The window is two offsets into the tokens held (the scheme of vLLM's
incremental detokenizer): tokens before `read_offset` have had their text
emitted and are decoded only as left context, from `prefix_offset` on; the text
of a step is what the decode from `prefix_offset` to the end adds past the
decode of the context alone. That difference is right only when the context
ends on a character boundary. The prompt's last token can end inside a
character (a token-id prompt, or a byte-level split right at the boundary):
its dangling bytes decode to U+FFFD alone, and joined to the output's leading
continuation bytes they decode to one real character, so the difference would
drop the output's first bytes. So the prompt's tokens that leave an incomplete
character at the context's end are not taken as context: the output's first
bytes are then decoded as its own, exactly as `decode(output_ids)` decodes
them. The window's context taken from the output always ends on a boundary,
since text is emitted (and the window moved) only when it does not end in
U+FFFD.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

REPLACEMENT = "\ufffd"
# Prompt tokens kept as left context, so the first output token decodes as it would mid-text.
NUM_CONTEXT_TOKENS = 5

Decode = Callable[[Sequence[int]], str]


class IncrementalDetokenizer:
    """Turns a choice's stream of token ids into a stream of complete UTF-8 text.

    `decode` maps token ids to text (special tokens skipped), e.g. `Tokenizer.decode`.
    """

    __slots__ = ("_decode", "_prefix_offset", "_read_offset", "_tokens")

    def __init__(self, decode: Decode, prompt_token_ids: Sequence[int] = ()) -> None:
        self._decode = decode
        self._tokens: list[int] = _prompt_context(decode, prompt_token_ids)
        # tokens[prefix_offset:read_offset] is context already emitted;
        # tokens[read_offset:] is not yet emitted.
        self._prefix_offset = 0
        self._read_offset = len(self._tokens)

    def push(self, token_ids: Sequence[int]) -> str:
        """Add new tokens; returns the text that became complete (possibly empty)."""
        if not token_ids:
            return ""
        self._tokens.extend(token_ids)
        prefix_text = self._decode(self._tokens[self._prefix_offset : self._read_offset])
        full_text = self._decode(self._tokens[self._prefix_offset :])
        if full_text.endswith(REPLACEMENT):
            return ""  # an incomplete character: wait for its next bytes
        new_text = full_text[len(prefix_text) :]
        self._advance()
        return new_text

    def flush(self) -> str:
        """At the end of the choice: the text still held back (with U+FFFD for broken bytes)."""
        prefix_text = self._decode(self._tokens[self._prefix_offset : self._read_offset])
        full_text = self._decode(self._tokens[self._prefix_offset :])
        self._advance()
        return full_text[len(prefix_text) :]

    @property
    def num_pending_tokens(self) -> int:
        """Tokens received whose text has not been emitted yet."""
        return len(self._tokens) - self._read_offset

    def _advance(self) -> None:
        # The last emitted tokens become the next window's left context; drop the rest.
        del self._tokens[: max(0, len(self._tokens) - NUM_CONTEXT_TOKENS)]
        self._prefix_offset = 0
        self._read_offset = len(self._tokens)


def _prompt_context(decode: Decode, prompt_token_ids: Sequence[int]) -> list[int]:
    """The prompt's last tokens, less any at its end that leave a character incomplete."""
    context = list(prompt_token_ids[-NUM_CONTEXT_TOKENS:])
    while context and decode(context).endswith(REPLACEMENT):
        context.pop()
    return context
