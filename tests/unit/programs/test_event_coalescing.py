"""A reader slower than the steps gets each Gen's queued text as one TextDelta, in order."""

from __future__ import annotations

import asyncio

from gateway.programs.core import events as ev
from gateway.programs.core.runtime import ProgramRun
from tests.unit.programs.builders import compile_program, copies, gen, program, ret, template, text


def test_coalesce_joins_each_gens_text_and_keeps_every_statements_order():
    a, b = "body[0].fork.branches[0].body[1].gen", "body[0].fork.branches[1].body[1].gen"
    queued = [
        ev.TextDelta(a, "x", "He"),
        ev.TextDelta(b, "x", "1"),
        ev.TextDelta(a, "x", "llo"),
        ev.VarSet(a, "x", "Hello"),
        ev.TextDelta(b, "x", "2"),
        ev.TextDelta(a, "x", "!"),  # after its VarSet: a new run of text, not joined up
        ev.VarSet(b, "x", "12"),
    ]
    assert ev.coalesce(queued) == [
        ev.TextDelta(a, "x", "Hello"),
        ev.TextDelta(b, "x", "12"),
        ev.VarSet(a, "x", "Hello"),
        ev.TextDelta(a, "x", "!"),
        ev.VarSet(b, "x", "12"),
    ]
    other_var = [ev.TextDelta(a, "x", "1"), ev.TextDelta(a, "y", "2")]
    assert ev.coalesce(other_var) == other_var
    assert ev.coalesce([]) == []


class _JoinWatch:
    """The backend with an event set once `n` holds were released (a fork's branches joined:
    every branch's text is queued by then)."""

    def __init__(self, backend, n: int) -> None:
        self._backend, self._n = backend, n
        self.joined = asyncio.Event()
        self.supports_holds = backend.supports_holds
        self.supports_prompt_logprobs = backend.supports_prompt_logprobs

    def submit(self, request):
        return self._backend.submit(request)

    async def release_hold(self, hold_id: str) -> None:
        await self._backend.release_hold(hold_id)
        if len(self._backend.released) >= self._n:
            self.joined.set()


async def test_a_slow_reader_gets_each_branchs_queued_text_as_one_delta(deps, backend):
    branch = [template("Option {i}:"), gen("idea", max_tokens=6, ignore_eos=True)]
    message = program(text("Ideas for a name."), copies(3, branch, index_var="i"), ret(var="idea"))
    watch = _JoinWatch(backend, 3)
    slow = ProgramRun(compile_program(message), {}, type(deps)(**{**vars_of(deps), "backend": watch}), "slow")
    events = slow.events()
    first = await anext(events)
    await watch.joined.wait()  # everything the branches said is queued now
    rest = [e async for e in events]
    deltas = [e for e in [first, *rest] if isinstance(e, ev.TextDelta)]
    result = rest[-1]
    assert isinstance(result, ev.ProgramResult)
    ideas = result.variables["idea"]
    for b, idea in enumerate(ideas):
        statement = f"body[1].fork.branches[{b}].body[1].gen"
        mine = [d.text for d in deltas if d.statement == statement]
        assert "".join(mine) == idea and idea
        # 6 tokens, 6 steps: at most the delta taken with the first event's batch (before
        # the wait), then the rest as one
        assert len(mine) <= 2

    eager = [e async for e in ProgramRun(compile_program(message), {}, deps, "eager").events()]
    assert eager[-1].variables["idea"] == ideas  # the same outputs, however they were read


def vars_of(deps) -> dict:
    return {name: getattr(deps, name) for name in deps.__dataclass_fields__}
