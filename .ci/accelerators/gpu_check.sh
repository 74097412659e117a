#!/usr/bin/env bash
# The GPU check: on a machine with a CUDA GPU and JAX's CUDA plugin (no network needed),
# or, as GPU_CHECK_KIND=rocm (.ci/accelerators/rocm_check.sh), an AMD GPU and JAX's ROCm plugin,
# puts the hostfeed wheel built elsewhere (and only the test tools the machine lacks) on
# PYTHONPATH, then, within GPU_CHECK_BUDGET_S (450 s) in all, runs:
#
#   1. smoke      .ci/accelerators/gpu_smoke.py (<= 60 s): handlers registered, taps, a call,
#                 a 64 MiB tap, the Recorder (every=/start=/stop=, stats, a Histogram, a raw
#                 4 MiB row, Recorder.step both ways, a captured Flax model, read back and
#                 compared with numpy). Stops the check at once if the handlers are
#                 missing: nothing later could pass.
#   2. gpu tests  test_gpu.py, test_cuda_lowering.py and test_rocm_lowering.py, -v.
#   3. bench      benches/gpu.py (<= 150 s, its own faulthandler dumps every thread's stack
#                 10 s before): taps, calls and recording against JAX's own ways, as
#                 ratios with targets.
#   4. suite      .ci/accelerators/suite_files.py's files, --scope=jax: the device path's
#                 files first (taps, calls, the Recorder, Recorder.step, selective
#                 recording, summaries, dtypes, ordering, transformations, capture), never
#                 the host-side ones, -rA --durations=20, in the time left.
#
# Every step runs with JAX_PLATFORMS=cuda,cpu (rocm,cpu): JAX creates only the backends
# named, and io_callback, pure_callback and debug.callback run their function on a CPU
# device, so the bench's baselines and the suite's comparisons need the CPU backend too.
# The GPU stays the default backend (the first named).
#
# GPU_CHECK_STEPS picks steps (default "smoke gpu_tests bench suite"; the smoke always
# runs when it is named, and a rerun that confirms a fix names only what failed, with
# GPU_CHECK_SUITE_FILES for the suite's files).
#
#   bash .ci/accelerators/gpu_wheel.sh        # where the wheel is built: fills dist/ (gitignored)
#   GPU_CHECK_PLATFORM=cpu bash .ci/accelerators/gpu_check.sh   # the dry run, on CPU (CI runs it)
#   bash .ci/accelerators/gpu_check.sh        # on the GPU machine, from the repository root, with
#                                    # dist/ carried along; results under $OUT (or ./gpu_check_out)
#
# Every pytest step writes a verbose log as it goes (a test's name appears when it starts,
# its outcome when it ends, so a run cut off still names each outcome) and each failure's
# report as it happens; faulthandler dumps every thread's stack when a test runs past
# GPU_CHECK_STACKS_S, and pytest-timeout (thread method: it also ends a test hung inside
# XLA's Execute, where the signal method cannot) stops one past GPU_CHECK_TEST_S.
# gpu_bench.json is rewritten after each section of the bench. No junit files: the GPU
# machine returns at most 8 files, and $OUT holds exactly 8: summary.txt, install.log,
# gpu_tests.log, gpu_tests.failures.txt, bench.log, gpu_bench.json, suite.log,
# suite.failures.txt. The check counts them at the end; the dry run fails on a 9th.
#
# Exit status and last line ("RESULT: ..."):
#   0  all met          every step passed and every target was met
#   1  suite failed     the smoke step, a test, or the suite's time ran out (targets as measured)
#   3  target missed    every test passed, a target was missed or the bench did not finish
#   2  setup failed     no wheel, hostfeed does not import, or the GPU handlers are missing
#   0  dry run ok       GPU_CHECK_PLATFORM=cpu: every step ran (targets not judged on CPU)
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
out=${OUT:-$root/gpu_check_out}
check_name=gpu_check
python=${PYTHON:-python3}
# Which GPU: cuda (the default) or rocm; JAX_PLATFORMS names it first (cpu: the dry run).
kind=${GPU_CHECK_KIND:-cuda}
case "$kind" in
    cuda) kind_name=CUDA smi="nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader" ;;
    rocm) kind_name=ROCm smi="rocm-smi --showproductname --showdriverversion" ;;
    *) echo "GPU_CHECK_KIND must be cuda or rocm, not $kind" >&2; exit 2 ;;
