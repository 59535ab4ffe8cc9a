"""The host work of a step that verifies drafts, per phase, on the CPU.

On a host-bound model a verifying step cannot overlap its host work with the step before:
its drafts continue the token sampled last, so its prepare waits for that step to end,
and everything from there to its result is on the critical path (on a lent H100 with the
33M-parameter trained model a batch-1 verifying step took 1.1 ms where a plain decode
took 0.65 ms). This measures that work without a GPU, on the default tiny model with its
forward replaced by `bench.spec_host.copying_forward` (every sequence continues the text
its prompt repeats, so every draft is accepted unless `--miss-every` says otherwise), half
of each batch greedy and half sampled with a seed (the logits so sharp that a draw keeps
the copied token).

    python bench/verify_host.py                            # ngram, suffix at b1 and b8
    python bench/verify_host.py --modes ngram --batch-sizes 1 --rounds 9
    python bench/verify_host.py --miss-every 7             # some drafts rejected
    py-spy record --format raw -r 1000 -o /tmp/verify.raw -- python bench/verify_host.py

The in-process engine (`mesh.engine.Engine`) serves each batch once, its scheduler
planning and its pipeline running the steps, while the steps its executor core prepares
are recorded. They are then replayed on a fresh core per round, in one thread:
`drafting`, `prepare` (or `prepare_next`), `execute`, as the pipeline calls them for a
step that may draft.
In the engine the event loop shares the interpreter with the step and prepare threads,
and the waits for it (which a scheduler in its own process does not cause) vary by a
tenth from run to run on the build VM; the replay's do not exist. Speculation is forced
on by a switch whose start-up table has every bucket's verify/decode ratio at 1.0 and
that never replaces it with measured wall times nor runs plain probes (`FixedSwitch`), so
the engine and every replay draft in the same steps: the replay's tokens must equal the
engine's.

Reported per verifying step, in microseconds of wall time (perf_counter; the best round of
`--rounds`, after one untimed round; each phase's nested phases taken out):

- choose: `ExecutorCore.drafting` (whether the step may draft; it runs before the
  prepare waits for the step before, so it is off the critical path);
- propose: the proposer's lookups (`Proposer.propose`, its n-gram index's update within);
- draft_rest: the rest of `step_drafts` (draft lengths, the switch's bookkeeping);
- prepare_batch: `step_batch.prepare_batch` (the extend's host arrays and upload);
- prepare_rest: the rest of `ExecutorCore.prepare` (drops, plan checks, page tables);
- forward: the stand-in forward (the device's work on a GPU; not counted as host);
- sampling_inputs: `StepSampler.inputs` for the verified rows;
- sample: `Sampler.sample` (on CPU its arithmetic; the device's work on a GPU, and not
  counted as host);
- verify: the rest of `Verifier.sample` (accept or reject each draft, the last tokens);
- accept: `Verifier.finish` (appending the kept tokens, finish checks, the counters);
- execute_rest: the rest of `ExecutorCore.execute` (the batch's device tokens, grammar
  rows, the finish loop, the switch's gains);
- result: `ExecutorCore._result` (the switch's answer for the scheduler, the suffix
  index's intake, the step clock);
- host: the sum of the critical-path host phases (all but choose, forward and sample).

`digest` is a hash of every request's output tokens, the same for two builds that emit the
same tokens; a replay whose tokens differ from the engine's fails the run.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import random
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from bench.spec_host import COPY_PERIOD, copy_text, copying_forward
from mesh.engine import Engine, EngineConfig
from radixmesh.sampling import SamplingParams
from radixmesh.speculation import SpecUsage
from radixmesh.step import StepPlan, StepResult
from services.common.gc_policy import hold_tuned_gc, release_tuned_gc
from services.executor.core import executor as executor_module
from services.executor.core.executor import ExecutorCore
from services.executor.core.sampling import Sampler
from services.executor.core.spec import SpeculativeConfig
from services.executor.core.spec.switch import SpecSwitch
from services.executor.core.spec.verifier import Verifier
from services.executor.core.step_sampling import StepSampler
from services.scheduler.core import SchedulerConfig

PHASES = (
    "choose", "propose", "draft_rest", "prepare_batch", "prepare_rest", "forward",
    "sampling_inputs", "sample", "verify", "accept", "execute_rest", "result",
)  # fmt: skip
OFF_PATH = ("choose", "forward", "sample")
"""Not host work on a verifying step's critical path: see the module docstring."""
HOST_PHASES = tuple(p for p in PHASES if p not in OFF_PATH)
BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
HEADER_LEN = 8
"""Each prompt begins with this many tokens of its own (the hashed half of the
vocabulary), so no two sequences share a prompt; the copied text follows, by position."""
SHARPNESS = 40.0
"""The stand-in's logits are scaled by this: a seeded draw at temperature 0.8 keeps the
copied token (the other tokens' share is about vocab * e^-50)."""


