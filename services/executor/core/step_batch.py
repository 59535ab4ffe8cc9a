"""A prepared step's batch: the host arrays of any plan's step, and the later steps of a
multi-step decode plan prepared from the step before.

`prepare_batch` builds a step's batch from its sequences and their scheduled
tokens (the plan's, plus any drafts to verify) and advances their planned state.
Step s >= 1 of a plan of k decode steps (`ExecutorCore.prepare_next`) runs the
sequences step s - 1 ran, less those ended, stopped or at their max_tokens or
context limit by their planned state: the same decodes as
`plan_checks.next_decodes` gives, without a plan rebuilt per step. Every one of
them decodes the token the step before samples, so its batch needs no host
token and every row samples.

Either way the samplers' sampling parameters are gathered from the table kept per
buffer row (`StepSampler.columns`), by array indexing: nothing per sequence is rebuilt
for a batch whose membership changed, and only the rows whose tokens are on the host
(prefills, extends) are copied one by one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from services.executor.core.forward_batch import (
    PageTables,
    build_batch,
    build_decode_batch,
    build_verify_batch,
)
from services.executor.core.prompt_scoring import plan_scoring
from services.executor.core.sampling_columns import PENALTIES, SCORES_PROMPT, SamplingColumns
from services.executor.core.sequence import SequenceState
from services.executor.core.spec.step import drafted_lengths, start_verifying
from services.executor.core.step_sampling import StepSampler

if TYPE_CHECKING:
    from services.executor.core.step_types import PreparedStep


def next_step_seqs(before: list[SequenceState], max_model_len: int) -> list[SequenceState]:
    """The decodes of a multi-step plan's next step, from those of the step before."""
    going = []
    for seq in before:  # plan_checks.steps_left(seq) > 0, inline: once per row and step
        known = seq.num_known_tokens
        max_tokens = seq.sampling.max_tokens
        if seq.finished or seq.stopped or known >= max_model_len:
            continue
        if max_tokens is None or known - seq.num_prompt_tokens < max_tokens:
            going.append(seq)
    return going


def prepare_decodes(
    prepared: PreparedStep,
    seqs: list[SequenceState],
    page_tables: PageTables,
    page_size: int,
    device: torch.device,
    sampler: StepSampler,
) -> None:
    """The batch, samplers and planned state of a step in which every sequence decodes the
    token sampled for it in the step before (so it is on the device at its row)."""
    n = len(seqs)
    rows = np.fromiter((s.row for s in seqs), dtype=np.int64, count=n)
    starts = np.fromiter((s.num_computed_tokens for s in seqs), dtype=np.int64, count=n)
    prepared.batch = build_decode_batch(rows, starts, page_tables, page_size, device)
    _every_row_samples(prepared, seqs, sampler.columns(rows))
    for seq in seqs:
        seq.num_computed_tokens += 1
        seq.num_known_tokens += 1
    _prepare_inputs(prepared, prepared.output_lens, sampler)


def _every_row_samples(
    prepared: PreparedStep, seqs: list[SequenceState], columns: SamplingColumns
) -> None:
    """Every one of `seqs` samples, in order, with the parameters `columns` holds; their
    output lengths are read before the step advances them."""
    prepared.seqs = prepared.samplers = seqs
    prepared.sampler_rows = list(range(len(seqs)))
    prepared.sampling_columns = columns
    prepared.output_lens = [s.num_known_tokens - s.num_prompt_tokens for s in seqs]


def _advance(
    seqs: list[SequenceState], num_tokens: Sequence[int], samplers: list[SequenceState]
) -> None:
    """The planned state after the step: each sequence has computed its tokens (a
    draft's too, which `start_verifying` took out and the verification adds back as it
    keeps them), and each sampler knows one more token, on the device."""
    for seq, q in zip(seqs, num_tokens, strict=True):
        seq.num_computed_tokens += q
    for seq in samplers:
        seq.num_known_tokens += 1
        seq.has_device_token = True


