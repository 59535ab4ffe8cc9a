"""What an executor serves and the limits it was sized for: one type, in-process and on the wire.

The executor core fills it at load time; `Executor.GetInfo` carries it
(`radixmesh.wire.info_to_proto` / `info_from_proto`, every field); the scheduler
routes and checks prompts with it and fits its step limits to it
(`services.scheduler.core.config.fit_to_executors`).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class ExecutorInfo:
    executor_id: str
    """Empty in the executor core's own info: the process or engine that runs the core
    names it (`dataclasses.replace(core.info, executor_id=...)`)."""
    model: str
    """The served model's name (ListModels, routing)."""
    page_size: int
    """Tokens per KV page."""
    num_pages: int
    """Pages of the executor's KV pool."""
    max_model_len: int
    """Longest sequence (prompt + output) the executor runs."""
    vocab_size: int | None = None
    """Token ids must be below it; None: not stated (the scheduler does not check)."""
    eos_token_ids: tuple[int, ...] = field(default=())
    max_num_seqs: int | None = None
    """Most sequences in one step the executor was sized for; None: not stated."""
    max_num_batched_tokens: int | None = None
    """Most tokens in one step the executor was sized for; None: not stated."""
    device: str = ""
    """"cpu" or "cuda:N"."""
    architecture: str = ""
    """The model folder's architecture, e.g. "LlamaForCausalLM"."""
    dtype: str = ""
    """"float32", "float16" or "bfloat16"."""
    max_draft_tokens: int = 0
    """Speculative decoding: most draft tokens the executor verifies per sequence and
    step (0: it does not speculate; the scheduler then plans no draft tokens)."""
    max_speculative_batch_size: int = 0
    """Speculation pays up to this many decodes in a step; larger steps plan no drafts."""
    max_forced_tokens: int = 0
    """Jump-forward: most draft tokens a constrained decode may verify per step, at any
    batch size, for the tokens its grammar forces (0: off; the scheduler then plans draft
    tokens for constrained decodes only as for any other)."""
