"""The executor's drafting per step: which decodes get a draft and how long, the rows a
verified draft occupies, and what a verification emits."""

from __future__ import annotations

import bisect
import heapq
import operator
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from radixmesh.errors import FailedPrecondition
from radixmesh.step import StepPlan
from services.executor.core.spec.adaptive import DraftLength, DraftPrior
from services.executor.core.spec.forced import ForcedTokens
from services.executor.core.spec.proposers import Proposer
from services.executor.core.spec.switch import SpecSwitch, request_gain
from services.executor.core.spec.verify import accepted_length

if TYPE_CHECKING:
    from services.executor.core.sequence import SequenceState

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class DraftLimits:
    max_batch_size: int
    """More decodes than this in a step: no drafts (the per-step switch)."""
    page_size: int
    max_model_len: int
    max_num_batched_tokens: int


@dataclass(frozen=True, slots=True)
class DraftChoice:
    """What a step may draft, decided once per step before its prepare waits for anything
    (`choose_drafting`): the proposer's guesses, the grammars' forced runs. A prepare given
    NO_DRAFTS drafts nothing, whatever the switches would say by then."""

    proposer: bool
    forced: bool
    probe: bool = False
    """The proposer drafts although its switch declined the step's best case (one
    step in `switch.PROBE_EVERY`): its drafts are verified whatever they are expected
    to keep, so the rolling acceptance follows a workload that changes."""


NO_DRAFTS = DraftChoice(proposer=False, forced=False)


def choose_drafting(
    has_proposer: bool,
    has_forced: bool,
    plan: StepPlan,
    seqs: dict[str, SequenceState],
    limits: DraftLimits,
    switch: SpecSwitch | None = None,
    forced_switch: SpecSwitch | None = None,
) -> DraftChoice:
    """Whether the plan's step may draft, from the plan alone: some decode allowed draft
    tokens, no prompt scoring, and the proposer within its switch's cap or jump-forward's
    switch allowing the step (that call counts: make it once per step). NO_DRAFTS when not.

    `seqs`: the held sequences (running ones are looked up for their sampling)."""
    if not (has_proposer or has_forced):
        return NO_DRAFTS
    allowed = False
    num_decodes = 0
    for new in plan.new_seqs:
        if new.sampling.prompt_logprobs_start is not None:
            return NO_DRAFTS
        num_decodes += new.num_scheduled_tokens == 1
    for running in plan.running_seqs:
        seq = seqs.get(running.req_id)
        if seq is None or not running.num_scheduled_tokens:
            continue
        if seq.sampling.prompt_logprobs_start is not None:
            return NO_DRAFTS
        allowed = allowed or running.num_draft_tokens > 0
        num_decodes += running.num_scheduled_tokens == 1
    if not allowed:
        if has_proposer and switch is not None:
            switch.note_undrafted(num_decodes)  # offered none: counts toward the probe
        return NO_DRAFTS
    max_batch = switch.max_batch_size if switch is not None else limits.max_batch_size
    proposer = has_proposer and num_decodes <= max_batch
    probe = False
    if proposer and switch is not None:
        best = best_gain(plan, seqs, num_decodes, switch.prior)
        if not switch.admits(num_decodes, best):
            proposer = probe = switch.allows(num_decodes, best)  # counts the decline
    forced = has_forced and (forced_switch is None or forced_switch.allows(num_decodes))
    return DraftChoice(proposer, forced, probe) if proposer or forced else NO_DRAFTS


def undrafted_steps(
    switch: SpecSwitch,
    decodes: Sequence[SequenceState],
    max_draft_tokens: int,
    proposer: Proposer | None = None,
    num_ahead: int = 0,
) -> int:
    """`DeclinedSteps`'s answer for one step, nothing kept from steps before it."""
    return DeclinedSteps()(switch, decodes, max_draft_tokens, proposer, num_ahead)


