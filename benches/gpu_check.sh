#!/usr/bin/env bash
# The GPU check: on a machine with a CUDA GPU and JAX's CUDA plugin (no network needed),
# installs the hostfeed wheel built elsewhere, runs the Python test suite on the GPU
# (JAX_PLATFORMS=cuda; tests that need several devices skip) and the GPU benchmarks
# (benches/gpu.py: taps and calls against io_callback / debug.callback and a pinned
# device-to-host copy floor, with the issue's targets as ratios).
#
#   bash benches/gpu_wheel.sh        # where the wheel is built: fills dist/ (gitignored)
#   bash benches/gpu_check.sh        # on the GPU machine, from the repository root, with
#                                    # dist/ carried along; results under $OUT (or ./gpu_check_out)
#
# Budget: under 10 minutes (pytest at most GPU_CHECK_PYTEST_S = 360 s, benchmarks at most
# GPU_CHECK_BENCH_S = 180 s). Exit status: 0 when the suite passed and every target was met.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=${OUT:-$root/gpu_check_out}
mkdir -p "$out"
summary="$out/summary.txt"
: > "$summary"
say() { echo "[gpu_check $(date +%H:%M:%S)] $*" | tee -a "$summary"; }
python=${PYTHON:-python3}
start=$SECONDS

# ---- the machine ----------------------------------------------------------------------
{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 || true
    command -v nvcc >/dev/null && nvcc --version | tail -2
    "$python" -c 'import sys, jax, jaxlib; print(sys.version); print("jax", jax.__version__, "jaxlib", jaxlib.__version__)'
    "$python" -m pip list 2>/dev/null | grep -i -E "^(jax|nvidia|pytest|numpy|ml.dtypes)" || true
} > "$out/environment.txt" 2>&1
say "environment: $(tr '\n' ' ' < "$out/environment.txt" | cut -c1-400)"

# ---- install the wheel (abi3 preferred, else this Python's tag) -------------------------
tag=$("$python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
wheel=$(ls dist/hostfeed-*-abi3-*.whl 2>/dev/null | head -1)
[ -n "$wheel" ] || wheel=$(ls dist/hostfeed-*-"$tag"-*.whl 2>/dev/null | head -1)
if [ -z "$wheel" ]; then
    say "FAIL: no hostfeed wheel for $tag in dist/ (build it with benches/gpu_wheel.sh and carry dist/)"
    exit 2
fi
test_tools='import pytest, pytest_timeout, zarr, matplotlib, tqdm'  # the test extra's tools
unpack() { "$python" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$1" "$2"; }
work=$(mktemp -d "${TMPDIR:-/tmp}/hostfeed_gpu_check.XXXXXX")  # not under $OUT: only results go back
venv="$work/venv"
# A virtual environment that sees the machine's JAX, with the wheel installed offline.
if "$python" -m venv --system-site-packages "$venv" >> "$out/install.log" 2>&1 \
        && "$venv/bin/python" -c 'import jax' >> "$out/install.log" 2>&1 \
        && "$venv/bin/python" -m pip install --no-index --no-deps --force-reinstall "$wheel" >> "$out/install.log" 2>&1; then
    py="$venv/bin/python"
    if ! "$py" -c "$test_tools" 2>/dev/null; then  # offline, from dist/
        "$py" -m pip install --no-index --find-links dist pytest pytest-timeout zarr matplotlib tqdm \
            >> "$out/install.log" 2>&1
    fi
else
    # No venv/pip, or JAX lives in another environment than the interpreter's base: unpack
    # the wheel (it holds only the package and its metadata) onto PYTHONPATH instead.
    say "venv unusable here (see install.log): unpacking the wheel onto PYTHONPATH"
    site="$work/site"
    mkdir -p "$site"
    unpack "$wheel" "$site"
    if ! "$python" -c "$test_tools" 2>/dev/null; then
        for w in dist/*.whl; do
            case "$w" in *hostfeed-*) ;; *) unpack "$w" "$site" ;; esac
        done
    fi
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    py=$python
fi
if ! (cd /tmp && "$py" -c 'import hostfeed' >> "$out/install.log" 2>&1); then
    say "FAIL: hostfeed does not import with this JAX (see install.log):"
    tail -3 "$out/install.log" | tee -a "$summary"
    if grep -q "supports jax" "$out/install.log"; then
        say "this hostfeed does not support the machine's JAX: build the wheel from a tree that does"
    fi
    exit 2
fi
say "installed $(basename "$wheel") into $py"

# GPU_CHECK_PLATFORM=cpu makes a dry run of this script on a machine without a GPU.
export JAX_PLATFORMS=${GPU_CHECK_PLATFORM:-cuda}
(cd /tmp && "$py" - <<'EOF') 2>&1 | tee -a "$summary"
import jax
from hostfeed import lowering, receiver
print("devices:", jax.devices())
print("hostfeed CUDA handlers:", lowering.cuda_status() or "registered",
      "| CUDA driver", receiver.cuda_driver_version())
EOF

# ---- the test suite on the GPU ------------------------------------------------------------
# No preallocation: tests start fresh interpreters on the same GPU while this one runs.
say "pytest (JAX_PLATFORMS=$JAX_PLATFORMS, at most ${GPU_CHECK_PYTEST_S:-360} s)"
XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 10 "${GPU_CHECK_PYTEST_S:-360}" \
    "$py" -m pytest tests/python -q -p no:cacheprovider -o addopts="" -rfEs \
    --junitxml="$out/pytest.xml" > "$out/pytest.txt" 2>&1
pytest_rc=$?
grep -E "^(FAILED|ERROR)" "$out/pytest.txt" | head -40 | tee -a "$summary"
tail -1 "$out/pytest.txt" | tee -a "$summary"
[ $pytest_rc -eq 124 ] && say "pytest ran out of time (partial results in pytest.txt)"
say "pytest exit status $pytest_rc after $((SECONDS - start)) s"

# ---- benchmarks -------------------------------------------------------------------------
say "benches/gpu.py (at most ${GPU_CHECK_BENCH_S:-180} s)"
OUT="$out" timeout -k 10 "${GPU_CHECK_BENCH_S:-180}" "$py" benches/gpu.py > "$out/bench.txt" 2>&1
bench_rc=$?
cat "$out/bench.txt" | tee -a "$summary" | tail -60
say "bench exit status $bench_rc; total $((SECONDS - start)) s"

targets_met=$("$py" -c 'import json, sys; print(json.load(open(sys.argv[1])).get("all_targets_met"))' \
    "$out/gpu_bench.json" 2>/dev/null || echo unknown)
say "suite: $([ $pytest_rc -eq 0 ] && echo passed || echo "FAILED ($pytest_rc)"); targets met: $targets_met"
[ $pytest_rc -eq 0 ] && [ $bench_rc -eq 0 ] && [ "$targets_met" = "True" ]