def prepare_batch(
    prepared: PreparedStep,
    seqs: list[SequenceState],
    num_tokens: list[int],
    drafts: list[list[int]] | None,
    page_tables: PageTables,
    page_size: int,
    device: torch.device,
    sampler: StepSampler,
) -> None:
    """The batch, samplers and planned state of a step running `num_tokens` of each of
    `seqs`. `drafts`: per sequence, draft tokens to verify after its decoded token (their
    positions join the batch; their state advances when the step executes)."""
    if drafts is not None and prepare_verify(
        prepared, seqs, num_tokens, drafts, page_tables, page_size, device, sampler
    ):
        return
    n = len(seqs)
    planned = np.array(num_tokens, dtype=np.int64)  # the plan's tokens, without drafts
    num_logits = None
    if drafts is not None:  # a drafted decode runs its last token from the host
        num_tokens, num_logits = drafted_lengths(num_tokens, drafts)
    rows = np.fromiter((s.row for s in seqs), dtype=np.int64, count=n)
    starts = np.fromiter((s.num_computed_tokens for s in seqs), dtype=np.int64, count=n)
    known = np.fromiter((s.num_known_tokens for s in seqs), dtype=np.int64, count=n)
    on_device = np.fromiter((s.has_device_token for s in seqs), dtype=bool, count=n)
    q_lens = np.array(num_tokens, dtype=np.int64)
    samples = starts + planned == known
    columns = sampler.columns(rows)
    if columns.present & SCORES_PROMPT:
        score_only = np.fromiter((s.sampling.score_only for s in seqs), dtype=bool, count=n)
        ends = samples & score_only  # max_tokens 0: the prompt's end samples nothing
        prepared.scored_to_end = [seqs[i] for i in np.flatnonzero(ends).tolist()]
        samples &= ~ends
        prepared.scoring = plan_scoring(seqs, starts.tolist(), num_tokens, device)
    from_device = samples & on_device  # then q_len is 1: the decode of the last sample
    if num_logits is not None:
        from_device &= num_logits == 1
    token_ids = np.zeros(int(q_lens.sum()), dtype=np.int64)
    offsets = np.cumsum(q_lens) - q_lens
    for i in np.flatnonzero(~from_device).tolist():  # the rows whose tokens are on the host
        seq, start, end = seqs[i], int(starts[i]), int(offsets[i])
        host = seq.token_ids[start : start + num_tokens[i]] + (drafts[i] if drafts else [])
        token_ids[end : end + len(host)] = host
    prepared.batch = build_batch(
        rows, starts, q_lens, samples, from_device, token_ids,
        page_tables, page_size, device, num_logits,
    )  # fmt: skip
    prepared.seqs = seqs
    sample_idx: Sequence[int]
    every_row_samples = bool(samples.all())
    if every_row_samples:
        prepared.samplers, prepared.sampler_rows = seqs, list(range(n))
        sample_idx = range(n)
    else:
        sample_idx = np.flatnonzero(samples).tolist()
        prepared.samplers = [seqs[i] for i in sample_idx]
        sampler_rows = np.full(n, -1, dtype=np.int64)
        sampler_rows[samples] = np.arange(len(sample_idx))
        prepared.sampler_rows = sampler_rows.tolist()
        columns = columns.take(samples)
    prepared.sampling_columns = columns
    output_lens = (known if every_row_samples else known[samples]) - columns.num_prompt_tokens
    prepared.output_lens = output_lens.tolist()
    if drafts is not None:
        prepared.drafts = [drafts[i] for i in sample_idx]
        start_verifying(seqs, drafts)
    _advance(seqs, num_tokens, prepared.samplers)
    if drafts is None:  # a drafted step's inputs cover every verified row: built at execute
        _prepare_inputs(prepared, output_lens, sampler)


def prepare_verify(
    prepared: PreparedStep,
    seqs: list[SequenceState],
    num_tokens: list[int],
    drafts: list[list[int]],
    page_tables: PageTables,
    page_size: int,
    device: torch.device,
    sampler: StepSampler,
) -> bool:
    """`prepare_batch` of a drafted step whose every sequence decodes (one planned token,
    the last known one, then its draft), from a Python pass over its rows
    (`build_verify_batch`); False, with nothing changed, for any other step. A drafted
    decode runs its last token from the host; one without a draft reads it from the
    device where it was sampled there. Its sampling inputs cover every verified row:
    built at execute."""
    host_tokens: list[list[int] | None] = []
    for seq, q, draft in zip(seqs, num_tokens, drafts, strict=True):
        start = seq.num_computed_tokens
        if q != 1 or start + 1 != seq.num_known_tokens:  # not a decode: it may not sample
            return False
        if draft or not seq.has_device_token:
            host_tokens.append(seq.token_ids[start : start + 1] + draft)
        else:
            host_tokens.append(None)
    rows = [seq.row for seq in seqs]
    columns = sampler.columns(np.array(rows, dtype=np.int64))
    if columns.present & SCORES_PROMPT:  # (a drafted step scores nothing: drafting.py)
        return False
    starts = [seq.num_computed_tokens for seq in seqs]
    prepared.batch = build_verify_batch(rows, starts, host_tokens, page_tables, page_size, device)
    _every_row_samples(prepared, seqs, columns)
    prepared.drafts = list(drafts)
    start_verifying(seqs, drafts)
    _advance(seqs, [1 + len(draft) for draft in drafts], seqs)
    return True


def _prepare_inputs(
    prepared: PreparedStep, output_lens: Sequence[int] | np.ndarray, sampler: StepSampler
) -> None:
    """The samplers' inputs. Penalties read token histories: a penalised row whose
    history lacks the token of the step before (prepared ahead, that step not finished) has
    that token added on the device when this step samples (`StepSampler.inputs`'
    `pending`), where it is by then; one lacking more (not a plain step before) leaves the
    inputs to be built at execute."""
    samplers, columns = prepared.samplers, prepared.sampling_columns
    assert columns is not None
    pending = []
    if columns.present & PENALTIES:
        for i in np.flatnonzero(columns.flags & PENALTIES).tolist():
            missing = samplers[i].num_known_tokens - 1 - len(samplers[i].token_ids)
            if missing == 1:
                pending.append(i)
            elif missing:
                return
    prepared.sampling_inputs = sampler.inputs(samplers, output_lens, columns, pending=pending)
