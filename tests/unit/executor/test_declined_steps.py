"""The proposer's declined steps, kept across steps (drafting.DeclinedSteps): the answer,
the guesses asked and the gain weighed are those of the plain rule, every decode looked at
after every step (`reference`, below), while the batch changes, guesses are found and
settled, and a drafting step changes its sequences' rates."""

from __future__ import annotations

import copy
import random
from types import SimpleNamespace

import pytest

from radixmesh.sampling import SamplingParams
from services.executor.core.spec import SpeculativeConfig
from services.executor.core.spec.adaptive import DraftLength, DraftPrior
from services.executor.core.spec.drafting import (
    ASK_SHARE,
    ASKED_PER_STEP,
    DORMANT_FOUND,
    OLD_ASK_EVERY,
    YOUNG_GUESSES,
    DeclinedSteps,
    may_draft,
)
from services.executor.core.spec.proposers import make_proposer
from services.executor.core.spec.switch import MIN_STEP_SAMPLES, SpecSwitch, request_gain

MAX_DRAFT = 4


def new_seq(rng: random.Random, n: int) -> SimpleNamespace:
    """A decode whose tokens repeat a short pattern now and then (guesses found, some kept)."""
    tokens = [rng.randrange(10, 40) for _ in range(n)]
    return SimpleNamespace(
        token_ids=tokens, draft_length=None, ngram_index=None, grammar=None, finished=False,
        num_output_tokens=0, sampling=SamplingParams(temperature=0.0),
    )  # fmt: skip


def next_token(rng: random.Random, seq: SimpleNamespace) -> int:
    return seq.token_ids[-8] if rng.random() < 0.85 else rng.randrange(10, 40)


