"""bench/executor_churn.py: plans that admit k sequences and end k every step with the
batch full, and a short run that reports each phase's host time per step."""

from __future__ import annotations

import argparse
import importlib
from collections import Counter
from pathlib import Path

from radixmesh import wire


def test_a_short_run_reports_every_phase_and_the_same_tokens_each_round(tmp_path: Path) -> None:
    bench = importlib.import_module("bench.executor_churn")
    from mesh.tiny_model import write_tiny_model

    model = str(write_tiny_model(tmp_path / "tiny"))
    args = argparse.Namespace(running=12, prompt_len=8, page_size=4, steps=6, rounds=2, seed=0)
    row = bench.measure(args, model, 3)  # rounds that sample different tokens raise
    assert (row["running"], row["k"], row["max_tokens"]) == (12, 3, 4)
    for phase in ("plan_decode", "admit", "prepare_batch", "sampling_inputs", "finish"):
        assert row[phase] > 0, phase
    assert row["host"] >= row["prepare_batch"] + row["sampling_inputs"]
    assert len(row["tokens_digest"]) == 16


def test_once_full_each_plan_admits_k_ends_k_and_decodes_the_rest() -> None:
    bench = importlib.import_module("bench.executor_churn")
    running, k, prompt_len, page_size = 16, 4, 8, 4
    messages = bench.churn_plans(running, k, prompt_len, 20, page_size, 100, seed=0)
    plans = [wire.plan_from_proto(m) for m in messages]
    admitted = {n.req_id: plan.step_id for plan in plans for n in plan.new_seqs}
    max_tokens = running // k
    held: dict[str, list[int]] = {}
    for plan in plans:
        assert len(plan.new_seqs) == k
        for req_id in plan.finished_req_ids:  # the step after the scheduler learns the end
            assert plan.step_id == admitted[req_id] + max_tokens + 1
            del held[req_id]
        for new in plan.new_seqs:
            assert new.num_scheduled_tokens == len(new.token_ids) == prompt_len
            assert new.sampling.max_tokens == max_tokens
            held[new.req_id] = list(new.page_ids)
        for run in plan.running_seqs:
            assert run.num_scheduled_tokens == 1
            held[run.req_id] += run.appended_page_ids
            num_tokens = prompt_len + plan.step_id - admitted[run.req_id]  # the decode's end
            if plan.step_id < admitted[run.req_id] + max_tokens:  # not ended yet
                assert len(held[run.req_id]) * page_size >= num_tokens
        pages = Counter(p for ids in held.values() for p in ids)
        assert not [p for p, n in pages.items() if n > 1]  # no page held twice
        if plan.step_id > max_tokens + 1:  # full: every running sequence decodes
            assert len(plan.running_seqs) == running
    samplings = {n.sampling for plan in plans for n in plan.new_seqs}
    assert any(s.greedy for s in samplings) and any(not s.greedy for s in samplings)