YOUNG_GUESSES = 8
"""A sequence asked for fewer guesses than this is asked in every declined step."""
ASKED_PER_STEP = 4
"""In a declined step, at most this many of the older sequences are asked too, those due
first (one in OLD_ASK_EVERY of the batch a step, at least one)."""
OLD_ASK_EVERY = 16
"""An older sequence whose guesses keep finding nothing is asked at most once in this many
declined steps: its interval doubles with each guess not found (one found brings it back to
every step). At batch 8 asking 4 a step asked each one every other step, an n-gram search
each, for a sequence whose text had not repeated for 8 guesses (a tenth of a declined step's
host work on the build VM). A fixed turn of that length for every older sequence starved
one that copies with edits: after each edit the rule declines until its rates recover, and
at batch 1, asked once in 16 declined steps, a copying sequence's steps rose from 34 to 74
(`bench/spec_host.py --copy-share 1 --edits 4 --fixed-ratio`: bench/RESULTS.md)."""

DORMANT_FOUND = 0.25
"""An older sequence whose rolling found rate is below this backs off (OLD_ASK_EVERY); above
it, it is asked in every declined step: a copying sequence's misses right after an edit
(two or three guesses not found) leave it above."""

ASK_SHARE = 0.02
"""A declined step's guesses cost at most this share of a plain step's wall time (at least
one guess a step): at batch 128 on the H200, asking each of a new batch's sequences in
each of its first steps took 1 ms a step for YOUNG_GUESSES steps, on steps of 2 ms. The
young ones are then asked in turn, fewer a step, and older ones after them."""
ASK_DECAY = 0.9
"""Weight of the past in the rolling wall time of one guess."""


