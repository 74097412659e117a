#!/usr/bin/env bash
# Builds what .ci/accelerators/tpu_check.sh installs on the TPU machine (which has no network): the
# hostfeed wheel (abi3, linked against glibc 2.27 with zig as CI links it) and the wheels
# of the test tools its Python lacks (zarr and its dependencies, for Python 3.11 by
# default), into dist/ (gitignored; carry it to the TPU machine with the working tree,
# about 16 MB). .ci/accelerators/tpu_check.sh unpacks from it only what the machine's Python lacks.
#
#   bash .ci/accelerators/tpu_wheel.sh [python-version-of-the-tpu-machine]   # default: 3.11
set -euo pipefail
cd "$(dirname "$0")/../.."
version=${1:-3.11}
maturin=${MATURIN:-maturin}
mkdir -p dist
rm -f dist/*.whl
"$maturin" build --release --zig --compatibility manylinux_2_27 --out dist \
    --interpreter "python$version"
python3 .ci/wheel_symbols.py dist/hostfeed-*.whl  # no C library symbol without a version
python3 -m pip download --quiet --only-binary=:all: --dest dist --python-version "$version" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform any \
    "zarr>=3.1" donfig numcodecs google-crc32c crc32c pyyaml typing_extensions packaging \
    pytest-timeout
rm -f dist/numpy-*.whl
ls -la dist
du -sh dist
