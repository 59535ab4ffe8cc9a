"""bench/speculative.py and bench/jump_forward.py serve one untimed batch of every measured
shape before they time anything, on prompts no measured row shares."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import types

from radixmesh.sampling import SamplingParams
from services.executor.core.pipeline import PipelineCounts


class _Tokenizer:
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [10 + ord(c) % 200 for c in text]

    def __len__(self) -> int:
        return 256


class _Stats:
    def __init__(self, owner: _FakeEngine) -> None:
        self.owner = owner

    def snapshot(self) -> types.SimpleNamespace:
        self.owner.measuring = True  # the next batch is the measured one
        return types.SimpleNamespace(
            num_drafts=0, num_accepted_tokens=0, num_draft_tokens=0, num_forced_tokens=0
        )


class _FakeEngine:
    def __init__(self, *args, **kwargs) -> None:
        self.measuring = False
        self.prefetches: list = []
        core = types.SimpleNamespace(
            info=types.SimpleNamespace(vocab_size=256), graph_bytes=None,
            spec_switch=types.SimpleNamespace(describe=lambda: "fake"), spec_stats=_Stats(self),
            forward=types.SimpleNamespace(verify=None), execute=lambda prepared: None,
            forced_switch=None,
        )  # fmt: skip
        self.executors = [core]
        self.ports = [types.SimpleNamespace(pipeline_counts=PipelineCounts())]

    async def __aenter__(self) -> _FakeEngine:
        return self

    async def __aexit__(self, *exc) -> None:
        return None


def _check(calls: list[tuple[bool, list[list[int]]]], num_shapes: int) -> None:
    """The first num_shapes batches are the warm-up, each measured batch's prompt lengths
    are one of theirs, and no warm-up prompt starts like a measured one."""
    warm = [prompts for measured, prompts in calls[:num_shapes]]
    assert not any(measured for measured, _ in calls[:num_shapes])
    timed = [prompts for measured, prompts in calls[num_shapes:] if measured]
    assert len(timed) >= num_shapes
    warm_lengths = [sorted(map(len, prompts)) for prompts in warm]
    assert all(sorted(map(len, prompts)) in warm_lengths for prompts in timed)
    later = {tuple(p[:16]) for _, prompts in calls[num_shapes:] for p in prompts}
    assert not later & {tuple(p[:16]) for prompts in warm for p in prompts}


def _patched_speculative_bench(monkeypatch, on_batch):
    """bench.speculative with fake engines (each made appended to the list returned) whose
    batches call on_batch(engines, engine, prompts) and answer output_len 11s."""
    bench = importlib.import_module("bench.speculative")
    engines: list[_FakeEngine] = []

    def make_engine(config):
        engines.append(_FakeEngine())
        return engines[-1]

    async def run_batch(engine, prompts, output_len):
        on_batch(engines, engine, prompts)
        return [[11] * output_len for _ in prompts], 1.0, [0.01] * len(prompts)

    monkeypatch.setattr(bench, "Engine", make_engine)
    no_config = types.SimpleNamespace(for_model=lambda *a, **k: None)
    monkeypatch.setattr(bench, "EngineConfig", no_config)
    monkeypatch.setattr(bench, "run_batch", run_batch)
    return bench, engines


def test_speculative_bench_warms_every_workload_and_batch_before_timing(monkeypatch) -> None:
    calls: list[tuple[bool, list[list[int]]]] = []

    def on_batch(engines, engine, prompts) -> None:
        calls.append((engine.measuring, prompts))
        engine.measuring = False

    bench, _ = _patched_speculative_bench(monkeypatch, on_batch)
    args = bench.parse_args([
        "--workloads", "code_edit", "multi_turn", "repeat", "random", "--batch-sizes", "1", "3",
        "--prompt-len", "64", "--output-len", "8", "--device", "cpu", "--modes", "off",
    ])  # fmt: skip
    rows = asyncio.run(bench.bench_modes(args, _Tokenizer()))["off"]
    assert len(rows) == 8
    num_shapes = 4 * 2
    assert all(len(p) > 0 for _, prompts in calls for p in prompts)
    _check(calls, num_shapes)
    warm_lengths = {len(p) for _, prompts in calls[:num_shapes] for p in prompts}
    assert 2 * 64 + 8 in warm_lengths  # multi_turn's second turn, not only its first


def test_speculative_bench_warms_every_engine_first_then_rotates_the_modes_per_repeat(
    monkeypatch,
) -> None:
    """All engines are warmed before any row is timed; a row's repeats take turns across
    the engines, the first of each turn rotating, so no mode always runs first."""
    calls: list[tuple[int, bool]] = []
    def on_batch(engines, engine, prompts) -> None:
        calls.append((engines.index(engine), engine.measuring))

    bench, _ = _patched_speculative_bench(monkeypatch, on_batch)
    args = bench.parse_args([
        "--workloads", "random", "--batch-sizes", "2", "--repeats", "3", "--prompt-len", "16",
        "--output-len", "4", "--device", "cpu", "--modes", "off", "ngram", "--control",
    ])  # fmt: skip
    rows = asyncio.run(bench.bench_modes(args, _Tokenizer()))
    assert list(rows) == ["off", "ngram", bench.CONTROL]
    assert [engine for engine, _ in calls[:3]] == [0, 1, 2]  # one warm-up batch each
    assert [engine for engine, _ in calls[3:]] == [0, 1, 2, 1, 2, 0, 2, 0, 1]
    assert all(len(mode_rows["random/b2"]["output_tok_s_runs"]) == 3 for mode_rows in rows.values())


def test_speculative_bench_through_serve_warms_first_and_sizes_the_pool_for_what_it_sends(
    monkeypatch,
) -> None:
    """--mode serve: one mesh per mode, every measured shape sent once before any timed
    batch, and the mesh's KV pool (--num-pages, as in process) holds the largest batch of the
    longest sequences sent, where serve would otherwise size it to the device's free memory."""
    bench = importlib.import_module("bench.speculative")
    spec_serve = importlib.import_module("bench.spec_serve")
    meshes: list[list[str]] = []
    calls: list[tuple[list[list[int]], int]] = []

    class FakeMesh:
        url = "http://fake"

        def __init__(self, model, device, mode, port, extra) -> None:
            meshes.append(extra)

        def switch_state(self) -> dict:
            return {}

        def stop(self, failed: bool = False) -> None:
            pass

    class FakeClient:
        def __init__(self, url: str, processes: int) -> None:
            pass

        def run_batch(self, prompts, output_len):
            calls.append((prompts, output_len))
            spec = {"num_tokens": output_len * len(prompts), "num_drafts": 0, "num_draft_tokens": 0,
                    "num_accepted_tokens": 0}
            return ["a" * output_len for _ in prompts], 1.0, [0.01] * len(prompts), spec

        def close(self) -> None:
            pass

    monkeypatch.setattr(spec_serve, "ServedMesh", FakeMesh)
    monkeypatch.setattr(spec_serve, "BatchClient", FakeClient)
    args = bench.parse_args([
        "--mode", "serve", "--workloads", "code_edit", "multi_turn", "random", "--batch-sizes", "1", "3",
        "--prompt-len", "64", "--output-len", "8", "--device", "cpu", "--modes", "off",
    ])  # fmt: skip
    rows = bench.bench_serve(args, "off", _Tokenizer())
    assert len(rows) == 6 and len(meshes) == 1
    num_shapes = 3 * 2
    warm_lengths = [sorted(map(len, prompts)) for prompts, _ in calls[:num_shapes]]
    assert all(sorted(map(len, prompts)) in warm_lengths for prompts, _ in calls[num_shapes:])
    extra = meshes[0]
    pages = int(extra[extra.index("--num-pages") + 1])
    assert pages == bench.pages_for(args)
    longest = max(len(p) + n for prompts, n in calls for p in prompts)
    assert pages * 16 >= max(args.batch_sizes) * longest