esac
export GPU_CHECK_KIND=$kind
platform=${GPU_CHECK_PLATFORM:-$kind}
dist=${GPU_CHECK_DIST:-$root/dist}
budget=${GPU_CHECK_BUDGET_S:-450}
steps=${GPU_CHECK_STEPS:-smoke gpu_tests bench suite}
smoke_s=${GPU_CHECK_SMOKE_S:-60}
gpu_tests_s=${GPU_CHECK_GPU_TESTS_S:-90}
bench_s=${GPU_CHECK_BENCH_S:-150}
test_s=${GPU_CHECK_TEST_S:-90}
stacks_s=${GPU_CHECK_STACKS_S:-45}
#: The most files the GPU machine brings back from $OUT.
max_files=8
junit=no
# The suite's files (default: .ci/accelerators/suite_files.py's); the CPU dry run picks a few.
suite_files=${GPU_CHECK_SUITE_FILES:-}
# shellcheck source=.ci/accelerators/check_lib.sh
source "$root/.ci/accelerators/check_lib.sh"
wants() { [[ " $steps " == *" $1 "* ]]; }

# JAX_PLATFORMS of every step on a machine whose GPU platform is $1: the GPU first (the
# default backend), then the CPU, whose device JAX's own callbacks run their function on.
jax_platforms_for() { if [ "$1" = cpu ]; then echo cpu; else echo "$1,cpu"; fi; }
jax_platforms=$(jax_platforms_for "$platform")
if [ "$platform" = cpu ]; then
    # The dry run: what the GPU machine would be given must name the CPU backend too (the
    # bench's baselines stop at once without it).
    would=$(jax_platforms_for "$kind")
    [[ ",$would," == *,cpu,* ]] || result 1 "dry run: on the GPU the steps would run with JAX_PLATFORMS=$would, without a CPU backend"
fi

# ---- the machine --------------------------------------------------------------------------
{
    if command -v "${smi%% *}" >/dev/null; then
        $smi 2>&1 | grep -v '^[=[:space:]]*$' | head -4
    else
        echo "no ${smi%% *}"
    fi
    "$python" -c 'import sys, platform, jax, jaxlib; print("python", sys.version.split()[0], "| jax", jax.__version__, "| jaxlib", jaxlib.__version__, "| C library", "-".join(platform.libc_ver()))' 2>&1 | tail -1
    echo "JAX_PLATFORMS=$jax_platforms XLA_FLAGS=${XLA_FLAGS:-(unset)} cores $(nproc 2>/dev/null || echo ?)"
} | while read -r line; do say "machine: $line"; done

# ---- install: the wheel, and only the test tools the machine lacks --------------------------
install_step before
export JAX_PLATFORMS=$jax_platforms
# No preallocation: tests start fresh interpreters on the same GPU while this one runs.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
export PYTHONUNBUFFERED=1
# Only pytest-timeout among the plugins: the machine's own plugins stay out.
export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1

# ---- 1. smoke --------------------------------------------------------------------------------
smoke_rc=0
if wants smoke; then
    say "1/4 smoke (at most ${smoke_s} s)"
    GPU_CHECK_SMOKE_S=$smoke_s timeout -k 5 "$smoke_s" "$python" .ci/accelerators/gpu_smoke.py 2>&1 \
        | tee -a "$summary"
    smoke_rc=${PIPESTATUS[0]}
    if [ "$smoke_rc" -eq 3 ]; then
        result 2 "setup failed: the $kind_name handlers are missing (see the smoke lines above)"
    fi
    [ "$smoke_rc" -eq 0 ] || say "smoke FAILED (exit status $smoke_rc): going on to name what fails"
fi

