"""The executor's host work per step when the batch changes every step ("churn").

    python bench/executor_churn.py                     # 256 running, k 8 and 16, CPU
    python bench/executor_churn.py --k 8 --rounds 7 --json churn.json

Short requests at a high rate keep the running batch full while nearly every step
admits a few sequences and ends a few: each step's plan admits k new sequences
(--prompt-len tokens, prefilled in that step) beside the decodes of the --running
others; each sequence ends by its max_tokens (--running / k output tokens, so the
running count holds steady) and is named in finished_req_ids two steps later, as a
scheduler that learns of the end from the result sends it; every page_size tokens a
decode gets a page appended. Sampling parameters are mixed: about half greedy, the
rest temperature with top-p or top-k, some with a seed, a few with penalties or
min_tokens.

The core is driven in process, one step at a time, as the servicer drives it on
CPU (prepare, then execute, on one thread), with the model's forward replaced by
fixed logits and the collector tuned as the service tunes it once loaded
(`gc_policy`). Reported per step, in microseconds of wall time, best round (of
--rounds) per phase:

- plan_decode: `wire.plan_from_proto` of the step's message (new_seq_decode: the new
  sequences' part of it);
- admit: the core's admission of the new sequences (`ExecutorCore._admit`);
- prepare_batch: the batch's host arrays and planned state (`step_batch.prepare_batch`,
  less its sampling inputs);
- sampling_inputs: the sampling inputs (`StepSampler.inputs`);
- prepare_rest: the rest of `ExecutorCore.prepare` (drops, plan checks, the running rows);
- launch / finish: `ExecutorCore.launch` (on CPU the sampling's arithmetic itself: the
  device's work on a GPU) and `finish` (appending the tokens, the finish checks);
- result_build: `wire.result_to_proto` of the step's result;
- host: the best round's sum of the host phases (all but launch; new_seq_decode is
  within plan_decode).

`tokens_digest` is a digest of every token the run sampled, the same for two builds
that sample the same tokens.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import random
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from radixmesh import wire
from radixmesh.sampling import SamplingParams
from radixmesh.step import NewSequence, RunningSequence, StepPlan
from radixmesh.v1 import executor_pb2
from services.common.gc_policy import hold_tuned_gc, release_tuned_gc
from services.common.logging import configure_logging
from services.executor.core import executor as executor_module
from services.executor.core.config import ExecutorConfig
from services.executor.core.executor import ExecutorCore
from services.executor.core.step_sampling import StepSampler

PHASES = (
    "plan_decode", "new_seq_decode", "admit", "prepare_batch", "sampling_inputs",
    "prepare_rest", "launch", "finish", "result_build",
)  # fmt: skip
HOST_PHASES = tuple(p for p in PHASES if p not in ("new_seq_decode", "launch"))
"""new_seq_decode is part of plan_decode; launch is the sampling's arithmetic."""


def sampling_mix(rng: random.Random, max_tokens: int) -> SamplingParams:
    """One request's sampling: about half greedy, the rest drawn with top-p or top-k, some
    seeded, a few penalised or held to min_tokens."""
    common: dict[str, Any] = {"max_tokens": max_tokens, "ignore_eos": True}
    u = rng.random()
    if u < 0.5:
        return SamplingParams(temperature=0.0, **common)
    if u < 0.62:
        return SamplingParams(temperature=0.0, min_tokens=4, **common)
    if u < 0.67:
        return SamplingParams(temperature=0.0, repetition_penalty=1.1, **common)
    if u < 0.72:
        penalties = {"frequency_penalty": 0.5, "presence_penalty": 0.2}
        return SamplingParams(temperature=0.8, **penalties, **common)
    draw: dict[str, Any] = {"temperature": rng.choice((0.7, 0.8, 1.0))}
    if rng.random() < 0.7:
        draw["top_p"] = rng.choice((0.9, 0.95))
    else:
        draw["top_k"] = rng.choice((40, 50))
    if rng.random() < 0.3:
        draw["seed"] = rng.getrandbits(63)
    return SamplingParams(**draw, **common)


