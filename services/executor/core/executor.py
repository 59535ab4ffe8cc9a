"""ExecutorCore: the model, the KV pool and per-sequence state; runs one step plan at a time.

A plan first drops finished ids, then admits new sequences, extends the page
tables of running ones, and runs every scheduled token in one forward. A
sequence samples when the step reaches the end of its known tokens; its
sampled token stays on the device for the next decode. The core ends a
sequence itself on EOS, a stop token, max_tokens or the context limit, and
forgets it at once (the scheduler learns it from the result, one step late).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import torch

from kernels import get_ops
from services.common.errors import InvalidArgument, ResourceExhausted
from services.common.sampling import SamplingParams
from services.common.step import (
    NewSequence,
    SequenceOutput,
    StepPlan,
    StepResult,
    TokenLogprobs,
)
from services.executor.core.config import ExecutorConfig
from services.executor.core.cuda_graphs import DecodeGraphs
from services.executor.core.forward_batch import BatchEntry, build_forward_batch
from services.executor.core.kv_pool import KVPool
from services.executor.core.loader import load_weights, read_model_folder
from services.executor.core.models.decoder import Decoder
from services.executor.core.resources import (
    resolve_device,
    resolve_dtype,
    resolve_max_model_len,
    size_num_pages,
)
from services.executor.core.sampling import Sampler, SampleResult
from services.executor.core.sequence import (
    MatcherFactory,
    SequenceState,
    TokenMatcher,
    check_finish,
)


@dataclass(frozen=True, slots=True)
class ModelInfo:
    name: str
    architecture: str
    vocab_size: int
    max_model_len: int
    eos_token_ids: list[int]
    page_size: int
    num_pages: int
    device: str
    """"cpu" or "cuda:N"."""
    dtype: str
    """"float32", "float16" or "bfloat16"."""
    max_num_seqs: int
    max_num_batched_tokens: int


class ExecutorCore:
    """Owns the weights, the KV pool and every running sequence's state; not thread-safe.

    `matcher_factory` turns a request's Constraint into its grammar matcher
    (see `sequence.TokenMatcher`); without one, constrained requests are refused.
    """

    def __init__(self, config: ExecutorConfig, matcher_factory: MatcherFactory | None = None):
        self.config = config
        self.device = resolve_device(config.device)
        folder = read_model_folder(config.model_path)
        spec = folder.spec
        dtype = resolve_dtype(config.dtype, spec.torch_dtype, self.device)
        max_model_len = resolve_max_model_len(config, spec)
        weights = load_weights(folder, dtype, self.device)
        self.model = Decoder(spec, weights, get_ops(self.device), max_model_len)
        use_graphs = config.cuda_graphs and self.device.type == "cuda"
        num_pages = size_num_pages(config, spec, dtype, self.device, int(use_graphs))
        self.kv_pool = KVPool(
            spec.num_layers, num_pages, config.page_size, spec.num_kv_heads, spec.head_dim,
            dtype, self.device, num_scratch_pages=int(use_graphs),
        )  # fmt: skip
        self._graphs: DecodeGraphs | None = None
        if use_graphs:
            self._graphs = DecodeGraphs(
                self.model, self.kv_pool, config.max_num_seqs,
                -(-max_model_len // config.page_size), self.kv_pool.scratch_page_ids[0],
            )  # fmt: skip
            self._graphs.capture()
        self.sampler = Sampler(spec.vocab_size, self.device)
        self.info = ModelInfo(
            name=config.model_name or folder.path.resolve().name,
            architecture=spec.architecture,
            vocab_size=spec.vocab_size,
            max_model_len=max_model_len,
            eos_token_ids=folder.eos_token_ids,
            page_size=config.page_size,
            num_pages=num_pages,
            device=str(self.device),
            dtype=str(dtype).removeprefix("torch."),
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
        )
        self._matcher_factory = matcher_factory
        self._seqs: dict[str, SequenceState] = {}
        self._free_rows = list(range(config.max_num_seqs - 1, -1, -1))
        self._last_tokens = torch.zeros(config.max_num_seqs, dtype=torch.int64, device=self.device)
        self._seed_rng = random.Random(config.seed)

    @property
    def num_seqs(self) -> int:
        return len(self._seqs)

    def has_seq(self, req_id: str) -> bool:
        return req_id in self._seqs

    @torch.inference_mode()
    def step(self, plan: StepPlan) -> StepResult:
        """Runs one plan; a refused plan (InvalidArgument, ResourceExhausted) changes nothing."""
        start = time.perf_counter()
        for req_id in plan.finished_req_ids:
            self._drop(req_id)
        self._validate(plan)
        matchers = self._build_matchers(plan.new_seqs)  # may refuse a constraint: before changes
        scheduled: list[tuple[SequenceState, int]] = []
        for new in plan.new_seqs:
            seq = self._admit(new, matchers.get(new.req_id))
            scheduled.append((seq, new.num_scheduled_tokens))
        for running in plan.running_seqs:
            seq = self._seqs.get(running.req_id)
            if seq is None:
                continue  # it finished here one step earlier
            seq.page_ids.extend(running.appended_page_ids)
            if running.num_scheduled_tokens:
                scheduled.append((seq, running.num_scheduled_tokens))
        outputs = self._run(scheduled) if scheduled else []
        return StepResult(plan.step_id, outputs, time.perf_counter() - start)

    def shutdown(self) -> None:
        self._seqs.clear()
        self._graphs = None
        self.kv_pool.release()

    # -- plan checks -------------------------------------------------------

    def _validate(self, plan: StepPlan) -> None:
        """Raises before any state changes, so a rejected plan leaves the core as it was."""
        if plan.num_scheduled_tokens > self.config.max_num_batched_tokens:
            raise ResourceExhausted(
                f"plan {plan.step_id}: {plan.num_scheduled_tokens} scheduled tokens exceed "
                f"max_num_batched_tokens ({self.config.max_num_batched_tokens})"
            )
        if len(self._seqs) + len(plan.new_seqs) > self.config.max_num_seqs:
            raise ResourceExhausted(
                f"plan {plan.step_id}: {len(self._seqs)} held + {len(plan.new_seqs)} new "
                f"sequences exceed max_num_seqs ({self.config.max_num_seqs})"
            )
        seen: set[str] = set()
        for new in plan.new_seqs:
            if new.req_id in self._seqs or new.req_id in seen:
                raise InvalidArgument(f"new_seqs: req_id {new.req_id!r} is already running")
            seen.add(new.req_id)
            self._check_new(new)
        for running in plan.running_seqs:
            seq = self._seqs.get(running.req_id)
            if seq is not None:
                self._check_span(
                    running.req_id, seq.num_computed_tokens, running.num_scheduled_tokens,
                    len(seq.token_ids), len(seq.page_ids) + len(running.appended_page_ids),
                )  # fmt: skip
                self._check_page_ids(running.req_id, running.appended_page_ids)

    def _check_new(self, new: NewSequence) -> None:
        where = f"new_seqs[{new.req_id!r}]"
        num_tokens = len(new.token_ids)
        if not 1 <= new.num_prompt_tokens <= num_tokens:
            raise InvalidArgument(
                f"{where}.num_prompt_tokens must be in [1, {num_tokens}], got {new.num_prompt_tokens}"
            )
        if num_tokens >= self.info.max_model_len:
            raise InvalidArgument(
                f"{where}.token_ids: {num_tokens} tokens leave no room under max_model_len "
                f"({self.info.max_model_len})"
            )
        if new.num_scheduled_tokens < 1:
            raise InvalidArgument(f"{where}.num_scheduled_tokens must be >= 1")
        vocab = self.info.vocab_size
        if any(not 0 <= t < vocab for t in new.token_ids):
            raise InvalidArgument(f"{where}.token_ids must be in [0, {vocab})")
        if new.constraint is not None and self._matcher_factory is None:
            raise InvalidArgument(f"{where}.constraint: this executor has no grammar backend")
        self._check_span(
            where, new.num_computed_tokens, new.num_scheduled_tokens, num_tokens, len(new.page_ids)
        )
        self._check_page_ids(where, new.page_ids)

    def _check_span(
        self, where: str, num_computed: int, num_scheduled: int, num_known: int, num_pages: int
    ) -> None:
        end = num_computed + num_scheduled
        if num_scheduled < 0 or end > num_known:
            raise InvalidArgument(
                f"{where}: num_computed_tokens ({num_computed}) + num_scheduled_tokens "
                f"({num_scheduled}) exceed the {num_known} known tokens"
            )
        if num_pages * self.config.page_size < end:
            raise InvalidArgument(
                f"{where}.page_ids: {num_pages} pages of {self.config.page_size} cannot hold "
                f"{end} tokens"
            )

    def _check_page_ids(self, where: str, page_ids: list[int]) -> None:
        num_pages = self.kv_pool.num_pages
        if page_ids and any(not 0 <= p < num_pages for p in page_ids):
            raise InvalidArgument(f"{where}.page_ids must be in [0, {num_pages})")

    # -- state ---------------------------------------------------------------

    def _build_matchers(self, new_seqs: list[NewSequence]) -> dict[str, TokenMatcher]:
        matchers: dict[str, TokenMatcher] = {}
        for new in new_seqs:
            if new.constraint is not None and self._matcher_factory is not None:
                matcher = self._matcher_factory(new.constraint)
                matcher.replay(new.token_ids[new.num_prompt_tokens :])  # earlier outputs on resume
                matchers[new.req_id] = matcher
        return matchers

    def _admit(self, new: NewSequence, matcher: TokenMatcher | None) -> SequenceState:
        seed = (
            new.sampling.seed if new.sampling.seed is not None else self._seed_rng.getrandbits(63)
        )
        seq = SequenceState(
            req_id=new.req_id,
            token_ids=list(new.token_ids),
            num_prompt_tokens=new.num_prompt_tokens,
            num_computed_tokens=new.num_computed_tokens,
            page_ids=list(new.page_ids),
            sampling=new.sampling,
            seed=seed,
            row=self._free_rows.pop(),
            matcher=matcher,
        )
        self._seqs[new.req_id] = seq
        return seq

    def _drop(self, req_id: str) -> None:
        seq = self._seqs.pop(req_id, None)
        if seq is not None:
            self._free_rows.append(seq.row)

    # -- compute -------------------------------------------------------------

    def _run(self, scheduled: list[tuple[SequenceState, int]]) -> list[SequenceOutput]:
        entries = []
        for seq, num_tokens in scheduled:
            end = seq.num_computed_tokens + num_tokens
            samples = end == len(seq.token_ids)
            entries.append(
                BatchEntry(
                    num_computed_tokens=seq.num_computed_tokens,
                    token_ids=seq.token_ids[seq.num_computed_tokens : end],
                    page_ids=seq.page_ids,
                    samples=samples,
                    device_row=seq.row if samples and seq.has_device_token else -1,
                )
            )
        batch = build_forward_batch(entries, self.config.page_size, self.device, self._last_tokens)
        if self._graphs is not None and self._graphs.can_run(batch):
            logits = self._graphs.run(batch)
        else:
            logits = self.model.forward(batch, self.kv_pool)
        samplers = [seq for (seq, _), e in zip(scheduled, entries, strict=True) if e.samples]
        sampled = self._sample(samplers, logits) if samplers else {}
        outputs = []
        for seq, num_tokens in scheduled:
            seq.num_computed_tokens += num_tokens
            output = sampled.get(seq.req_id) or SequenceOutput(seq.req_id, None)
            outputs.append(output)
            if output.finish_reason is not None:
                self._drop(seq.req_id)
        return outputs

    def _sample(self, seqs: list[SequenceState], logits: torch.Tensor) -> dict[str, SequenceOutput]:
        # Token histories matter only to penalties: other rows pass empty lists (no copies).
        penalised = [_has_penalties(s.sampling) for s in seqs]
        inputs = self.sampler.prepare(
            [s.sampling for s in seqs],
            [s.seed for s in seqs],
            [s.num_output_tokens for s in seqs],
            [s.prompt_token_ids if p else [] for s, p in zip(seqs, penalised, strict=True)],
            [s.output_token_ids if p else [] for s, p in zip(seqs, penalised, strict=True)],
            self.info.eos_token_ids,
        )
        bitmask = self._bitmask(seqs)
        result = self.sampler.sample(logits, inputs, bitmask)
        rows = torch.tensor([s.row for s in seqs], dtype=torch.int64, device=self.device)
        self._last_tokens[rows] = result.token_ids
        token_ids = result.token_ids.tolist()
        logprobs = _logprobs_by_row(seqs, token_ids, result)
        outputs = {}
        for i, (seq, token_id) in enumerate(zip(seqs, token_ids, strict=True)):
            seq.token_ids.append(token_id)
            seq.has_device_token = True
            if seq.matcher is not None:
                seq.matcher.accept(token_id)
            reason, stop_id = check_finish(
                seq, token_id, self.info.eos_token_ids, self.info.max_model_len
            )
            outputs[seq.req_id] = SequenceOutput(seq.req_id, token_id, logprobs[i], reason, stop_id)
        return outputs

    def _bitmask(self, seqs: list[SequenceState]) -> torch.Tensor | None:
        if all(s.matcher is None for s in seqs):
            return None
        words = (self.info.vocab_size + 31) // 32
        bitmask = torch.full((len(seqs), words), -1, dtype=torch.int32)
        for row, seq in enumerate(seqs):
            if seq.matcher is not None:
                seq.matcher.fill_bitmask(bitmask, row)
        return bitmask.to(self.device, non_blocking=True)


def _has_penalties(params: SamplingParams) -> bool:
    return (
        params.repetition_penalty != 1.0
        or params.frequency_penalty != 0.0
        or params.presence_penalty != 0.0
    )


def _logprobs_by_row(
    seqs: list[SequenceState], token_ids: list[int], result: SampleResult
) -> list[TokenLogprobs | None]:
    wanted = [s.sampling.logprobs or s.sampling.top_logprobs > 0 for s in seqs]
    if not any(wanted) or result.logprobs is None:
        return [None] * len(seqs)
    chosen = result.logprobs.tolist()
    top_ids = result.top_ids.tolist() if result.top_ids is not None else None
    top_lps = result.top_logprobs.tolist() if result.top_logprobs is not None else None
    out: list[TokenLogprobs | None] = []
    for i, seq in enumerate(seqs):
        if not wanted[i]:
            out.append(None)
            continue
        k = seq.sampling.top_logprobs
        top = list(zip(top_ids[i][:k], top_lps[i][:k], strict=True)) if top_ids and top_lps else []
        out.append(TokenLogprobs(token_ids[i], chosen[i], top))
    return out
