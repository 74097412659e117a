#!/usr/bin/env bash
# The GPU check on a machine with an AMD GPU and JAX's ROCm plugin: .ci/accelerators/gpu_check.sh
# with GPU_CHECK_KIND=rocm (JAX_PLATFORMS=rocm, the ROCm handlers required, the ROCm
# lowering tests, rocm-smi for the machine's lines); the same steps, budget, files under
# $OUT and exit statuses. Not yet run on ROCm hardware: the GPU machines this project
# borrows are NVIDIA only.
#
#   bash .ci/accelerators/gpu_wheel.sh        # where the wheel is built: fills dist/
#   bash .ci/accelerators/rocm_check.sh       # on the ROCm machine, from the repository root
#   GPU_CHECK_PLATFORM=cpu bash .ci/accelerators/rocm_check.sh   # the dry run, on CPU
GPU_CHECK_KIND=rocm exec bash "$(dirname "$0")/gpu_check.sh" "$@"