class FixedSwitch(SpecSwitch):
    """A switch that keeps its start-up table: no step's wall time replaces a ratio and no
    plain probe runs, so which steps draft follows the plans and the tokens alone (the
    same in the engine and in every replay)."""

    def observe_step(self, num_decodes: int, seconds: float, speculating: bool) -> None:
        return None

    def plain_probe(self, num_decodes: int) -> int:
        return 0


def fixed_switch(batch: int, num_speculative_tokens: int) -> FixedSwitch:
    """Every bucket's verify/decode ratio 1.0, as a GPU's start-up timing would set it."""
    return FixedSwitch(
        batch, {b: 1.0 for b in BUCKETS if b <= batch}, max_gain=num_speculative_tokens + 1
    )


class Phases:
    """Seconds per phase of the verifying steps, their nested phases taken out."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.num_steps = 0
        self._step: dict[str, float] = defaultdict(float)
        self._stack: list[float] = []

    def wrap(self, name: str, fn: Callable) -> Callable:
        def timed(*args: Any, **kwargs: Any) -> Any:
            self._stack.append(0.0)  # the nested phases' seconds
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                took = time.perf_counter() - start
                nested = self._stack.pop()
                self._step[name] += took - nested
                if self._stack:
                    self._stack[-1] += took

        return timed

    def commit(self, verifying: bool) -> None:
        """The step's phases: added when it verified drafts, else dropped."""
        step, self._step = self._step, defaultdict(float)
        if verifying:
            for name, seconds in step.items():
                self.seconds[name] += seconds
            self.num_steps += 1


@contextmanager
def instrumented(core: ExecutorCore, phases: Phases) -> Iterator[None]:
    """The core's inner phases timed into `phases` (class, module and instance attributes,
    restored after)."""
    patches = [
        (executor_module, "step_drafts", "draft_rest"),
        (executor_module, "prepare_batch", "prepare_batch"),
        (StepSampler, "inputs", "sampling_inputs"),
        (Sampler, "sample", "sample"),
        (Verifier, "sample", "verify"),
        (Verifier, "finish", "accept"),
    ]
    saved = [(owner, attr, getattr(owner, attr)) for owner, attr, _ in patches]
    proposer, forward = core.proposer, core.model.forward
    try:
        for owner, attr, name in patches:
            setattr(owner, attr, phases.wrap(name, getattr(owner, attr)))
        core._result = phases.wrap("result", core._result)  # type: ignore[method-assign]
        proposer.propose = phases.wrap("propose", proposer.propose)  # type: ignore[union-attr]
        core.model.forward = phases.wrap("forward", forward)  # type: ignore[method-assign]
        yield
    finally:
        for owner, attr, fn in saved:
            setattr(owner, attr, fn)
        del core._result
        del proposer.propose  # type: ignore[union-attr]
        core.model.forward = forward  # type: ignore[method-assign]


def stand_in(vocab_size: int, miss_every: int) -> Callable:
    """`copying_forward`'s logits, sharpened (SHARPNESS); with `miss_every` a copying
    sequence's token at every position p with p % miss_every == 0 is another text token,
    so the draft that guessed the copy there is rejected (its later tokens copy again)."""
    copying = copying_forward(vocab_size)
    table = torch.tensor(copy_text(vocab_size, COPY_PERIOD))
    half = vocab_size // 2

    def forward(batch: Any, kv_pool: Any) -> torch.Tensor:
        logits = copying(batch, kv_pool)
        if miss_every:
            rows = batch.logits_indices
            positions = batch.positions[rows].long() + 1  # the sampled token's position
            ids = batch.input_ids[rows].long()
            miss = torch.nonzero((ids < half) & (positions % miss_every == 0)).flatten()
            if len(miss):
                logits[miss] = 0.0
                logits[miss, table[(positions[miss] + 7) % COPY_PERIOD]] = 1.0
        return logits * SHARPNESS

    return forward


