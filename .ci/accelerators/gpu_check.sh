#!/usr/bin/env bash
# The GPU check: on a machine with a CUDA GPU and JAX's CUDA plugin (no network needed),
# or, as GPU_CHECK_KIND=rocm (.ci/accelerators/rocm_check.sh), an AMD GPU and JAX's ROCm plugin,
# puts the hostfeed wheel built elsewhere (and only the test tools the machine lacks) on
# PYTHONPATH, then, within GPU_CHECK_BUDGET_S (450 s) in all, runs:
#
#   1. smoke      .ci/accelerators/gpu_smoke.py (<= 60 s): handlers registered, one tap, one call,
#                 one 64 MiB tap, a barrier. Stops the check at once if the handlers are
#                 missing: nothing later could pass.
#   2. gpu tests  test_gpu.py, test_cuda_lowering.py and test_rocm_lowering.py, -v.
#   3. bench      benches/gpu.py (<= 150 s): the issue's three targets, as ratios.
#   4. suite      the rest of tests/python (not test_bench.py, a CPU bench subprocess),
#                 -rA --durations=20, in the time left.
#
#   bash .ci/accelerators/gpu_wheel.sh        # where the wheel is built: fills dist/ (gitignored)
#   GPU_CHECK_PLATFORM=cpu bash .ci/accelerators/gpu_check.sh   # the dry run, on CPU (CI runs it)
#   bash .ci/accelerators/gpu_check.sh        # on the GPU machine, from the repository root, with
#                                    # dist/ carried along; results under $OUT (or ./gpu_check_out)
#
# Every pytest step writes a verbose log as it goes (a test's name appears when it starts,
# its outcome when it ends, so a run cut off still names each outcome) and a junit file;
# faulthandler dumps every thread's stack when a test runs past GPU_CHECK_STACKS_S, and
# pytest-timeout (thread method: it also ends a test hung inside XLA's Execute, where the
# signal method cannot) stops one past GPU_CHECK_TEST_S. gpu_bench.json is rewritten after
# each section of the bench. $OUT holds at most 10 files: summary.txt, install.log,
# gpu_tests.log, gpu_tests.xml, gpu_tests.failures.txt, bench.log, gpu_bench.json,
# suite.log, suite.xml, suite.failures.txt (.ci/accelerators/check_lib.sh's pytest steps).
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
# Which GPU: cuda (the default) or rocm; JAX_PLATFORMS is the same word (cpu: the dry run).
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
smoke_s=${GPU_CHECK_SMOKE_S:-60}
gpu_tests_s=${GPU_CHECK_GPU_TESTS_S:-120}
bench_s=${GPU_CHECK_BENCH_S:-150}
test_s=${GPU_CHECK_TEST_S:-90}
stacks_s=${GPU_CHECK_STACKS_S:-45}
# The suite's files (default: all but test_bench.py); the CPU dry run picks a few.
suite_files=${GPU_CHECK_SUITE_FILES:-}
# shellcheck source=.ci/accelerators/check_lib.sh
source "$root/.ci/accelerators/check_lib.sh"

# ---- the machine --------------------------------------------------------------------------
{
    if command -v "${smi%% *}" >/dev/null; then
        $smi 2>&1 | grep -v '^[=[:space:]]*$' | head -4
    else
        echo "no ${smi%% *}"
    fi
    "$python" -c 'import sys, jax, jaxlib; print("python", sys.version.split()[0], "| jax", jax.__version__, "| jaxlib", jaxlib.__version__)' 2>&1 | tail -1
} | while read -r line; do say "machine: $line"; done

# ---- install: the wheel, and only the test tools the machine lacks --------------------------
install_step before
export JAX_PLATFORMS=$platform
# No preallocation: tests start fresh interpreters on the same GPU while this one runs.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
export PYTHONUNBUFFERED=1
# Only pytest-timeout among the plugins: the machine's own plugins stay out.
export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1

# ---- 1. smoke --------------------------------------------------------------------------------
say "1/4 smoke (at most ${smoke_s} s)"
GPU_CHECK_SMOKE_S=$smoke_s timeout -k 5 "$smoke_s" "$python" .ci/accelerators/gpu_smoke.py 2>&1 \
    | tee -a "$summary"
smoke_rc=${PIPESTATUS[0]}
if [ "$smoke_rc" -eq 3 ]; then
    result 2 "setup failed: the $kind_name handlers are missing (see the smoke lines above)"
fi
[ "$smoke_rc" -eq 0 ] || say "smoke FAILED (exit status $smoke_rc): going on to name what fails"

# ---- 2. the GPU tests ---------------------------------------------------------------------------
say "2/4 gpu tests (at most $(cap "$gpu_tests_s") s)"
pytest_step gpu_tests "$(cap "$gpu_tests_s")" tests/python/test_gpu.py tests/python/test_cuda_lowering.py \
    tests/python/test_rocm_lowering.py
gpu_tests_rc=$?

# ---- 3. the bench -------------------------------------------------------------------------------
bench_secs=$(cap "$bench_s")
say "3/4 bench (at most ${bench_secs} s)"
if [ "$bench_secs" -ge 10 ]; then
    OUT="$out" timeout -k 10 "$bench_secs" "$python" benches/gpu.py > "$out/bench.log" 2>&1
    bench_rc=$?
else
    bench_rc=124
fi
[ -f "$out/bench.log" ] && sed -n '/^targets/,$p' "$out/bench.log" | tee -a "$summary"
judge=$("$python" - "$out/gpu_bench.json" <<'EOF' 2>/dev/null || echo "no gpu_bench.json"
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
say "bench: exit status $bench_rc; targets $judge"

# ---- 4. the rest of the suite ---------------------------------------------------------------------
suite_step "4/4 suite"
suite_rc=$?

# ---- verdict ------------------------------------------------------------------------------------
failed_steps=""
[ "$smoke_rc" -eq 0 ] || failed_steps="$failed_steps smoke($smoke_rc)"
[ "$gpu_tests_rc" -eq 0 ] || failed_steps="$failed_steps gpu_tests($gpu_tests_rc)"
[ "$suite_rc" -eq 0 ] || failed_steps="$failed_steps suite($suite_rc)"
if [ -n "$failed_steps" ]; then
    result 1 "suite failed:$failed_steps; bench $bench_rc, targets $judge"
fi
if [ "$platform" = cpu ]; then
    [ "$bench_rc" -eq 0 ] || result 1 "suite failed: the dry-run bench exited $bench_rc"
    result 0 "dry run ok: every step ran on CPU (targets not judged)"
fi
case "$judge" in
    met*) [ "$bench_rc" -eq 0 ] && result 0 "all met: suite passed; targets $judge" ;;
esac
result 3 "target missed: suite passed; bench $bench_rc, targets $judge"
