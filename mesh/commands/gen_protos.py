"""Regenerate the Python stubs and descriptor set from protos/."""

from __future__ import annotations

import argparse

from mesh.protogen import regenerate_in_place


def add_arguments(parser: argparse.ArgumentParser) -> None:
    del parser


def run(args: argparse.Namespace) -> int:
    del args
    for path in regenerate_in_place():
        print(path)
    return 0
