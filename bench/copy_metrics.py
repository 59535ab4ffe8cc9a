"""How well a model's greedy edit copies the function it was asked to edit: the shared
prefix of two token lists, whether an output is the function with one name renamed, and
the steps prompt-lookup speculation would take to decode it (bench/train_tiny.py's record)."""

from __future__ import annotations

import re

WORD = re.compile(r"\w+|\s+|[^\w\s]")


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def is_edit(output: str, body: str) -> bool:
    """Whether `output` is `body` with at most one name renamed, wherever it stands."""
    before, after = WORD.findall(body), WORD.findall(output)
    if len(before) != len(after):
        return False
    changed = {(a, b) for a, b in zip(before, after, strict=True) if a != b}
    if len(changed) > 1:
        return False
    return all(old.isidentifier() and new.isidentifier() and old not in after for old, new in changed)


def lookup_steps(prompt: list[int], output: list[int]) -> int:
    """Steps that decode `output` after `prompt` if every step verifies a prompt-lookup draft
    (the ngram mode's defaults, services' SpeculativeConfig): a step keeps the draft's
    tokens up to its first wrong one, and one token more."""
    from services.executor.core.spec import PromptLookup, SpeculativeConfig

    config = SpeculativeConfig(method="ngram")
    lookup = PromptLookup(config.min_match_len, config.max_match_len)
    steps = done = 0
    while done < len(output):
        draft = lookup.propose(prompt + output[:done], config.max_draft_tokens).token_ids
        kept = common_prefix(draft, output[done:])
        done, steps = done + kept + 1, steps + 1
    return steps
