"""Executor configuration: one frozen dataclass, validated at construction."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from radixmesh.errors import InvalidArgument
from services.executor.core.spec.config import SpeculativeConfig

DTYPES = ("auto", "float32", "float16", "bfloat16")
QUANTIZATIONS = ("auto", "none", "fp8")
_DEVICE_RE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")
MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class ExecutorConfig:
    model_path: str
    """A Hugging Face model folder (config.json and safetensors)."""
    model_name: str | None = None
    """Name the executor reports; None means the folder's name."""
    device: str = "auto"
    """"auto" (CUDA when present, else CPU), "cpu", "cuda" or "cuda:N"."""
    dtype: str = "auto"
    """"auto": the config's torch_dtype on CUDA, float32 on CPU."""
    quantization: str = "auto"
    """Format of the q/k/v, o, gate/up and down projections: "auto" keeps the
    checkpoint's (FP8 checkpoints stay FP8), "fp8" quantizes a bf16 checkpoint at load
    (per-row weight scales, per-token activation scales), "none" holds them in `dtype`."""
    page_size: int = 16
    """Tokens per KV page."""
    num_pages: int | None = None
    """KV pages to allocate; None sizes the pool from memory (see below)."""
    kv_memory_fraction: float = 0.85
    """On CUDA: share of the memory free after weights and activations given to the KV pool."""
    cpu_kv_bytes: int = 256 * MIB
    """On CPU: bytes given to the KV pool when num_pages is None."""
    max_num_seqs: int = 256
    """Most sequences the executor holds at once."""
    max_num_batched_tokens: int = 8192
    """Most tokens one step may run."""
    max_model_len: int | None = None
    """Context limit (prompt + output); None takes the model config's."""
    seed: int = 0
    """Seed of the executor's generator, which draws seeds for requests that give none."""
    cuda_graphs: bool = True
    """On CUDA: replay decode steps as captured graphs (one per batch-size bucket)."""
    extend_graph_tokens: int = 0
    """On CUDA with cuda_graphs: steps that are not plain decodes (extends, short prefills,
    decodes mixed with them) of at most this many tokens replay captured graphs too, one
    per token and sequence bucket (extend_graphs.py); 0: they run eagerly."""
    kernel_backends: tuple[str, ...] = ()
    """Ops replaced by a site's own implementation, as `op=module:object` or
    `module:object` (a `radixmesh_kernels.backends.KernelOverride`); see radixmesh_kernels/backends.py."""
    kernel_entry_points: bool = True
    """Also load the backends installed under the `radixmesh.kernels` entry-point group."""
    tensor_parallel_size: int = 1
    """Ranks of the tensor-parallel group this executor is (one process and one device
    each; see models/tensor_parallel.py). The group is one executor to the mesh."""
    batch_invariant: bool = False
    """A sequence's logits do not depend on the rest of the batch, its size, or whether its
    positions run as a decode or as a verification extend: one fixed-tile matmul for every
    row count, decode attention split by each row's own length, every extend's attention
    run as decode rows (radixmesh_kernels/batch_invariant.py). Greedy outputs are then the same with
    speculation on or off at any batch size, at some cost in speed. Plain (not FP8) weights
    and one rank only."""
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    """Speculative decoding (drafts from prompt lookup or recent outputs); off by default.
    A step that may draft is prepared once the step before has executed (a draft needs the
    token sampled last); one its switch declines overlaps the step before, as without."""

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> InvalidArgument:
            return InvalidArgument(f"executor.{name} {why}")

        if not self.model_path:
            raise bad("model_path", "must not be empty")
        if self.model_name is not None and not self.model_name:
            raise bad("model_name", "must not be empty when given")
        if not _DEVICE_RE.match(self.device):
            raise bad("device", f"must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        if self.dtype not in DTYPES:
            raise bad("dtype", f"must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.quantization not in QUANTIZATIONS:
            raise bad(
                "quantization",
                f"must be one of {', '.join(QUANTIZATIONS)}, got {self.quantization!r}",
            )
        if not 1 <= self.page_size <= 1024:
            raise bad("page_size", f"must be in [1, 1024], got {self.page_size}")
        if self.num_pages is not None and self.num_pages < 1:
            raise bad("num_pages", f"must be >= 1 when given, got {self.num_pages}")
        if not 0.0 < self.kv_memory_fraction <= 1.0:
            raise bad("kv_memory_fraction", f"must be in (0, 1], got {self.kv_memory_fraction}")
        if self.cpu_kv_bytes < 1:
            raise bad("cpu_kv_bytes", f"must be >= 1, got {self.cpu_kv_bytes}")
        if self.max_num_seqs < 1:
            raise bad("max_num_seqs", f"must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise bad("max_num_batched_tokens", f"must be >= 1, got {self.max_num_batched_tokens}")
        if self.extend_graph_tokens and not 32 <= self.extend_graph_tokens <= min(
            self.max_num_batched_tokens, 8192
        ):
            raise bad(
                "extend_graph_tokens",
                "must be 0 (off) or in [32, min(max_num_batched_tokens, 8192)], "
                f"got {self.extend_graph_tokens}",
            )
        if self.extend_graph_tokens and self.batch_invariant:
            raise InvalidArgument(
                "executor.extend_graph_tokens cannot be combined with executor.batch_invariant: "
                "that mode runs an extend's attention as decode rows"
            )
        if self.max_model_len is not None and self.max_model_len < 2:
            raise bad("max_model_len", f"must be >= 2 when given, got {self.max_model_len}")
        if self.seed < 0:
            raise bad("seed", f"must be >= 0, got {self.seed}")
        if not 1 <= self.tensor_parallel_size <= 64:
            raise bad(
                "tensor_parallel_size", f"must be in [1, 64], got {self.tensor_parallel_size}"
            )
        if self.batch_invariant and self.quantization == "fp8":
            raise InvalidArgument(
                "executor.batch_invariant cannot be combined with executor.quantization fp8: "
                "the batch-invariant matmul takes plain weights only"
            )
        if self.batch_invariant and self.tensor_parallel_size > 1:
            raise InvalidArgument(
                "executor.batch_invariant cannot be combined with executor.tensor_parallel_size "
                f"{self.tensor_parallel_size}: the ranks' all-reduce is not batch-invariant"
            )
