"""On a CUDA device: once the executor core has started, a mixed run compiles nothing.

The start-up (prefill attention choice per bucket, prefill warm-up, decode graph
capture, the sampler's compiled draw) is meant to meet every kernel
specialization a request can hit. After it, this test serves a mixed workload
through the core: prompts across the prefill buckets, long prompts chunked into
extends over long page tables, decode batches that grow and shrink, greedy,
random, filtered, penalised and log-probability sampling. Every Triton kernel
specialization made in the process (`triton.knobs.runtime.jit_cache_hook`, called
on each in-memory cache miss, before the compile or the disk-cache load) and every
frame torch.compile converts (dynamo's frame counter) during the run is recorded;
the test fails naming them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mesh.tiny_model import write_tiny_model
from radixmesh.sampling import SamplingParams
from services.executor.core.config import ExecutorConfig
from services.executor.core.executor import ExecutorCore
from tests.fixtures.executor_driver import generate
from tests.unit.executor.conftest import random_prompt

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

PROMPT_LENS = (1, 5, 17, 64, 127, 200, 333, 511, 700, 1023, 1500)
SAMPLINGS = (
    SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True),
    SamplingParams(temperature=0.8, seed=5, max_tokens=12, ignore_eos=True),
    SamplingParams(temperature=1.0, top_p=0.9, top_k=40, min_p=0.05, seed=6, max_tokens=12),
    SamplingParams(
        temperature=0.0,
        max_tokens=12,
        repetition_penalty=1.2,
        frequency_penalty=0.5,
        presence_penalty=0.3,
        min_tokens=4,
    ),
    SamplingParams(temperature=0.7, seed=8, max_tokens=8, logprobs=True, top_logprobs=3),
)


def dynamo_frames() -> int:
    from torch._dynamo.utils import counters

    return sum(counters["frames"].values())


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny-compile"), arch="llama", seed=0)


def test_a_mixed_run_after_startup_compiles_no_kernel(model_dir: Path) -> None:
    from triton import knobs

    config = ExecutorConfig(
        model_path=str(model_dir), device="cuda", dtype="bfloat16", page_size=16,
        num_pages=2048, max_num_seqs=32, max_num_batched_tokens=1024,
    )  # fmt: skip
    core = ExecutorCore(config)
    compiled: list[str] = []

    def record(*, repr: str, key: object = None, configs: object = None, **_: object) -> bool:
        # triton passes these by name; the key and attributes say what specialized
        compiled.append(f"{repr} key={str(key)[:400]} attrs={str(configs)[:300]}")
        return False  # compile as usual: the test only records

    previous = knobs.runtime.jit_cache_hook
    knobs.runtime.jit_cache_hook = record
    frames_before = dynamo_frames()
    try:
        outputs = []
        for i, sampling in enumerate(SAMPLINGS):  # mixed lengths in one batch each time
            prompts = [random_prompt(n, seed=100 * i + n) for n in PROMPT_LENS]
            outputs += generate(core, prompts, sampling)
        # a lone decode, then a batch of every size class the graphs cover up to 32
        for size in (1, 2, 3, 8, 13, 32):
            prompts = [random_prompt(9 + j, seed=size * 50 + j) for j in range(size)]
            outputs += generate(core, prompts, SAMPLINGS[0])
        torch.cuda.synchronize()
    finally:
        knobs.runtime.jit_cache_hook = previous
        core.shutdown()
    frames = dynamo_frames() - frames_before
    assert all(o.token_ids for o in outputs)  # the run ran
    assert compiled == [], f"{len(compiled)} Triton specializations at request time: {compiled[:8]}"
    assert frames == 0, f"torch.compile converted {frames} frames at request time"
