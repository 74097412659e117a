#!/usr/bin/env bash
# The TPU check: on a machine with a TPU and JAX's TPU support (libtpu; no network needed),
# puts the hostfeed wheel built elsewhere (and only the test tools the machine lacks) on
# PYTHONPATH, then, within TPU_CHECK_BUDGET_S (560 s) in all, runs the steps that
# TPU_CHECK_STEPS names (default: all three, in this order):
#
#   smoke   .ci/accelerators/tpu_smoke.py (<= 120 s): every feature once on the TPU (taps in order,
#           id_print, call, barrier_wait, tap_with_device, transformations, the Recorder
#           with every=/start=/stop=, reduce="stats", a Histogram, read-back), and which
#           dtypes the TPU's host transfers carry; then .ci/accelerators/tpu_traced_on_cpu.py
#           (a summary traced with the CPU as default backend, lowered for the TPU).
#   bench   python -m hostfeed bench (the TPU suite, <= 300 s): hostfeed against JAX's
#           callbacks, the targets as ratios, tpu_bench.json. The smoke and the bench run
#           with JAX_PLATFORMS=tpu,cpu (JAX's own callbacks need its CPU backend).
#           (TPU_CHECK_BENCH_ONLY="record paths": only those sections)
#   suite   .ci/accelerators/suite_files.py's files (the device path's first, never the
#           host-side ones; --scope=jax) with JAX_PLATFORMS=tpu, in the time left; tests
#           that start another process or need several devices skip themselves there.
#
#   bash .ci/accelerators/tpu_wheel.sh        # where the wheel is built: fills dist/ (gitignored)
#   TPU_CHECK_PLATFORM=cpu bash .ci/accelerators/tpu_check.sh   # the dry run, on CPU
#   bash .ci/accelerators/tpu_check.sh        # on the TPU machine, from the repository root, with
#                                    # dist/ carried along; results under $OUT (or ./tpu_check_out)
#
# One program at a time can hold a TPU, so every step is one process after the other; a
# machine's command limit may ask for two calls (TPU_CHECK_STEPS="smoke bench", then
# TPU_CHECK_STEPS=suite), each writing its files under $OUT. The pytest steps are
# .ci/accelerators/check_lib.sh's (verbose log, junit, failures as they happen, resumed after a
# hung test).
#
# $OUT holds 8 files: summary.txt, install.log, tpu_smoke.json, bench.log, tpu_bench.json,
# suite.log, suite.xml, suite.failures.txt (a machine that returns 8 files at most drops a
# 9th: keep the command's own output in summary.txt rather than in a file of its own).
#
# Exit status and last line ("RESULT: ..."):
#   0  all met          every step run passed and every target was met
#   1  suite failed     the smoke step, a test, or the suite's time ran out (targets as measured)
#   3  target missed    every test passed, a target was missed or the bench did not finish
#   2  setup failed     no wheel, or hostfeed does not import
#   0  dry run ok       TPU_CHECK_PLATFORM=cpu: every step ran (targets not judged on CPU)
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
out=${OUT:-$root/tpu_check_out}
check_name=tpu_check
python=${PYTHON:-python3}
platform=${TPU_CHECK_PLATFORM:-tpu}
dist=${TPU_CHECK_DIST:-$root/dist}
budget=${TPU_CHECK_BUDGET_S:-560}
steps=${TPU_CHECK_STEPS:-smoke bench suite}
smoke_s=${TPU_CHECK_SMOKE_S:-120}
bench_s=${TPU_CHECK_BENCH_S:-300}
test_s=${TPU_CHECK_TEST_S:-60}
stacks_s=${TPU_CHECK_STACKS_S:-40}
# The suite's files (default: .ci/accelerators/suite_files.py's).
suite_files=${TPU_CHECK_SUITE_FILES:-}
# shellcheck source=.ci/accelerators/check_lib.sh
source "$root/.ci/accelerators/check_lib.sh"
wants() { [[ " $steps " == *" $1 "* ]]; }

"$python" -c 'import sys, platform, jax, jaxlib; print("python", sys.version.split()[0], "| jax", jax.__version__, "| jaxlib", jaxlib.__version__, "|", platform.libc_ver())' 2>&1 \
    | tail -1 | while read -r line; do say "machine: $line"; done

