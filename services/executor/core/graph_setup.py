"""Which CUDA graphs an executor captures, the memory they take, and what they cost.

Two sets of `StepGraphs` (cuda_graphs.py): plain decodes (1 row per sequence, every
bucket up to max_num_seqs) and, with speculative decoding or jump-forward on, steps that
verify drafts at max(k, max forced tokens) + 1 rows per sequence; with
`extend_graph_tokens` also `ExtendGraphs` (extend_graphs.py) for the other steps of up to
that many tokens. Decode graphs are captured at each page-table width the decode attention
has a path for (`decode_graph_widths`: the one-launch path's short tables, and the whole
table). Jump-forward drafts at any batch size, and a measured speculation switch needs
every bucket timed, so the verification set then covers every bucket too; a cap set by
hand bounds it otherwise.

The graphs' memory (one pool, one logits buffer: see `capture_all`) is estimated before
the KV pool is sized (`estimate_graph_bytes`, subtracted from its budget), then measured
when they are captured; a measurement above the estimate is logged as a warning.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from radixmesh_kernels.batch_invariant import workspace_bytes
from radixmesh_kernels.paged_decode_attention import decode_graph_widths
from services.common.logging import get_logger
from services.executor.core.config import ExecutorConfig
from services.executor.core.cuda_graphs import (
    StepGraphs,
    batch_buckets,
    capture_all,
    pages_per_seq,
)
from services.executor.core.extend_graphs import MAX_COPY_SLOTS, ExtendGraphs, extend_shapes
from services.executor.core.kv_pool import KVPool
from services.executor.core.models import ModelSpec
from services.executor.core.models.decoder import Decoder
from services.executor.core.models.tensor_parallel import TensorParallel
from services.executor.core.spec.switch import UNMEASURED_MAX_BATCH_SIZE, SpecSwitch, StepTimings

log = get_logger(__name__)

GRAPH_OVERHEAD_BYTES = 4 << 20
"""Per captured graph: its executable's device memory and allocator rounding (a bound)."""
GRAPH_SLACK_BYTES = 64 << 20
"""Once per executor: the cuBLAS workspace of the capture stream, kernels loaded."""
TIMED_CONTEXT = 512
"""Context length of the timed steps' sequences (their attention reads this many keys)."""


@dataclass(frozen=True, slots=True)
class GraphPlan:
    decode_seqs: int
    """Largest bucket of the decode graphs."""
    verify_seqs: int = 0
    """Largest bucket of the verification graphs; 0: none."""
    verify_rows: int = 1
    """Rows per sequence of the verification graphs: max(k, max forced tokens) + 1."""
    batch_invariant: bool = False
    """The executor's batch-invariant mode: its decode attention's split partials and an
    extend's per-row page table count in the graphs' memory."""
    extend_tokens: int = 0
    """Most tokens of the extend graphs (extend_graphs.py); 0: none."""
    extend_seqs: int = 0
    """Largest sequence bucket of the extend graphs."""

    def shapes(self) -> list[tuple[int, int]]:
        """(largest bucket, rows per sequence) of each set."""
        sets = [(self.decode_seqs, 1)]
        if self.verify_seqs:
            sets.append((self.verify_seqs, self.verify_rows))
        return sets


def plan_graphs(config: ExecutorConfig, max_forced_tokens: int) -> GraphPlan:
    """The graphs an executor with CUDA graphs on captures. `max_forced_tokens`: the
    jump-forward run cap when jump-forward runs, else 0."""
    speculative = config.speculative
    draft = speculative.max_draft_tokens if speculative.enabled else 0
    rows = max(draft, max_forced_tokens) + 1
    extend = {
        "extend_tokens": config.extend_graph_tokens,
        "extend_seqs": min(config.max_num_seqs, config.extend_graph_tokens),
    }
    if rows == 1:
        return GraphPlan(config.max_num_seqs, batch_invariant=config.batch_invariant, **extend)
    seqs = config.max_num_seqs
    if not max_forced_tokens and speculative.max_batch_size is not None:
        seqs = min(seqs, speculative.max_batch_size)  # a fixed cap: no drafts above it
    return GraphPlan(config.max_num_seqs, seqs, rows, config.batch_invariant, **extend)