def prompts(vocab_size: int, batch: int, prompt_len: int, seed: int) -> list[list[int]]:
    """Each sequence's own header (the hashed half), then the copied text by position."""
    rng = random.Random(seed)
    text = copy_text(vocab_size, COPY_PERIOD)
    half = vocab_size // 2
    return [
        [rng.randrange(half, vocab_size) for _ in range(HEADER_LEN)]
        + [text[p % COPY_PERIOD] for p in range(HEADER_LEN, prompt_len)]
        for _ in range(batch)
    ]


def samplings(batch: int, output_len: int) -> list[SamplingParams]:
    """Half greedy, half sampled with a seed of their own."""
    common: dict[str, Any] = {"max_tokens": output_len, "ignore_eos": True}
    return [
        SamplingParams(temperature=0.0, **common)
        if i % 2 == 0
        else SamplingParams(temperature=0.8, seed=1000 + i, **common)
        for i in range(batch)
    ]


class Outputs:
    """Each request's tokens, in the order the core's step results emit them."""

    def __init__(self) -> None:
        self.tokens: dict[str, list[int]] = defaultdict(list)

    def add(self, result: StepResult) -> None:
        for out in result.outputs:
            if out.token_id is not None:
                self.tokens[out.req_id] += [*out.accepted_token_ids, out.token_id]

    def digest(self) -> str:
        return hashlib.sha256(repr(sorted(self.tokens.items())).encode()).hexdigest()[:16]


def engine_config(args: argparse.Namespace, mode: str, batch: int) -> EngineConfig:
    return EngineConfig.for_model(
        args.model,
        scheduler=SchedulerConfig(max_num_seqs=batch, max_queue_len=4096),
        device="cpu",
        max_num_seqs=batch,
        overlap_prepare=True,  # as on CUDA: a verifying step's prepare waits for the step before
        speculative=SpeculativeConfig(
            method=mode, max_draft_tokens=args.num_speculative_tokens, max_batch_size=batch
        ),
    )


async def record(
    args: argparse.Namespace, mode: str, batch: int
) -> tuple[Any, list[tuple[StepPlan, int]], Outputs]:
    """The engine serves the batch once: its core's config, the steps it prepared in
    order (each its plan and which of the plan's steps it is), and the tokens its results
    emitted (each compared with the stream's)."""
    steps: list[tuple[StepPlan, int]] = []
    outputs = Outputs()
    async with Engine(engine_config(args, mode, batch)) as engine:
        core = engine.executors[0]
        vocab_size = core.info.vocab_size
        core.model.forward = stand_in(vocab_size, args.miss_every)
        core.spec_switch = fixed_switch(batch, args.num_speculative_tokens)
        prepare, prepare_next, execute = core.prepare, core.prepare_next, core.execute

        def recorded_prepare(plan: StepPlan, *rest: Any) -> Any:
            steps.append((plan, 0))
            return prepare(plan, *rest)

        def recorded_next(plan: StepPlan, substep: int) -> Any:
            steps.append((plan, substep))
            return prepare_next(plan, substep)

        def recorded_execute(prepared: Any) -> StepResult:
            result = execute(prepared)
            outputs.add(result)
            return result

        core.prepare, core.prepare_next = recorded_prepare, recorded_next  # type: ignore[method-assign]
        core.execute = recorded_execute  # type: ignore[method-assign]
        ids, streamed = [], []
        for prompt, sampling in zip(
            prompts(vocab_size, batch, args.prompt_len, args.seed),
            samplings(batch, args.output_len),
            strict=True,
        ):
            req_id = f"r{len(ids)}"
            ids.append(req_id)
            streamed.append(collect(await engine.generate(prompt, sampling, req_id=req_id)))
        done = await asyncio.gather(*streamed)
        config = core.config
    if dict(zip(ids, done, strict=True)) != dict(outputs.tokens):
        raise RuntimeError(f"{mode} b{batch}: the streams differ from the core's results")
    return config, steps, outputs


async def collect(stream: Any) -> list[int]:
    tokens: list[int] = []
    async for update in stream:
        if update.error is not None:
            raise update.error
        tokens += update.token_ids
    return tokens


