"""Where the executor runs: device and dtype choice, its ops, context limit, KV pool sizing,
and the ExecutorInfo they add up to."""

from __future__ import annotations

import torch

from radixmesh.errors import InvalidArgument
from radixmesh.executor_info import ExecutorInfo
from radixmesh_kernels import Ops, get_ops
from radixmesh_kernels.backends import KernelBackendError, discover, load_spec, with_overrides
from radixmesh_kernels.batch_invariant import batch_invariant_ops
from services.common.logging import get_logger
from services.executor.core.config import ExecutorConfig
from services.executor.core.kv_pool import num_pages_for_budget, page_bytes
from services.executor.core.loader import DTYPES, ModelFolder
from services.executor.core.models import ModelSpec

ACTIVATION_SLACK_BYTES = 512 << 20

log = get_logger(__name__)


def resolve_ops(config: ExecutorConfig, device: torch.device) -> Ops:
    """The device's op set with the configured kernel backends in place, each checked
    against its op's torch reference first, then the batch-invariant mode's linear and
    decode attention when it is on. InvalidArgument names a refused op."""
    try:
        overrides = [load_spec(spec) for spec in config.kernel_backends]
        if config.kernel_entry_points:
            overrides += discover()
        ops = with_overrides(get_ops(device), overrides, device)
    except KernelBackendError as exc:
        raise InvalidArgument(f"executor.kernel_backends: {exc}") from None
    return batch_invariant_ops(ops, device) if config.batch_invariant else ops


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise InvalidArgument(f"executor.device {name!r}: CUDA is not available")
        index = torch.cuda.current_device() if device.index is None else device.index
        if index >= torch.cuda.device_count():
            raise InvalidArgument(f"executor.device {name!r}: no such CUDA device")
        device = torch.device("cuda", index)
    return device


def resolve_dtype(name: str, config_dtype: str | None, device: torch.device) -> torch.dtype:
    if name != "auto":
        return DTYPES[name]
    if device.type == "cpu":
        return torch.float32
    return DTYPES.get(str(config_dtype), torch.bfloat16)


def resolve_max_model_len(config: ExecutorConfig, spec: ModelSpec) -> int:
    if config.max_model_len is None:
        return spec.max_position_embeddings
    if config.max_model_len > spec.max_position_embeddings:
        raise InvalidArgument(
            f"executor.max_model_len ({config.max_model_len}) exceeds the model's "
            f"context of {spec.max_position_embeddings} positions"
        )
    return config.max_model_len


def fit_max_model_len(config: ExecutorConfig, max_model_len: int, num_pages: int) -> int:
    """The longest sequence this executor serves: `max_model_len`, at most what its whole
    KV pool holds. A longer one could never finish: it would be admitted, stream until the
    pool ran out, and fail then. A `max_model_len` given in the config that the pool cannot
    hold is refused; one taken from the model's context is lowered to the pool's (logged),
    so a prompt past it is refused at submit and an output ends there with "length"."""
    capacity = num_pages * config.page_size
    if max_model_len <= capacity:
        return max_model_len
    if config.max_model_len is not None:
        raise InvalidArgument(
            f"executor.max_model_len ({config.max_model_len}) exceeds what the KV pool holds: "
            f"{capacity} tokens ({num_pages} pages of {config.page_size}); lower it, or give "
            "the pool more pages (--num-pages, --kv-memory-fraction)"
        )
    log.warning(
        "max_model_len lowered to what the KV pool holds",
        model_context=max_model_len, pool_tokens=capacity, num_pages=num_pages,
        page_size=config.page_size,
    )  # fmt: skip
    return capacity


def activation_reserve_bytes(config: ExecutorConfig, spec: ModelSpec, dtype: torch.dtype) -> int:
    """A generous bound on the memory one step's activations and logits take."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    per_token = 4 * spec.hidden_size + spec.q_size + 2 * spec.kv_size + 3 * spec.intermediate_size
    logits = 3 * config.max_num_seqs * spec.vocab_size * 4
    return config.max_num_batched_tokens * per_token * itemsize + logits + ACTIVATION_SLACK_BYTES


def size_num_pages(
    config: ExecutorConfig,
    spec: ModelSpec,
    dtype: torch.dtype,
    device: torch.device,
    num_scratch_pages: int = 0,
    graph_bytes: int = 0,
) -> int:
    """Usable pages: config.num_pages, or what the memory budget allows after scratch pages.

    Call after the weights are loaded, so free memory excludes them. `graph_bytes`: what
    the CUDA graphs to be captured will hold (graph_setup.estimate_graph_bytes), kept
    out of the budget with the activations.
    """
    if config.num_pages is not None:
        return config.num_pages
    bytes_per_page = page_bytes(
        spec.num_layers, config.page_size, spec.num_kv_heads, spec.head_dim, dtype
    )
    if device.type != "cuda":
        budget = config.cpu_kv_bytes
    else:
        torch.cuda.empty_cache()
        free, _total = torch.cuda.mem_get_info(device)
        reserve = activation_reserve_bytes(config, spec, dtype) + graph_bytes
        budget = max(int((free - reserve) * config.kv_memory_fraction), 0)
    budget -= num_scratch_pages * bytes_per_page
    return num_pages_for_budget(budget, bytes_per_page)


def describe_executor(
    config: ExecutorConfig,
    folder: ModelFolder,
    spec: ModelSpec,
    max_model_len: int,
    num_pages: int,
    device: torch.device,
    dtype: torch.dtype,
    has_grammar: bool = False,
    max_speculative_batch_size: int = 0,
) -> ExecutorInfo:
    """What the core tells the scheduler about itself (its executor_id is left empty: the
    process or engine that runs the core names it). Jump-forward needs a grammar backend.
    `max_speculative_batch_size`: the speculation switch's cap (spec/switch.py)."""
    speculative = config.speculative
    return ExecutorInfo(
        executor_id="",
        model=config.model_name or folder.path.resolve().name,
        architecture=spec.architecture,
        vocab_size=spec.vocab_size,
        max_model_len=max_model_len,
        eos_token_ids=tuple(folder.eos_token_ids),
        page_size=config.page_size,
        num_pages=num_pages,
        device=str(device),
        dtype=str(dtype).removeprefix("torch."),
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_draft_tokens=speculative.max_draft_tokens if speculative.enabled else 0,
        max_speculative_batch_size=max_speculative_batch_size if speculative.enabled else 0,
        max_forced_tokens=max_forced_tokens(config, has_grammar, device),
    )


def max_forced_tokens(config: ExecutorConfig, has_grammar: bool, device: torch.device) -> int:
    """Jump-forward's run cap where it runs (a grammar backend, the mode on), else 0."""
    speculative = config.speculative
    if has_grammar and speculative.jump_forward_on(device.type):
        return speculative.max_forced_tokens
    return 0
