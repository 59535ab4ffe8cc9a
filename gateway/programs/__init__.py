"""Structured programs: the runtime that turns a program's statements into scheduler requests.

`core/` is plain Python (no grpc): the statement tree, validation, the interpreter, tools
and plugins. `convert.py` maps `program.proto` to the tree, `server.py` is the
`radixmesh.v1.Programs` servicer, `backend.py` the scheduler port over the gateway's
scheduler client. See docs/programs.md.
"""
