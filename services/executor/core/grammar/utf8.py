"""Valid UTF-8 under every constraint: the one byte sequence the grammar library lets through.

xgrammar matches text byte by byte and refuses overlong forms, stray continuation bytes
and code points past U+10FFFF, but accepts the three-byte forms of the UTF-16 surrogates
U+D800-U+DFFF (0xED followed by 0xA0-0xBF), which UTF-8 forbids (RFC 3629). A byte-level
vocabulary has a token per raw byte, so a sampled string can spell one: Python decodes it
as three U+FFFD and a JSON Schema maxLength that the grammar counted as one character is
broken. `Utf8Guard` closes that hole per tokenizer:

- a token whose own bytes hold a surrogate is banned outright (added to the constraint's
  banned tokens);
- after a token ending in the lead byte 0xED, tokens starting with 0xA0-0xBF are masked
  off and refused (`after_lead_mask`), so the next byte is 0x80-0x9F (U+D000-U+D7FF).

A matcher knows its state from its last accepted token, so rollback and replay need
nothing more.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from services.executor.core.grammar.compiler import banned_token_mask

SURROGATE_LEAD = 0xED
SURROGATE_SECOND = range(0xA0, 0xC0)
"""After 0xED, these second bytes encode U+D800-U+DFFF."""


@dataclass(frozen=True, slots=True, eq=False)
class Utf8Guard:
    """The surrogate hole of one vocabulary; `build` makes it, None when it has none."""

    surrogate_token_ids: frozenset[int]
    """Tokens whose bytes spell a surrogate by themselves: never allowed."""
    lead_token_ids: frozenset[int]
    """Tokens ending in 0xED: the next token must not start with 0xA0-0xBF."""
    after_lead_token_ids: frozenset[int]
    """Tokens starting with 0xA0-0xBF: refused right after a lead token."""
    after_lead_mask: torch.Tensor = field(repr=False)
    """int32 [ceil(V/32)] allowing every token but `after_lead_token_ids`."""

    @classmethod
    def build(cls, decoded_vocab: Sequence[bytes], vocab_size: int) -> Utf8Guard | None:
        """From the tokenizer's bytes per token id (xgrammar's `decoded_vocab`)."""
        surrogate, lead, after = set(), set(), set()
        pair_seconds = bytes(SURROGATE_SECOND)
        for token_id, text in enumerate(decoded_vocab[:vocab_size]):
            if not text:
                continue
            if text[0] in SURROGATE_SECOND:
                after.add(token_id)
            if text[-1] == SURROGATE_LEAD:
                lead.add(token_id)
            at = text.find(SURROGATE_LEAD)
            while 0 <= at < len(text) - 1:
                if text[at + 1] in pair_seconds:
                    surrogate.add(token_id)
                    break
                at = text.find(SURROGATE_LEAD, at + 1)
        lead -= surrogate
        if not surrogate and not (lead and after):
            return None
        return cls(
            frozenset(surrogate),
            frozenset(lead),
            frozenset(after),
            banned_token_mask(vocab_size, after),
        )

    def follows_lead(self, token_ids: Sequence[int]) -> bool:
        """Whether the next token comes right after a lead byte 0xED."""
        return bool(token_ids) and token_ids[-1] in self.lead_token_ids

    def refuses(self, token_ids: Sequence[int], token_id: int) -> bool:
        """Whether token_id, after token_ids, would complete a surrogate."""
        return token_id in self.after_lead_token_ids and self.follows_lead(token_ids)
