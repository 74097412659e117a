#!/usr/bin/env bash
# Builds what an accelerator check (.ci/accelerators/gpu_check.sh, tpu_check.sh) installs on
# its machine, which has no network: the hostfeed wheel (abi3, linked against glibc 2.27
# with zig as CI links it, its symbols checked by .ci/wheel_symbols.py) and the wheels of
# the test tools such a machine's Python lacks (zarr and its dependencies; pytest-timeout),
# for the machine's Python version, into dist/ (gitignored; carry it with the working
# tree, about 16 MB). The check unpacks from it only what the machine's Python lacks.
#
#   bash .ci/accelerators/accel_wheel.sh PYTHON_VERSION     # e.g. 3.12 (gpu_wheel.sh, tpu_wheel.sh)
# Needs maturin (MATURIN=...) and zig (pip install ziglang), as CI's tools have.
set -euo pipefail
cd "$(dirname "$0")/../.."
version=${1:?the Python version of the accelerator machine, e.g. 3.12}
maturin=${MATURIN:-maturin}
interpreter=python$version
if ! "$interpreter" --version >/dev/null 2>&1 && command -v pyenv >/dev/null 2>&1; then
    # pyenv's shim serves only the global version: use the installed one directly.
    interpreter="$(pyenv root)/versions/$(pyenv latest "$version")/bin/python$version"
fi
mkdir -p dist
rm -f dist/*.whl
"$maturin" build --release --zig --compatibility manylinux_2_27 --out dist \
    --interpreter "$interpreter"
python3 .ci/wheel_symbols.py dist/hostfeed-*.whl  # no C library symbol without a version
python3 -m pip download --quiet --only-binary=:all: --dest dist --python-version "$version" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform any \
    "zarr>=3.1" donfig numcodecs google-crc32c crc32c pyyaml typing_extensions packaging \
    pytest-timeout
rm -f dist/numpy-*.whl  # the machine's JAX brings its numpy
ls -la dist
du -sh dist
