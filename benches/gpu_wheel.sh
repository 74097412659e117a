#!/usr/bin/env bash
# Builds what benches/gpu_check.sh installs on the GPU machine (which has no network):
# the hostfeed wheel for its Python (3.12 by default; an abi3 wheel, where the build makes
# one, serves every Python) and the pure-Python wheels of pytest and pytest-timeout, all
# into dist/ (gitignored; carry it to the GPU machine with the working tree).
#
#   bash benches/gpu_wheel.sh [python-for-the-gpu-machine]   # default: python3.12
set -euo pipefail
cd "$(dirname "$0")/.."
python=${1:-python3.12}
if ! "$python" --version >/dev/null 2>&1 && command -v pyenv >/dev/null 2>&1; then
    # pyenv's shim serves only the global version: use the installed one directly.
    python="$(pyenv root)/versions/$(pyenv latest "${python#python}")/bin/$python"
fi
maturin=${MATURIN:-maturin}
mkdir -p dist
rm -f dist/hostfeed-*.whl
"$maturin" build --release --interpreter "$python" --out dist
"$python" -m pip download --only-binary=:all: --dest dist pytest pytest-timeout
ls -la dist
