"""Programs server-side against the same programs client-driven, on one `radixmesh serve`.

The five programs of `mesh/loadgen/program_suite.py` (HellaSwag-style select, tree of
thought, the seed's triage with its branch, 4-turn chat, JSON extraction), each run (a)
as one `Programs.Run` call and (b) statement by statement as plain requests from the
client (as SGLang's frontend runs a program), at each concurrency. Reports programs/s,
latency p50/p99, prompt tokens computed per program against its unique tokens, requests
per program, forward passes per select, branch prediction accuracy (mesh/loadgen/
program_bench.py says how each is counted).

    python bench/programs.py                               # tiny model on the CPU
    python bench/programs.py --model /models/llama-8b --device cuda --json out.json
    python bench/programs.py --rtt-ms 20                   # a round trip per client call
    python bench/programs.py --smoke                       # CI: tiny shapes, not timed
    python bench/programs.py --target 127.0.0.1:8080       # a mesh already running
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mesh.loadgen.program_bench import MODES, ProgramBenchConfig, format_rows, run_suite
from mesh.loadgen.program_suite import PROGRAMS, SMOKE, Shape
from mesh.loadgen.scrape import MetricsScraper, endpoints_from_mesh_info
from services.common.config import free_port


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(",") if v)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="", help="HOST:PORT of a running mesh (default: start one)")
    parser.add_argument("--mesh-info", default="", help="its --endpoints-json file (forwards per select)")
    parser.add_argument("--api-key", default="")
    parser.add_argument("--model", default="", help="model folder for the mesh started here (default: tiny)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--num-pages", type=int, default=4096)
    parser.add_argument(
        "--extend-graph-tokens", type=int, default=0,
        help="the mesh started here replays steps of up to this many tokens that are not "
        "plain decodes as CUDA graphs (radixmesh serve --extend-graph-tokens; 0: off)",
    )
    parser.add_argument("--programs", default=",".join(PROGRAMS))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--concurrency", default="1,16,64", help="comma-separated")
    parser.add_argument("--num-programs", type=int, default=32, help="programs per point")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rtt-ms", type=float, default=0.0, help="injected round trip per client call")
    parser.add_argument("--repeats", type=int, default=1, help="runs per point (the modes' order alternates)")
    parser.add_argument("--max-tokens", type=int, default=Shape().max_tokens)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, 1 and 4 concurrent, 3 programs")
    parser.add_argument("--json", default="", help="write the report here")
    return parser.parse_args(argv)


def config_of(args: argparse.Namespace) -> ProgramBenchConfig:
    shape = SMOKE if args.smoke else Shape(max_tokens=args.max_tokens)
    return ProgramBenchConfig(
        programs=tuple(p for p in args.programs.split(",") if p),
        modes=tuple(m for m in args.modes.split(",") if m),
        concurrencies=(1, 4) if args.smoke else _ints(args.concurrency),
        num_programs=3 if args.smoke else args.num_programs,
        warmup=1 if args.smoke else args.warmup,
        rtt_ms=args.rtt_ms,
        shape=shape,
        repeats=1 if args.smoke else args.repeats,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config = config_of(args)
    mesh = None
    target, mesh_info = args.target, args.mesh_info
    if not target:
        from bench.spec_serve import ServedMesh
        from mesh.tiny_model import ensure_default_model

        port = free_port()
        mesh_info = str(Path(tempfile.mkdtemp(prefix="programs-bench-")) / "endpoints.json")
        extra = ["--num-pages", str(args.num_pages), "--endpoints-json", mesh_info, "--max-queue-wait-s", "0"]
        if args.extend_graph_tokens:
            extra += ["--extend-graph-tokens", str(args.extend_graph_tokens)]
        model = args.model or str(ensure_default_model())
        mesh = ServedMesh(model, args.device, "off", port, extra)
        target = f"127.0.0.1:{port}"
    try:
        scraper = MetricsScraper(endpoints_from_mesh_info(mesh_info)) if mesh_info else None
        report = asyncio.run(run_suite(target, args.api_key, config, scraper, on_row=_show))
    finally:
        if mesh is not None:
            mesh.stop()
    print(format_rows(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


def _show(row: dict) -> None:
    """One finished point, at once (a run cut short by its time limit keeps these)."""
    keep = ("program", "mode", "concurrency", "programs_per_s", "latency_p50_s", "latency_p99_s")
    keep += ("computed_prompt_tokens_per_program", "num_errors", "forwards_per_select", "branch_prediction", "where", "statement_done_s")
    print(json.dumps({k: row[k] for k in keep if k in row}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
