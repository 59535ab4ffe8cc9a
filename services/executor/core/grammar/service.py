"""Structured output: constraints compiled into token masks, one `GrammarService` per tokenizer.

A `Constraint` (JSON Schema, any JSON object, regex, EBNF grammar or a list of
choices) is compiled by xgrammar into a `CompiledConstraint` once, in a small
thread pool (xgrammar releases the GIL while compiling, so a slow grammar does
not hold up the event loop or a quick compile beside it), and kept in a bounded
LRU cache keyed by the constraint. Requests for a grammar already compiling
join that compile. Invalid grammars, and grammars that take longer than
`compile_timeout_s`, fail with `InvalidArgument` naming the constraint field;
the failure is cached too, so a retry fails fast.

Each constrained sequence then gets a `ConstraintMatcher` (matcher.py) that
fills its bitmask row and follows its tokens. The service is the executor's
`Grammar` backend (interface.py): `matcher_for` and `accept_batch`.

Bitmask layout (xgrammar's, and `radixmesh_kernels/bitmask.py`'s): int32 words
[batch, ceil(vocab_size / 32)], bit j of word i allows token 32 * i + j.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path

import torch
import xgrammar as xgr

from radixmesh.errors import InvalidArgument, ResourceExhausted, Unavailable
from radixmesh.sampling import Constraint
from services.executor.core.grammar.compiler import (
    JSON_KINDS,
    CompiledConstraint,
    banned_token_mask,
    compile_constraint,
    constraint_field,
    control_byte_token_ids,
    special_token_ids,
)
from services.executor.core.grammar.matcher import ConstraintMatcher, accept_batch
from services.executor.core.grammar.utf8 import Utf8Guard


@dataclass(frozen=True, slots=True)
class GrammarConfig:
    compile_timeout_s: float = 5.0
    """Longest a compile may take; a slower grammar is refused as InvalidArgument."""
    cache_size: int = 256
    """Compiled constraints (and compile failures) kept, least recently used dropped first."""
    max_workers: int = 2
    """Compiles running at once (threads)."""
    max_pending: int = 64
    """Compiles queued or running at once; one more is refused as ResourceExhausted."""
    compile_threads: int = 1
    """xgrammar's own threads inside one compile (token-mask precomputation)."""
    any_whitespace: bool = False
    """Allow free whitespace in JSON output. Off: with it, a weak model can write whitespace forever."""
    strict_json_schema: bool = True
    """JSON Schema objects and arrays admit no properties or items beyond those the schema names."""
    max_error_chars: int = 300
    """Longest compiler message quoted in an error."""

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> InvalidArgument:
            return InvalidArgument(f"grammar.{name} {why}")

        if not (math.isfinite(self.compile_timeout_s) and self.compile_timeout_s > 0):
            raise bad("compile_timeout_s", f"must be > 0, got {self.compile_timeout_s}")
        for name in ("cache_size", "max_workers", "max_pending", "compile_threads"):
            if getattr(self, name) < 1:
                raise bad(name, f"must be >= 1, got {getattr(self, name)}")
        if self.max_error_chars < 40:
            raise bad("max_error_chars", f"must be >= 40, got {self.max_error_chars}")


@dataclass(slots=True)
class GrammarMetrics:
    """Plain counters, updated under the service's lock (read by tests and benchmarks; not
    exported as Prometheus metrics)."""

    num_compiles: int = 0
    """Compiles run to the end (succeeded or failed)."""
    compile_seconds_total: float = 0.0
    compile_seconds_max: float = 0.0
    num_cache_hits: int = 0
    """Lookups answered from the cache (a cached failure counts too)."""
    num_cache_misses: int = 0
    """Lookups that started a compile."""
    num_shared_compiles: int = 0
    """Lookups that joined a compile already in flight."""
    num_compile_errors: int = 0
    """Compiles that failed: invalid grammar, or over the time limit."""
    num_timeouts: int = 0
    """Requests refused because their compile ran (or waited) past the time limit."""
    num_constrained_requests: int = 0
    """Matchers created, one per constrained sequence."""


