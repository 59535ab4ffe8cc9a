"""`@program`: a Python function that builds a structured program, run on the server.

    @program
    def triage(s, query):
        s += system("You route support requests.")
        s += user(query)
        s += assistant(select("route", ["retrieve", "chat"]))
        if s["route"] == "retrieve":
            s += tool("retrieve", query=query, out="docs")
            s += user("Answer from: {docs}")
        s += assistant(gen("answer", max_tokens=64))
        return s["answer"]

    triage.run(query="...")                      # compiled: one Programs/Run call
    triage.run(query="...", mode="interactive")  # one Session round trip per statement
    for event in triage.run(query="...", stream=True): ...
    triage.run_batch([{"query": "a"}, {"query": "b"}], concurrency=8)

Compiled mode traces the function: its parameters are program inputs, `if` on a
condition over variables is explored both ways and becomes an If statement (the paths
are merged; at most MAX_PATHS). An `if` while fork branches are open becomes an If in
each open branch's body (one whose bodies come out the same in a branch is left out
there), so branches may branch on their own variables; forks nest. Interactive mode runs the function as ordinary Python
against a session whose context stays on the server, so any control flow works.
Both give the same result for the same inputs.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any

from radixmesh.lang.client import Client, ProgramFailed, ProgramResult
from radixmesh.lang.expr import Cond, Var, deciding
from radixmesh.lang.state import ForkTrace, LiveState, TraceState
from radixmesh.v1 import program_pb2 as pb

MAX_PATHS = 64

_default_client: Client | None = None


def set_default_client(client: Client) -> None:
    global _default_client
    _default_client = client


def _client(client: Client | None) -> Client:
    return client or _default_client or Client()


_NOT_DETERMINISTIC = (
    "@program: the function is not deterministic across its paths (or an if inside fork"
    " branches decides statements after the join)"
)


def _merge(traces: list[list[Any]]) -> list[pb.Statement]:
    """Paths that agree up to their first condition (or fork), as statements with nested
    Ifs. A decision taken while forks were open is marked ("open" in each open branch,
    "late" in the parent after the join): there, an If whose two bodies are the same is
    left out, since the function wrote it to some other place."""
    out: list[pb.Statement] = []
    first = traces[0]
    i = 0
    while i < len(first) and isinstance(first[i], pb.Statement):
        out.append(first[i])
        i += 1
    for trace in traces[1:]:
        if trace[:i] != first[:i] or (i < len(first)) != (i < len(trace)):
            raise TypeError(_NOT_DETERMINISTIC)
    if i == len(first):
        return out
    if isinstance(first[i], ForkTrace):
        forks = [t[i] for t in traces]
        width = len(first[i].branches)
        if any(not isinstance(f, ForkTrace) or len(f.branches) != width for f in forks):
            raise TypeError(_NOT_DETERMINISTIC)
        bodies = [pb.Body(body=_merge([f.branches[b] for f in forks])) for b in range(width)]
        out.append(pb.Statement(fork=pb.Fork(branches=bodies, index_var=first[i].index_var)))
        return out + _merge([t[i + 1 :] for t in traces])
    if any(not isinstance(t[i], tuple) for t in traces):
        raise TypeError(_NOT_DETERMINISTIC)
    cond: Cond = first[i][0]
    then = [t[i + 1 :] for t in traces if t[i][1]]
    otherwise = [t[i + 1 :] for t in traces if not t[i][1]]
    then_body = _merge(then) if then else []
    otherwise_body = _merge(otherwise) if otherwise else []
    kind = first[i][2] if len(first[i]) == 3 else ""
    if kind and then and otherwise and then_body == otherwise_body:
        return out + then_body
    if kind == "late-branch-var":
        raise TypeError(
            f"@program: an if on {cond.var.ref!r}, a fork branch's variable, decides statements"
            " after the join; branch inside the branches, or on the joined list after the join"
        )
    branch = pb.If(condition=cond.to_proto(), then=then_body, otherwise=otherwise_body)
    out.append(pb.Statement(branch=branch))
    return out


class Program:
    def __init__(
        self,
        fn: Callable[..., Any],
        name: str = "",
        model: str = "",
        output_schema: dict | str | None = None,
    ) -> None:
        self.fn = fn
        self.name = name or fn.__name__
        self.model = model
        self.output_schema = output_schema
        self.params = list(inspect.signature(fn).parameters)[1:]

    def __repr__(self) -> str:
        return f"<program {self.name}({', '.join(self.params)})>"

    # --- compiled ------------------------------------------------------------------------

    def _finish(self, state: Any, value: Any) -> None:
        if getattr(state, "returned", None) is not None:
            return
        if value is not None:
            state.ret(value, self.output_schema)
        else:
            state._before()

    def _trace(self, decisions: list[bool]) -> tuple[list[Any], list[bool]]:
        state = TraceState()
        used: list[bool] = []

        def decide(cond: Cond) -> bool:
            taken = decisions[len(used)] if len(used) < len(decisions) else True
            used.append(taken)
            if state._pending is None:
                state.items.append((cond, taken))
            else:  # inside fork branches: an If in each branch still open (and after)
                state._pending.note_decision(cond, taken)
            return taken

        with deciding(decide):
            value = self.fn(state, *[Var(p) for p in self.params])
            self._finish(state, value)
        return state.items, used

    def compile(self) -> pb.Program:
        """The whole function as one Program (its parameters are its inputs)."""
        traces: list[list[Any]] = []
        stack: list[list[bool]] = [[]]
        while stack:
            prefix = stack.pop()
            items, used = self._trace(prefix)
            traces.append(items)
            if len(traces) > MAX_PATHS:
                raise TypeError(f"@program {self.name}: more than {MAX_PATHS} paths to trace")
            for i in range(len(prefix), len(used)):
                stack.append([*used[:i], not used[i]])
        return pb.Program(name=self.name, model=self.model, body=_merge(traces))

    def _inputs(self, inputs: Mapping[str, Any]) -> dict[str, str]:
        missing = [p for p in self.params if p not in inputs]
        extra = [k for k in inputs if k not in self.params]
        if missing or extra:
            raise TypeError(f"{self.name}: missing inputs {missing}, unknown inputs {extra}")
        return {k: v if isinstance(v, str) else json.dumps(v) for k, v in inputs.items()}

    # --- async ---------------------------------------------------------------------------

    async def astream(
        self, *, client: Client | None = None, mode: str = "compiled", **inputs: Any
    ) -> AsyncIterator[pb.ProgramEvent]:
        """Every event as it arrives (ProgramResult last, when the program returns)."""
        values = self._inputs(inputs)
        if mode == "compiled":
            async for event in _client(client).run(self.compile(), values):
                yield event
            return
        if mode != "interactive":
            raise ValueError("mode must be 'compiled' or 'interactive'")
        queue: asyncio.Queue[pb.ProgramEvent | BaseException | None] = asyncio.Queue()
        task = asyncio.create_task(self._interactive(_client(client), values, queue))
        try:
            while (item := await queue.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _interactive(self, client: Client, inputs: dict[str, str], queue: asyncio.Queue) -> None:
        loop = asyncio.get_running_loop()
        start = pb.SessionStart(name=self.name, model=self.model, inputs=inputs)
        try:
            async with client.session(start) as session:

                def send(statement: pb.Statement) -> list[pb.ProgramEvent]:
                    def forward(event: pb.ProgramEvent) -> None:
                        loop.call_soon_threadsafe(queue.put_nowait, event)

                    future = asyncio.run_coroutine_threadsafe(session.run(statement, forward), loop)
                    return future.result()

                state = LiveState(send, inputs)

                def body() -> None:
                    with deciding(state.decide):
                        value = self.fn(state, *[state[p] for p in self.params])
                        self._finish(state, value)

                await asyncio.to_thread(body)
            queue.put_nowait(None)
        except BaseException as exc:
            queue.put_nowait(exc)

    async def arun(self, *, client: Client | None = None, mode: str = "compiled", **inputs: Any) -> ProgramResult:
        events = [e async for e in self.astream(client=client, mode=mode, **inputs)]
        results = [e for e in events if e.WhichOneof("event") == "result"]
        if results:
            return ProgramResult.from_event(results[-1].result, events)
        variables: dict[str, Any] = dict(self._inputs(inputs))
        for event in events:
            if event.WhichOneof("event") == "var_set":
                variables[event.var_set.var] = json.loads(event.var_set.value_json)
        return ProgramResult(None, variables, [], events)

    async def arun_batch(
        self,
        batch: Sequence[Mapping[str, Any]],
        *,
        concurrency: int = 8,
        client: Client | None = None,
        mode: str = "compiled",
    ) -> list[ProgramResult]:
        """Every input set, at most `concurrency` programs at a time, results in order."""
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        gate = asyncio.Semaphore(concurrency)

        async def one(inputs: Mapping[str, Any]) -> ProgramResult:
            async with gate:
                return await self.arun(client=client, mode=mode, **inputs)

        return list(await asyncio.gather(*(one(i) for i in batch)))

    # --- sync ----------------------------------------------------------------------------

    def run(
        self,
        *,
        client: Client | None = None,
        mode: str = "compiled",
        stream: bool = False,
        **inputs: Any,
    ) -> Any:
        """ProgramResult; with stream=True an iterator of events instead."""
        if stream:
            return _iterate(self.astream(client=client, mode=mode, **inputs))
        return _sync(self.arun(client=client, mode=mode, **inputs))

    def run_batch(
        self,
        batch: Sequence[Mapping[str, Any]],
        *,
        concurrency: int = 8,
        client: Client | None = None,
        mode: str = "compiled",
    ) -> list[ProgramResult]:
        return _sync(self.arun_batch(batch, concurrency=concurrency, client=client, mode=mode))


def _sync(coro: Any) -> Any:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    coro.close()
    raise RuntimeError("inside an event loop: use the async form (arun, astream, arun_batch)")


def _iterate(events: AsyncIterator[pb.ProgramEvent]) -> Iterator[pb.ProgramEvent]:
    """An async iterator read on a thread of its own, as a plain iterator."""
    import queue as queue_module

    items: queue_module.Queue[Any] = queue_module.Queue()
    done = object()

    async def pump() -> None:
        try:
            async for event in events:
                items.put(event)
        except BaseException as exc:
            items.put(exc)
        items.put(done)

    thread = threading.Thread(target=lambda: asyncio.run(pump()), daemon=True)
    thread.start()
    while (item := items.get()) is not done:
        if isinstance(item, BaseException):
            raise item
        yield item
    thread.join()


def program(
    fn: Callable[..., Any] | None = None,
    *,
    name: str = "",
    model: str = "",
    output_schema: dict | str | None = None,
) -> Any:
    """Decorator: `@program` or `@program(output_schema=SCHEMA, model="...")`."""
    if fn is not None:
        return Program(fn)
    return lambda f: Program(f, name=name, model=model, output_schema=output_schema)


__all__ = ["MAX_PATHS", "Program", "ProgramFailed", "program", "set_default_client"]