# ---- 2. the GPU tests ---------------------------------------------------------------------------
gpu_tests_rc=0
if wants gpu_tests; then
    say "2/4 gpu tests (at most $(cap "$gpu_tests_s") s)"
    pytest_step gpu_tests "$(cap "$gpu_tests_s")" tests/python/test_gpu.py \
        tests/python/test_cuda_lowering.py tests/python/test_rocm_lowering.py
    gpu_tests_rc=$?
fi

# ---- 3. the bench -------------------------------------------------------------------------------
bench_secs=$(cap "$bench_s")
wants bench || bench_secs=0
[ "$bench_secs" -eq 0 ] || say "3/4 bench (at most ${bench_secs} s)"
if ! wants bench; then
    bench_rc=0
elif [ "$bench_secs" -ge 10 ]; then
    OUT="$out" GPU_CHECK_BENCH_S="$bench_secs" timeout -k 10 "$bench_secs" \
        "$python" benches/gpu.py > "$out/bench.log" 2>&1
    bench_rc=$?
else
    bench_rc=124
fi
[ -f "$out/bench.log" ] && sed -n '/^targets/,$p' "$out/bench.log" | tee -a "$summary"
[ "$bench_rc" -eq 0 ] || [ ! -f "$out/bench.log" ] || tail -4 "$out/bench.log" | tee -a "$summary"
judge="not run"
wants bench && judge=$("$python" - "$out/gpu_bench.json" <<'EOF' 2>/dev/null || echo "no gpu_bench.json"
import json, sys
r = json.load(open(sys.argv[1]))
done = ", ".join(r.get("sections_done", []))
if r.get("dry_run"):
    print(f"dry run (targets not judged) | sections: {done}")
elif "all_targets_met" not in r:
    print(f"incomplete | sections: {done}")
else:
    print(f"{'met' if r['all_targets_met'] else 'missed'} | " + "; ".join(
        f"{k} {v:.2f}x" for k, v in r["targets"].items()))
EOF
)
wants bench && say "bench: exit status $bench_rc; targets $judge"

# ---- 4. the rest of the suite ---------------------------------------------------------------------
suite_rc=0
if wants suite; then
    # The order the GPU machine runs (checked in the dry run too, which runs a few files).
    order=$("$python" .ci/accelerators/suite_files.py) || result 1 "suite failed: no suite order (suite_files.py)"
    say "suite order: $(wc -w <<< "$order") files, first $(tr ' ' '\n' <<< "$order" | head -5 | sed 's|.*/||' | tr '\n' ' ')"
    suite_step "4/4 suite" --scope=jax
    suite_rc=$?
fi

# ---- verdict ------------------------------------------------------------------------------------
files_back=$(find "$out" -maxdepth 1 -type f | wc -l)
if [ "$files_back" -gt "$max_files" ]; then
    say "\$OUT holds $files_back files, more than the $max_files the GPU machine returns: $(ls "$out" | tr '\n' ' ')"
    [ "$platform" = cpu ] && result 1 "dry run: the check would bring back $files_back files, more than $max_files"
fi
failed_steps=""
[ "$smoke_rc" -eq 0 ] || failed_steps="$failed_steps smoke($smoke_rc)"
[ "$gpu_tests_rc" -eq 0 ] || failed_steps="$failed_steps gpu_tests($gpu_tests_rc)"
[ "$suite_rc" -eq 0 ] || failed_steps="$failed_steps suite($suite_rc)"
if [ -n "$failed_steps" ]; then
    result 1 "suite failed:$failed_steps; bench $bench_rc, targets $judge"
fi
if [ "$platform" = cpu ]; then
    [ "$bench_rc" -eq 0 ] || result 1 "suite failed: the dry-run bench exited $bench_rc"
    result 0 "dry run ok: the steps ($steps) ran on CPU (targets not judged)"
fi
case "$judge" in
    met*) [ "$bench_rc" -eq 0 ] && result 0 "all met: steps ($steps) passed; targets $judge" ;;
    "not run") result 0 "steps ($steps) passed; bench not run here" ;;
esac
result 3 "target missed: steps ($steps) passed; bench $bench_rc, targets $judge"
