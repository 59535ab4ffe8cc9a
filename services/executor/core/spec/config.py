"""Speculative decoding configuration of an executor."""

from __future__ import annotations

from dataclasses import dataclass

from radixmesh.errors import InvalidArgument

SPECULATIVE_METHODS = ("off", "ngram", "suffix", "radix")
JUMP_FORWARD_MODES: dict[str, bool | None] = {"on": True, "off": False, "auto": None}
"""--jump-forward's values and SpeculativeConfig.jump_forward's (auto: by device)."""


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    method: str = "off"
    """"off"; "ngram": prompt lookup over the sequence's own prompt and output;
    "suffix": prompt lookup, else the continuation of the longest match among recent
    outputs of every sequence of this executor; "radix": "suffix" plus the continuations
    of each new sequence's prompt in the cache service's radix tree (every executor's
    finished sequences), looked up once per sequence while it prefills (spec/radix.py)."""
    max_draft_tokens: int = 8
    """Most draft tokens verified per sequence and step (the draft length adapts below it:
    spec/adaptive.py). 8, not 4: on the trained fixture's code editing at batch 1 on a lent
    H100, prompt lookup ran 2.38x of speculation off at 8 and 1.75x at 4 (acceptance
    length 6.6 against 4.7), each against off in the same process (bench/RESULTS.md). A
    sequence whose drafts keep less is expected to keep less (its rolling acceptance; with
    eager verification its drafts are also cut by it: spec/adaptive.py), and where a
    verification of 9 positions a sequence costs more than it saves, the switch declines
    (spec/switch.py)."""
    min_match_len: int = 2
    """Shortest suffix of the context that must recur for a draft to be proposed."""
    max_match_len: int = 5
    """Longest suffix looked up (longer matches are tried first)."""
    max_batch_size: int | None = None
    """Speculation is off in a step with more running decodes than this: a large batch is
    compute-bound and verifying k + 1 positions per sequence costs more than it saves.
    None (the default): measured at start-up on CUDA with graphs (a decode step timed
    against a verification step per batch size, then each step weighed against the
    tokens its drafts are expected to gain: spec/switch.py), `UNMEASURED_MAX_BATCH_SIZE` (8)
    elsewhere.
    A number: that fixed cap, nothing measured."""
    max_suffix_tokens: int = 1 << 18
    """"suffix": tokens of recent outputs the cross-request index keeps (oldest dropped)."""
    max_tree_tokens: int = 256
    """"radix": most tokens of a prompt's continuation read from the cache's tree."""
    jump_forward: bool | None = None
    """Jump-forward: a constrained decode's draft starts with the tokens its grammar forces
    (the only token its mask allows, spec/forced.py), at any batch size, with the method
    off too. The output is the same as without it, in fewer steps. None (auto): on the
    CPU; off on CUDA until its graphed verification is measured faster there than the
    decode steps it saves (the eager one was slower: bench/RESULTS.md, jump-forward on the
    GPU). `on` turns it on anywhere."""
    max_forced_tokens: int = 8
    """Jump-forward: most forced tokens verified per constrained decode and step (the
    scheduler leases pages and takes step budget for this many)."""

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> InvalidArgument:
            return InvalidArgument(f"executor.speculative.{name} {why}")

        if self.method not in SPECULATIVE_METHODS:
            raise bad("method", f"must be one of {', '.join(SPECULATIVE_METHODS)}, got {self.method!r}")
        if not 1 <= self.max_draft_tokens <= 64:
            raise bad("max_draft_tokens", f"must be in [1, 64], got {self.max_draft_tokens}")
        if self.min_match_len < 1:
            raise bad("min_match_len", f"must be >= 1, got {self.min_match_len}")
        if self.max_match_len < self.min_match_len:
            raise bad(
                "max_match_len",
                f"must be >= min_match_len ({self.min_match_len}), got {self.max_match_len}",
            )
        if self.max_batch_size is not None and self.max_batch_size < 1:
            raise bad("max_batch_size", f"must be >= 1, got {self.max_batch_size}")
        if not 1 <= self.max_tree_tokens <= 4096:
            raise bad("max_tree_tokens", f"must be in [1, 4096], got {self.max_tree_tokens}")
        if self.max_suffix_tokens < 1:
            raise bad("max_suffix_tokens", f"must be >= 1, got {self.max_suffix_tokens}")
        if not 1 <= self.max_forced_tokens <= 64:
            raise bad("max_forced_tokens", f"must be in [1, 64], got {self.max_forced_tokens}")

    @property
    def enabled(self) -> bool:
        return self.method != "off"

    def jump_forward_on(self, device_type: str) -> bool:
        """Whether jump-forward runs on a device of this type (resolving auto)."""
        return self.jump_forward if self.jump_forward is not None else device_type != "cuda"
