"""Which steps a speculating executor's decodes are offered drafts in (draft_offers.py)."""

from __future__ import annotations

from services.scheduler.core.draft_offers import UNBOUNDED, DraftOffers


def test_a_decline_offers_nothing_until_the_probe_and_nothing_while_it_runs() -> None:
    offers = DraftOffers()
    assert offers.undrafted_ahead() == 0  # nothing answered: the executor drafts
    offers.planned(1, offered=True)  # step 1
    offers.planned(1, offered=True)  # step 2, before step 1's answer
    offers.answered(10)  # step 1: steps 2..10 decline, step 11 may draft
    assert offers.num_offered_in_flight == 1  # step 2
    assert offers.undrafted_ahead() == 11 - 3  # steps 3..10 are offered none
    offers.planned(4, offered=False)  # steps 3..6
    offers.answered(9)  # step 2 agrees: step 11
    assert (offers.undrafted_ahead(), offers.num_offered_in_flight) == (4, 0)
    offers.planned(4, offered=False)  # steps 7..10
    assert offers.undrafted_ahead() == 0  # step 11: the probe
    offers.planned(1, offered=True)
    for _ in range(4):  # steps 3..6 answer, all before the probe: they say step 11
        offers.answered(offers.first_drafting - offers.num_answered - 1)
        assert offers.first_drafting == 11
    assert offers.undrafted_ahead() == UNBOUNDED  # the probe runs: no drafts after it
    offers.planned(4, offered=False)  # steps 12..15
    for _ in range(4):  # steps 7..10
        offers.answered(11 - offers.num_answered)
    assert offers.num_offered_in_flight == 1
    offers.answered(64)  # the probe found nothing: the next is step 75
    assert offers.num_offered_in_flight == 0
    assert offers.undrafted_ahead() == 75 - 16


def test_a_probe_that_finds_drafts_offers_them_from_the_next_plan() -> None:
    offers = DraftOffers()
    offers.planned(1, offered=False)
    offers.answered(2)  # step 2 may draft
    offers.planned(1, offered=True)  # step 2
    offers.planned(1, offered=False)  # step 3, planned while it ran
    offers.answered(0)  # step 2: it drafts now
    assert offers.undrafted_ahead() == 0 and offers.first_drafting is None


def test_a_due_step_planned_without_drafts_is_offered_at_the_next_plan() -> None:
    """The scheduler numbers every step, the executor's switch counts decode steps only: a
    step that may draft can come due in a plan that offered none; the next one is offered
    drafts rather than waiting for an answer that would never change."""
    offers = DraftOffers()
    offers.planned(1, offered=False)  # step 1
    offers.answered(1)  # step 2 may draft
    offers.planned(1, offered=False)  # step 2, a prefill without decodes (say)
    offers.answered(1)  # step 2: step 3 may draft
    offers.planned(1, offered=False)  # step 3 planned before that answer came
    assert offers.undrafted_ahead() == 0  # step 4 is offered
