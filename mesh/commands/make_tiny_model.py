"""Write a tiny random-weight Hugging Face model folder with a locally trained tokenizer."""

from __future__ import annotations

import argparse

from mesh.tiny_model import ARCHS, write_tiny_model


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", help="output folder (created if missing; files are overwritten)")
    parser.add_argument("--arch", choices=sorted(ARCHS), default="llama", help="model architecture")
    parser.add_argument("--seed", type=int, default=0, help="torch seed for the random weights")


def run(args: argparse.Namespace) -> int:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    out = write_tiny_model(args.dir, arch=args.arch, seed=args.seed)
    print(out)
    return 0
