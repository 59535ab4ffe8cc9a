"""Render the Envoy config (and optionally exec Envoy with it): `python -m gateway.envoy --help`.

Used by the compose file's envoy service; flags, not environment, carry every setting.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from gateway.envoy import GatewayAddress, RateLimit, render_envoy_config
from gateway.envoy.process import envoy_binary, validate_config


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m gateway.envoy", description=__doc__)
    parser.add_argument("--public-port", type=int, default=8080)
    parser.add_argument("--admin-port", type=int, default=9901)
    parser.add_argument(
        "--admin-address", default="127.0.0.1", help="0.0.0.0 to let Prometheus scrape"
    )
    parser.add_argument(
        "--gateway",
        action="append",
        required=True,
        metavar="HOST:GRPC_PORT:HTTP_PORT",
        help="a gateway replica (repeat for several; a DNS name may resolve to many)",
    )
    parser.add_argument(
        "--descriptor", default=None, help="proto descriptor set (default: packaged)"
    )
    parser.add_argument(
        "--rate-limit-tokens", type=int, default=0, help="bucket size; 0 turns the limit off"
    )
    parser.add_argument("--rate-limit-fill-interval-s", type=float, default=1.0)
    parser.add_argument("--no-access-log", action="store_true")
    parser.add_argument("--output", default="-", help="file to write, - for stdout")
    parser.add_argument(
        "--exec", action="store_true", help="validate, then replace this process with Envoy"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    rate_limit = (
        RateLimit(args.rate_limit_tokens, args.rate_limit_fill_interval_s)
        if args.rate_limit_tokens
        else None
    )
    config = render_envoy_config(
        args.public_port,
        args.admin_port,
        [GatewayAddress.parse(g) for g in args.gateway],
        descriptor_path=args.descriptor,
        rate_limit=rate_limit,
        access_log=not args.no_access_log,
        admin_address=args.admin_address,
    )
    if args.output == "-":
        if args.exec:
            print("--exec needs --output FILE", file=sys.stderr)
            return 2
        sys.stdout.write(config)
        return 0
    Path(args.output).write_text(config)
    if args.exec:
        validate_config(args.output)
        binary = envoy_binary()
        os.execv(binary, [binary, "-c", args.output, "--disable-hot-restart"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
