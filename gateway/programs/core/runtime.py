"""The interpreter: runs a validated program's statements as scheduler requests on one context.

    run = ProgramRun(program, inputs, deps, run_id="r1")
    async for event in run.events():
        ...

Each Gen/Select continues the context the statements before it built: its prompt is
the context's tokens, and the request holds them (`hold_id`) when it finishes, so the
next statement's request finds them cached. Fork branches start from a copy of the
context (the same held prefix) and run concurrently. Every hold the run made is released
when it ends, however it ends (a client that goes away cancels the iteration).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import time
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.core.models import ModelRegistry
from gateway.core.output import ChoiceStream
from gateway.core.prepare import PreparedRequest
from gateway.programs.core import events as ev
from gateway.programs.core.context import Context, role_text
from gateway.programs.core.model import (
    Append,
    Call,
    Fork,
    Gen,
    If,
    Limits,
    OnError,
    Program,
    Return,
    Select,
    Statement,
)
from gateway.programs.core.plugins import PluginChain
from gateway.programs.core.port import ProgramBackend
from gateway.programs.core.predict import BranchPredictor, Speculation, lookahead
from gateway.programs.core.scoring import score_choices
from gateway.programs.core.tools import ToolRegistry
from gateway.programs.core.validate import Checker
from gateway.programs.core.values import holds, render, resolve
from gateway.tracing import phase
from radixmesh.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
)
from radixmesh.sampling import Constraint, ConstraintKind, Priority, SamplingParams

_JSON_KINDS = (ConstraintKind.JSON_SCHEMA, ConstraintKind.JSON_OBJECT)


@dataclass(frozen=True, slots=True)
class RuntimeDeps:
    backend: ProgramBackend
    models: ModelRegistry
    tools: ToolRegistry
    plugins: PluginChain = field(default_factory=PluginChain)
    limits: Limits = field(default_factory=Limits)
    """The server's limits: a program may only lower them."""
    predictor: BranchPredictor | None = None
    """Branch prediction (None or disabled: Ifs are not predicted)."""

    def checker(self, limits: Limits) -> Checker:
        def check_model(model: str, where: str) -> None:
            try:
                self.models.resolve(model)
            except NotFound:  # as a request for an unknown model is (NOT_FOUND, HTTP 404)
                raise NotFound(f"{where}: model {model!r} is not served here; see the model list") from None

        return Checker(limits, self.tools.names, check_model)


@dataclass(slots=True)
class Scope:
    """The variables and context one body runs on (a fork branch has its own)."""

    variables: dict[str, Any]
    context: Context
    assigned: list[str] = field(default_factory=list)
    speculations: dict[str, Speculation] = field(default_factory=dict)
    """Ifs ahead (by path) whose likely branch is being prefilled."""
    group_id: str = ""
    """A fork branch's requests: the fork's program group (scheduled as one unit)."""

    def set(self, name: str, value: Any) -> None:
        self.variables[name] = value
        if name not in self.assigned:
            self.assigned.append(name)


class _Returned(Exception):
    def __init__(self, value: Any) -> None:
        self.value = value