def reference(switch: SpecSwitch, decodes: list, allowed: int, proposer) -> int:
    """The rule as it reads: weigh every decode, settle every held guess, ask the young
    ones and the older ones due (the longest due first, at most `width`), weigh again if
    anything changed."""
    n = len(decodes)
    if switch.cost_ratios is None or not 0 < n <= switch.max_batch_size:
        return 0
    admits = switch.admits(n, fresh_gain(switch, decodes))
    if not admits:
        changed = False
        now = switch.num_declined_asks
        switch.num_declined_asks += 1
        for seq in decodes:
            length = seq.draft_length
            if length is not None and length.unverified is not None:
                changed = length.settle(seq.token_ids) or changed
        width = min(ASKED_PER_STEP, -(-n // OLD_ASK_EVERY))
        due = sorted(
            (seq.draft_length.next_ask, i) for i, seq in enumerate(decodes)
            if seq.draft_length is not None and seq.draft_length.num_guesses >= YOUNG_GUESSES
            and seq.draft_length.unverified is None and seq.draft_length.next_ask <= now
            and seq.grammar is None and may_draft(seq)
        )  # fmt: skip
        window = {i for _, i in due[:width]}
        for i, seq in enumerate(decodes):
            length = seq.draft_length
            if length is not None:
                if length.unverified is not None:
                    continue
                if length.num_guesses >= YOUNG_GUESSES and i not in window:
                    continue
            if seq.grammar is not None or not may_draft(seq):
                continue
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
        if changed:
            admits = switch.admits(n, fresh_gain(switch, decodes))
    return switch.plain_probe(n) if admits else switch.steps_to_probe(n)


def fresh_gain(switch: SpecSwitch, decodes: list) -> float:
    tokens = [1.0 + (s.draft_length or switch.prior).best_guess(MAX_DRAFT) for s in decodes]
    return request_gain(tokens, len(decodes))


@pytest.mark.parametrize("ratio", [1.6, 1.9])
def test_kept_across_steps_it_asks_and_answers_as_a_fresh_look_does(ratio: float) -> None:
    rng = random.Random(7)
    kept_switch = SpecSwitch(32, cost_ratios={1: ratio, 32: ratio}, max_gain=MAX_DRAFT + 1)
    kept_switch.prior = DraftPrior(found=0.1, acceptance=0.5)  # earlier requests seldom copied
    fresh_switch = copy.deepcopy(kept_switch)
    kept_seqs = [new_seq(rng, 24) for _ in range(20)]
    proposer = make_proposer(SpeculativeConfig(method="ngram", max_draft_tokens=MAX_DRAFT))
    fresh_proposer = make_proposer(SpeculativeConfig(method="ngram", max_draft_tokens=MAX_DRAFT))
    assert proposer is not None and fresh_proposer is not None
    fresh_seqs = copy.deepcopy(kept_seqs)
    declined = DeclinedSteps()
    answers = set()
    old_holds = 0  # guesses held for sequences past their young ones
    for step in range(160):
        if step % 37 == 36:  # one ends, another joins: the batch changes
            kept_seqs.pop(step % len(kept_seqs))
            fresh_seqs.pop(step % len(fresh_seqs))
            joining = new_seq(rng, 24)
            kept_seqs.append(joining)
            fresh_seqs.append(copy.deepcopy(joining))
        if step % 53 == 52:  # a drafting step: its verification scores a sequence's draft
            for switch, seqs in ((kept_switch, kept_seqs), (fresh_switch, fresh_seqs)):
                switch.num_planned += 1
                if seqs[3].draft_length is not None:
                    seqs[3].draft_length.update(MAX_DRAFT, MAX_DRAFT)
        kept = declined(kept_switch, kept_seqs, MAX_DRAFT, proposer)
        fresh = reference(fresh_switch, fresh_seqs, MAX_DRAFT, fresh_proposer)
        assert kept == fresh, step
        answers.add(kept == 0)
        assert declined.gain(kept_switch.prior, MAX_DRAFT) == pytest.approx(
            fresh_gain(kept_switch, kept_seqs), rel=1e-12
        )
        for a, b in zip(kept_seqs, fresh_seqs, strict=True):  # the same guesses asked
            la, lb = a.draft_length, b.draft_length
            assert (la is None) == (lb is None)
            if la is not None:
                assert (la.num_guesses, la.unverified, la.found, la.acceptance) == (
                    lb.num_guesses, lb.unverified, lb.found, lb.acceptance,
                )  # fmt: skip
        assert kept_switch.num_declined_asks == fresh_switch.num_declined_asks
        old_holds += sum(
            1 for seq in kept_seqs
            if seq.draft_length is not None and seq.draft_length.unverified is not None
            and seq.draft_length.num_guesses > YOUNG_GUESSES
        )  # fmt: skip
        for a, b in zip(kept_seqs, fresh_seqs, strict=True):  # each decodes a token
            token = next_token(rng, a)
            a.token_ids.append(token)
            b.token_ids.append(token)
    assert answers == {True, False}  # the answer changed along the way
    assert old_holds > 0


def test_a_drafting_step_makes_it_weigh_the_batch_again() -> None:
    """The rates a drafting step changes are read again (`SpecSwitch.num_planned`), not the
    terms kept from before it."""
    rng = random.Random(3)
    switch = SpecSwitch(32, cost_ratios={1: 3.0, 32: 3.0}, max_gain=MAX_DRAFT + 1)
    seqs = [new_seq(rng, 24) for _ in range(8)]
    for seq in seqs:
        seq.draft_length = DraftLength(MAX_DRAFT)  # its own rates (no prior to move)
    declined = DeclinedSteps()
    declined(switch, seqs, MAX_DRAFT)
    before = declined.gain(switch.prior, MAX_DRAFT)
    seqs[0].draft_length.update(MAX_DRAFT, 0)  # its draft kept nothing
    declined(switch, seqs, MAX_DRAFT)
    assert declined.gain(switch.prior, MAX_DRAFT) == before  # not told: the terms kept
    switch.num_planned += 1
    declined(switch, seqs, MAX_DRAFT)
    assert declined.gain(switch.prior, MAX_DRAFT) == pytest.approx(fresh_gain(switch, seqs))
    assert declined.gain(switch.prior, MAX_DRAFT) < before


class CountingProposer:
    def __init__(self, inner) -> None:
        self.inner = inner
        self.asked: list[int] = []  # id of each sequence's token list asked about

    def index_for(self):
        return self.inner.index_for()

    def propose(self, token_ids, max_tokens, own=None):
        self.asked.append(id(token_ids))
        return self.inner.propose(token_ids, max_tokens, own)


def test_a_declined_steps_guesses_stay_within_their_share_of_a_plain_step() -> None:
    """With a plain step of 1 ms timed and a guess costing 10 us, a declined step asks 2
    guesses (ASK_SHARE of the step): a new batch's young sequences are asked in turn, 2 a
    step, every one of them within 10 steps, and none twice before all have been once."""
    rng = random.Random(5)
    switch = SpecSwitch(32, cost_ratios={1: 3.0, 32: 3.0}, max_gain=MAX_DRAFT + 1)
    switch.prior = DraftPrior(found=0.1, acceptance=0.5)
    for _ in range(MIN_STEP_SAMPLES):
        switch.observe_step(20, 1e-3, False)
    assert switch.plain_step_s(20) == pytest.approx(1e-3)
    inner = make_proposer(SpeculativeConfig(method="ngram", max_draft_tokens=MAX_DRAFT))
    proposer = CountingProposer(inner)
    seqs = [new_seq(rng, 24) for _ in range(20)]
    declined = DeclinedSteps(ask_s=1e-5)
    assert int(ASK_SHARE * 1e-3 / 1e-5) == 2
    per_step = []
    for _ in range(10):
        before = len(proposer.asked)
        assert declined(switch, seqs, MAX_DRAFT, proposer) > 0  # declined
        per_step.append(len(proposer.asked) - before)
        for seq in seqs:
            seq.token_ids.append(next_token(rng, seq))
    assert per_step == [2] * 10
    assert sorted(proposer.asked) == sorted(id(seq.token_ids) for seq in seqs)  # each once
    unbounded = CountingProposer(inner)
    fresh = [new_seq(rng, 24) for _ in range(20)]
    DeclinedSteps()(switch, fresh, MAX_DRAFT, unbounded)  # no guess timed yet: no cap
    assert len(unbounded.asked) == 20
