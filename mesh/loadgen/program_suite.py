"""The program benchmark's five programs (`radixmesh bench --workload program`), modelled on
SGLang's benchmark programs and the seed's scenarios:

- `select`: HellaSwag-style 4-way multiple choice after a shared few-shot prefix;
- `fork`: tree of thought: fork 4, a thought each, join, select the best;
- `triage`: the seed's RAG/agent router: a select picks retrieve or chat, an If on it runs
  the retrieval branch (its rules, a search Gen, the `retrieve` tool, an answer) or the
  chat answer (its rules): each branch starts with static text, which branch prediction
  prefills while the select runs;
- `chat`: a conversation of 4 turns;
- `json`: extraction of a support ticket under a JSON schema;
- `triage_unseen`: triage under a new name per instance, so never predicted (the control).

`instance(name, i)` is the i-th instance: the same statements with its own inputs (so
instances share what a real workload shares: the few-shot prefix, the instructions).
Programs use plain text (no chat roles), so a client that runs them statement by
statement sends exactly the text the server-side runtime appends.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass

from mesh.loadgen.workloads import TICKET_SCHEMA, WORDS
from radixmesh.errors import InvalidArgument
from radixmesh.v1 import inference_pb2 as ipb
from radixmesh.v1 import program_pb2 as pb


@dataclass(frozen=True, slots=True)
class Shape:
    """Lengths of the programs' generated and varying parts (tiny for CI's smoke run)."""

    max_tokens: int = 32
    """Tokens per free Gen (thoughts, chat turns, answers)."""
    json_max_tokens: int = 96
    num_shots: int = 4
    """Few-shot examples before a select question."""
    words: int = 24
    """Words of each instance's own text (a question, a document)."""

    def __post_init__(self) -> None:
        for name in ("max_tokens", "json_max_tokens", "num_shots", "words"):
            if getattr(self, name) < 1:
                raise InvalidArgument(f"{name}: must be >= 1, got {getattr(self, name)}")


SMOKE = Shape(max_tokens=4, json_max_tokens=160, num_shots=2, words=6)


def _text(value: str) -> pb.Statement:
    return pb.Statement(append=pb.Append(text=value))


def _template(value: str) -> pb.Statement:
    return pb.Statement(append=pb.Append(template=value))


def _gen(var: str, max_tokens: int, constraint: ipb.Constraint | None = None, stop: tuple = ()) -> pb.Statement:
    sampling = ipb.SamplingParams(max_tokens=max_tokens, temperature=0.0, stop=list(stop))
    return pb.Statement(gen=pb.Gen(var=var, sampling=sampling, constraint=constraint))


def _select(var: str, choices: list[str]) -> pb.Statement:
    return pb.Statement(select=pb.Select(var=var, choices=choices))


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def select_program(shape: Shape, rng: random.Random) -> tuple[pb.Program, dict[str, str]]:
    shots = random.Random(0)  # the few-shot prefix is the same for every instance
    body = [_text("Pick the most likely ending of each story.\n\n")]
    for k in range(shape.num_shots):
        endings = [_words(shots, 6) for _ in range(4)]
        body.append(_text(f"Story: {_words(shots, shape.words)}\nEndings: {' | '.join(endings)}\nAnswer: {endings[k % 4]}\n\n"))
    endings = [_words(rng, 6) for _ in range(4)]
    body += [_template("Story: {story}\nEndings: " + " | ".join(endings) + "\nAnswer: "), _select("ending", endings)]
    return pb.Program(name="bench-select", body=body), {"story": _words(rng, shape.words)}


