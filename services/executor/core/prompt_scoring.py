"""Prompt log probabilities: the logits at prompt positions of a prefill or extend.

A sequence whose sampling asks for `prompt_logprobs_start` k scores every prompt
token at positions >= k: the log probability of token p given tokens [0, p) is
row p - 1 of the logits, so the rows p - 1 for p in [k, num_prompt_tokens) that a
step runs are gathered from the final hidden states. Only those rows go through
the LM head and a log_softmax, in chunks, so a long prompt never materialises a
[num_tokens, vocab] tensor. Decodes never score (their rows are past the prompt),
so decode batches, CUDA graphs included, are untouched.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from radixmesh.step import TokenLogprobs
from services.executor.core.sequence import SequenceState

SCORE_CHUNK_ROWS = 1024
"""Rows per LM-head + log_softmax pass (bounds the float32 [rows, vocab] buffer)."""


@dataclass(slots=True)
class ScoredSpan:
    seq: SequenceState
    first_position: int
    """Prompt position of the first scored token of this step."""
    num_rows: int
    top_logprobs: int


@dataclass(slots=True)
class PromptScoring:
    """What a step scores: flat batch rows, the token each row predicts, per-sequence spans."""

    rows: torch.Tensor
    """[R] int64 rows of the batch's tokens whose logits score the next prompt token."""
    targets: torch.Tensor
    """[R] int64: the prompt token at each row's position + 1."""
    spans: list[ScoredSpan]
    """In row order; span i covers the next num_rows rows."""


def plan_scoring(
    seqs: Sequence[SequenceState],
    starts: Sequence[int],
    num_tokens: Sequence[int],
    device: torch.device,
) -> PromptScoring | None:
    """The rows of this step that score prompt tokens; None when no sequence scores any.

    `starts` are the sequences' num_computed_tokens before the step, `num_tokens`
    the tokens each runs, in batch order (the flat batch is their concatenation).
    """
    rows: list[np.ndarray] = []
    targets: list[int] = []
    spans: list[ScoredSpan] = []
    offset = 0
    for seq, start, q in zip(seqs, starts, num_tokens, strict=True):
        k = seq.sampling.prompt_logprobs_start
        if k is not None:
            first = max(start, k - 1)
            end = min(start + q, seq.num_prompt_tokens - 1)
            if end > first:
                rows.append(np.arange(offset + first - start, offset + end - start))
                targets += seq.token_ids[first + 1 : end + 1]
                spans.append(ScoredSpan(seq, first + 1, end - first, seq.sampling.top_logprobs))
        offset += q
    if not spans:
        return None
    return PromptScoring(
        rows=torch.from_numpy(np.concatenate(rows)).to(device),
        targets=torch.tensor(targets, dtype=torch.int64, device=device),
        spans=spans,
    )


def score(
    hidden: torch.Tensor,
    lm_head: Callable[[torch.Tensor], torch.Tensor],
    scoring: PromptScoring,
    chunk_rows: int = SCORE_CHUNK_ROWS,
) -> list[list[TokenLogprobs]]:
    """Per span, the scored tokens' log probabilities (with top alternatives when asked).

    `hidden` is [R, hidden] (the final-norm hidden states at `scoring.rows`);
    `lm_head` maps hidden rows to float32 logits.
    """
    max_top = max(span.top_logprobs for span in scoring.spans)
    chosen_parts, top_id_parts, top_lp_parts = [], [], []
    for lo in range(0, hidden.shape[0], chunk_rows):
        logprobs = torch.log_softmax(lm_head(hidden[lo : lo + chunk_rows]), dim=-1)
        targets = scoring.targets[lo : lo + chunk_rows]
        chosen_parts.append(logprobs.gather(1, targets[:, None]).squeeze(1))
        if max_top:
            best = logprobs.topk(max_top, dim=-1)
            top_lp_parts.append(best.values)
            top_id_parts.append(best.indices)
    chosen = torch.cat(chosen_parts).tolist()
    target_ids = scoring.targets.tolist()
    top_ids = torch.cat(top_id_parts).tolist() if max_top else None
    top_lps = torch.cat(top_lp_parts).tolist() if max_top else None
    out: list[list[TokenLogprobs]] = []
    row = 0
    for span in scoring.spans:
        k = span.top_logprobs
        entries = []
        for i in range(row, row + span.num_rows):
            top = (
                list(zip(top_ids[i][:k], top_lps[i][:k], strict=True))
                if k and top_ids is not None and top_lps is not None
                else []
            )
            entries.append(TokenLogprobs(target_ids[i], chosen[i], top))
        out.append(entries)
        row += span.num_rows
    return out
