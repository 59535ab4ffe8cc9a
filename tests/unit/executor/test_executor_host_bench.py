"""bench/executor_host.py: a short run serves every plan's steps through the servicer and
reports each batch size's host time per step, with a profile of the step thread."""

from __future__ import annotations

import argparse
import asyncio
import importlib
from pathlib import Path

from radixmesh import wire


def test_a_short_run_reports_host_time_per_step_and_a_profile(tmp_path: Path) -> None:
    bench = importlib.import_module("bench.executor_host")
    args = argparse.Namespace(
        model=None, device="cpu", batch_sizes=[1, 3], steps_per_plan=4, plans=3,
        prompt_len=5, page_size=16, rounds=2, num_threads=1, real_forward=False,
        profile=str(tmp_path / "step.prof"), top=5,
    )  # fmt: skip
    rows = asyncio.run(bench.main_async(args))
    assert [r["batch_size"] for r in rows] == [1, 3]
    for row in rows:
        assert row["steps_per_plan"] == 4
        assert 0 < row["best_step_thread_cpu_us_per_step"] <= row["step_thread_cpu_us_per_step"]
        assert row["host_us_per_step"] > 0
        assert len(row["profile_us_per_step"]) == 5
        assert (tmp_path / f"step.prof.b{row['batch_size']}").is_file()


def test_the_plans_admit_then_decode_in_plans_of_k_steps() -> None:
    bench = importlib.import_module("bench.executor_host")
    messages = bench.plans(2, 5, 3, 4, 16, 100, seed=0)
    assert [m.step_id for m in messages] == [1, 2, 3, 4]
    assert len(messages[0].new_seqs) == 2 and not messages[0].running_seqs
    for msg in messages[1:]:
        running = wire.plan_from_proto(msg).running_seqs
        assert msg.num_steps == 4 and [r.req_id for r in running] == ["r0", "r1"]
    pages = [list(n.page_ids) for n in messages[0].new_seqs]
    assert len(pages[0]) * 16 >= 5 + 3 * 4 + 2  # every token of the run has a slot
    assert not set(pages[0]) & set(pages[1])
