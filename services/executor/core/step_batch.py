"""A prepared step's batch: the host arrays of any plan's step, and the later steps of a
multi-step decode plan prepared from the step before.

`prepare_batch` builds a step's batch from its sequences and their scheduled
tokens (the plan's, plus any drafts to verify) and advances their planned state.
Step s >= 1 of a plan of k decode steps (`ExecutorCore.prepare_next`) runs the
sequences step s - 1 ran, less those ended, stopped or at their max_tokens or
context limit by their planned state: the same decodes as
`plan_checks.next_decodes` gives, without a plan rebuilt per step. Every one of
them decodes the token the step before samples, so its batch needs no host
token and every row samples; the sampling inputs of such a batch are kept
across its steps while it does not change (step_sampling.py).
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import numpy as np
import torch

from services.executor.core.forward_batch import PageTables, build_batch, build_decode_batch
from services.executor.core.prompt_scoring import plan_scoring
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
    prepared.seqs = prepared.samplers = seqs
    prepared.sampler_rows = list(range(n))
    output_lens = prepared.output_lens = [s.num_known_tokens - s.num_prompt_tokens for s in seqs]
    complete = True  # each token history is on the host (the steps before all executed)
    for seq in seqs:
        seq.num_computed_tokens += 1
        seq.num_known_tokens += 1
        complete = complete and len(seq.token_ids) + 1 == seq.num_known_tokens
    if complete or not any(s.sampling.has_penalties for s in seqs):
        prepared.sampling_inputs = sampler.inputs(seqs, output_lens)


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
    if any(s.sampling.prompt_logprobs_start is not None for s in seqs):
        score_only = np.fromiter((s.sampling.score_only for s in seqs), dtype=bool, count=n)
        ends = samples & score_only  # max_tokens 0: the prompt's end samples nothing
        prepared.scored_to_end = [seqs[i] for i in np.flatnonzero(ends).tolist()]
        samples &= ~ends
        prepared.scoring = plan_scoring(seqs, starts.tolist(), num_tokens, device)
    from_device = samples & on_device  # then q_len is 1: the decode of the last sample
    if num_logits is not None:
        from_device &= num_logits == 1
    if from_device.all():
        token_ids = np.zeros(n, dtype=np.int64)
    else:
        token_ids = np.fromiter(
            itertools.chain.from_iterable(
                (0,) if d else s.token_ids[c : c + q] + (drafts[i] if drafts else [])
                for i, (s, c, q, d) in enumerate(
                    zip(seqs, starts.tolist(), num_tokens, from_device.tolist(), strict=True)
                )
            ),
            dtype=np.int64,
            count=int(q_lens.sum()),
        )
    prepared.batch = build_batch(
        rows, starts, q_lens, samples, from_device, token_ids,
        page_tables, page_size, device, num_logits,
    )  # fmt: skip
    prepared.seqs = seqs
    sample_idx = np.flatnonzero(samples).tolist()
    prepared.samplers = [seqs[i] for i in sample_idx]
    sampler_rows = np.full(n, -1, dtype=np.int64)
    sampler_rows[samples] = np.arange(len(sample_idx))
    prepared.sampler_rows = sampler_rows.tolist()
    prepared.output_lens = [
        seqs[i].num_known_tokens - seqs[i].num_prompt_tokens for i in sample_idx
    ]
    if drafts is not None:
        prepared.drafts = [drafts[i] for i in sample_idx]
        start_verifying(seqs, drafts)
    for seq, q in zip(seqs, num_tokens, strict=True):
        seq.num_computed_tokens += q
    for seq in prepared.samplers:
        seq.num_known_tokens += 1
        seq.has_device_token = True
    if drafts is not None:
        return  # sampling inputs cover every verified row: built at execute time
    if all(
        len(s.token_ids) + 1 == s.num_known_tokens or not s.sampling.has_penalties
        for s in prepared.samplers
    ):  # penalties read token histories: complete unless a step before is unexecuted
        prepared.sampling_inputs = sampler.inputs(prepared.samplers, prepared.output_lens)
