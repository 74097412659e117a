#!/usr/bin/env bash
# Builds what .ci/accelerators/gpu_check.sh installs on the GPU machine (which has no network):
# the hostfeed wheel (abi3: one file for Python 3.11+) and the wheels of the test extra's
# tools for its Python (3.12 by default: pytest, pytest-timeout, zarr, matplotlib, tqdm
# and their dependencies, except numpy, which the machine's JAX brings), all into dist/
# (gitignored; carry it to the GPU machine with the working tree, about 30 MB).
# .ci/accelerators/gpu_check.sh unpacks from it only what the machine's Python lacks.
#
#   bash .ci/accelerators/gpu_wheel.sh [python-for-the-gpu-machine]   # default: python3.12
set -euo pipefail
cd "$(dirname "$0")/../.."
python=${1:-python3.12}
if ! "$python" --version >/dev/null 2>&1 && command -v pyenv >/dev/null 2>&1; then
    # pyenv's shim serves only the global version: use the installed one directly.
    python="$(pyenv root)/versions/$(pyenv latest "${python#python}")/bin/$python"
fi
maturin=${MATURIN:-maturin}
mkdir -p dist
rm -f dist/hostfeed-*.whl
"$maturin" build --release --interpreter "$python" --out dist
"$python" -m pip download --only-binary=:all: --dest dist \
    pytest pytest-timeout "zarr>=3.1" "matplotlib>=3.7" "tqdm>=4.60"
rm -f dist/numpy-*.whl
ls -la dist
du -sh dist
