"""Branch prediction: prefill the likely branch of an If while its condition is computed.

An If whose condition reads the variable of the Gen or Select just before it (only literal
appends between them) cannot be decided until that statement finishes. When its history
says which branch it usually takes, and with which value of the variable, the runtime
submits, beside the Gen/Select, one speculative request: the context, the predicted value,
the appends up to the If and the literal text the branch starts with, prefilled at the
lowest priority class with no token sampled, and held. When the If resolves:

- hit (the predicted branch, on the predicted context): the prefill is joined and its hold
  kept until the branch's body has run, so the branch's first Gen finds it cached;
- miss: the request is cancelled and its hold released (no pages left behind).

The history (per If: how often each branch ran, and the variable's values that led there)
lives in a `ResultStore` under `branch:<program>:<if path>`, so replicas of the gateway
share it when the store is the cache service's (Redis-backed with `--redis-url`). Updates
are read-modify-write: two replicas recording at once may lose one count, which a
statistic can afford.

    predictor = BranchPredictor(store, PredictionConfig(min_runs=3))
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gateway.core.prepare import PreparedRequest
from gateway.programs.core import events as ev
from gateway.programs.core.context import role_text
from gateway.programs.core.model import Append, Gen, If, Program, Select, Statement
from gateway.programs.core.scoring import Boundary
from gateway.programs.core.tools import ResultStore
from radixmesh.errors import InvalidArgument
from radixmesh.sampling import ConstraintKind, Priority, SamplingParams
from services.common.metrics import counter

if TYPE_CHECKING:
    from gateway.programs.core.runtime import ProgramRun, Scope

PREDICTIONS = counter(
    "program",
    "branch_predictions_total",
    "If statements whose branch was predicted, by result (hit: the predicted branch ran)",
    ["result"],
)
SPECULATIVE_TOKENS = counter(
    "program",
    "speculative_prefill_tokens_total",
    "Tokens prefilled ahead of a predicted branch, by outcome (used: the branch ran on them)",
    ["outcome"],
)
_MAX_VALUES = 8  # values kept per If (the most frequent)


@dataclass(frozen=True, slots=True)
class PredictionConfig:
    enabled: bool = True
    """Off: no statistics are read or written and nothing is prefilled ahead."""
    min_runs: int = 3
    """Runs of an If recorded before its branch is predicted."""
    min_share: float = 0.6
    """The predicted branch must have run at least this share of the recorded runs."""
    max_value_chars: int = 64
    """Longer values of the condition's variable are not recorded (nor predicted)."""
    join_timeout_s: float = 0.05
    """On a hit, how long the If waits for a prefill still running before it gives it up."""

    def __post_init__(self) -> None:
        if self.min_runs < 1:
            raise InvalidArgument(f"min_runs: must be >= 1, got {self.min_runs}")
        if not 0.5 <= self.min_share <= 1.0:
            raise InvalidArgument(f"min_share: must be in [0.5, 1], got {self.min_share}")
        if self.max_value_chars < 1:
            raise InvalidArgument(f"max_value_chars: must be >= 1, got {self.max_value_chars}")
        if not self.join_timeout_s >= 0:
            raise InvalidArgument(f"join_timeout_s: must be >= 0, got {self.join_timeout_s}")


