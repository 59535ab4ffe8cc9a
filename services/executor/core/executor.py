"""ExecutorCore: the model, the KV pool and per-sequence state; runs step plans.

A plan first drops finished ids, then admits new sequences, extends the page
tables of running ones, and runs every scheduled token in one forward. A
sequence samples when the step reaches the end of its known tokens; its
sampled token stays on the device for the next decode. The core ends a
sequence itself on EOS, a stop token, max_tokens or the context limit (and on
a token its grammar refuses, with "abort"), and forgets it at once (the
scheduler learns it from the result, one step late).

A step is split in two, so that the host work of step N + 1 can run while
step N is on the device: `prepare(plan)` (checks, state updates known from
the plan alone, host arrays, their upload) and `execute(prepared)` (forward,
sampling, finish detection). `step(plan)` is `execute(prepare(plan))`.
`execute` is itself `finish(launch(prepared))`: for a plain step (`plain`: no
grammar, drafts, scoring, page copies or log probabilities, its sampling inputs
prepared) `launch` only queues the device work (forward, sample, the sampled
ids' copy to the host) and `finish` waits for that copy and detects the
finishes, so a pipeline can queue step N + 1 on the device before it reads
step N's tokens back (`pipeline.py`, launch-ahead).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterable

import torch

from radixmesh.errors import FailedPrecondition, InvalidArgument
from radixmesh.step import (
    NewSequence,
    SequenceOutput,
    StepPlan,
    StepResult,
    TokenLogprobs,
)
from services.common.logging import get_logger
from services.executor.core.config import ExecutorConfig
from services.executor.core.forward_batch import PageTables
from services.executor.core.grammar import UNCONSTRAINED, Grammar, SequenceGrammar, StepGrammar
from services.executor.core.grammar.step import PendingMasks, Unconstrained
from services.executor.core.graph_setup import (
    speculation_switches,
)
from services.executor.core.models.tensor_parallel import (
    SINGLE,
    TensorParallel,
)
from services.executor.core.page_copy import copy_slots, step_copies, upload
from services.executor.core.plan_checks import PlanLimits, next_decodes, validate_plan
from services.executor.core.prompt_scoring import score
from services.executor.core.resources import (
    describe_executor,
    resolve_device,
)
from services.executor.core.sampling import Sampler
from services.executor.core.sequence import SequenceState, check_finish
from services.executor.core.spec import Proposer, SpecStats, make_proposer
from services.executor.core.spec.drafting import (
    NO_DRAFTS,
    DeclinedSteps,
    DraftChoice,
    DraftLimits,
    check_not_verifying,
    choose_drafting,
)
from services.executor.core.spec.forced import ForcedTokens
from services.executor.core.spec.step import (
    StepClock,
    record_gains,
    rows_over_drafts,
    step_drafts,
)
from services.executor.core.spec.verifier import Verifier
from services.executor.core.startup import load_model
from services.executor.core.step_batch import next_step_seqs, prepare_batch, prepare_decodes
from services.executor.core.step_forward import StepForward
from services.executor.core.step_sampling import StepSampler
from services.executor.core.step_types import LaunchedStep, PreparedStep, is_plain

log = get_logger(__name__)


class ExecutorCore:
    """Owns the weights, the KV pool and every running sequence's state.

    One thread may call `prepare` while another calls `execute` (see `prepare`);
    other calls are not thread-safe.

    `grammar` gives each constrained request its matcher (see `grammar.Grammar`);
    without one, constrained requests are refused.
    """

    def __init__(
        self, config: ExecutorConfig, grammar: Grammar | None = None, tp: TensorParallel = SINGLE
    ):
        """`tp`: this process's rank of its tensor-parallel group (every rank builds a core
        and runs the same plans; see core/tensor_parallel.py)."""
        self.config = config
        self.device = resolve_device(config.device)
        if tp.world_size != config.tensor_parallel_size:
            raise InvalidArgument(
                f"executor.tensor_parallel_size is {config.tensor_parallel_size} but the core "
                f"was given a group of {tp.world_size} ranks"
            )
        self.tp = tp
        loaded = load_model(config, grammar is not None, tp, self.device)
        folder, spec, dtype = loaded.folder, loaded.spec, loaded.dtype
        max_model_len, num_pages, captured = loaded.max_model_len, loaded.num_pages, loaded.graphs
        forced_cap = loaded.forced_cap
        self.startup_seconds = loaded.startup_seconds
        """Startup phases and their wall times (see `startup.LoadedModel`)."""
        self.model, self.kv_pool = loaded.model, loaded.kv_pool
        self.forward = StepForward(self.model, self.kv_pool)
        """The forward a step runs: a captured graph set's, or the eager one."""
        if captured:
            self.forward.decode, self.forward.verify = captured.decode, captured.verify
            self.forward.extend = captured.extend
        self.graph_bytes = (captured.estimated_bytes, captured.measured_bytes) if captured else None
        """With CUDA graphs: (estimated, measured) bytes of device memory they hold."""
        switches = speculation_switches(
            config, captured, forced_cap, tp, self.device, self.startup_seconds
        )
        self.spec_switch, self.forced_switch = switches.proposer, switches.forced
        """Whether a step's decodes draft; whether it verifies forced runs (None: always)."""
        self.sampler = Sampler(
            spec.vocab_size, self.device, apply_bitmask=self.model.ops.apply_bitmask
        )
        self.sampler.warmup()  # its compiled draw, before any request
        self.info = describe_executor(
            config, folder, spec, max_model_len, num_pages, self.device, dtype, grammar is not None,
            self.spec_switch.max_batch_size,
        )  # fmt: skip
        self._proposer = make_proposer(config.speculative)
        self._forced = (
            ForcedTokens(spec.vocab_size, self.info.max_forced_tokens)
            if self.info.max_forced_tokens
            else None
        )
        """Jump-forward: the runs constrained decodes' grammars force (None: off)."""
        self.spec_stats = SpecStats()
        """Speculative decoding counters of every step executed (read by tests and bench)."""
        self._limits = PlanLimits(
            config.max_num_batched_tokens, config.max_num_seqs, max_model_len, spec.vocab_size,
            config.page_size, num_pages, has_grammar=grammar is not None,
        )  # fmt: skip
        self._draft_limits = DraftLimits(
            self.spec_switch.max_batch_size, config.page_size, max_model_len,
            config.max_num_batched_tokens,
        )  # fmt: skip
        self._lock = threading.Lock()
        """Guards held sequences, free rows and the step counters between prepare and execute."""
        self._num_prepared = 0
        self._num_executed = 0
        self._step_clock = StepClock()  # times decode steps for the switches
        self._declined = DeclinedSteps()  # the proposer's switch's answer after each step
        self._seqs: dict[str, SequenceState] = {}
        self._drafting: tuple[StepPlan, DraftChoice] | None = None
        """The plan `drafting` was asked about last and its answer, for its prepare."""
        self._decodes: tuple[int, list[SequenceState]] | None = None
        """The plan prepared last and the sequences its step ran (a multi-step plan's next
        step runs those still going: step_batch.py)."""
        self._page_tables = PageTables(config.max_num_seqs, -(-max_model_len // config.page_size))
        self._free_rows = list(range(config.max_num_seqs - 1, -1, -1))
        self._last_tokens = torch.zeros(config.max_num_seqs, dtype=torch.int64, device=self.device)
        self._seed_rng = random.Random(config.seed)
        self._step_sampler = StepSampler(self.sampler, self._last_tokens, self.info.eos_token_ids)
        self._grammar = StepGrammar(
            grammar, config.max_num_seqs, spec.vocab_size, self.device, folder.eos_token_ids
        )
        self._verifier = Verifier(
            self.sampler, self._grammar, self._last_tokens, self.spec_stats,
            self.info.eos_token_ids, self.info.max_model_len,
        )  # fmt: skip

    @property
    def num_seqs(self) -> int:
        return len(self._seqs)

    def has_seq(self, req_id: str) -> bool:
        return req_id in self._seqs

    @property
    def proposer(self) -> Proposer | None:
        """The draft proposer (None with speculation off); `--speculative radix` feeds its
        tree references from the event loop (spec/radix.py)."""
        return self._proposer

    def step(self, plan: StepPlan) -> StepResult:
        """Runs one plan; a refused plan (InvalidArgument, ResourceExhausted) changes nothing."""
        return self.execute(self.prepare(plan, self.drafting(plan)))

    def stop(self, req_ids: list[str]) -> None:
        """The scheduler aborted these sequences: the steps of a multi-step plan not yet
        prepared skip them (any thread; the plan naming them in abort_req_ids drops them)."""
        with self._lock:
            for req_id in req_ids:
                seq = self._seqs.get(req_id)
                if seq is not None:
                    seq.stopped = True

    def drafting(self, plan: StepPlan, substep: int = 0) -> DraftChoice:
        """What the plan's step `substep` may draft (drafting.choose_drafting), for
        `prepare(plan, drafting=...)`; a later step of a multi-step plan drafts nothing.
        Call it once per step (it counts jump-forward's switch decision), on the prepare
        thread: a step that may draft is prepared only once the step before executed."""
        if substep or (self._proposer is None and self._forced is None):
            if substep and self._proposer is not None:
                self.spec_switch.note_undrafted(len(plan.running_seqs))
            choice = NO_DRAFTS
        else:
            with self._lock:
                choice = choose_drafting(
                    self._proposer is not None, self._forced is not None, plan, self._seqs,
                    self._draft_limits, self.spec_switch, self.forced_switch,
                )  # fmt: skip
        self._drafting = (plan, choice)
        return choice

    def prepare_next(self, plan: StepPlan, substep: int) -> PreparedStep:
        """Step `substep` (>= 1) of a multi-step plan (`plan.num_steps`), prepared after
        step `substep` - 1 under the same contract as `prepare`: each of the plan's running
        sequences decodes one more token, except those ended, stopped (`stop`) or at
        their max_tokens or context limit by their planned state; nothing is dropped or
        admitted, and the plan's first step checked the pages."""
        return self._prepare(plan, substep)

    def prepare(self, plan: StepPlan, drafting: DraftChoice | None = None) -> PreparedStep:
        """Everything of a step that does not need the results of steps not yet executed
        (the plan's first step; `prepare_next` the later ones of a multi-step plan).
        `drafting`: what the step may draft; None: what `drafting(plan)` answered last for
        this plan object, else decided here.

        Contract:
        - Prepared steps are executed in the order prepared, each once. Step N + 1
          may be prepared before step N is executed, and (on another thread) while
          step N executes; prepare calls do not overlap each other, nor do execute calls.
        - Drops plan.finished_req_ids, checks the plan (raising InvalidArgument or
          ResourceExhausted leaves the core as it was, the drops aside), admits new
          sequences, appends pages, advances each scheduled sequence's planned
          state (num_computed_tokens, num_known_tokens) and uploads the batch.
        - A dropped sequence still runs, with its output, in steps prepared before.
        - Decode inputs need no sampled values: the last token stays on the device
          and is read when the step executes. A running id the core does not hold
          is skipped; one that an earlier step ends at execute time (EOS, stop,
          length) is skipped by `execute` (its rows run and are discarded).
        - Sampling inputs are built here unless a penalised row's token history
          lacks more than the one token of the step before (that one is added on
          the device when the step samples); the grammar bitmask is always built at
          execute time (it follows the tokens sampled before).
        """
        if drafting is None and self._drafting is not None and self._drafting[0] is plan:
            drafting = self._drafting[1]
        self._drafting = None
        return self._prepare(plan, 0, drafting)

    @torch.inference_mode()
    def _prepare(
        self, plan: StepPlan, substep: int, drafting: DraftChoice | None = NO_DRAFTS
    ) -> PreparedStep:
        start = time.perf_counter()
        with self._lock:
            before = self._decodes
            if substep and before is not None and before[0] == plan.step_id:
                prepared = PreparedStep(plan.step_id, self._num_prepared, substep=substep)
                self._num_prepared += 1
                decodes = next_step_seqs(before[1], self.info.max_model_len)
                if decodes:
                    prepare_decodes(
                        prepared, decodes, self._page_tables, self.config.page_size, self.device,
                        self._step_sampler,
                    )  # fmt: skip
                self._decodes = (plan.step_id, decodes)
                prepared.plain = is_plain(prepared)
                prepared.prepare_seconds = time.perf_counter() - start
                return prepared
            if substep:
                plan = next_decodes(plan, self._seqs, self.info.max_model_len)
            else:
                for req_id in (*plan.finished_req_ids, *plan.abort_req_ids):
                    self._drop(req_id)
                validate_plan(plan, self._seqs, self._limits)
                if self._proposer is not None or self._forced is not None:  # else none verifies
                    check_not_verifying(plan, self._seqs)
            copies = step_copies(plan.new_seqs, self.kv_pool, self.device)  # checks too
            grammars = self._admit_grammars(plan.new_seqs)  # may refuse: before changes
            seqs: list[SequenceState] = []
            num_tokens: list[int] = []
            allowed: list[int] = []
            for new in plan.new_seqs:
                seqs.append(self._admit(new, grammars.get(new.req_id)))
                num_tokens.append(new.num_scheduled_tokens)
                allowed.append(0)
            for running in plan.running_seqs:
                seq = self._seqs.get(running.req_id)
                if seq is None:
                    continue  # it finished here in a step executed earlier
                if running.appended_page_ids:
                    self._page_tables.write(seq.row, seq.num_pages, running.appended_page_ids)
                    seq.num_pages += len(running.appended_page_ids)
                if running.num_scheduled_tokens:
                    seqs.append(seq)
                    num_tokens.append(running.num_scheduled_tokens)
                    allowed.append(running.num_draft_tokens)
            prepared = PreparedStep(plan.step_id, self._num_prepared, substep=substep)
            prepared.copies, prepared.offered = copies, any(allowed)
            all_executed = self._num_executed == self._num_prepared
            drafts = step_drafts(
                self._proposer, all_executed, seqs, num_tokens, allowed, self._draft_limits,
                self._forced, self.spec_switch, self.forced_switch, drafting,
            )  # fmt: skip
            self._num_prepared += 1
            if seqs:
                prepare_batch(
                    prepared, seqs, num_tokens, drafts, self._page_tables, self.config.page_size,
                    self.device, self._step_sampler,
                )  # fmt: skip
            self._decodes = (plan.step_id, prepared.seqs)
        prepared.plain = is_plain(prepared)
        prepared.prepare_seconds = time.perf_counter() - start
        return prepared

    def execute(self, prepared: PreparedStep) -> StepResult:
        """Runs a prepared step: forward, grammar masks, sampling, finish detection
        (`finish(launch(prepared))`).

        Beside the forward (on a worker thread on CPU, on this thread while the device
        computes with CUDA; see grammar/step.py) each constrained sequence's grammar
        accepts the token it sampled last, then its bitmask row is filled.
        step_seconds in the result is this call's time plus the prepare's. If it
        raises, the state of the step's sequences is undefined: drop them.
        """
        return self.finish(self.launch(prepared))

    def verifies(self, prepared: PreparedStep) -> bool:
        """The step verifies drafts (the proposer's or forced runs): the steps after it
        continue from the tokens it keeps, so they are prepared once it has executed."""
        return prepared.drafts is not None

    def plain(self, prepared: PreparedStep) -> bool:
        """The step may be launched before the steps prepared ahead of it are finished
        (`PreparedStep.plain`, decided at prepare)."""
        return prepared.plain

    @torch.inference_mode()
    def launch(self, prepared: PreparedStep) -> LaunchedStep:
        """Queues a plain step's device work (forward, sample, the ids' copy to the host)
        and returns without waiting for it; any other step runs whole here. Steps launch
        in the order prepared, each once; `finish` them in the same order."""
        start = time.perf_counter()
        if not prepared.plain:
            return LaunchedStep(prepared, start, result=self._execute_whole(prepared, start))
        self._count_executed(prepared)
        batch, inputs = prepared.batch, prepared.sampling_inputs
        assert batch is not None and inputs is not None
        batch.load_device_tokens(self._last_tokens)
        logits = self.forward(batch)
        if not prepared.samplers:  # prefill chunks only: nothing to sample
            return LaunchedStep(prepared, start)
        assert batch.sample_rows is not None
        live = [not s.finished for s in prepared.samplers]
        token_ids = self._step_sampler.draw(inputs, batch.sample_rows, logits, live).token_ids
        if token_ids.device.type != "cuda":
            return LaunchedStep(prepared, start, token_ids=token_ids)
        host = torch.empty(token_ids.shape, dtype=token_ids.dtype, pin_memory=True)
        host.copy_(token_ids, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        return LaunchedStep(prepared, start, token_ids=host, ready=ready)

    @torch.inference_mode()
    def finish(self, launched: LaunchedStep) -> StepResult:
        """The launched step's result: waits for its sampled ids (not for steps launched
        after it), appends them and detects the finishes. A sequence that a step finished
        since this one was launched is skipped (its row ran and is discarded)."""
        if launched.result is not None:
            return launched.result
        if launched.ready is not None:
            launched.ready.synchronize()
        token_ids = [] if launched.token_ids is None else launched.token_ids.tolist()
        prepared = launched.prepared
        outputs: list[SequenceOutput] = []
        with self._lock:
            for seq, row in zip(prepared.seqs, prepared.sampler_rows, strict=True):
                if seq.finished:
                    continue
                if row < 0:
                    outputs.append(SequenceOutput(seq.req_id, None))
                else:
                    outputs.append(self._finish_sample(seq, token_ids[row], None))
        return self._result(prepared, outputs, launched.start)

    def _count_executed(self, prepared: PreparedStep) -> None:
        with self._lock:
            if prepared.index < self._num_executed:
                raise FailedPrecondition(
                    f"step {prepared.step_id}: prepared steps run once, in the order prepared"
                )
            self._num_executed = prepared.index + 1

    def _execute_whole(self, prepared: PreparedStep, start: float) -> StepResult:
        """Any step, from its forward to its result (`execute` before the split)."""
        self._count_executed(prepared)
        batch = prepared.batch
        outputs: list[SequenceOutput] = []
        if prepared.copies is not None:  # each layer copies after its KV writes (page_copy.py)
            if batch is None:
                copy_slots((*self.kv_pool.k_caches, *self.kv_pool.v_caches), prepared.copies)
            else:
                batch.slot_copies = upload(prepared.copies, self.device)
        if batch is not None:
            batch.load_device_tokens(self._last_tokens)
            samplers = prepared.samplers
            grammars = [None if s.finished else s.grammar for s in samplers]
            pending: PendingMasks | Unconstrained = UNCONSTRAINED  # no live constrained row
            if any(g is not None for g in grammars):  # the grammar on a draft's first row
                rows, lens = rows_over_drafts(grammars, prepared.output_lens, prepared.drafts)
                pending = self._grammar.start(rows, lens)
            scoring, scored = prepared.scoring, {}
            if scoring is not None:  # an extend that scores prompt tokens: no decode graph
                logits, hidden = self.forward.scored(batch, scoring.rows)
                entries = score(hidden, self.model.lm_head, scoring)
                scored = {id(span.seq): (span, e) for span, e in zip(scoring.spans, entries, strict=True)}
            else:
                logits = self.forward(batch)
            scored_to_end = {id(seq) for seq in prepared.scored_to_end}
            masks = pending.result()
            verified: list[tuple[list[int], int] | None] = []
            sampled: list[tuple[int, TokenLogprobs | None] | None] = []
            if prepared.drafts is not None:
                masks, verified = self._verifier.sample(
                    prepared, logits, masks, self._step_sampler.inputs
                )
            elif samplers:
                live = [not s.finished and i not in masks.refused for i, s in enumerate(samplers)]
                assert prepared.sampling_columns is not None and batch.sample_rows is not None
                sampled = self._step_sampler.sample(
                    samplers, prepared.output_lens, prepared.sampling_inputs,
                    prepared.sampling_columns, batch.sample_rows, logits, live, masks,
                )  # fmt: skip
            with self._lock:
                fast = prepared.samplers is prepared.seqs and not (masks.refused or verified or scored)
                if fast:  # every row samples (a decode batch, or new and running rows all sampling)
                    self._finish_decodes(prepared.seqs, sampled, outputs)
                pairs: Iterable[tuple[SequenceState, int]] = (
                    () if fast else zip(prepared.seqs, prepared.sampler_rows, strict=True)
                )
                for seq, row in pairs:
                    if seq.finished:
                        continue  # ended by an earlier step; the scheduler did not know yet
                    if row in masks.refused:
                        outputs.append(self._refused(seq))
                        continue
                    if verified and row >= 0 and (check := verified[row]) is not None:
                        assert prepared.drafts is not None
                        draft = prepared.drafts[row]
                        outputs.append(self._verifier.finish(seq, draft, *check, self._end))
                        continue
                    sample = sampled[row] if row >= 0 and sampled else None
                    outputs.append(
                        self._finish_sample(seq, *sample)
                        if sample is not None
                        else SequenceOutput(seq.req_id, None)
                    )
                    if scored and (entry := scored.get(id(seq))) is not None:
                        outputs[-1].prompt_logprobs = entry[1]
                        outputs[-1].prompt_logprobs_position = entry[0].first_position
                    if id(seq) in scored_to_end:  # score only: prompt done, nothing sampled
                        self._end(seq)
                        outputs[-1].finish_reason = "length"
            if prepared.drafts is not None:
                switch = self.spec_switch if self._proposer is not None else None
                record_gains(switch, self.forced_switch, prepared.drafts, outputs)
        return self._result(prepared, outputs, start)

    def _result(
        self, prepared: PreparedStep, outputs: list[SequenceOutput], start: float
    ) -> StepResult:
        """The step's result, with the proposer's answer and the step's timing."""
        result = StepResult(prepared.step_id, outputs, substep=prepared.substep)
        if self._proposer is not None and prepared.batch is not None:  # a prefill's too: no reset
            going = [seq for seq in prepared.seqs if not seq.finished]
            ahead = self._num_prepared - prepared.index - 1  # prepared since: counted
            k, proposer = self.config.speculative.max_draft_tokens, self._proposer
            result.undrafted_steps = self._declined(self.spec_switch, going, k, proposer, ahead)
            proposer.take_in()  # the ended sequences' outputs, a bounded share a step
        end = time.perf_counter()  # the switch's answer is this step's work
        result.step_seconds = prepared.prepare_seconds + end - start
        self._step_clock.tick(prepared, end, (self.spec_switch, self.forced_switch))
        return result

    def shutdown(self) -> None:
        with self._lock:
            self._seqs.clear()
            self.forward.drop_graphs()
            self.kv_pool.release()
        self._grammar.shutdown()

    # -- state ---------------------------------------------------------------

    def _admit_grammars(self, new_seqs: list[NewSequence]) -> dict[str, SequenceGrammar]:
        grammars: dict[str, SequenceGrammar] = {}
        for new in new_seqs:
            if new.constraint is not None:
                grammars[new.req_id] = self._grammar.admit(
                    new.constraint,
                    new.token_ids[new.num_prompt_tokens :],  # earlier outputs on resume
                    new.sampling.min_tokens,
                    new.sampling.stop_token_ids,
                )
        return grammars

    def _admit(self, new: NewSequence, grammar: SequenceGrammar | None) -> SequenceState:
        seed = (
            new.sampling.seed if new.sampling.seed is not None else self._seed_rng.getrandbits(63)
        )
        seq = SequenceState(
            req_id=new.req_id,
            token_ids=list(new.token_ids),
            num_prompt_tokens=new.num_prompt_tokens,
            num_computed_tokens=new.num_computed_tokens,
            num_known_tokens=len(new.token_ids),
            num_pages=len(new.page_ids),
            sampling=new.sampling,
            seed=seed,
            row=self._free_rows.pop(),
            grammar=grammar,
        )
        self._page_tables.write(seq.row, 0, new.page_ids)
        self._step_sampler.admit(seq)
        self._seqs[new.req_id] = seq
        return seq

    def _drop(self, req_id: str) -> None:
        """Forgets a sequence the plan names; steps prepared before still run it."""
        seq = self._seqs.pop(req_id, None)
        if seq is not None:
            self._release_row(seq)
            if self._proposer is not None:
                self._proposer.observe(seq.token_ids, seq.num_prompt_tokens)

    def _end(self, seq: SequenceState) -> None:
        """The core ends the sequence: later prepared steps skip it."""
        seq.finished = True
        if self._seqs.get(seq.req_id) is seq:
            del self._seqs[seq.req_id]
        self._release_row(seq)
        if self._proposer is not None:
            self._proposer.observe(seq.token_ids, seq.num_prompt_tokens)

    def _release_row(self, seq: SequenceState) -> None:
        # The row may be reused at once: its next owner reads it only after writing it.
        if not seq.released:
            seq.released = True
            self._free_rows.append(seq.row)

    # -- execute -------------------------------------------------------------

    def _refused(self, seq: SequenceState) -> SequenceOutput:
        """The grammar refused the token sampled last, which its bitmask allowed: an
        internal error that ends the sequence."""
        log.error("grammar_refused_sampled_token", req_id=seq.req_id, token_id=seq.token_ids[-1])
        self._end(seq)
        return SequenceOutput(seq.req_id, None, finish_reason="abort")

    def _finish_decodes(
        self,
        seqs: list[SequenceState],
        sampled: list[tuple[int, TokenLogprobs | None] | None],
        outputs: list[SequenceOutput],
    ) -> None:
        """Each sequence's sampled token where every one sampled (None: ended before)."""
        finish = self._finish_sample
        for seq, sample in zip(seqs, sampled, strict=True):
            if sample is not None:
                outputs.append(finish(seq, *sample))

    def _finish_sample(
        self, seq: SequenceState, token_id: int, logprobs: TokenLogprobs | None
    ) -> SequenceOutput:
        if seq.grammar is not None:
            seq.grammar.pending_token = token_id  # accepted beside the sequence's next forward
        seq.token_ids.append(token_id)
        reason, stop_id = check_finish(
            seq, token_id, self.info.eos_token_ids, self.info.max_model_len
        )
        if reason is not None:
            self._end(seq)
        return SequenceOutput(seq.req_id, token_id, logprobs, reason, stop_id)

