"""Write a tiny random-weight Hugging Face model folder with a locally trained tokenizer.

Exit codes: 0 when written, 1 when the folder could not be written (no permission, disk
full), 2 for bad arguments (a path that cannot be a folder, a seed out of range)."""

from __future__ import annotations

import argparse
import sys

from mesh.tiny_model import ARCHS, write_tiny_model
from radixmesh.errors import InvalidArgument, RadixmeshError

PROG = "radixmesh make-tiny-model"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", help="output folder (created if missing; files are overwritten)")
    parser.add_argument("--arch", choices=sorted(ARCHS), default="llama", help="model architecture")
    parser.add_argument("--seed", type=int, default=0, help="torch seed for the random weights")


def run(args: argparse.Namespace) -> int:
    if not 0 <= args.seed < 2**63:
        print(f"{PROG}: --seed: must be in [0, 2**63), got {args.seed}", file=sys.stderr)
        return 2
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        out = write_tiny_model(args.dir, arch=args.arch, seed=args.seed)
    except InvalidArgument as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    except RadixmeshError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # writing the files: no space, no permission
        where = exc.filename or args.dir
        print(f"{PROG}: cannot write {where}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(out)
    return 0
