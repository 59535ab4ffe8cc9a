"""What the decoder needs to know about a model, read from a Hugging Face config.json.

`ArchOptions` holds what differs between architectures (registered per
architecture name in `models.ARCHITECTURES`); `ModelSpec` is the shape of one
model, parsed from its config with those options applied.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from radixmesh.errors import InvalidArgument

SUPPORTED_ROPE_TYPES = ("default", "llama3", "linear")


@dataclass(frozen=True, slots=True)
class ArchOptions:
    """How one architecture departs from the plain Llama decoder."""

    qkv_bias: bool | None = None
    """Bias on q/k/v projections; None follows the config's `attention_bias`."""
    o_bias: bool | None = None
    """Bias on the output projection; None follows the config's `attention_bias`."""
    qk_norm: bool = False
    """RMSNorm over each head of q and k before rotary (Qwen3)."""
    honours_sliding_window: bool = False
    """Whether the config's `sliding_window` applies to every layer (Mistral): each query
    then attends only the last `sliding_window` positions, itself included."""


@dataclass(frozen=True, slots=True)
class ModelSpec:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    qk_norm: bool
    torch_dtype: str | None
    """The config's weight dtype ("bfloat16", ...), if it names one."""
    sliding_window: int | None = None
    """Every layer's attention window, when the architecture honours the config's one."""

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim


def _require(config: dict[str, Any], key: str) -> Any:
    if key not in config:
        raise InvalidArgument(f"config.json: missing field {key!r}")
    return config[key]


def read_rope(config: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(theta, scaling) from `rope_parameters` (transformers 5) or legacy `rope_theta`/`rope_scaling`."""
    params: dict[str, Any] = dict(config.get("rope_parameters") or {})
    legacy = config.get("rope_scaling") or {}
    for key, value in legacy.items():
        params.setdefault(key, value)
    theta = float(params.pop("rope_theta", config.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise InvalidArgument(
            f"config.json: rope type {rope_type!r} is not supported "
            f"(supported: {', '.join(SUPPORTED_ROPE_TYPES)})"
        )
    if rope_type == "default":
        return theta, None
    params["rope_type"] = rope_type
    return theta, params


def parse_spec(config: dict[str, Any], architecture: str, options: ArchOptions) -> ModelSpec:
    if config.get("hidden_act", "silu") != "silu":
        raise InvalidArgument(f"config.json: hidden_act {config['hidden_act']!r} is not supported")
    if config.get("mlp_bias", False):
        raise InvalidArgument("config.json: mlp_bias is not supported")
    hidden_size = int(_require(config, "hidden_size"))
    num_heads = int(_require(config, "num_attention_heads"))
    head_dim = config.get("head_dim") or hidden_size // num_heads
    num_kv_heads = int(config.get("num_key_value_heads") or num_heads)
    if num_heads % num_kv_heads:
        raise InvalidArgument(
            f"config.json: num_attention_heads ({num_heads}) must be a multiple of "
            f"num_key_value_heads ({num_kv_heads})"
        )
    attention_bias = bool(config.get("attention_bias", False))
    theta, scaling = read_rope(config)
    max_positions = int(config.get("max_position_embeddings") or 2048)
    return ModelSpec(
        architecture=architecture,
        vocab_size=int(_require(config, "vocab_size")),
        hidden_size=hidden_size,
        intermediate_size=int(_require(config, "intermediate_size")),
        num_layers=int(_require(config, "num_hidden_layers")),
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=int(head_dim),
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=max_positions,
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        qkv_bias=attention_bias if options.qkv_bias is None else options.qkv_bias,
        o_bias=attention_bias if options.o_bias is None else options.o_bias,
        qk_norm=options.qk_norm,
        torch_dtype=config.get("dtype") or config.get("torch_dtype"),
        sliding_window=_read_window(config) if options.honours_sliding_window else None,
    )


def _read_window(config: dict[str, Any]) -> int | None:
    """The config's `sliding_window` (None or absent: full attention)."""
    window = config.get("sliding_window")
    if window is None:
        return None
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise InvalidArgument(
            f"config.json: sliding_window must be a positive integer or null, got {window!r}"
        )
    return window