def replay(
    args: argparse.Namespace, config: Any, steps: list[tuple[StepPlan, int]], batch: int
) -> tuple[Phases, Outputs, SpecUsage]:
    """The steps on a fresh core, one thread, as the pipeline runs a step that may draft:
    its drafting choice, its prepare (`prepare_next` for a multi-step plan's later
    steps), its execute. The phases of the verifying steps, the tokens emitted, and the
    drafts' counts."""
    core = ExecutorCore(config)
    core.model.forward = stand_in(core.info.vocab_size, args.miss_every)  # type: ignore[method-assign]
    core.spec_switch = fixed_switch(batch, args.num_speculative_tokens)
    phases, outputs = Phases(), Outputs()
    choose, execute = (
        phases.wrap("choose", core.drafting),
        phases.wrap("execute_rest", core.execute),
    )
    prepare = phases.wrap("prepare_rest", core.prepare)
    prepare_next = phases.wrap("prepare_rest", core.prepare_next)
    hold_tuned_gc()  # the collector as the service runs it once loaded
    try:
        with instrumented(core, phases):
            for plan, substep in steps:
                choice = choose(plan, substep)
                prepared = prepare_next(plan, substep) if substep else prepare(plan, choice)
                outputs.add(execute(prepared))
                phases.commit(prepared.drafts is not None)
    finally:
        core.shutdown()
        release_tuned_gc()
    usage = core.spec_stats.snapshot()
    return phases, outputs, usage


def measure(args: argparse.Namespace, mode: str, batch: int) -> dict[str, Any]:
    """One row: the engine's run recorded, one untimed replay, then `--rounds` timed ones."""
    config, steps, served = asyncio.run(record(args, mode, batch))
    rounds = []
    for repeat in range(args.rounds + 1):
        phases, outputs, usage = replay(args, config, steps, batch)
        if outputs.tokens != served.tokens:
            raise RuntimeError(f"{mode} b{batch}: replay {repeat} emitted other tokens")
        if repeat:
            rounds.append(phases)

    def us(phases: Phases, names: tuple[str, ...]) -> float:
        return sum(phases.seconds.get(n, 0.0) for n in names) / max(1, phases.num_steps) * 1e6

    row: dict[str, Any] = {"mode": mode, "batch": batch}
    for name in PHASES:
        row[name] = round(min(us(p, (name,)) for p in rounds), 1)
    row["host"] = round(min(us(p, HOST_PHASES) for p in rounds), 1)
    row["steps"] = len(steps)
    row["verifying_steps"] = rounds[0].num_steps
    row["accepted_per_draft"] = round(usage.num_accepted_tokens / max(1, usage.num_drafts), 2)
    row["acceptance"] = round(usage.num_accepted_tokens / max(1, usage.num_draft_tokens), 3)
    row["digest"] = served.digest()
    return row


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default=None, help="model folder (default: the tiny model)")
    p.add_argument("--modes", nargs="+", default=["ngram", "suffix"])
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--num-speculative-tokens", type=int, default=4)
    p.add_argument(
        "--miss-every",
        type=int,
        default=0,
        help="a copying sequence's token at every position divisible by this is "
        "not the copy (0: every draft accepted)",
    )
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-threads", type=int, default=1)
    p.add_argument("--json", default=None, help="also write the rows here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    args = parse_args(argv)
    if args.model is None:
        from mesh.tiny_model import ensure_default_model

        args.model = str(ensure_default_model())
    torch.set_num_threads(args.num_threads)
    rows = [measure(args, mode, b) for mode in args.modes for b in args.batch_sizes]
    print("us per verifying step (best round): " + ", ".join((*PHASES, "host")))
    for row in rows:
        print(
            f"{row['mode']:<6} b{row['batch']:<3} "
            + ", ".join(f"{name} {row[name]:.0f}" for name in (*PHASES, "host"))
            + f"; {row['verifying_steps']} of {row['steps']} steps verify, "
            f"{row['accepted_per_draft']} accepted a draft; digest {row['digest']}"
        )
    digest = hashlib.sha256("".join(r["digest"] for r in rows).encode()).hexdigest()[:16]
    print(f"all outputs digest {digest}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))
    return rows


if __name__ == "__main__":
    main()
