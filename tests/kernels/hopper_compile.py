"""Compiles every Triton kernel for an H100/H200 (sm_90) without a GPU.

The interpreter runs the kernels' logic on the CPU but accepts programs a GPU
compiler rejects; this compiles them ahead of time for sm_90 (through PTX and
the ptxas bundled with Triton) and prints one JSON line per kernel with the
shared memory it needs. It sets TRITON_INTERPRET=0 itself, so it runs as its
own process:

    python tests/kernels/hopper_compile.py [--sweep] [--registers]

--sweep compiles every autotune config for bf16 and fp32 at head_dim 80 and
128 (minutes); configs over the shared-memory limit are reported, not failed,
since the autotuner skips them. --registers also reports each kernel's registers per
thread and spilled bytes, from `ptxas -v` on its PTX (what bounds the warps an SM keeps
resident, and so the loads a memory-bound kernel has in flight).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from itertools import product
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.compiler import compile as triton_compile

from radixmesh_kernels import (
    batch_invariant,
    bitmask,
    gemv,
    kv_store,
    paged_attention,
    paged_decode_attention,
    rmsnorm,
    rotary,
    rotary_kv_store,
    silu_and_mul,
)

HOPPER = GPUTarget("cuda", 90, 32)
MAX_SHARED_BYTES = 227 * 1024  # per block on sm_90

SCALARS = {"qk_scale": "fp32", "eps": "fp32"}
LAUNCH_NUM_STAGES = 3
"""Triton's default for a launch that names none (the GEMV's)."""
DIVISIBLE_SCALARS = frozenset(
    {"in_features", "out_features", "k_per_split", "hidden", "intermediate", "half"}
)
"""Integer arguments a launch specializes as multiples of 16 at the model shapes (the GEMV's
dimensions and K slice, the hidden and intermediate sizes, half a head), as it does
strides. Without it the loads bounded by them compile to 2-byte ones, and the register
counts are not the launch's."""


def compile_sm90(kernel, types: dict[str, str], constexprs: dict, num_warps: int, num_stages: int):
    """Compiles as a launch would specialize it: pointers and strides 16-aligned."""
    names = kernel.arg_names
    # a constexpr the case leaves out keeps its default (a launch that does not pass it)
    defaults = {p.name: p.default for p in kernel.params if p.is_constexpr and p.has_default}
    constexprs = defaults | constexprs
    signature, attrs = {}, {}
    for i, name in enumerate(names):
        if name in constexprs:
            signature[name] = "constexpr"
        elif name.endswith("_ptr"):
            signature[name] = types[name]
            attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            signature[name] = SCALARS.get(name, "i32")
            if name.startswith("stride") or name in DIVISIBLE_SCALARS:
                attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(
        fn=kernel,
        signature=signature,
        constexprs={(names.index(k),): v for k, v in constexprs.items()},
        attrs=attrs,
    )
    return triton_compile(
        src, target=HOPPER, options={"num_warps": num_warps, "num_stages": num_stages}
    )


def attention_types(dtype: str) -> dict[str, str]:
    kv = {name: f"*{dtype}" for name in ("q_ptr", "k_cache_ptr", "v_cache_ptr", "out_ptr")}
    ints = {name: "*i32" for name in ("page_table_ptr", "cu_seqlens_q_ptr", "seq_lens_ptr")}
    parts = {name: "*fp32" for name in ("part_out_ptr", "part_m_ptr", "part_l_ptr")}
    return kv | ints | parts


def cases(sweep: bool):
    """`_cases`, and a dependent-launch variant (USE_PDL) of the first case of each kernel that
    takes it (the GEMV: once per weight type), named "... pdl"."""
    varied = set()
    for name, kernel, types, consts, num_warps, num_stages in _cases(sweep):
        yield name, kernel, types, consts, num_warps, num_stages
        key = (kernel, consts.get("HAS_SCALE"))
        if "USE_PDL" in kernel.arg_names and key not in varied:
            varied.add(key)
            yield f"{name} pdl", kernel, types, consts | {"USE_PDL": True}, num_warps, num_stages


def griddep_order(ptx: str) -> dict[str, bool]:
    """Where a dependent launch's instructions sit in a kernel's PTX: `loads_before_wait`, a
    global load issued ahead of `griddepcontrol.wait` (the GEMV's first weight tile; for
    every other kernel it would read what the kernel ahead is still writing), and whether
    `launch_dependents` follows the wait."""
    wait = ptx.find("griddepcontrol.wait")
    launch = ptx.find("griddepcontrol.launch_dependents")
    first_load = ptx.find("ld.global")
    return {
        "waits": wait >= 0,
        "loads_before_wait": 0 <= first_load < wait,
        "launches_after_wait": launch > wait >= 0,
    }


