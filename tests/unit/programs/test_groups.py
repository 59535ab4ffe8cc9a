"""Program groups: a Select's scoring requests share one group id, and so do the requests
of one Fork's branches, so the scheduler admits each set together and never preempts part
of it; requests outside them carry none."""

from __future__ import annotations

from gateway.programs.core import events as ev
from gateway.programs.core.runtime import ProgramRun
from tests.unit.programs.builders import compile_program, copies, gen, program, select, text


async def test_a_selects_choices_and_a_forks_branches_are_each_one_group(deps, backend):
    message = program(
        text("Pick a colour for the bike shed.\n"),
        gen("first", max_tokens=2),
        copies(3, [text("Idea: "), gen("idea", max_tokens=2)]),
        select("colour", ["red", "green", "blue"]),
    )
    events = [e async for e in ProgramRun(compile_program(message), {}, deps, "g").events()]
    assert isinstance(events[-1], ev.ProgramResult)
    groups = [(r.sampling.max_tokens, r.group_id, r.group_size) for r in backend.requests]
    assert groups[0] == (2, "", 0)  # the Gen before the fork
    # a fork's branches may send several requests each: it says no size
    assert groups[1:4] == [(2, "g/fork/body[2].fork", 0)] * 3
    assert groups[4:] == [(0, "g/select/body[3].select", 3)] * 3  # all its choices