def test_jump_forward_bench_warms_every_batch_size_on_both_engines(monkeypatch) -> None:
    bench = importlib.import_module("bench.jump_forward")
    calls: list[tuple[int, int, list[list[int]], SamplingParams]] = []

    async def fake_round(engine, prompts, sampling, constraint, concurrency):
        calls.append((id(engine), concurrency, prompts, sampling))
        return {"wall_s": 1.0, "tpots": [], "outputs": [], "ttfts": []}

    monkeypatch.setattr(bench, "_round", fake_round)
    monkeypatch.setattr(
        bench, "GrammarService",
        types.SimpleNamespace(from_model_dir=lambda *a, **k: types.SimpleNamespace(close=lambda wait: None)),
    )  # fmt: skip
    monkeypatch.setattr(bench, "_engine_config", lambda args, model, mode: None)
    monkeypatch.setattr("mesh.engine.Engine", lambda config, grammar=None: _FakeEngine())
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(["--batch-sizes", "1", "4", "--rounds", "1", "--prompt-len", "24"])
    asyncio.run(bench.bench_modes(args, "unused"))
    warm, timed = calls[:4], calls[4:]
    assert [c[1] for c in warm] == [1, 1, 4, 4] and len({c[0] for c in warm}) == 2
    assert all(c[3].max_tokens == min(args.output_len, bench.WARM_OUTPUT_LEN) for c in warm)
    assert [c[1] for c in timed] == [1, 1, 4, 4]
    assert all(len(p) == 24 for c in calls for p in c[2])
    measured = {tuple(p) for c in timed for p in c[2]}
    assert not measured & {tuple(p) for c in warm for p in c[2]}



def test_speculative_bench_speedups_pair_each_repeat_with_off_and_compare_the_fastest() -> None:
    bench = importlib.import_module("bench.speculative")
    # repeat 2 of the mode fell on a stall of the machine; off's repeat 1 did
    rates, off_rates = [90.0, 100.0, 40.0], [100.0, 50.0, 50.0]
    found = bench.speedups(rates, off_rates)
    assert found["speedup_vs_off"] == 90.0 / 50.0  # medians: 90 over 50
    assert found["speedup_paired"] == 0.9  # ratios 0.9, 2.0, 0.8
    assert found["speedup_best"] == 1.0  # 100 against 100
