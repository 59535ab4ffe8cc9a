"""The `radixmesh` command: one subcommand per module under `mesh/commands/`."""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> module under mesh.commands exposing add_arguments(parser) and run(args) -> int
COMMANDS: dict[str, str] = {
    "serve": "serve",
    "generate": "generate",
    "make-tiny-model": "make_tiny_model",
    "bench": "bench",
    "gen-protos": "gen_protos",
    "profile": "profile",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="radixmesh", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        try:
            module = importlib.import_module(f"mesh.commands.{module_name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"mesh.commands.{module_name}":
                raise
            continue  # not built yet
        cmd = sub.add_parser(name, help=(module.__doc__ or "").strip().splitlines()[0])
        module.add_arguments(cmd)
        cmd.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args._run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