# ---- install: the wheel, and only the test tools the machine lacks --------------------------
# After the machine's own packages: its JAX stays the one imported.
install_step after
export JAX_PLATFORMS=$platform
# JAX's own callbacks (the bench's baselines, the smoke's dtype table) place their operands
# on a CPU device: the smoke and the bench run with JAX's CPU backend beside the TPU; the
# suite runs on the TPU alone.
with_cpu=$platform
[ "$platform" = cpu ] || with_cpu="$platform,cpu"
export PYTHONUNBUFFERED=1
# Only pytest-timeout among the plugins: the machine's own plugins stay out.
export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1

# ---- smoke ------------------------------------------------------------------------------------
smoke_rc=0
if wants smoke; then
    say "smoke (at most $(cap "$smoke_s") s)"
    JAX_PLATFORMS=$with_cpu TPU_CHECK_SMOKE_S=$(cap "$smoke_s") OUT="$out" \
        timeout -k 5 "$(cap "$smoke_s")" "$python" .ci/accelerators/tpu_smoke.py 2>&1 | tee -a "$summary"
    smoke_rc=${PIPESTATUS[0]}
    # Then, once the smoke has let go of the TPU: traced with the CPU as default backend,
    # lowered for the TPU (.ci/accelerators/tpu_traced_on_cpu.py). Not in the dry run.
    if [ "$platform" != cpu ]; then
        JAX_PLATFORMS="cpu,$platform" timeout -k 5 60 "$python" \
            .ci/accelerators/tpu_traced_on_cpu.py 2>&1 | grep -v -i warn | tee -a "$summary"
        traced_rc=${PIPESTATUS[0]}
        [ "$traced_rc" -eq 0 ] || { say "traced on the CPU: FAILED ($traced_rc)"; smoke_rc=$traced_rc; }
    fi
    [ "$smoke_rc" -eq 0 ] || say "smoke FAILED (exit status $smoke_rc)"
fi

# ---- bench ------------------------------------------------------------------------------------
bench_rc=skipped judge="not run"
if wants bench; then
    bench_secs=$(cap "$bench_s")
    say "bench (at most ${bench_secs} s)"
    quick=()
    [ "$platform" = tpu ] || quick=(--quick --suite tpu)
    # TPU_CHECK_BENCH_ONLY: the bench's sections to run (default: all of the TPU suite).
    [ -z "${TPU_CHECK_BENCH_ONLY:-}" ] || read -r -a only <<< "$TPU_CHECK_BENCH_ONLY"
    [ -z "${TPU_CHECK_BENCH_ONLY:-}" ] || quick+=(--only "${only[@]}")
    JAX_PLATFORMS=$with_cpu timeout -k 10 "$bench_secs" "$python" -m hostfeed bench "${quick[@]}" \
        --json "$out/tpu_bench.json" > "$out/bench.log" 2>&1
    bench_rc=$?
    sed -n '/^targets/,$p' "$out/bench.log" | tee -a "$summary"
    judge=$("$python" - "$out/tpu_bench.json" <<'EOF' 2>/dev/null || echo "no tpu_bench.json"
import json, sys
r = json.load(open(sys.argv[1]))
failed = [k for k, v in r.items() if isinstance(v, dict) and "error" in v]
t = r.get("targets", {})
verdict = "met" if t and all(v <= 1.0 for v in t.values()) and not failed else "missed"
print(f"{verdict} | " + "; ".join(f"{k} {v:.2f}x" for k, v in t.items())
      + (f" | sections failed: {', '.join(failed)}" if failed else ""))
EOF
)
    say "bench: exit status $bench_rc; targets $judge"
fi

# ---- suite ------------------------------------------------------------------------------------
suite_rc=0
if wants suite; then
    suite_step suite --scope=jax
    suite_rc=$?
fi

# ---- verdict ----------------------------------------------------------------------------------
failed_steps=""
[ "$smoke_rc" -eq 0 ] || failed_steps="$failed_steps smoke($smoke_rc)"
[ "$suite_rc" -eq 0 ] || failed_steps="$failed_steps suite($suite_rc)"
if [ -n "$failed_steps" ]; then
    result 1 "suite failed:$failed_steps; bench $bench_rc, targets $judge"
fi
if [ "$platform" = cpu ]; then
    [ "$bench_rc" = skipped ] || [ "$bench_rc" -eq 0 ] || result 1 "suite failed: the dry-run bench exited $bench_rc"
    result 0 "dry run ok: every step ran on CPU (targets not judged)"
fi
case "$judge" in
    met*) [ "$bench_rc" -eq 0 ] && result 0 "all met: steps ($steps) passed; targets $judge" ;;
    "not run") result 0 "steps ($steps) passed; bench not run here" ;;
esac
result 3 "target missed: steps ($steps) passed; bench $bench_rc, targets $judge"
