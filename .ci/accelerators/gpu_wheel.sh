#!/usr/bin/env bash
# What .ci/accelerators/gpu_check.sh installs on the GPU machine (Python 3.12 there):
# .ci/accelerators/accel_wheel.sh for that Python.
#
#   bash .ci/accelerators/gpu_wheel.sh [python-version-of-the-gpu-machine]   # default: 3.12
exec bash "$(dirname "$0")/accel_wheel.sh" "${1:-3.12}"
