#!/usr/bin/env bash
# What .ci/accelerators/tpu_check.sh installs on the TPU machine (Python 3.11 there):
# .ci/accelerators/accel_wheel.sh for that Python.
#
#   bash .ci/accelerators/tpu_wheel.sh [python-version-of-the-tpu-machine]   # default: 3.11
exec bash "$(dirname "$0")/accel_wheel.sh" "${1:-3.11}"
