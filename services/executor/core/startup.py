"""What an executor core is built from at startup: the model's weights on the device
(this rank's shard under tensor parallelism), the KV pool sized for what is left, and on
CUDA the prefill attention choice, the prefill warm-up and the captured step graphs, each
phase timed."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from services.executor.core.config import ExecutorConfig
from services.executor.core.graph_setup import (
    CapturedGraphs,
    capture_graphs,
    estimate_graph_bytes,
    plan_graphs,
)
from services.executor.core.kv_pool import KVPool
from services.executor.core.loader import ModelFolder, load_weights, read_model_folder
from services.executor.core.models.decoder import Decoder
from services.executor.core.models.spec import ModelSpec
from services.executor.core.models.tensor_parallel import (
    TensorParallel,
    check_divisible,
    shard_spec,
    shard_weights,
    weights_to,
)
from services.executor.core.resources import (
    fit_max_model_len,
    max_forced_tokens,
    resolve_dtype,
    resolve_max_model_len,
    resolve_ops,
    size_num_pages,
)
from services.executor.core.warmup import decide_prefill_attention, warm_prefill


@dataclass(slots=True)
class LoadedModel:
    folder: ModelFolder
    spec: ModelSpec
    """The model's shape on this rank (its shard's under tensor parallelism)."""
    dtype: torch.dtype
    max_model_len: int
    model: Decoder
    kv_pool: KVPool
    num_pages: int
    graphs: CapturedGraphs | None
    """The captured step graphs (None without CUDA graphs)."""
    forced_cap: int
    """The most tokens a constraint's forced run may verify in one step."""
    startup_seconds: dict[str, float]
    """Startup phases and their wall times: load_weights, then on CUDA
    prefill_attention_choice (times the prefill attention per bucket), warm_prefill
    (compiles and tunes the prefill kernels) and capture_graphs."""


def load_model(
    config: ExecutorConfig, has_grammar: bool, tp: TensorParallel, device: torch.device
) -> LoadedModel:
    """Weights, pool and graphs of a core on `device`, for rank `tp` of its group."""
    folder = read_model_folder(config.model_path)
    spec = folder.spec
    if tp.world_size > 1:
        check_divisible(spec, tp.world_size)
    dtype = resolve_dtype(config.dtype, spec.torch_dtype, device)
    max_model_len = resolve_max_model_len(config, spec)
    start = time.perf_counter()
    if tp.world_size == 1:
        weights = load_weights(folder, dtype, device, config.quantization)
    else:  # the whole model on the host, then this rank's slices on the device
        full = load_weights(folder, dtype, torch.device("cpu"), config.quantization)
        weights = weights_to(shard_weights(full, spec, tp), device)
        del full
        spec = shard_spec(spec, tp)
    startup_seconds: dict[str, float] = {"load_weights": time.perf_counter() - start}
    model = Decoder(spec, weights, resolve_ops(config, device), max_model_len, tp)
    use_graphs = config.cuda_graphs and device.type == "cuda"
    forced_cap = max_forced_tokens(config, has_grammar, device)
    graph_plan = plan_graphs(config, forced_cap)
    graph_bytes = estimate_graph_bytes(
        graph_plan, spec, dtype, folder.spec.vocab_size, max_model_len, config.page_size
    ) if use_graphs else 0  # fmt: skip
    num_pages = size_num_pages(config, spec, dtype, device, int(use_graphs), graph_bytes)
    num_pages = tp.min_over_ranks(num_pages, device)  # one pool of page ids
    max_model_len = fit_max_model_len(config, max_model_len, num_pages)
    kv_pool = KVPool(
        spec.num_layers, num_pages, config.page_size, spec.num_kv_heads, spec.head_dim,
        dtype, device, num_scratch_pages=int(use_graphs),
    )  # fmt: skip
    if device.type == "cuda":  # every prefill attention choice before any forward
        choice = decide_prefill_attention(
            model, kv_pool, min(config.max_num_batched_tokens, max_model_len)
        )
        startup_seconds["prefill_attention_choice"] = choice.seconds
        start = time.perf_counter()
        warm_tokens = min(config.max_num_batched_tokens, max_model_len - 1, 4096)
        warm_prefill(model, kv_pool, warm_tokens, page_id=0)  # no page is held yet
        startup_seconds["warm_prefill"] = time.perf_counter() - start
    captured = capture_graphs(
        model, kv_pool, graph_plan, max_model_len, graph_bytes, startup_seconds
    ) if use_graphs else None  # fmt: skip
    return LoadedModel(
        folder, spec, dtype, max_model_len, model, kv_pool, num_pages, captured, forced_cap,
        startup_seconds,
    )  # fmt: skip
