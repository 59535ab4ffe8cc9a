"""A device for CPU runs: the model's forward waits a fixed time with the interpreter lock
released, as a step thread does while a GPU runs, and returns fixed logits.

    python bench/engine.py --device cpu --stand-in-device-ms 1.9 --num-requests 64 --mode both

On a CPU the tiny model's forward is hundreds of milliseconds at batch 64, so
what the service path adds to a step (the Step stream, the scheduler process,
the interpreter lock shared by the executor's step thread and its gRPC loop)
disappears in it. With the stand-in every step costs the host work of both
modes plus the same device time; the difference between `inprocess` and
`services` is what the mesh adds, on a machine without a GPU. Relative numbers
only: a GPU host's cores are faster and more numerous than a build VM's.

`bench/engine.py --stand-in-device-ms X` installs it in the in-process engine
(`install`) and starts the executor service through this file (`main`: the
executor's own flags, after `--device-ms X`).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from services.executor.core.executor import ExecutorCore


def install(
    core: ExecutorCore,
    device_ms: float,
    seed: int = 0,
    hashed: bool = False,
    spec_ratio: float | None = None,
) -> None:
    """Replace `core`'s forward: fixed logits (`executor_churn.fixed_logits`), each step
    after a `device_ms` wait. `hashed`: logits whose text never repeats
    (`spec_host.hashed_forward`), as on random prompts, in place of the fixed ones (each
    greedy sequence of those repeats one token). `spec_ratio` (with `hashed`): the
    proposer's switch as a GPU's start-up would set it, every bucket's verify/decode ratio
    `spec_ratio`, so a speculating core's steps decline and it says so after each one."""
    if device_ms < 0:
        raise ValueError(f"device_ms must be >= 0, got {device_ms}")
    if hashed:
        from bench.spec_host import hashed_forward

        core.model.forward = hashed_forward(core.info.vocab_size)  # type: ignore[method-assign]
        core.forward.decode = core.forward.verify = core.forward.extend = None
    else:
        from bench.executor_churn import fixed_logits

        fixed_logits(core, seed)
    if spec_ratio is not None:
        if not hashed:
            raise ValueError("a speculation ratio needs hashed logits (fixed ones repeat)")
        install_switch(core, spec_ratio)
    logits, seconds = core.model.forward, device_ms / 1000.0

    def forward(batch: Any, kv_pool: Any) -> torch.Tensor:
        time.sleep(seconds)  # releases the interpreter lock, as a wait on a device does
        return logits(batch, kv_pool)

    core.model.forward = forward  # type: ignore[method-assign]


def install_switch(core: ExecutorCore, spec_ratio: float) -> None:
    """`install`'s proposer switch: measured as `spec_ratio` at every bucket."""
    from bench.spec_host import stand_in_switch

    if core.proposer is None:
        raise ValueError("a speculation ratio needs the executor's --speculative on")
    k = core.config.speculative.max_draft_tokens
    core.spec_switch = stand_in_switch(core.info.max_speculative_batch_size, spec_ratio, k)


def main(argv: list[str]) -> int:
    """`--device-ms X [--hashed] [--spec-ratio R]` then the executor service's flags: the
    service, with the stand-in."""
    if len(argv) < 2 or argv[0] != "--device-ms":
        print(
            "usage: device_stand_in.py --device-ms X [--hashed] [--spec-ratio R] <executor flags>",
            file=sys.stderr,
        )
        return 2
    device_ms, rest = float(argv[1]), argv[2:]
    hashed = rest[:1] == ["--hashed"]
    rest = rest[1:] if hashed else rest
    spec_ratio = None
    if rest[:1] == ["--spec-ratio"]:
        spec_ratio, rest = float(rest[1]), rest[2:]
    from services.executor import main as executor_main
    from services.executor.server import ExecutorServicer

    attach = ExecutorServicer.attach

    def attach_with_stand_in(self: ExecutorServicer, core: Any, *args: Any, **kw: Any) -> None:
        install(core, device_ms, hashed=hashed, spec_ratio=spec_ratio)
        attach(self, core, *args, **kw)

    ExecutorServicer.attach = attach_with_stand_in  # type: ignore[method-assign]
    return executor_main.main(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
