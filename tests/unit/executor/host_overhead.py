"""Host cost of a decode step on CPU: `python -m tests.unit.executor.host_overhead`.

The tiny model's forward is replaced by a stub returning fixed logits, so what
is timed is the executor's own work per step (plan checks, batch building,
sampling inputs, sampling of the given logits, finish detection), split into
prepare and execute. Medians over 200 decode steps, one torch thread.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import torch

from radixmesh.step import NewSequence, RunningSequence, StepPlan
from tests.unit.executor.conftest import greedy, make_core, random_prompt, save_tiny_model

NUM_STEPS = 200


def measure(model_dir: Path, batch_size: int) -> dict[str, float]:
    model = save_tiny_model(model_dir, "llama3-untied")
    core = make_core(model, num_pages=1024, max_num_seqs=64, page_size=16)
    prompts = [random_prompt(8, seed=i) for i in range(batch_size)]
    core.step(
        StepPlan(
            1,
            new_seqs=[
                NewSequence(
                    f"r{i}",
                    p,
                    8,
                    0,
                    8,
                    list(range(16 * i, 16 * i + 16)),
                    greedy(None, ignore_eos=True),
                )
                for i, p in enumerate(prompts)
            ],
        )
    )
    logits = torch.randn(batch_size, core.info.vocab_size)
    core.model.forward = lambda batch, kv_pool: logits
    prepare, execute = [], []
    for step_id in range(2, NUM_STEPS + 2):
        plan = StepPlan(
            step_id, running_seqs=[RunningSequence(f"r{i}", 1) for i in range(batch_size)]
        )
        start = time.perf_counter()
        prepared = core.prepare(plan)
        middle = time.perf_counter()
        core.execute(prepared)
        prepare.append(middle - start)
        execute.append(time.perf_counter() - middle)
    total = [a + b for a, b in zip(prepare, execute, strict=True)]
    return {
        name: statistics.median(values) * 1e6
        for name, values in (("step", total), ("prepare", prepare), ("execute", execute))
    }


def main() -> None:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        for batch_size in (1, 32):
            us = measure(Path(tmp) / f"b{batch_size}", batch_size)
            print(
                f"batch {batch_size:2d}: host {us['step']:.0f} us/step "
                f"(prepare {us['prepare']:.0f}, execute without forward {us['execute']:.0f})"
            )


if __name__ == "__main__":
    main()