@dataclass(slots=True)
class IfStats:
    """One If's history: runs per branch, and per value of its variable the runs per branch."""

    then: int = 0
    otherwise: int = 0
    values: dict[str, list[int]] = field(default_factory=dict)

    def record(self, taken: bool, value: str | None) -> None:
        if taken:
            self.then += 1
        else:
            self.otherwise += 1
        if value is not None:
            counts = self.values.setdefault(value, [0, 0])
            counts[0 if taken else 1] += 1
            if len(self.values) > _MAX_VALUES:
                rarest = min(self.values, key=lambda v: sum(self.values[v]))
                del self.values[rarest]

    def predict(self, config: PredictionConfig) -> tuple[bool, str] | None:
        """(branch, value of the variable) when the history is long and one-sided enough."""
        runs = self.then + self.otherwise
        if runs < config.min_runs:
            return None
        taken = self.then >= self.otherwise
        if max(self.then, self.otherwise) < config.min_share * runs:
            return None
        index = 0 if taken else 1
        candidates = [(c[index], v) for v, c in self.values.items() if c[index] > 0]
        if not candidates:
            return None
        return taken, max(candidates)[1]

    def to_json(self) -> bytes:
        return json.dumps({"then": self.then, "otherwise": self.otherwise, "values": self.values}).encode()

    @classmethod
    def from_json(cls, raw: bytes | None) -> IfStats:
        if not raw:
            return cls()
        try:
            data = json.loads(raw)
            values = {str(k): [int(v[0]), int(v[1])] for k, v in data.get("values", {}).items()}
            return cls(int(data["then"]), int(data["otherwise"]), values)
        except (ValueError, KeyError, TypeError, IndexError):
            return cls()  # a malformed entry starts the history again


def program_key(program: Program) -> str:
    """A program's name, or (unnamed) a hash of its compiled body."""
    if program.name:
        return program.name
    return "sha256-" + hashlib.sha256(repr(program.body).encode()).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class Lookahead:
    """An If that waits on the statement before it, and the literal text between them."""

    branch: If
    between: tuple[Append, ...]
    select: bool = False  # decided by a Select: its choice continues the context in context


def lookahead(body: tuple[Statement, ...], index: int) -> Lookahead | None:
    """The If decided by body[index]'s variable, when only literal appends lie between."""
    s = body[index]
    if not isinstance(s, (Gen, Select)):
        return None
    if isinstance(s, Gen) and s.constraint is not None and s.constraint.kind in (
        ConstraintKind.JSON_SCHEMA,
        ConstraintKind.JSON_OBJECT,
    ):
        return None  # the variable holds parsed JSON, not the text the context got
    between: list[Append] = []
    for later in body[index + 1 :]:
        if isinstance(later, Append) and not later.is_template:
            between.append(later)
        elif isinstance(later, If) and later.condition.var == s.var:
            return Lookahead(later, tuple(between), isinstance(s, Select))
        else:
            return None
    return None


def _leading_text(body: tuple[Statement, ...]) -> list[Append]:
    lead = []
    for s in body:
        if not (isinstance(s, Append) and not s.is_template):
            break
        lead.append(s)
    return lead


class BranchPredictor:
    def __init__(self, store: ResultStore, config: PredictionConfig = PredictionConfig()) -> None:
        self.store = store
        self.config = config

    def key(self, program: Program, branch: If) -> str:
        return f"branch:{program_key(program)}:{branch.path}"

    async def stats(self, key: str) -> IfStats:
        return IfStats.from_json(await self.store.get_result(key))

    async def record(self, key: str, taken: bool, value: object) -> None:
        text = value if isinstance(value, str) and len(value) <= self.config.max_value_chars else None
        stats = await self.stats(key)
        stats.record(taken, text)
        await self.store.put_result(key, stats.to_json())

    async def speculate(self, run: ProgramRun, scope: Scope, ahead: Lookahead, model: str) -> Speculation:
        """Read ahead.branch's history, and when it predicts, start the prefill in the
        background: before the Gen/Select is submitted, so both run in the same step."""
        spec = Speculation(self, run, scope, ahead, model)
        try:
            guess = (await self.stats(spec.key)).predict(self.config)
        except Exception:  # a result store that is down costs the prediction, not the program
            guess = None
        spec.task = asyncio.create_task(spec.prefill(guess), name=f"predict-{run.run_id}-{ahead.branch.path}")
        return spec