@dataclass(slots=True)
class _Failure:
    """A cached compile failure: each lookup raises a fresh InvalidArgument with this message."""

    message: str


@dataclass(slots=True)
class _Pending:
    """A compile queued or running; every request for the same constraint waits on `future`."""

    constraint: Constraint
    created_at: float
    future: Future = field(init=False)
    """The pool's future, set as the compile is submitted."""
    started_at: float | None = None
    """Set by the worker thread when the compile starts."""


class GrammarService:
    """Compiles constraints for one tokenizer and vocabulary width; thread-safe.

    Use `compile` (async) from an event loop, `compile_sync` from a worker
    thread, or `poll` from a step loop that must not block. Each constrained
    sequence then takes a matcher from `new_matcher`.
    """

    def __init__(
        self,
        tokenizer_info: xgr.TokenizerInfo,
        config: GrammarConfig | None = None,
        *,
        banned_token_ids: Iterable[int] = (),
    ):
        """`banned_token_ids`: tokens no constrained output may hold (the tokenizer's
        special tokens; stop tokens stay allowed). Tokens that spell a UTF-16 surrogate
        are banned as well, and a surrogate split over two tokens is masked (utf8.py)."""
        self.config = config or GrammarConfig()
        self.tokenizer_info = tokenizer_info
        self.vocab_size: int = tokenizer_info.vocab_size
        """Width of the logits rows the masks cover (the model's vocab_size)."""
        self.metrics = GrammarMetrics()
        self._lock = threading.Lock()
        self._local = threading.local()
        self._cache: OrderedDict[Constraint, CompiledConstraint | _Failure] = OrderedDict()
        self._pending: dict[Constraint, _Pending] = {}
        self._pool = ThreadPoolExecutor(self.config.max_workers, thread_name_prefix="grammar")
        self._closed = False
        self._stop_token_ids = tuple(tokenizer_info.stop_token_ids)
        self._utf8 = Utf8Guard.build(tokenizer_info.decoded_vocab, self.vocab_size)
        surrogates = self._utf8.surrogate_token_ids if self._utf8 is not None else frozenset()
        self._token_masks = self._build_token_masks(frozenset(banned_token_ids) | surrogates)

    @classmethod
    def from_tokenizer(
        cls,
        tokenizer,
        vocab_size: int,
        *,
        stop_token_ids: list[int] | None = None,
        config: GrammarConfig | None = None,
    ) -> GrammarService:
        """From a Hugging Face tokenizer; `vocab_size` is the model's logits width (may be padded)."""
        if vocab_size < len(tokenizer):
            raise InvalidArgument(
                f"grammar.vocab_size ({vocab_size}) must be >= the tokenizer's {len(tokenizer)} tokens"
            )
        info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids
        )
        return cls(info, config, banned_token_ids=special_token_ids(tokenizer))

    @classmethod
    def from_model_dir(
        cls,
        model_dir: str | Path,
        vocab_size: int | None = None,
        config: GrammarConfig | None = None,
    ) -> GrammarService:
        """From a Hugging Face model folder; vocab_size defaults to its config.json's."""
        from transformers import AutoTokenizer

        model_dir = Path(model_dir)
        if vocab_size is None:
            vocab_size = int(json.loads((model_dir / "config.json").read_text())["vocab_size"])
        return cls.from_tokenizer(
            AutoTokenizer.from_pretrained(model_dir), vocab_size, config=config
        )

    # ----- compiling -----

    async def compile(self, constraint: Constraint) -> CompiledConstraint:
        """The compiled constraint, waiting at most compile_timeout_s without blocking the loop."""
        entry = self._lookup_or_start(constraint)
        if not isinstance(entry, _Pending):
            return self._unwrap(entry)
        waiter = asyncio.wrap_future(entry.future)
        waiter.add_done_callback(_retrieve)
        done, _ = await asyncio.wait({waiter}, timeout=self.config.compile_timeout_s)
        if not done:
            raise self._timeout_error(entry)
        if waiter.cancelled():  # the service closed before the compile ran
            raise Unavailable("grammar service is closed")
        return waiter.result()

    def compile_sync(self, constraint: Constraint) -> CompiledConstraint:
        """The compiled constraint, blocking this thread at most compile_timeout_s."""
        entry = self._lookup_or_start(constraint)
        if not isinstance(entry, _Pending):
            return self._unwrap(entry)
        try:
            return entry.future.result(timeout=self.config.compile_timeout_s)
        except FutureTimeout:
            raise self._timeout_error(entry) from None
        except CancelledError:
            raise Unavailable("grammar service is closed") from None

    def poll(self, constraint: Constraint) -> CompiledConstraint | None:
        """Never blocks: the compiled constraint, or None while it compiles (starting it if needed).

        Raises InvalidArgument for a bad grammar or one compiling past the limit, and
        ResourceExhausted when it waited past the limit without a worker.
        """
        entry = self._lookup_or_start(constraint)
        if not isinstance(entry, _Pending):
            return self._unwrap(entry)
        if entry.future.cancelled():
            raise Unavailable("grammar service is closed")
        if entry.future.done():
            return entry.future.result()
        since = entry.started_at if entry.started_at is not None else entry.created_at
        if time.monotonic() - since > self.config.compile_timeout_s:
            raise self._timeout_error(entry)
        return None

    def new_matcher(self, compiled: CompiledConstraint) -> ConstraintMatcher:
        """A fresh matcher for one sequence (counted as one constrained request)."""
        with self._lock:
            self.metrics.num_constrained_requests += 1
        return ConstraintMatcher(compiled)

    def matcher_for(self, constraint: Constraint) -> ConstraintMatcher:
        """compile_sync, then new_matcher: the executor's matcher for a new sequence."""
        return self.new_matcher(self.compile_sync(constraint))

    def accept_batch(
        self, matchers: Sequence[ConstraintMatcher], token_ids: Sequence[int]
    ) -> list[bool]:
        """Each matcher accepts its token, the grammar library called once for the batch."""
        return accept_batch(matchers, token_ids)

    def allocate_bitmask(self, batch_size: int) -> torch.Tensor:
        """An all-ones int32 [batch_size, ceil(vocab_size/32)] host bitmask (pinned with CUDA)."""
        bitmask = xgr.allocate_token_bitmask(batch_size, self.vocab_size)
        return bitmask.pin_memory() if torch.cuda.is_available() else bitmask

    @property
    def num_cached(self) -> int:
        with self._lock:
            return len(self._cache)

    def close(self, wait: bool = False) -> None:
        """Drops queued compiles; a running one finishes in its thread (awaited if `wait`).

        Cached constraints stay available; a new compile raises Unavailable.
        """
        with self._lock:
            self._closed = True
        self._pool.shutdown(wait=wait, cancel_futures=True)

    # ----- internals -----

    def _lookup_or_start(self, constraint: Constraint) -> CompiledConstraint | _Failure | _Pending:
        with self._lock:
            entry = self._cache.get(constraint)
            if entry is not None:
                self._cache.move_to_end(constraint)
                self.metrics.num_cache_hits += 1
                return entry
            pending = self._pending.get(constraint)
            if pending is not None:
                self.metrics.num_shared_compiles += 1
                return pending
            if self._closed:
                raise Unavailable("grammar service is closed")
            if len(self._pending) >= self.config.max_pending:
                raise ResourceExhausted(
                    f"grammar compiler busy: {len(self._pending)} compiles in flight"
                )
            self.metrics.num_cache_misses += 1
            pending = _Pending(constraint, created_at=time.monotonic())
            self._pending[constraint] = pending
            pending.future = self._pool.submit(self._run_compile, pending)
            return pending

    def _run_compile(self, pending: _Pending) -> CompiledConstraint:
        constraint = pending.constraint
        pending.started_at = start = time.monotonic()
        failure: _Failure | None = None
        cfg = self.config
        try:
            grammar = compile_constraint(
                self._compiler(),
                constraint,
                any_whitespace=cfg.any_whitespace,
                strict_json_schema=cfg.strict_json_schema,
                max_error_chars=cfg.max_error_chars,
            )
        except InvalidArgument as e:
            failure = _Failure(str(e))
        elapsed = time.monotonic() - start
        if failure is None and elapsed > cfg.compile_timeout_s:
            failure = _Failure(
                f"{constraint_field(constraint)}: grammar too complex "
                f"(compile took {elapsed:.2f} s, limit {cfg.compile_timeout_s} s)"
            )
        result = failure or self._wrap(constraint, grammar, elapsed)
        self._finish(pending, result, elapsed)
        return self._unwrap(result)

    def _wrap(self, constraint: Constraint, grammar, elapsed: float) -> CompiledConstraint:
        token_mask, banned = self._token_masks[constraint.kind in JSON_KINDS]
        return CompiledConstraint(
            constraint=constraint,
            grammar=grammar,
            compile_seconds=elapsed,
            token_mask=token_mask,
            banned_token_ids=banned,
            stop_token_ids=self._stop_token_ids,
            utf8=self._utf8,
        )

    def _finish(self, pending: _Pending, result: CompiledConstraint | _Failure, elapsed: float):
        with self._lock:
            self._pending.pop(pending.constraint, None)
            self._cache[pending.constraint] = result
            while len(self._cache) > self.config.cache_size:
                self._cache.popitem(last=False)
            m = self.metrics
            m.num_compiles += 1
            m.compile_seconds_total += elapsed
            m.compile_seconds_max = max(m.compile_seconds_max, elapsed)
            m.num_compile_errors += isinstance(result, _Failure)

    def _timeout_error(self, pending: _Pending) -> Exception:
        with self._lock:
            self.metrics.num_timeouts += 1
        limit = self.config.compile_timeout_s
        name = constraint_field(pending.constraint)
        if pending.started_at is None:
            return ResourceExhausted(f"grammar compiler busy: {name} waited {limit} s for a worker")
        return InvalidArgument(f"{name}: grammar too complex (compile took over {limit} s)")

    @staticmethod
    def _unwrap(entry: CompiledConstraint | _Failure) -> CompiledConstraint:
        if isinstance(entry, _Failure):
            raise InvalidArgument(entry.message)
        return entry

    def _compiler(self) -> xgr.GrammarCompiler:
        """One compiler per worker thread (their own caches are off: ours is the cache)."""
        compiler = getattr(self._local, "compiler", None)
        if compiler is None:
            compiler = xgr.GrammarCompiler(
                self.tokenizer_info, max_threads=self.config.compile_threads, cache_enabled=False
            )
            self._local.compiler = compiler
        return compiler

    def _build_token_masks(self, banned: frozenset[int]):
        """{is_json: (token_mask or None, banned ids)}: what every constraint turns off."""
        keep = set(self._stop_token_ids)
        text_banned = frozenset(t for t in banned if t not in keep and t < self.vocab_size)
        vocab = self.tokenizer_info.decoded_vocab
        control = control_byte_token_ids(vocab, self.config.any_whitespace)
        json_banned = text_banned | (control - keep - set(self.tokenizer_info.special_token_ids))
        return {
            is_json: (banned_token_mask(self.vocab_size, ids) if ids else None, ids)
            for is_json, ids in ((False, text_banned), (True, json_banned))
        }


def _retrieve(future: asyncio.Future) -> None:
    """Marks a waiter's outcome as seen, so an abandoned waiter logs nothing."""
    if not future.cancelled():
        future.exception()