def estimate_graph_bytes(
    plan: GraphPlan,
    spec: ModelSpec,
    dtype: torch.dtype,
    vocab_size: int,
    max_model_len: int,
    page_size: int,
) -> int:
    """A bound on the device memory the plan's graphs hold: the largest capture's
    activations and logits (the others reuse its pool), the shared float32 logits
    buffer, the static inputs, and an allowance per graph; in the batch-invariant mode also
    its decode attention's workspace."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    per_token = 4 * spec.hidden_size + spec.q_size + 2 * spec.kv_size + 3 * spec.intermediate_size
    shapes = plan.shapes()
    rows = max(seqs * r for seqs, r in shapes)
    activations = rows * (per_token * itemsize + vocab_size * (itemsize + 4))
    logits_buffer = rows * vocab_size * 4
    inputs = sum(
        seqs * r * 3 * 8 + seqs * 4 * (1 + pages_per_seq(max_model_len, page_size, r))
        for seqs, r in shapes
    )
    num_graphs = sum(
        len(batch_buckets(seqs)) * len(set_widths(max_model_len, page_size, r))
        for seqs, r in shapes
    )
    overhead = num_graphs * GRAPH_OVERHEAD_BYTES + GRAPH_SLACK_BYTES
    if plan.extend_tokens:  # its largest capture's activations, each graph's kept hidden states
        extend_graphs = extend_shapes(plan.extend_tokens, plan.extend_seqs)
        activations = max(
            activations,
            plan.extend_tokens * per_token * itemsize
            + plan.extend_seqs * vocab_size * (itemsize + 4),
        )
        logits_buffer = max(logits_buffer, plan.extend_seqs * vocab_size * 4)
        inputs += plan.extend_tokens * 3 * 8 + plan.extend_seqs * 4 * (
            3 + pages_per_seq(max_model_len, page_size, 1)
        ) + 2 * MAX_COPY_SLOTS * 8
        inputs += sum(t * spec.hidden_size * itemsize for t, _ in extend_graphs)
        overhead += len(extend_graphs) * GRAPH_OVERHEAD_BYTES
    if plan.batch_invariant:
        activations += max(
            workspace_bytes(
                seqs * r, spec.num_heads, spec.head_dim,
                pages_per_seq(max_model_len, page_size, r), page_size, spec.sliding_window,
            )
            for seqs, r in shapes
        )  # fmt: skip
    return activations + logits_buffer + inputs + overhead


def set_widths(max_model_len: int, page_size: int, num_rows: int) -> list[int]:
    """The page-table widths a set of graphs of `num_rows` rows is captured at."""
    pages = pages_per_seq(max_model_len, page_size, num_rows)
    return decode_graph_widths(pages, page_size) if num_rows == 1 else [pages]


@dataclass(slots=True)
class CapturedGraphs:
    decode: StepGraphs
    verify: StepGraphs | None
    estimated_bytes: int
    measured_bytes: int
    extend: ExtendGraphs | None = None


def capture_graphs(
    model: Decoder,
    kv_pool: KVPool,
    plan: GraphPlan,
    max_model_len: int,
    estimated_bytes: int,
    startup_seconds: dict[str, float] | None = None,
) -> CapturedGraphs:
    """Builds and captures the plan's graphs (writing padding into the pool's first
    scratch page); logs their measured memory against the estimate. The capture's wall
    time goes to startup_seconds["capture_graphs"]."""
    start = time.perf_counter()
    page_size, scratch = kv_pool.page_size, kv_pool.scratch_page_ids[0]
    device = kv_pool.k_caches[0].device

    def graphs(seqs: int, rows: int) -> StepGraphs:
        widths = set_widths(max_model_len, page_size, rows)
        return StepGraphs(model, kv_pool, seqs, rows, widths[-1], scratch, widths)

    decode = graphs(plan.decode_seqs, 1)
    verify = graphs(plan.verify_seqs, plan.verify_rows) if plan.verify_seqs else None
    extend = ExtendGraphs(
        model, kv_pool, plan.extend_tokens, plan.extend_seqs,
        pages_per_seq(max_model_len, page_size, 1), scratch,
    ) if plan.extend_tokens else None  # fmt: skip
    measured = capture_all([g for g in (decode, verify, extend) if g is not None], device)
    fields = {"estimated_bytes": estimated_bytes, "measured_bytes": measured}
    if measured > estimated_bytes:
        log.warning("cuda_graph_memory_over_estimate", **fields)
    else:
        log.info("cuda_graph_memory", **fields)
    if startup_seconds is not None:
        startup_seconds["capture_graphs"] = time.perf_counter() - start
    return CapturedGraphs(decode, verify, estimated_bytes, measured, extend)


def time_steps(
    decode: StepGraphs,
    verify: StepGraphs,
    *,
    replays: int = 4,
    trials: int = 3,
    context: int = TIMED_CONTEXT,
) -> dict[int, tuple[float, float]]:
    """Seconds of one replay of the decode graph and of the verification graph per
    bucket both have (powers of two and the largest), each the best of `trials` means
    over `replays` replays, timed with CUDA events. Every sequence is a padding sequence
    of `context` keys (its page table all scratch), so nothing but the scratch page is
    written; the buffers are padding again after."""
    device = decode.input_ids.device
    shared = sorted(set(decode.buckets) & set(verify.buckets))
    timed = [b for b in shared if b & (b - 1) == 0 or b == shared[-1]]
    table: dict[int, tuple[float, float]] = {}
    for graphs in (decode, verify):
        cap = graphs.max_pages_per_seq * graphs.kv_pool.page_size - graphs.num_rows
        graphs.seq_lens.fill_(max(min(context, cap), 1) + graphs.num_rows)
    try:
        for bucket in timed:
            table[bucket] = (
                _time_replays(decode, bucket, replays, trials, device),
                _time_replays(verify, bucket, replays, trials, device),
            )
    finally:
        for graphs in (decode, verify):
            graphs.seq_lens.fill_(graphs.num_rows)
    return table


def _time_replays(graphs: StepGraphs, bucket: int, replays: int, trials: int, device) -> float:
    graphs.replay(bucket)  # warm: the first replay uploads the graph
    best = float("inf")
    for _ in range(trials):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graphs.replay(bucket)
        end.record()
        torch.cuda.synchronize(device)
        best = min(best, start.elapsed_time(end) / 1e3 / replays)
    return best


def agree_timings(timings: StepTimings, tp: TensorParallel, device: torch.device) -> StepTimings:
    """The slowest rank's time per entry, so that every rank of a tensor-parallel group
    switches alike (each prepares the same plans and must draft the same)."""
    if tp.world_size == 1:
        return timings

    def slowest(seconds: float) -> float:
        return -tp.min_over_ranks(-round(seconds * 1e9), device) / 1e9

    return {b: (slowest(d), slowest(v)) for b, (d, v) in sorted(timings.items())}


@dataclass(frozen=True, slots=True)
class Switches:
    proposer: SpecSwitch
    """Whether a step's decodes get the proposer's drafts."""
    forced: SpecSwitch | None
    """Whether a step verifies jump-forward's forced runs; None: always (nothing measured)."""


