"""Running one program against a mesh, two ways, with what each cost.

- `ServerSide`: one `Programs.Run` call; the runtime next to the scheduler runs it.
- `ClientDriven`: the way SGLang's frontend runs a program: the client keeps the context's
  text and sends every statement as its own plain `Inference.Generate` request (a Gen is
  one request with the whole context as its prompt; a Select caches the prefix with one
  request, then scores every choice with a request of prefix + choice and prompt
  logprobs from the prefix's end, all together; a Fork runs its branches' requests
  concurrently; a Call runs the tool in the client; an If is decided in the client).

Both add `rtt_s` before every call they send (an injected client-server round trip).
`Outcome` counts the prompt tokens the server computed (prompt - cached, from its usage),
the requests sent, and, client-driven, every prompt's text (for the unique-token count).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf import json_format

from gateway.programs.builtin_tools import BUILTIN_TOOLS
from gateway.programs.convert import integral_json
from gateway.programs.core.model import Condition, ConditionKind
from gateway.programs.core.tools import ToolRegistry
from gateway.programs.core.values import holds, render
from radixmesh.v1 import inference_pb2 as ipb
from radixmesh.v1 import inference_pb2_grpc, program_pb2_grpc
from radixmesh.v1 import program_pb2 as pb


@dataclass(slots=True)
class Outcome:
    latency_s: float = 0.0
    error: str = ""
    """The status code's name of a failed program ("" : it finished)."""
    error_message: str = ""
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    num_requests: int = 0
    num_selects: int = 0
    predictions: dict[str, int] = field(default_factory=dict)
    """Server-side: BranchTaken.prediction names -> count (NONE, HIT, MISS)."""
    branch_ttft_s: list[tuple[str, float]] = field(default_factory=list)
    """Server-side: (prediction, seconds from the event before an If's BranchTaken, the
    condition's VarSet, to the branch's first text)."""
    prompts: list[str] = field(default_factory=list)
    """Client-driven: every prompt sent, in order."""
    consumed_texts: list[str] = field(default_factory=list)
    """Client-driven: generated texts that a later prompt of the program carries again."""
    done_at_s: dict[str, float] = field(default_factory=dict)
    """Per statement of the program's own body but appends ("body[3].select"): seconds
    from the program's start to its end (server-side: the last VarSet or SelectScores in
    it)."""
    started: float = 0.0

    @property
    def computed_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens

    def add_usage(self, usage: Any) -> None:
        self.prompt_tokens += usage.prompt_tokens
        self.cached_tokens += usage.cached_tokens
        self.completion_tokens += usage.completion_tokens


class ServerSide:
    def __init__(self, channel: grpc.aio.Channel, metadata: tuple, rtt_s: float = 0.0) -> None:
        self._stub = program_pb2_grpc.ProgramsStub(channel)
        self._metadata = metadata
        self._rtt_s = rtt_s

    async def run(self, program: pb.Program, inputs: dict[str, str]) -> Outcome:
        out = Outcome(num_requests=1)
        started = time.perf_counter()
        await asyncio.sleep(self._rtt_s)
        branch_at: tuple[str, float] | None = None
        last_at = started
        try:
            request = pb.RunProgramRequest(program=program, inputs=inputs)
            async for event in self._stub.Run(request, metadata=self._metadata):
                kind = event.WhichOneof("event")
                now = time.perf_counter()
                if kind == "branch":
                    name = pb.BranchPrediction.Name(event.branch.prediction).removeprefix("BRANCH_PREDICTION_")
                    out.predictions[name] = out.predictions.get(name, 0) + 1
                    branch_at = (name, last_at)
                elif kind == "text" and branch_at is not None and ".branch." in event.statement:
                    out.branch_ttft_s.append((branch_at[0], now - branch_at[1]))
                    branch_at = None
                elif kind == "select":
                    out.num_selects += 1
                if kind in ("var_set", "select"):
                    out.done_at_s[top_level(event.statement)] = now - started
                elif kind == "result":
                    for entry in event.result.usage:
                        out.add_usage(entry.usage)
                last_at = now
        except grpc.aio.AioRpcError as exc:
            out.error, out.error_message = exc.code().name, str(exc.details())[:300]
        out.latency_s = time.perf_counter() - started
        return out


@dataclass(slots=True)
class _Context:
    text: str
    variables: dict[str, Any]
    pending: list[str] = field(default_factory=list)
    """Texts generated into this context that no later prompt has carried yet."""