def _splitk_constants(rows: int, cfg, weight_bytes: int, **flags) -> dict:
    """The split-K GEMV's constexprs for a launch of `rows` rows with `cfg` over weights of
    `weight_bytes` bytes an element (FP8 weights carry row scales)."""
    return dict(NUM_ROWS=rows, HAS_SCALE=weight_bytes == 1, SPLIT_K=cfg.split_k,
                BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, EVEN=True,
                VEC=gemv.VEC_BYTES // weight_bytes, PREFETCH=cfg.prefetch, **flags)  # fmt: skip


def _cases(sweep: bool):
    """(name, kernel, pointer types, constexprs, num_warps, num_stages).

    Without sweep: bf16, head_dim 80 (padded to 128), each attention kernel's
    first autotune config, without and with a sliding window. With sweep: bf16
    and fp32, head_dim 80 and 128, every config."""
    for dtype, ieee in (("bf16", False), ("fp32", True))[: 2 if sweep else 1]:
        types = attention_types(dtype)
        for head_dim, sliding in product((80, 128)[: 2 if sweep else 1], (False, True)):
            consts = dict(PAGE_SIZE=16, HEAD_DIM=head_dim, BLOCK_D=128, SLIDING=sliding, IEEE=ieee)
            tag = f"{dtype} d{head_dim}{' sliding' if sliding else ''}"
            prefill_cfgs = paged_attention._prefill_configs()
            split_cfgs = paged_decode_attention._split_configs()
            for cfg in prefill_cfgs if sweep else prefill_cfgs[:1]:
                yield (
                    f"prefill {tag} {cfg.kwargs} w{cfg.num_warps} s{cfg.num_stages}",
                    paged_attention._paged_prefill_kernel,
                    types,
                    consts | cfg.kwargs | {"GROUP": 4},
                    cfg.num_warps,
                    cfg.num_stages,
                )
            for block_m in paged_attention.PACKED_BLOCK_MS:
                launch = dict(paged_attention.packed_launch(block_m))
                warps, stages = launch.pop("num_warps"), launch.pop("num_stages")
                yield (
                    f"prefill packed {tag} {launch} w{warps} s{stages}",
                    paged_attention._paged_prefill_kernel,
                    types,
                    consts | launch | {"GROUP": 4, "ROWS_PER_TOKEN": 4},
                    warps,
                    stages,
                )
            for cfg in split_cfgs if sweep else split_cfgs[:1]:
                yield (
                    f"decode split {tag} {cfg.kwargs} w{cfg.num_warps} s{cfg.num_stages}",
                    paged_decode_attention._decode_split_kernel,
                    types,
                    consts | cfg.kwargs | {"GROUP": 8, "BLOCK_H": 16},
                    cfg.num_warps,
                    cfg.num_stages,
                )
    yield (
        "decode reduce",
        paged_decode_attention._decode_reduce_kernel,
        attention_types("bf16"),
        dict(HEAD_DIM=80, BLOCK_S=8, BLOCK_D=128),
        4,
        1,
    )
    bf16 = "*bf16"
    yield (
        "rmsnorm",
        rmsnorm._rmsnorm_kernel,
        dict.fromkeys(("x_ptr", "residual_ptr", "weight_ptr", "out_ptr", "new_residual_ptr"), bf16),
        dict(HAS_RESIDUAL=True, BLOCK_H=4096),
        8,
        1,
    )
    rotary_types = dict.fromkeys(("q_ptr", "k_ptr", "q_out_ptr", "k_out_ptr"), bf16)
    yield (
        "rotary",
        rotary._rotary_kernel,
        rotary_types | {"positions_ptr": "*i64", "cos_sin_ptr": "*fp32"},
        dict(BLOCK_HQ=32, BLOCK_HK=8, BLOCK_HALF=64),
        4,
        1,
    )
    fused_types = dict.fromkeys(
        ("q_ptr", "k_ptr", "v_ptr", "q_out_ptr", "k_cache_ptr", "v_cache_ptr"), bf16
    )
    yield (
        "rotary_kv_store",
        rotary_kv_store._rotary_kv_store_kernel,
        fused_types | {"positions_ptr": "*i64", "cos_sin_ptr": "*fp32", "slot_mapping_ptr": "*i64"},
        dict(BLOCK_HQ=32, BLOCK_HK=8, BLOCK_HALF=64),
        4,
        1,
    )
    yield (
        "silu_and_mul",
        silu_and_mul._silu_and_mul_kernel,
        {"x_ptr": bf16, "out_ptr": bf16},
        dict(BLOCK_N=1024),
        4,
        1,
    )
    kv_types = dict.fromkeys(("k_ptr", "v_ptr", "k_cache_ptr", "v_cache_ptr"), bf16)
    yield (
        "kv_store",
        kv_store._kv_store_kernel,
        kv_types | {"slot_mapping_ptr": "*i64"},
        dict(BLOCK_H=8, BLOCK_D=128),
        4,
        1,
    )
    yield (
        "copy_kv_slots",
        kv_store._copy_kv_slots_kernel,
        dict.fromkeys(("k_cache_ptr", "v_cache_ptr"), bf16)
        | dict.fromkeys(("src_ptr", "dst_ptr"), "*i64"),
        dict(BLOCK=1024),
        4,
        1,
    )
    gemv_types = {"x_ptr": bf16, "w_ptr": "*fp8e4nv", "out_ptr": bf16, "counter_ptr": "*i32"}
    gemv_types |= dict.fromkeys(("scale_ptr", "bias_ptr", "partial_ptr"), "*fp32")
    gemv_types |= {"residual_ptr": bf16, "norm_w_ptr": bf16, "row_counter_ptr": "*i32"}
    gemv_types |= dict.fromkeys(("rstd_ptr", "sumsq_ptr"), "*fp32")
    for size, candidates in gemv.CANDIDATES.items():
        weight = "*fp8e4nv" if size == 1 else bf16
        chosen = candidates if sweep else [candidates[1], *(c for c in candidates if c.prefetch)][:2]
        for rows, cfg in product((1, 2), chosen):
            yield (
                f"gemv {weight[1:]} rows {rows} {cfg.describe()}",
                gemv._gemv_splitk_kernel,
                gemv_types | {"w_ptr": weight},
                _splitk_constants(rows, cfg, size, HAS_BIAS=True),
                cfg.num_warps,
                LAUNCH_NUM_STAGES,  # gemv_splitk leaves Triton's default
            )
        # the fused forms: the down projection with silu_and_mul in its activation read and
        # the residual add + row statistics after it; a projection reading its input's norm
        cfg = candidates[1]
        fused = {
            "gated residual": dict(GATED=True, ADD_RESIDUAL=True, BLOCK_TILES=256),
            "norm": dict(NORM_INPUT=True),
        }
        for rows, (what, flags) in product((1, 2), fused.items()):
            yield (
                f"gemv {weight[1:]} {what} rows {rows} {cfg.describe()}",
                gemv._gemv_splitk_kernel,
                gemv_types | {"w_ptr": weight},
                _splitk_constants(rows, cfg, size, HAS_BIAS=False, **flags),
                cfg.num_warps,
                LAUNCH_NUM_STAGES,
            )
    for dtype, ieee in (("bf16", False), ("fp32", True)):
        yield (
            f"batch-invariant matmul {dtype}",
            batch_invariant._matmul_kernel,
            dict.fromkeys(("x_ptr", "w_ptr", "bias_ptr", "out_ptr"), f"*{dtype}"),
            dict(HAS_BIAS=True, BLOCK_M=batch_invariant.MATMUL_BLOCK_M,
                 BLOCK_N=batch_invariant.MATMUL_BLOCK_N, BLOCK_K=batch_invariant.MATMUL_BLOCK_K,
                 IEEE=ieee, BROADCAST=False),
            batch_invariant.MATMUL_NUM_WARPS,
            batch_invariant.MATMUL_NUM_STAGES,
        )  # fmt: skip
    for sliding in (False, True):
        yield (
            f"batch-invariant decode split bf16{' sliding' if sliding else ''}",
            batch_invariant._split_kernel,
            attention_types("bf16"),
            dict(GROUP=8, PAGE_SIZE=16, BLOCK_H=16, BLOCK_N=64, SPLIT=batch_invariant.SPLIT_LEN,
                 HEAD_DIM=128, BLOCK_D=128, SLIDING=sliding, IEEE=False),
            4,
            2,
        )  # fmt: skip
    yield (
        "batch-invariant decode merge",
        batch_invariant._merge_kernel,
        attention_types("bf16"),
        dict(HEAD_DIM=80, BLOCK_D=128),
        1,
        1,
    )
    yield (
        "apply_bitmask",
        bitmask._apply_bitmask_kernel,
        {"logits_ptr": "*fp32", "bitmask_ptr": "*i32"},
        dict(BLOCK_V=4096),
        8,
        1,
    )


def ptxas_usage(ptx: str) -> dict[str, int]:
    """Registers per thread and spilled bytes (stores + loads) of a kernel's PTX for sm_90a,
    from the ptxas bundled with Triton."""
    import triton

    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(ptx)
        f.flush()
        done = subprocess.run(
            [str(ptxas), "-v", "--gpu-name", "sm_90a", f.name, "-o", os.devnull],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
    registers = re.search(r"Used (\d+) registers", done.stderr)
    spills = re.findall(r"(\d+) bytes spill (?:stores|loads)", done.stderr)
    return {
        "registers": int(registers.group(1)) if registers else -1,
        "spill_bytes": sum(int(n) for n in spills),
    }


def main(argv: list[str]) -> int:
    """Exit status 1 when a kernel fails to compile, or (without --sweep, where
    the autotuner would skip it) needs more shared memory than sm_90 has."""
    sweep = "--sweep" in argv
    registers = "--registers" in argv
    failed = 0
    for name, kernel, types, consts, num_warps, num_stages in cases(sweep):
        try:
            compiled = compile_sm90(kernel, types, consts, num_warps, num_stages)
        except Exception as exc:
            failed += 1
            print(json.dumps({"kernel": name, "error": f"{type(exc).__name__}: {exc}"[:2000]}))
            continue
        shared = compiled.metadata.shared
        fits = shared <= MAX_SHARED_BYTES
        failed += not (fits or sweep)
        row = {"kernel": name, "shared_bytes": shared, "fits": fits}
        if registers:
            row |= ptxas_usage(compiled.asm["ptx"])
        if name.endswith(" pdl"):
            row |= griddep_order(compiled.asm["ptx"])
        print(json.dumps(row), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
