"""radixmesh.lang: write structured programs in Python, run them on a radixmesh server.

See docs/programs.md. The client SDK: imports grpc and the v1 stubs only.
"""

from radixmesh.lang.client import Client, ProgramFailed, ProgramResult, Session
from radixmesh.lang.expr import Cond, Piece, Var, assistant, gen, select, system, text, tool, user
from radixmesh.lang.program import Program, program, set_default_client

__all__ = [
    "Client",
    "Cond",
    "Piece",
    "Program",
    "ProgramFailed",
    "ProgramResult",
    "Session",
    "Var",
    "assistant",
    "gen",
    "program",
    "select",
    "set_default_client",
    "system",
    "text",
    "tool",
    "user",
]