class ClientDriven:
    def __init__(self, channel: grpc.aio.Channel, metadata: tuple, rtt_s: float = 0.0) -> None:
        self._stub = inference_pb2_grpc.InferenceStub(channel)
        self._metadata = metadata
        self._rtt_s = rtt_s
        self._tools = ToolRegistry({t.name: t for t in BUILTIN_TOOLS})

    async def run(self, program: pb.Program, inputs: dict[str, str]) -> Outcome:
        out = Outcome()
        started = out.started = time.perf_counter()
        try:
            await self._body(program.body, _Context("", dict(inputs)), out, top=True)
        except grpc.aio.AioRpcError as exc:
            out.error, out.error_message = exc.code().name, str(exc.details())[:300]
        except ValueError:  # a truncated JSON output, as the runtime refuses it
            out.error = "FAILED_PRECONDITION"
        out.latency_s = time.perf_counter() - started
        return out

    async def _generate(self, out: Outcome, ctx: _Context, request: ipb.GenerateRequest) -> tuple[str, ipb.Complete]:
        await asyncio.sleep(self._rtt_s)
        out.num_requests += 1
        out.prompts.append(request.prompt)
        out.consumed_texts += ctx.pending
        ctx.pending = []
        text, complete = "", ipb.Complete()
        async for response in self._stub.Generate(request, metadata=self._metadata):
            if response.HasField("chunk"):
                text += response.chunk.text
            else:
                complete = response.complete
        out.add_usage(complete.usage)
        return text, complete

    async def _body(self, body: Any, ctx: _Context, out: Outcome, top: bool = False) -> None:
        for i, s in enumerate(body):
            kind = s.WhichOneof("kind")
            await self._statement(s, kind, ctx, out)
            if top and kind != "append":
                out.done_at_s[f"body[{i}].{kind}"] = time.perf_counter() - out.started

    async def _statement(self, s: Any, kind: str, ctx: _Context, out: Outcome) -> None:
        if kind == "append":
            a = s.append
            ctx.text += render(a.template, ctx.variables, "template") if a.template else a.text
        elif kind == "gen":
            await self._gen(s.gen, ctx, out)
        elif kind == "select":
            await self._select(s.select, ctx, out)
        elif kind == "call":
            args: dict[str, Any] = {k: render(v, ctx.variables, k) for k, v in s.call.args.items()}
            if s.call.HasField("json_args"):
                args.update(integral_json(json_format.MessageToDict(s.call.json_args)))
            await asyncio.sleep(self._rtt_s)  # the tool is the client's own call
            ctx.variables[s.call.var] = (await self._tools.call(s.call.tool, args, None)).value
        elif kind == "branch":
            c = s.branch.condition
            which = c.WhichOneof("kind")
            value = getattr(c, which)
            condition = Condition(ConditionKind(which), value.var, value.value, c.negate)
            taken = holds(condition, ctx.variables, "condition")
            await self._body(s.branch.then if taken else s.branch.otherwise, ctx, out)
        elif kind == "fork":
            await self._fork(s.fork, ctx, out)

    async def _gen(self, g: pb.Gen, ctx: _Context, out: Outcome) -> None:
        request = ipb.GenerateRequest(prompt=ctx.text, sampling=g.sampling)
        which = g.constraint.WhichOneof("kind") if g.HasField("constraint") else None
        if which == "json_schema":
            request.json_schema = g.constraint.json_schema
        elif which is not None:
            raise ValueError(f"the client-driven runner does not send {which} constraints")
        text, _ = await self._generate(out, ctx, request)
        ctx.text += text
        ctx.pending.append(text)
        ctx.variables[g.var] = json.loads(text) if which == "json_schema" else text

    async def _select(self, s: pb.Select, ctx: _Context, out: Outcome) -> None:
        out.num_selects += 1
        head = ipb.GenerateRequest(prompt=ctx.text, sampling=ipb.SamplingParams(max_tokens=1, temperature=0.0))
        _, cached = await self._generate(out, ctx, head)  # caches the prefix, says its length
        start = cached.usage.prompt_tokens
        scoring = ipb.SamplingParams(max_tokens=0, temperature=0.0, prompt_logprobs_start=start)
        requests = [ipb.GenerateRequest(prompt=ctx.text + c, sampling=scoring) for c in s.choices]
        results = await asyncio.gather(*(self._generate(out, ctx, r) for r in requests))
        means = []
        for _, complete in results:
            logprobs = [p.sampled.logprob for p in complete.prompt_logprobs]
            means.append(sum(logprobs) / max(1, len(logprobs)))
        best = max(range(len(means)), key=means.__getitem__)
        ctx.text += s.choices[best]
        ctx.variables[s.var] = s.choices[best]

    async def _fork(self, f: pb.Fork, ctx: _Context, out: Outcome) -> None:
        bodies = [b.body for b in f.branches] or [f.each.body] * f.copies
        branches = []
        for i in range(len(bodies)):
            variables = dict(ctx.variables)
            if f.index_var:
                variables[f.index_var] = str(i)
            branches.append(_Context(ctx.text, variables))
        out.consumed_texts += ctx.pending  # the branches' first prompts carry it: counted once
        ctx.pending = []
        await asyncio.gather(*(self._body(b, c, out) for b, c in zip(bodies, branches, strict=True)))
        names = dict.fromkeys(n for c in branches for n in c.variables if n not in ctx.variables or n == f.index_var)
        for name in names:
            if name != f.index_var:
                ctx.variables[name] = [c.variables.get(name, "") for c in branches]


def top_level(path: str) -> str:
    """The statement of the program's own body that a path is in ("body[2].fork" for
    "body[2].fork.each.body[1].gen")."""
    return ".".join(path.split(".")[:2])