def churn_plans(
    num_running: int, k: int, prompt_len: int, num_steps: int, page_size: int, vocab: int,
    seed: int,
) -> list[executor_pb2.StepPlan]:  # fmt: skip
    """Plans 1..num_steps: `num_running // k` steps that fill the batch k a step, then
    steady churn (k admitted, k ending, per step)."""
    rng = random.Random(seed)
    max_tokens = num_running // k
    free_pages = list(range(num_running * 2 * (-(-(prompt_len + max_tokens) // page_size))))[::-1]
    live: dict[str, tuple[int, list[int]]] = {}  # req_id -> (step admitted, pages)
    ended: dict[int, list[str]] = defaultdict(list)  # step -> ids the scheduler forgets then
    messages = []
    for step_id in range(1, num_steps + 1):
        running, finished = [], ended.pop(step_id, [])
        for req_id in finished:
            free_pages.extend(live.pop(req_id)[1])
        for req_id, (admitted, pages) in live.items():
            position = prompt_len + step_id - admitted - 1  # the decoded token's position
            if position >= prompt_len + max_tokens - 1:
                running.append(RunningSequence(req_id, 1))  # ended a step ago: skipped
                continue
            appended = []
            if position // page_size >= len(pages):
                appended = [free_pages.pop()]
                pages.extend(appended)
            running.append(RunningSequence(req_id, 1, appended))
        new = []
        for i in range(k):
            req_id = f"s{step_id}-{i}"
            pages = [free_pages.pop() for _ in range(-(-(prompt_len + 1) // page_size))]
            prompt = [rng.randrange(3, vocab) for _ in range(prompt_len)]
            sampling = sampling_mix(rng, max_tokens)
            new.append(NewSequence(req_id, prompt, prompt_len, 0, prompt_len, pages, sampling))
            live[req_id] = (step_id, pages)
            ended[step_id + max_tokens + 1].append(req_id)  # its last token at step + max - 1
        plan = StepPlan(step_id, new_seqs=new, running_seqs=running, finished_req_ids=finished)
        messages.append(wire.plan_to_proto(plan))
    return messages


class Phases:
    """Seconds per phase, summed over the steps timed (while `on`)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.on = False

    @contextlib.contextmanager
    def timed(self, name: str) -> Iterator[None]:
        if not self.on:
            yield
            return
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - start

    def wrap(self, name: str, fn: Callable) -> Callable:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self.on:
                return fn(*args, **kwargs)
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - start

        return timed


@contextlib.contextmanager
def instrumented(core: ExecutorCore, phases: Phases) -> Iterator[None]:
    """The core's phases timed into `phases` (module and class attributes, restored after)."""
    patches = [
        (wire, "_new_seq_from_proto", "new_seq_decode"),
        (executor_module, "prepare_batch", "prepare_batch"),
        (StepSampler, "inputs", "sampling_inputs"),
    ]
    saved = [(owner, attr, getattr(owner, attr)) for owner, attr, _ in patches]
    admit = core._admit
    try:
        for owner, attr, name in patches:
            setattr(owner, attr, phases.wrap(name, getattr(owner, attr)))
        core._admit = phases.wrap("admit", admit)  # type: ignore[method-assign]
        yield
    finally:
        for owner, attr, fn in saved:
            setattr(owner, attr, fn)
        del core._admit


def fixed_logits(core: ExecutorCore, seed: int) -> None:
    """The model's forward replaced by fixed logits (the same rows every step)."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(
        core.config.max_num_batched_tokens, core.sampler.vocab_size, generator=generator
    ).to(core.device)

    def forward(batch: Any, kv_pool: Any) -> torch.Tensor:
        return logits[: batch.logits_indices.shape[0]]

    core.model.forward = forward  # type: ignore[method-assign]
    core.forward.decode = core.forward.verify = core.forward.extend = None


def run_round(
    core: ExecutorCore, messages: list[executor_pb2.StepPlan], warmup: int, phases: Phases
) -> str:
    """Every plan once, from an empty core; the first `warmup` steps untimed. Returns the
    digest of the tokens sampled."""
    digest = hashlib.sha256()
    for i, msg in enumerate(messages):
        phases.on = i >= warmup
        with phases.timed("plan_decode"):
            plan = wire.plan_from_proto(msg)
        with phases.timed("prepare"):
            prepared = core.prepare(plan)
        with phases.timed("launch"):
            launched = core.launch(prepared)
        with phases.timed("finish"):
            result = core.finish(launched)
        with phases.timed("result_build"):
            wire.result_to_proto(result)
        if any(out.finish_reason not in (None, "length") for out in result.outputs):
            raise RuntimeError(f"step {plan.step_id}: an unexpected finish")
        digest.update(repr([(o.req_id, o.token_id) for o in result.outputs]).encode())
    phases.on = False
    return digest.hexdigest()[:16]


def measure(args: argparse.Namespace, model: str, k: int) -> dict[str, Any]:
    max_tokens = args.running // k
    pages_per_seq = -(-(args.prompt_len + max_tokens) // args.page_size)
    config = ExecutorConfig(
        model_path=model, device="cpu", page_size=args.page_size,
        num_pages=args.running * 2 * pages_per_seq, max_num_seqs=args.running + 2 * k,
        max_num_batched_tokens=max(8192, k * args.prompt_len + args.running),
    )  # fmt: skip
    warmup = max_tokens + 2  # the batch fills, then the timed steps churn
    messages: list[executor_pb2.StepPlan] = []
    rounds, digests = [], set()
    for _ in range(args.rounds):  # a fresh core each: the same seeds drawn, the same tokens
        core = ExecutorCore(config)
        fixed_logits(core, args.seed)
        messages = messages or churn_plans(
            args.running, k, args.prompt_len, warmup + args.steps, args.page_size,
            core.sampler.vocab_size, args.seed,
        )  # fmt: skip
        phases = Phases()
        hold_tuned_gc()  # the collector as the service runs it once loaded (main.py)
        try:
            with instrumented(core, phases):
                digests.add(run_round(core, messages, warmup, phases))
        finally:
            core.shutdown()
            release_tuned_gc()
        rounds.append(phases.seconds)
    if len(digests) != 1:
        raise RuntimeError(f"rounds sampled different tokens: {sorted(digests)}")

    def us(seconds: dict[str, float], name: str) -> float:
        if name == "prepare_rest":
            inner = ("admit", "prepare_batch")
            return (seconds["prepare"] - sum(seconds[n] for n in inner)) / args.steps * 1e6
        if name == "prepare_batch":
            return (seconds["prepare_batch"] - seconds["sampling_inputs"]) / args.steps * 1e6
        return seconds[name] / args.steps * 1e6

    row: dict[str, Any] = {"running": args.running, "k": k, "max_tokens": max_tokens}
    for name in PHASES:
        row[name] = round(min(us(r, name) for r in rounds), 1)
    row["host"] = round(min(sum(us(r, n) for n in HOST_PHASES) for r in rounds), 1)
    row["tokens_digest"] = digests.pop()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="model folder (default: the tiny model)")
    parser.add_argument("--running", type=int, default=256, help="sequences running per step")
    parser.add_argument("--k", type=int, nargs="+", default=[8, 16], help="admitted per step")
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=200, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-threads", type=int, default=1)
    parser.add_argument("--json", default=None, help="also write the rows here")
    args = parser.parse_args()
    configure_logging("executor-bench", "warning")
    torch.set_num_threads(args.num_threads)
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            from mesh.tiny_model import write_tiny_model

            model = str(write_tiny_model(Path(tmp) / "tiny"))
        rows = [measure(args, model, k) for k in args.k]
    print("us per step (best round): " + ", ".join(("k", *PHASES, "host")))
    for row in rows:
        print(
            f"running {row['running']}, k {row['k']:2d}: "
            + ", ".join(f"{name} {row[name]:.0f}" for name in (*PHASES, "host"))
            + f"; tokens {row['tokens_digest']}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
