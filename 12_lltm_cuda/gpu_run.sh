#!/usr/bin/env bash
# Stage 12's whole GPU run in one command, on a machine with an NVIDIA GPU, a CUDA build of
# torch and the CUDA toolkit (nvcc of torch.version.cuda's major version):
#
#     12_lltm_cuda/gpu_run.sh [LOG_DIR]          (PYTHON=/path/to/python to pick the interpreter)
#
# It installs common/, stages 09, 10 and 12 into that Python (no build isolation: the build
# must see the installed torch), runs stage 12's tests (both build routes included),
# compute-sanitizer's memcheck on the kernel tests where compute-sanitizer is installed, and
# benchmark.py. Every log lands in LOG_DIR (default /tmp/12_lltm_cuda_gpu_run); paste
# benchmark.txt and the GPU line into the README's "GPU figures" section.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
LOG=${1:-/tmp/12_lltm_cuda_gpu_run}
mkdir -p "$LOG"
"$PY" -c "import torch, sys; sys.exit(0 if torch.version.cuda and torch.cuda.is_available() else
    f'gpu_run.sh: needs a GPU and a CUDA build of torch; this is torch {torch.__version__}')"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  "$PY" -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, torch.cuda.get_device_name())"
  command -v nvcc >/dev/null && nvcc --version | tail -2 || echo "nvcc not on PATH"; } 2>&1 | tee "$LOG/gpu.txt"

for stage in common 09_lltm_python 10_lltm_cpp 12_lltm_cuda; do
    if [ -d "$stage" ]; then
        echo "==> installing $stage" | tee -a "$LOG/install.txt"
        "$PY" -m pip install --no-build-isolation --no-deps -q "./$stage" >>"$LOG/install.txt" 2>&1 \
            || { tail -40 "$LOG/install.txt"; exit 1; }
    fi
done

# -o addopts="": the repository's pytest.ini adds nbval options this run does not need.
PYTEST=("$PY" -m pytest -p no:cacheprovider -o addopts="")
status=0
"${PYTEST[@]}" 12_lltm_cuda/tests -q -rs 2>&1 | tee "$LOG/tests.txt" || status=1

if command -v compute-sanitizer >/dev/null; then
    # memcheck: any out-of-bounds or misaligned access in the kernels fails the run.
    compute-sanitizer --tool memcheck --error-exitcode 99 "${PYTEST[@]}" 12_lltm_cuda/tests -q -x \
        -k "(reference or rows or contiguous or gradcheck or bias_of) and not OnTheCpu" 2>&1 | tail -25 | tee "$LOG/sanitizer.txt" \
        || status=1
else
    echo "compute-sanitizer not installed: memcheck not run" | tee "$LOG/sanitizer.txt"
fi

"$PY" 12_lltm_cuda/benchmark.py 2>&1 | tee "$LOG/benchmark.txt" || status=1
echo "logs in $LOG (exit status $status)"
exit $status