def fork_program(shape: Shape, rng: random.Random) -> tuple[pb.Program, dict[str, str]]:
    branch = [_template("Thought {i}: "), _gen("thought", shape.max_tokens, stop=("\n",))]
    body = [
        _text("Solve the problem step by step. Think of several approaches first.\n"),
        _template("Problem: {problem}\n"),
        pb.Statement(fork=pb.Fork(each=pb.Body(body=branch), copies=4, index_var="i")),
        _template("Thoughts: {thought}\nThe best approach is number "),
        _select("best", ["0", "1", "2", "3"]),
    ]
    return pb.Program(name="bench-fork", body=body), {"problem": _words(rng, shape.words)}


def triage_program(shape: Shape, rng: random.Random) -> tuple[pb.Program, dict[str, str]]:
    rules = _words(random.Random("triage-rules"), 4 * shape.words)  # the same in every instance
    retrieve = [
        _text(f"Search the knowledge base first, then answer from the documents it returns. {rules}\nSearch query: "),
        _gen("search", min(8, shape.max_tokens), stop=("\n",)),
        pb.Statement(call=pb.Call(tool="retrieve", var="docs", args={"query": "{query}"}, json_args={"k": 2})),
        _template("\nDocuments: {docs}\nAnswer: "),
        _gen("answer", shape.max_tokens),
    ]
    chat = [_text(f"Reply kindly and briefly, without looking anything up. {rules}\nAnswer: "), _gen("answer", shape.max_tokens)]
    condition = pb.Condition(equals=pb.VarValue(var="route", value="retrieve"))
    body = [
        _text("You route support requests: retrieve looks the answer up, chat replies directly.\n"),
        _template("Request: {query}\nRoute: "),
        _select("route", ["retrieve", "chat"]),
        _text("\n"),
        pb.Statement(branch=pb.If(condition=condition, then=retrieve, otherwise=chat)),
    ]
    topic = rng.choice(("refund policy", "shipping times", "reset my password", "退款政策"))
    return pb.Program(name="bench-triage", body=body), {"query": f"{topic}: {_words(rng, shape.words // 2)}"}


def triage_unseen_program(shape: Shape, rng: random.Random) -> tuple[pb.Program, dict[str, str]]:
    """The triage program under a name of its own per instance: its If has no history, so it
    is never predicted (the control for branch prediction's time saved)."""
    program, inputs = triage_program(shape, rng)
    program.name = f"bench-triage-unseen-{rng.getrandbits(64):016x}"
    return program, inputs


def chat_program(shape: Shape, rng: random.Random) -> tuple[pb.Program, dict[str, str]]:
    body = [_text("A helpful assistant answers the user's questions in a few words.\n")]
    inputs = {}
    for turn in range(4):
        inputs[f"q{turn}"] = _words(rng, max(2, shape.words // 2))
        body += [_template(f"User: {{q{turn}}}\nAssistant: "), _gen(f"a{turn}", shape.max_tokens, stop=("\n",)), _text("\n")]
    return pb.Program(name="bench-chat", body=body), inputs


def json_program(shape: Shape, rng: random.Random) -> tuple[pb.Program, dict[str, str]]:
    constraint = ipb.Constraint(json_schema=json.dumps(TICKET_SCHEMA))
    body = [
        _text("Extract the support ticket from the message as JSON.\n"),
        _template("Message: {message}\nTicket: "),
        _gen("ticket", shape.json_max_tokens, constraint=constraint),
    ]
    return pb.Program(name="bench-json", body=body), {"message": _words(rng, shape.words)}


PROGRAMS: dict[str, Callable[[Shape, random.Random], tuple[pb.Program, dict[str, str]]]] = {
    "select": select_program,
    "fork": fork_program,
    "triage": triage_program,
    "triage_unseen": triage_unseen_program,
    "chat": chat_program,
    "json": json_program,
}


def instance(name: str, index: int, shape: Shape, seed: int = 0) -> tuple[pb.Program, dict[str, str]]:
    if name not in PROGRAMS:
        raise InvalidArgument(f"programs: unknown program {name!r} (known: {', '.join(PROGRAMS)})")
    return PROGRAMS[name](shape, random.Random(f"{seed}/{name}/{index}"))