class DeclinedSteps:
    """After each step of an executor: 0 when the switch would draft these sequences' next
    decode step, each offered `max_draft_tokens`; else D, the D-th decode step from now
    being the first that may draft (its probe), the D - 1 before it declined. Where it
    would draft, now and then D > 0 too: a few plain steps, to time what it weighs drafts
    against (`SpecSwitch.plain_probe`). The scheduler plans the D - 1 without drafts,
    several a plan (StepResult's `undrafted_steps`); without a timing table, or past the
    cap, 0.

    `num_ahead`: steps prepared after this one (the pipeline prepares ahead): they have
    counted toward the probe already, so the probe is that many steps further from this one.

    Where the rule declines, the `proposer` is asked for the next guesses of the young
    sequences and of a few older ones (`_ask`), not verified but scored against the tokens
    that follow: a sequence that started from the executor's low rates (spec/adaptive.py)
    but has text to copy is found in its first steps, and one that begins to quote late in
    its output within a few, not at the batch's next probe.

    It keeps the last step's decodes and what it weighed of each (1 / (1 + its best
    guess), the terms of the step's harmonic gain), its young sequences and those holding
    a guess to settle, while the decodes stay the same and no step has planned drafts since
    (`SpecSwitch.num_planned`: a drafting step changes their rates): a declined step then
    costs the few sequences it asks, not the batch (the whole declined path cost the trained
    tiny model 7% a step at batch 32 on the H200 while it weighed and scanned every decode
    after every step: bench/RESULTS.md).
    """

    def __init__(self, ask_s: float | None = None) -> None:
        self._ask_s = ask_s
        """The wall time of one guess: given (fixed), else measured (rolling, ASK_DECAY)."""
        self._measure = ask_s is None
        self._young_next = 0
        """Where the next capped step's young guesses start (by position in the batch)."""
        self._switch: SpecSwitch | None = None
        self._allowed = 0
        self._planned = -1
        """The switch's num_planned when the decodes were weighed."""
        self._decodes: list[SequenceState] = []
        self._inverse: list[float] = []
        """Per decode: 1 / (1 + its best guess) by its own rates; 0.0 for one weighed by the
        switch's prior (no draft length yet), counted in `_num_prior`."""
        self._num_prior = 0
        self._young: set[int] = set()
        """Decodes asked in every declined step (fewer than YOUNG_GUESSES guesses so far)."""
        self._holding: set[int] = set()
        """Decodes holding an unverified guess (`DraftLength.hold`)."""
        self._due: list[tuple[int, int]] = []
        """Heap of (`DraftLength.next_ask`, i): one entry per older decode holding no guess."""

    def __call__(
        self,
        switch: SpecSwitch,
        decodes: Sequence[SequenceState],
        max_draft_tokens: int,
        proposer: Proposer | None = None,
        num_ahead: int = 0,
    ) -> int:
        num_decodes = len(decodes)
        if switch.cost_ratios is None or not 0 < num_decodes <= switch.max_batch_size:
            return 0
        if not self._same(switch, decodes, max_draft_tokens):
            self._weigh(switch, decodes, max_draft_tokens)
        admits = switch.admits(num_decodes, self.gain(switch.prior, max_draft_tokens))
        if (  # a young sequence's guess may change the answer
            not admits and proposer is not None and self._ask(proposer, max_draft_tokens, switch)
        ):
            admits = switch.admits(num_decodes, self.gain(switch.prior, max_draft_tokens))
        if admits:
            return switch.plain_probe(num_decodes)  # 0 but now and then: the plain side's time
        return switch.steps_to_probe(num_decodes) + num_ahead

    def _same(self, switch: SpecSwitch, decodes: Sequence[SequenceState], allowed: int) -> bool:
        """The decodes weighed last, unchanged since by a drafting step."""
        kept = self._decodes
        return (
            switch is self._switch
            and allowed == self._allowed
            and switch.num_planned == self._planned
            and len(decodes) == len(kept)
            and all(map(operator.is_, decodes, kept))
        )

    def _weigh(self, switch: SpecSwitch, decodes: Sequence[SequenceState], allowed: int) -> None:
        self._switch, self._allowed, self._planned = switch, allowed, switch.num_planned
        self._decodes = list(decodes)
        self._inverse = [0.0] * len(decodes)
        self._num_prior = 0
        self._young, self._holding, self._due = set(), set(), []
        for i, seq in enumerate(decodes):
            self._reweigh(i, seq, allowed, new=True)

    def _reweigh(self, i: int, seq: SequenceState, allowed: int, new: bool = False) -> None:
        """Decode i's terms after its draft length changed (`new`: not weighed before)."""
        length = seq.draft_length
        if length is None:
            self._num_prior += new
            young = True
        else:
            self._num_prior -= not new and self._inverse[i] == 0.0
            self._inverse[i] = 1.0 / (1.0 + length.best_guess(allowed))
            young = length.num_guesses < YOUNG_GUESSES
            if length.unverified is not None:
                self._holding.add(i)
            else:
                self._holding.discard(i)
                if new and not young:  # (later: queued by `_ask` once asked or settled)
                    heapq.heappush(self._due, (length.next_ask, i))
        if young:
            self._young.add(i)
        else:
            self._young.discard(i)

    def gain(self, prior: DraftPrior, allowed: int) -> float:
        """The tokens per decode the decodes weighed last can expect of their next step at
        most (`best_gain`): each one's best guess by its own rates, a new sequence's by the
        executor's (`prior`)."""
        inverse = sum(self._inverse) + self._num_prior / (1.0 + prior.best_guess(allowed))
        return len(self._inverse) / inverse

    def _ask(self, proposer: Proposer, allowed: int, switch: SpecSwitch) -> bool:
        """A declined step's guesses, not verified: each young decode's next one, and the next
        ASKED_PER_STEP older ones', in turn from step to step, as the next step would ask for
        them (an older one at most once in OLD_ASK_EVERY steps), within the step's share of
        guesses (`_max_asks`: the young ones first, in turn). Each is noted (found or not)
        and held to be scored against the tokens the sequence then produces
        (`DraftLength.settle`: every held guess is looked at each step), so a sequence's
        found rate and acceptance follow its text while the batch declines. Whether any
        guess was found or a held one kept tokens (nothing else can make the switch's
        answer change)."""
        changed = False
        decodes = self._decodes
        num_decodes = len(decodes)
        for i in sorted(self._holding):
            length = decodes[i].draft_length
            if length is None or length.unverified is None:  # settled elsewhere
                self._holding.discard(i)
                continue
            scored = length.settle(decodes[i].token_ids)  # (maybe its right prefix alone)
            changed = scored or changed
            if scored or length.unverified is None:
                self._reweigh(i, decodes[i], allowed)
            if length.unverified is None and i not in self._young:  # due again (`_due_now`
                heapq.heappush(self._due, (length.next_ask, i))  # dropped it while it held)
        now = switch.num_declined_asks
        switch.num_declined_asks += 1
        due = self._due_now(now, min(ASKED_PER_STEP, -(-num_decodes // OLD_ASK_EVERY)))
        if not (due or self._young):
            return changed  # (most declined steps of a small batch)
        asking = self._asking([i for _, i in due], switch.plain_step_s(num_decodes))
        for entry in due:
            if entry[1] not in asking:  # not reached: due still
                heapq.heappush(self._due, entry)
        begun = time.perf_counter()
        for i in asking:
            seq = decodes[i]
            length = seq.draft_length
            if length is None:
                length = seq.draft_length = switch.prior.new_length(allowed)
            if seq.ngram_index is None:
                seq.ngram_index = proposer.index_for()
            draft = proposer.propose(seq.token_ids, allowed, seq.ngram_index)
            guess = draft.token_ids[: length.limit(draft.match_len)]
            length.note_guess(bool(guess))
            if guess or length.found >= DORMANT_FOUND:
                length.ask_every = 1
            else:
                length.ask_every = min(2 * length.ask_every, OLD_ASK_EVERY)
            length.next_ask = now + length.ask_every
            if guess:
                length.hold(guess, len(seq.token_ids))
                changed = True
            self._reweigh(i, seq, allowed)
            if not guess and i not in self._young:  # (one holding is queued once settled)
                heapq.heappush(self._due, (length.next_ask, i))
        if asking and self._measure:
            took = (time.perf_counter() - begun) / len(asking)
            last = self._ask_s
            self._ask_s = took if last is None else ASK_DECAY * last + (1 - ASK_DECAY) * took
        return changed

    def _due_now(self, now: int, width: int) -> list[tuple[int, int]]:
        """The entries of up to `width` older decodes due by declined step `now` that may
        guess, the longest due first (then by batch position), taken off the heap. An entry
        that no longer stands is dropped: its decode holds a guess (queued again once it is
        settled), was asked since, or never guesses (constrained: its draft starts with
        forced tokens; may_draft changes only with a grammar)."""
        due, decodes, holding = self._due, self._decodes, self._holding
        window: list[tuple[int, int]] = []
        while due and due[0][0] <= now and len(window) < width:
            entry = heapq.heappop(due)
            seq = decodes[entry[1]]
            length = seq.draft_length
            if (
                entry[1] not in holding
                and length is not None
                and length.next_ask == entry[0]
                and seq.grammar is None
                and may_draft(seq)
            ):
                window.append(entry)
        return window

    def _asking(self, window: list[int], step_s: float | None) -> list[int]:
        """The decodes this step asks, in batch order: the young ones (none holding a guess),
        then the window's older ones, within `_max_asks` (the young in turn from where
        the last capped step stopped); only those reached are looked at."""
        decodes, holding = self._decodes, self._holding
        limit = self._max_asks(step_s)
        young = sorted(self._young)
        if limit is not None and len(young) > limit:
            turn = bisect.bisect_left(young, self._young_next)
            young = young[turn:] + young[:turn]
        ask: list[int] = []
        for i in young:
            if limit is not None and len(ask) >= limit:
                break
            seq = decodes[i]
            if seq.grammar is not None or not may_draft(seq):  # (the next step may be prepared)
                self._young.discard(i)  # never asks (may_draft changes only with a grammar)
            elif i not in holding:  # one guess at a time
                ask.append(i)
        if ask and limit is not None:
            self._young_next = ask[-1] + 1
        ask += window if limit is None else window[: max(0, limit - len(ask))]  # (`_due_now`'s)
        return sorted(ask)

    def _max_asks(self, step_s: float | None) -> int | None:
        """The guesses a declined step may ask (ASK_SHARE of a plain step's time); None (no
        cap) until both a guess and a plain step have been timed."""
        if step_s is None or not self._ask_s:
            return None
        return max(1, int(ASK_SHARE * step_s / self._ask_s))


def best_gain(
    plan: StepPlan, seqs: dict[str, SequenceState], num_decodes: int, prior: DraftPrior
) -> float:
    """The most tokens per decode the plan's step can expect from the proposer's guesses,
    known before the step before it has executed: each running decode's guess as long as
    its draft length allows (`DraftLength.limit` at the longest match), weighed by its
    rolling acceptance, averaged as the step's requests see it (`switch.request_gain`).
    `plan_drafts` expects at most this from the guesses it gets, so a switch that declines
    it would decline them too, and the step needs no wait for the token sampled last (its
    prepare overlaps the step before)."""
    tokens = []
    for running in plan.running_seqs:
        allowed = running.num_draft_tokens
        if running.num_scheduled_tokens != 1 or allowed <= 0:
            continue
        seq = seqs.get(running.req_id)
        if seq is not None:
            tokens.append(1.0 + (seq.draft_length or prior).best_guess(allowed))
    return request_gain(tokens, num_decodes)


def check_not_verifying(plan: StepPlan, seqs: dict[str, SequenceState]) -> None:
    """A sequence whose draft a prepared step verifies has no known position until that
    step executes: speculation needs prepares between steps (overlap_prepare off)."""
    for running in plan.running_seqs:
        seq = seqs.get(running.req_id)
        if seq is not None and seq.verifying and running.num_scheduled_tokens:
            raise FailedPrecondition(
                f"plan {plan.step_id}: running_seqs[{running.req_id!r}] verifies a draft in a "
                "step not executed yet (speculative decoding prepares between steps)"
            )


def can_draft(seq: SequenceState) -> bool:
    """A decode whose every earlier step has executed, and whose sampling lets it draft
    (`may_draft`)."""
    return (
        seq.has_device_token
        and len(seq.token_ids) == seq.num_known_tokens
        and seq.num_computed_tokens + 1 == seq.num_known_tokens
        and may_draft(seq)
    )


def may_draft(seq: SequenceState) -> bool:
    """A live sequence with no per-position output that a verified run would have to carry
    (logprobs, prompt scores) and no penalties (they read a history that would include the
    draft)."""
    params = seq.sampling
    return (
        not seq.finished
        and not (params.logprobs or params.top_logprobs > 0)
        and params.prompt_logprobs_start is None
        and params.repetition_penalty == 1.0
        and params.frequency_penalty == 0.0
        and params.presence_penalty == 0.0
        and (seq.grammar is None or seq.num_output_tokens >= params.min_tokens)
    )


def max_draft_len(seq: SequenceState, allowed: int, limits: DraftLimits) -> int:
    """The most draft tokens the sequence's pages, context limit and max_tokens leave room
    for: the step writes KV for positions up to num_computed_tokens + k and emits up to
    k + 1 tokens."""
    position = seq.num_computed_tokens
    room = [
        allowed,
        seq.num_pages * limits.page_size - position - 1,
        limits.max_model_len - len(seq.token_ids) - 1,
    ]
    if seq.sampling.max_tokens is not None:
        room.append(seq.sampling.max_tokens - seq.num_output_tokens - 1)
    return max(0, min(room))


def plan_drafts(
    proposer: Proposer | None,
    seqs: Sequence[SequenceState],
    num_tokens: Sequence[int],
    allowed: Sequence[int],
    limits: DraftLimits,
    forced: ForcedTokens | None = None,
    switch: SpecSwitch | None = None,
    forced_switch: SpecSwitch | None = None,
    choice: DraftChoice | None = None,
) -> list[list[int]] | None:
    """Each scheduled sequence's draft (most empty); None when the step drafts nothing.

    `choice`: what `choose_drafting` decided for the step (None: decided here, as it would);
    the proposer and the forced runs are used only where it allows them.

    `allowed`: the plan's num_draft_tokens per sequence. Only decodes draft, and none in
    a step with prompt scoring. A constrained decode's draft starts with the tokens its
    grammar forces (`forced`: jump-forward, at any batch size); the proposer's guess
    follows them, in a step the `switch` allows (spec/switch.py: within its cap, and where
    the guesses' expected kept tokens pay for the verification; without one: at most
    limits.max_batch_size decodes; a step that verifies forced runs keeps its guesses).
    `forced_switch`: whether the step verifies forced runs at all (None: it does). Each
    sequence's `num_forced_tokens` is set to the length of its forced head.
    """
    if not any(allowed) or any(s.sampling.prompt_logprobs_start is not None for s in seqs):
        return None
    num_decodes = sum(1 for q in num_tokens if q == 1)
    if choice is None:
        max_batch = switch.max_batch_size if switch is not None else limits.max_batch_size
        allow_forced = forced is not None and (
            forced_switch is None or forced_switch.allows(num_decodes)
        )
        choice = DraftChoice(num_decodes <= max_batch, allow_forced)
    if not choice.proposer:
        proposer = None
    if not choice.forced:
        forced = None
    if proposer is None and forced is None:
        return None
    if proposer is not None and switch is not None:
        switch.num_planned += 1  # the rates below change: DeclinedSteps weighs them again
    room = limits.max_num_batched_tokens - sum(num_tokens)
    drafts: list[list[int]] = []
    guessed: list[float] = []  # 1 + each guess's tokens expected kept
    any_forced = False
    probed = _probed_rows(len(seqs), switch.num_probes if switch else 0) if choice.probe else None
    for row, (seq, q, cap) in enumerate(zip(seqs, num_tokens, allowed, strict=True)):
        seq.num_forced_tokens = 0
        k = max_draft_len(seq, min(cap, room), limits) if cap and q == 1 else 0
        if k <= 0 or not can_draft(seq):
            drafts.append([])
            continue
        tokens = forced.propose(seq.grammar, k) if forced and seq.grammar is not None else []
        seq.num_forced_tokens = len(tokens)
        any_forced = any_forced or bool(tokens)
        if proposer is not None and len(tokens) < k and (probed is None or row in probed):
            if seq.draft_length is None:
                seq.draft_length = switch.prior.new_length(cap) if switch else DraftLength(cap)
            seq.draft_length.settle(seq.token_ids)  # a verified guess replaces a held one
            seq.draft_length.unverified = None
            if tokens:  # forced tokens first: not yet the sequence's own, so no index
                draft = proposer.propose([*seq.token_ids, *tokens], k - len(tokens))
            else:
                if seq.ngram_index is None:
                    seq.ngram_index = proposer.index_for()
                draft = proposer.propose(seq.token_ids, k, seq.ngram_index)
            guess = draft.token_ids[: seq.draft_length.limit(draft.match_len)]
            seq.draft_length.note_guess(bool(guess))
            guessed.append(1.0 + seq.draft_length.acceptance * len(guess))
            tokens += guess
        room -= len(tokens)
        drafts.append(tokens)
    gain = request_gain(guessed, num_decodes)
    expected = sum(guessed) - len(guessed)  # the guesses' tokens expected kept
    if (
        expected
        and not any_forced
        and not choice.probe
        and switch is not None
        and not switch.allows(num_decodes, gain)
    ):
        return None  # guesses only, and they do not pay: a plain step
    if switch is not None and not any_forced:
        switch.expected_kept = expected  # what the verification is to measure against
    return drafts if any(drafts) else None


PROBE_MAX_SEQS = 4
"""A probe drafts for this many of its decodes (in turn from probe to probe): enough for
the rolling gain to see a workload change, without a declined batch's every sequence
catching its n-gram index up on the steps it did not draft."""


def _probed_rows(num_rows: int, num_probes: int) -> range | set[int]:
    """The rows a probe drafts for: PROBE_MAX_SEQS of them, the next ones each probe."""
    if num_rows <= PROBE_MAX_SEQS:
        return range(num_rows)
    first = (num_probes * PROBE_MAX_SEQS) % num_rows
    return {(first + i) % num_rows for i in range(PROBE_MAX_SEQS)}


def expand_rows(
    rows: Sequence[T | None], output_lens: Sequence[int], drafts: Sequence[Sequence[int]]
) -> tuple[list[T | None], list[int]]:
    """Per-sampler values over a drafted step's logits rows: the value on each sampler's
    first row and None on its draft rows; output lengths base, base + 1, ... per row."""
    out: list[T | None] = []
    lens: list[int] = []
    for value, base, draft in zip(rows, output_lens, drafts, strict=True):
        out.append(value)
        out.extend([None] * len(draft))
        lens.extend(range(base, base + len(draft) + 1))
    return out, lens


def verify_draft(draft: Sequence[int], sampled: Sequence[int], num_allowed: int) -> list[int]:
    """The tokens a verified draft emits: its accepted prefix, then the target's sample at
    the first rejected position (or after the last draft token: the bonus token)."""
    accepted = accepted_length(draft, sampled, num_allowed)
    return [*draft[:accepted], sampled[accepted]]