class ProgramRun:
    def __init__(
        self,
        program: Program,
        inputs: Mapping[str, str],
        deps: RuntimeDeps,
        run_id: str,
        priority: Priority = Priority.INTERACTIVE,
    ) -> None:
        deps.checker(program.limits).program(program, inputs.keys())  # before any token
        self.program = program
        self.deps = deps
        self.run_id = run_id
        self.priority = priority
        self.deadline = time.time() + program.limits.max_wall_time_s
        model, tokenizer = deps.models.resolve(program.model)
        self.scope = Scope(dict(inputs), Context(f"{run_id}/ctx", model, tokenizer))
        self.usage: list[ev.StatementUsage] = []
        self._queue: asyncio.Queue[ev.Event | BaseException | None] = asyncio.Queue()
        self._holds: set[str] = set()
        self._background: set[asyncio.Task[None]] = set()
        self._req_ids = itertools.count()
        self._num_statements = 0
        self.num_tokens = 0
        """Tokens the run has cost so far: prompt tokens prefilled (not found cached) plus
        tokens generated, over every model statement; limits.max_total_tokens bounds it."""
        self.returned: tuple[Any] | None = None
        """Interactive mode: set (to the value) once a Return ran."""

    async def events(self) -> AsyncGenerator[ev.Event, None]:
        """Run the whole program; the last event is the ProgramResult."""
        task = asyncio.create_task(self._main(), name=f"program-{self.run_id}")
        try:
            async for item in self._drain():
                yield item
        finally:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            await asyncio.shield(self.release_holds())
            await self.settle_background()

    async def _drain(self) -> AsyncGenerator[ev.Event, None]:
        """The queue's events until its end (None) or failure (raised). What is queued by
        the time the reader comes back is taken at once, each Gen's text in it as one
        TextDelta (`coalesce`): a reader slower than the steps (a busy stream) gets fewer,
        larger messages, one that keeps up gets each step's text as it comes."""
        while True:
            batch: list[ev.Event] = []
            item = await self._queue.get()
            while item is not None and not isinstance(item, BaseException):
                batch.append(item)
                if self._queue.empty():
                    break
                item = self._queue.get_nowait()
            for event in ev.coalesce(batch):
                yield event
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item

    async def _main(self) -> None:
        try:
            value = None
            async with asyncio.timeout(self.program.limits.max_wall_time_s):
                try:
                    await self.body(self.program.body, self.scope)
                except _Returned as returned:
                    value = returned.value
            await self.emit(self.result(value))
            await self._queue.put(None)
        except TimeoutError:
            limit = self.program.limits.max_wall_time_s
            await self._queue.put(DeadlineExceeded(f"program: ran past max_wall_time ({limit:g} s)"))
        except BaseException as exc:  # handed to the reader, which raises it
            await self._queue.put(exc)

    async def run_statement(self, statement: Statement) -> AsyncGenerator[ev.Event, None]:
        """Interactive mode: check and run one more statement on the kept context; the last
        event is its StatementDone (with returned=True after a Return: the session is over)."""
        count = self._num_statements + 1
        if count > self.program.limits.max_statements:
            raise InvalidArgument(
                f"{statement.path}: over limits.max_statements ({self.program.limits.max_statements})"
            )
        one = dataclasses.replace(self.program, body=(statement,))
        self.deps.checker(self.program.limits).program(one, self.scope.variables.keys())
        self._num_statements = count
        before = len(self.scope.assigned)
        task = asyncio.create_task(self._one(statement), name=f"program-{self.run_id}")
        try:
            async for item in self._drain():
                yield item
        finally:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        names = self.scope.assigned[before:]
        done = ev.StatementDone(
            statement.path, {n: self.scope.variables[n] for n in names}, self.returned is not None
        )
        yield self._outgoing(done) if self.deps.plugins.rewrites_responses else done

    async def _one(self, statement: Statement) -> None:
        try:
            remaining = self.deadline - time.time()
            if remaining <= 0:
                raise DeadlineExceeded("session: ran past max_wall_time")
            async with asyncio.timeout(remaining):
                try:
                    await self.statement(statement, self.scope)
                except _Returned as returned:
                    self.returned = (returned.value,)
                    await self.emit(self.result(returned.value))
            await self._queue.put(None)
        except TimeoutError:
            await self._queue.put(DeadlineExceeded("session: ran past max_wall_time"))
        except BaseException as exc:
            await self._queue.put(exc)

    def result(self, value: Any) -> ev.ProgramResult:
        return ev.ProgramResult("", value, dict(self.scope.variables), tuple(self.usage))

    async def emit(self, event: ev.Event) -> None:
        if self.deps.plugins.rewrites_responses:
            event = self._outgoing(event)
        await self._queue.put(event)

    def _outgoing(self, event: ev.Event) -> ev.Event:
        """What the client sees of an event under post_response plugins: variable values,
        tool arguments and the result's variables rewritten (the run keeps the originals)."""
        post = self.deps.plugins.post_response
        if isinstance(event, ev.VarSet):
            return dataclasses.replace(event, value=post(event.value))
        if isinstance(event, ev.ToolStarted):
            return dataclasses.replace(event, args=post(event.args))
        if isinstance(event, (ev.ProgramResult, ev.StatementDone)):
            return dataclasses.replace(event, variables={k: post(v) for k, v in event.variables.items()})
        return event

    def charge(self, path: str, num_tokens: int) -> None:
        """Count tokens prefilled or generated; past limits.max_total_tokens the run fails."""
        self.num_tokens += max(0, num_tokens)
        limit = self.program.limits.max_total_tokens
        if self.num_tokens > limit:
            raise ResourceExhausted(
                f"{path}: the program has processed {self.num_tokens} tokens (prompt tokens"
                f" prefilled plus generated), over limits.max_total_tokens ({limit})"
            )

    async def release_holds(self) -> None:
        holds_, self._holds = self._holds, set()
        for hold_id in holds_:
            with contextlib.suppress(Exception):
                await self.deps.backend.release_hold(hold_id)

    def hold(self, hold_id: str) -> None:
        """Count a hold the run made, to release it when the run ends at the latest."""
        self._holds.add(hold_id)

    async def release(self, hold_id: str) -> None:
        if hold_id in self._holds:
            self._holds.discard(hold_id)
            await self.deps.backend.release_hold(hold_id)

    def background(self, work: Any) -> None:
        """Run a coroutine beside the program (a statistics update); awaited at its end."""
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def settle_background(self) -> None:
        """Wait for background work; a failure there never fails the program."""
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    # --- statements ----------------------------------------------------------------------

    async def body(self, body: tuple[Statement, ...], scope: Scope) -> None:
        try:
            for index, statement in enumerate(body):
                await self.predict_ahead(body, index, scope)
                with phase(f"program.{type(statement).__name__.lower()}", path=statement.path):
                    await self.statement(statement, scope)
        finally:  # a body that failed or was cancelled before its If: stop that prefill
            for spec in scope.speculations.values():
                if spec.task is not None:
                    spec.task.cancel()

    async def predict_ahead(self, body: tuple[Statement, ...], index: int, scope: Scope) -> None:
        """Before a Gen/Select that an If right after it waits on, start prefilling the
        branch that If will likely take (gateway.programs.core.predict)."""
        predictor = self.deps.predictor
        if predictor is None or not predictor.config.enabled:
            return
        ahead = lookahead(body, index)
        if ahead is None:
            return
        s = body[index]
        assert isinstance(s, (Gen, Select))
        model, tokenizer = self.deps.models.resolve(s.model or self.program.model)
        scope.context.on_model(model, tokenizer)
        scope.speculations[ahead.branch.path] = await predictor.speculate(self, scope, ahead, model)

    async def statement(self, s: Statement, scope: Scope) -> None:
        if isinstance(s, Append):
            text = render(s.text, scope.variables, f"{s.path}.template") if s.is_template else s.text
            text = self.deps.plugins.pre_request(text)
            scope.context.append_text(role_text(scope.context.tokenizer, s.role, s.part, text))
        elif isinstance(s, Gen):
            await self.gen(s, scope)
        elif isinstance(s, Select):
            await self.select(s, scope)
        elif isinstance(s, Call):
            await self.call(s, scope)
        elif isinstance(s, If):
            await self.branch(s, scope)
        elif isinstance(s, Fork):
            await self.fork(s, scope)
        else:
            raise _Returned(self.return_value(s, scope))

    async def branch(self, s: If, scope: Scope) -> None:
        taken = holds(s.condition, scope.variables, f"{s.path}.condition")
        spec = scope.speculations.pop(s.path, None)
        prediction = ev.Prediction.NONE
        if spec is not None:
            value = resolve(s.condition.var, scope.variables, f"{s.path}.condition")
            prediction = await spec.settle(taken, value, scope.context.tokens)
        await self.emit(ev.BranchTaken(s.path, taken, prediction))
        try:
            await self.body(s.then if taken else s.otherwise, scope)
        finally:  # a kept prefill is held until the branch has used it
            if spec is not None:
                await spec.release()

    async def set_var(self, scope: Scope, path: str, name: str, value: Any) -> None:
        scope.set(name, value)
        await self.emit(ev.VarSet(path, name, value))

    def request(
        self,
        scope: Scope,
        model: str,
        token_ids: list[int],
        sampling: SamplingParams,
        constraint: Constraint | None = None,
        hold: bool = True,
        group_id: str | None = None,
    ) -> PreparedRequest:
        """A request continuing scope's context; with hold, it holds the result under the
        context's hold_id. Its program group is group_id, else the scope's (a fork's)."""
        hold_id = scope.context.hold_id if hold and self.deps.backend.supports_holds else ""
        if hold_id:
            self._holds.add(hold_id)
        return PreparedRequest(
            req_id=f"{self.run_id}/{next(self._req_ids)}",
            model=model,
            prompt_token_ids=tuple(token_ids),
            sampling=sampling,
            constraint=constraint,
            hold_id=hold_id,
            group_id=scope.group_id if group_id is None else group_id,
            priority=self.priority,
            deadline_unix_ms=int(self.deadline * 1000),
        )

    async def gen(self, s: Gen, scope: Scope) -> None:
        model, tokenizer = self.deps.models.resolve(s.model or self.program.model)
        tokens = scope.context.on_model(model, tokenizer)
        try:
            max_tokens = tokenizer.check_length(
                len(tokens), s.sampling.max_tokens, "context", s.sampling.min_tokens
            )
        except InvalidArgument as exc:
            raise InvalidArgument(f"{s.path}: {exc}") from None
        sampling = dataclasses.replace(s.sampling, max_tokens=max_tokens)
        stream = ChoiceStream(
            0, tokenizer, stop=sampling.stop, prompt_token_ids=tokens, min_tokens=sampling.min_tokens
        )
        request = self.request(scope, model, tokens, sampling, s.constraint)
        output: list[int] = []
        # the deltas' way out: through the response plugins' text streams (None: one
        # cannot stream, so the variable's VarSet alone carries the rewritten text)
        shown = self.deps.plugins.text_streams() if self.deps.plugins.rewrites_responses else []
        text, usage, stop_string, charged = "", ev.Usage(), False, False
        updates = self.deps.backend.submit(request)
        async with contextlib.aclosing(updates):  # type: ignore[type-var]
            async for update in updates:
                if update.error is not None:
                    raise type(update.error)(f"{s.path}: {update.error}")
                if update.num_prompt_tokens is not None:
                    usage = ev.Usage(update.num_prompt_tokens, 0, update.num_cached_tokens or 0)
                    charged = True
                    self.charge(s.path, usage.prompt_tokens - usage.cached_tokens)
                self.charge(s.path, len(update.token_ids))
                delta = stream.on_update(
                    update.token_ids, (), update.finish_reason or "", update.matched_stop_token_id
                )
                output += update.token_ids
                if delta.text:
                    text += delta.text
                    await self.show(s, shown, delta.text, last=False)
                if stream.finished:
                    stop_string = delta.abort_upstream or (
                        delta.matched_stop is not None and update.matched_stop_token_id is None
                    )
                    break
        await self.show(s, shown, "", last=True)
        if not charged:  # the scheduler did not say what it found cached: all of it prefilled
            self.charge(s.path, len(tokens))
        self.usage.append(ev.StatementUsage(s.path, model, ev.Usage(usage.prompt_tokens, stream.num_tokens, usage.cached_tokens)))
        if stop_string:
            scope.context.append_text(text)
        else:
            if output and output[-1] in tokenizer.stop_token_ids(sampling.stop_token_ids):
                output = output[:-1]
            scope.context.append_tokens(output, text)
        value: Any = text
        if s.constraint is not None and s.constraint.kind in _JSON_KINDS:
            try:
                value = json.loads(text)
            except ValueError:
                raise FailedPrecondition(
                    f"{s.path}: the output is not complete JSON (finish_reason"
                    f" {stream.finish_reason!r}; raise sampling.max_tokens)"
                ) from None
        await self.set_var(scope, s.path, s.var, value)

    async def show(self, s: Gen, streams: list | None, text: str, last: bool) -> None:
        """Emit a Gen's new text as a TextDelta, through the response plugins' streams."""
        if streams is None:
            return
        for stream in streams:
            text = stream.push(text) + (stream.flush() if last else "")
        if text:
            await self.emit(ev.TextDelta(s.path, s.var, text))

    async def select(self, s: Select, scope: Scope) -> None:
        model, tokenizer = self.deps.models.resolve(s.model or self.program.model)
        tokens = scope.context.on_model(model, tokenizer)
        scored = await score_choices(self, s, scope, model, tokenizer, tokens)
        best = max(range(len(scored.scores)), key=lambda i: scored.order_key[i])
        choice = s.choices[best]
        self.usage.append(ev.StatementUsage(s.path, model, scored.usage))
        self.charge(s.path, scored.usage.prompt_tokens - scored.usage.cached_tokens)
        await self.emit(ev.SelectScores(s.path, s.var, scored.scores))
        placed = scored.placed[best]  # the tokens scored: the next statement finds them cached
        scope.context.continue_at(placed.keep, placed.token_ids, choice)
        await self.set_var(scope, s.path, s.var, choice)

    async def call(self, s: Call, scope: Scope) -> None:
        args: dict[str, Any] = {
            name: render(template, scope.variables, f"{s.path}.args[{name!r}]")
            for name, template in s.args
        }
        args.update(dict(s.json_args))
        await self.emit(ev.ToolStarted(s.path, s.tool, args))
        started = time.monotonic()
        try:
            outcome = await self.deps.tools.call(s.tool, args, s.timeout_s)
        except (FailedPrecondition, DeadlineExceeded) as exc:
            elapsed = int((time.monotonic() - started) * 1000)
            await self.emit(ev.ToolFinished(s.path, s.tool, False, str(exc), elapsed))
            if s.on_error is OnError.FAIL:
                raise type(exc)(f"{s.path}: {exc}") from None
            await self.emit(ev.ProgramError(s.path, exc.code, str(exc)))
            await self.set_var(scope, s.path, s.var, s.fallback)
            return
        elapsed = int((time.monotonic() - started) * 1000)
        await self.emit(ev.ToolFinished(s.path, s.tool, outcome.cached, "", elapsed))
        await self.set_var(scope, s.path, s.var, outcome.value)

    async def fork(self, s: Fork, scope: Scope) -> None:
        branches = []
        for b in range(len(s.branches)):
            variables = dict(scope.variables)
            if s.index_var:
                variables[s.index_var] = str(b)
            context = scope.context.fork(f"{self.run_id}/{s.path}/{b}")
            branches.append(Scope(variables, context, group_id=f"{self.run_id}/fork/{s.path}"))
        tasks = [
            asyncio.create_task(self.body(body, branch))
            for branch, body in zip(branches, s.branches, strict=True)
        ]
        try:
            await asyncio.gather(*tasks)
        finally:  # one branch failed (or the run was cancelled): stop the others
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        names = list(dict.fromkeys(n for b in branches for n in b.assigned))
        for hold_id in {b.context.hold_id for b in branches} & self._holds:
            self._holds.discard(hold_id)
            await self.deps.backend.release_hold(hold_id)
        for name in names:
            await self.set_var(scope, s.path, name, [b.variables.get(name, "") if name in b.assigned else "" for b in branches])

    def return_value(self, s: Return, scope: Scope) -> Any:
        if s.is_template:
            value: Any = render(s.text, scope.variables, f"{s.path}.template")
        else:
            value = resolve(s.text, scope.variables, f"{s.path}.var")
        if s.output_schema:
            import jsonschema

            candidate = value
            if isinstance(value, str):
                try:
                    candidate = json.loads(value)
                except ValueError:
                    raise FailedPrecondition(f"{s.path}.output_schema: the value is not JSON") from None
            try:
                jsonschema.validate(candidate, json.loads(s.output_schema))
            except jsonschema.ValidationError as exc:
                raise FailedPrecondition(f"{s.path}.output_schema: {exc.message}") from None
            value = candidate
        return self.deps.plugins.post_response(value)
