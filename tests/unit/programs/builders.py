"""Short builders of program.proto statements for the runtime's tests."""

from __future__ import annotations

from gateway.programs import convert
from gateway.programs.core.model import Limits, Program
from radixmesh.v1 import inference_pb2 as ipb
from radixmesh.v1 import program_pb2 as pb


def text(value: str, role: str = "", part: int = pb.ROLE_PART_WHOLE) -> pb.Statement:
    return pb.Statement(append=pb.Append(text=value, role=role, part=part))


def template(value: str, role: str = "") -> pb.Statement:
    return pb.Statement(append=pb.Append(template=value, role=role))


def begin(role: str) -> pb.Statement:
    return text("", role, pb.ROLE_PART_BEGIN)


def end(role: str) -> pb.Statement:
    return text("", role, pb.ROLE_PART_END)


def gen(var: str, max_tokens: int = 6, constraint: ipb.Constraint | None = None, **sampling) -> pb.Statement:
    params = ipb.SamplingParams(max_tokens=max_tokens, temperature=0.0, **sampling)
    return pb.Statement(gen=pb.Gen(var=var, sampling=params, constraint=constraint))


def select(var: str, choices: list[str], method: int = 0) -> pb.Statement:
    return pb.Statement(select=pb.Select(var=var, choices=choices, method=method))


def call(tool: str, var: str, **kw) -> pb.Statement:
    return pb.Statement(call=pb.Call(tool=tool, var=var, **kw))


def fork(*bodies: list[pb.Statement], index_var: str = "") -> pb.Statement:
    branches = [pb.Body(body=b) for b in bodies]
    return pb.Statement(fork=pb.Fork(branches=branches, index_var=index_var))


def copies(n: int, body: list[pb.Statement], index_var: str = "") -> pb.Statement:
    return pb.Statement(fork=pb.Fork(each=pb.Body(body=body), copies=n, index_var=index_var))


def when(kind: str, var: str, value: str, then: list, otherwise: list = (), negate: bool = False):
    condition = pb.Condition(negate=negate, **{kind: pb.VarValue(var=var, value=value)})
    return pb.Statement(branch=pb.If(condition=condition, then=then, otherwise=list(otherwise)))


def ret(var: str = "", template: str = "", output_schema: str = "") -> pb.Statement:
    value = {"var": var} if var else {"template": template}
    return pb.Statement(result=pb.Return(output_schema=output_schema, **value))


def program(*body: pb.Statement, limits: pb.Limits | None = None, **kw) -> pb.Program:
    return pb.Program(body=list(body), limits=limits, **kw)


def compile_program(message: pb.Program, bound: Limits = Limits()) -> Program:
    return convert.program_from_proto(message, bound)