def speculation_switches(
    config: ExecutorConfig,
    graphs: CapturedGraphs | None,
    max_forced_tokens: int,
    tp: TensorParallel,
    device: torch.device,
    startup_seconds: dict[str, float] | None = None,
) -> Switches:
    """The executor's switches (spec/switch.py). The proposer's: the fixed cap when one is
    configured, else measured from the graphs when they were captured, else the
    unmeasured cap. Jump-forward's, with graphs: a step pads every decode to the
    verification rows, so its forced runs are weighed against that cost as drafts are
    (its cap is max_num_seqs: the scheduler plans forced tokens at any batch size). The
    timing's wall time goes to startup_seconds["time_speculation"]."""
    speculative = config.speculative
    fixed = speculative.max_batch_size
    measure = graphs is not None and graphs.verify is not None and (
        max_forced_tokens > 0 or (speculative.enabled and fixed is None)
    )
    timings = None
    if measure:
        assert graphs is not None and graphs.verify is not None
        start = time.perf_counter()
        timings = agree_timings(time_steps(graphs.decode, graphs.verify), tp, device)
        if startup_seconds is not None:
            startup_seconds["time_speculation"] = time.perf_counter() - start
    if fixed is not None:
        proposer = SpecSwitch(fixed)
    elif speculative.enabled and timings is not None:
        max_gain = speculative.max_draft_tokens + 1  # the verification rows may be more
        proposer = SpecSwitch.measured(timings, max_gain, config.max_num_seqs)
        proposer.backs_off = True  # its declined steps score guesses (drafting.py)
    else:
        proposer = SpecSwitch(min(UNMEASURED_MAX_BATCH_SIZE, config.max_num_seqs))
    forced = None
    if max_forced_tokens and timings is not None:
        forced = SpecSwitch.measured(timings, max_forced_tokens + 1, config.max_num_seqs)
        forced.max_batch_size = config.max_num_seqs
    if timings is not None:
        log.info(
            "speculation_switch",
            max_batch_size=proposer.max_batch_size,
            **{
                f"b{b}_ms": f"decode {d * 1e3:.3f}, verify {v * 1e3:.3f}"
                for b, (d, v) in timings.items()
            },
        )
    return Switches(proposer, forced)