class Speculation:
    """One If's speculative prefill, from its start beside the Gen/Select to the If's end."""

    def __init__(self, predictor: BranchPredictor, run: ProgramRun, scope: Scope, ahead: Lookahead, model: str) -> None:
        self.predictor = predictor
        self.run = run
        self.ahead = ahead
        self.model = model
        self.key = predictor.key(run.program, ahead.branch)
        self.base = list(scope.context.tokens)
        self.tokenizer = scope.context.tokenizer
        self.hold_id = f"{scope.context.hold_id}/predict/{ahead.branch.path}"
        self.guess: tuple[bool, str] | None = None
        self.tokens: list[int] = []
        self.usage = ev.Usage()
        self.task: asyncio.Task[None] | None = None
        self._held = False

    def _encode(self, appends: list[Append] | tuple[Append, ...]) -> list[int]:
        tokens: list[int] = []
        for a in appends:
            text = self.run.deps.plugins.pre_request(a.text)
            tokens += self.tokenizer.encode_text(role_text(self.tokenizer, a.role, a.part, text))
        return tokens

    async def prefill(self, guess: tuple[bool, str] | None) -> None:
        branch = self.ahead.branch
        if guess is None:
            return
        lead = _leading_text(branch.then if guess[0] else branch.otherwise)
        if not lead:
            return  # nothing static to prefill at the branch's start
        self.guess = guess
        if self.ahead.select:  # the choice's tokens as the select scores and appends them
            placed = Boundary(self.tokenizer, self.base).choice(guess[1])
            self.tokens = self.base[: placed.keep] + list(placed.token_ids)
        else:
            self.tokens = self.base + self.tokenizer.encode_text(guess[1])
        self.tokens += self._encode(self.ahead.between)
        self.tokens += self._encode(lead)
        sampling = SamplingParams(temperature=0.0, max_tokens=0, prompt_logprobs_start=len(self.tokens) - 1)
        request = PreparedRequest(
            req_id=f"{self.run.run_id}/predict/{branch.path}",
            model=self.model,
            prompt_token_ids=tuple(self.tokens),
            sampling=sampling,
            hold_id=self.hold_id if self.run.deps.backend.supports_holds else "",
            priority=Priority.SPECULATIVE,  # the lowest class: never ahead of any other work
            deadline_unix_ms=int(self.run.deadline * 1000),
        )
        if request.hold_id:
            self._held = True
            self.run.hold(self.hold_id)
        updates = self.run.deps.backend.submit(request)
        async with contextlib.aclosing(updates):  # type: ignore[type-var]
            async for update in updates:
                if update.error is not None:
                    return  # a refused speculation (e.g. shed under load) costs nothing more
                if update.num_prompt_tokens is not None:
                    self.usage = ev.Usage(update.num_prompt_tokens, 0, update.num_cached_tokens or 0)
                if update.finished:
                    break

    def _matches(self, taken: bool, context: list[int]) -> bool:
        if self.guess is None or self.guess[0] != taken:
            return False
        lead = _leading_text(self.ahead.branch.then if taken else self.ahead.branch.otherwise)
        return context + self._encode(lead) == self.tokens

    async def settle(self, taken: bool, value: object, context: list[int]) -> ev.Prediction:
        """The If resolved: on a hit, join the prefill (waiting at most join_timeout_s for
        one still running: a later one would delay the branch instead of speeding it up);
        otherwise, or when it is late, cancel it and release its hold."""
        assert self.task is not None
        hit = self._matches(taken, context)  # no guess: False
        kept = False
        if hit:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self.task), self.predictor.config.join_timeout_s)
            kept = self.task.done()
        if not kept:
            self.task.cancel()
            with contextlib.suppress(BaseException):
                await self.task
            await self.release()
        prediction = ev.Prediction.NONE
        if self.guess is not None:
            prediction = ev.Prediction.HIT if hit else ev.Prediction.MISS
            PREDICTIONS.labels(result=prediction.name.lower()).inc()
            computed = self.usage.prompt_tokens - self.usage.cached_tokens
            SPECULATIVE_TOKENS.labels(outcome="used" if kept else "wasted").inc(max(0, computed))
            self.run.usage.append(ev.StatementUsage(f"{self.ahead.branch.path}.prediction", self.model, self.usage))
        self.run.background(self.predictor.record(self.key, taken, value))
        return prediction

    async def release(self) -> None:
        if self._held:
            self._held = False
            await self.run.release(self.hold_id)
