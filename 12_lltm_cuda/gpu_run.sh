#!/usr/bin/env bash
# Stage 12's whole GPU run in one command, on a machine with an NVIDIA GPU, a CUDA build of
# torch and the CUDA toolkit (nvcc of torch.version.cuda's major version):
#
#     12_lltm_cuda/gpu_run.sh [LOG_DIR]          (PYTHON=/path/to/python to pick the interpreter)
#
# It installs common/, stages 09, 10 and 12 into that Python (no build isolation: the build
# must see the installed torch; 10 and 12 compile side by side), then runs stage 12's tests
# (both build routes included) and, beside them, compute-sanitizer's memcheck on the kernel
# tests where compute-sanitizer is installed, and last, alone on the GPU, benchmark.py. It
# prints a line, with the seconds since it started, as the installs, the tests and the
# benchmark start and end; STEP_LIMIT=SECONDS stops the tests, the sanitizer or the benchmark
# if it runs longer. The compilers are $CC and $CXX where set (nvcc's host compiler too). Every
# log lands in LOG_DIR (default /tmp/12_lltm_cuda_gpu_run; a relative path is taken from the
# repository's root); paste benchmark.txt and gpu.txt into the README's "GPU figures" section.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$(command -v python || command -v python3)}
LOG=${1:-/tmp/12_lltm_cuda_gpu_run}
LIMIT=${STEP_LIMIT:-0}  # timeout(1) reads 0 as no limit
mkdir -p "$LOG"
START=$SECONDS
say() { echo "gpu_run.sh [$((SECONDS - START)) s] $*"; }

"$PY" -c "import torch, sys; sys.exit(0 if torch.version.cuda and torch.cuda.is_available() else
    f'gpu_run.sh: needs a GPU and a CUDA build of torch; this is torch {torch.__version__}')"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  "$PY" -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, torch.cuda.get_device_name())"
  command -v nvcc >/dev/null && nvcc --version | tail -2 || echo "nvcc not on PATH"
  echo "C++ compiler (CXX): $("${CXX:-c++}" --version | head -1)" || true
  echo "nvcc's host compiler (CC): $("${CC:-cc}" --version | head -1)" || true
  grep -m1 "model name" /proc/cpuinfo || true; } 2>&1 | tee "$LOG/gpu.txt"

install() {  # install STAGE: one pip call, its output in install_STAGE.txt, its tail on failure
    "$PY" -m pip install --no-build-isolation --no-deps -q "./$1" >"$LOG/install_$1.txt" 2>&1 \
        || { tail -40 "$LOG/install_$1.txt"; return 1; }
}
say "installing common and 09 (Python), then 10 (C++) and 12 (C++ and CUDA) side by side"
install common
install 09_lltm_python
install 10_lltm_cpp & cpp=$!
install 12_lltm_cuda || { wait $cpp; exit 1; }
wait $cpp
say "installed"

# The first error message formats numbers (shapes, sizes). A module whose compiler put its own
# copy of libstdc++ into it (ldd shows none) crashed right there, at the first bad input,
# instead of raising: one bad call before the tests, its output appended to gpu.txt.
set +e
"$PY" -c "
import torch, eml.lltm_cuda._C as compiled
try:
    compiled.forward(torch.zeros(3, device='cuda'), *[torch.zeros(3, 3, device='cuda')] * 4)
except RuntimeError as error:
    print('a bad input raises:', str(error).splitlines()[0])" >>"$LOG/gpu.txt" 2>&1
preflight=$?
set -e
if [ $preflight -ge 128 ]; then
    echo "gpu_run.sh: stage 12's module died of signal $((preflight - 128)) while raising its error for a 1-D input"
    echo "  (CXX=${CXX:-c++}). A module with its own copy of libstdc++ does this: rebuild with the system's"
    echo "  compiler, CC=gcc CXX=g++ $0"
    exit 1
elif [ $preflight -ne 0 ]; then
    echo "gpu_run.sh: stage 12's module fails before the tests:"; tail -5 "$LOG/gpu.txt"; exit 1
fi

# -o addopts="": the repository's pytest.ini adds nbval options this run does not need.
PYTEST=("$PY" -m pytest -p no:cacheprovider -o addopts="")
status=0
say "stage 12's tests, and compute-sanitizer beside them"
timeout "$LIMIT" "${PYTEST[@]}" 12_lltm_cuda/tests -q -rs --durations=5 >"$LOG/tests.txt" 2>&1 & tests=$!
if command -v compute-sanitizer >/dev/null; then
    # memcheck: any out-of-bounds or misaligned access in the kernels fails the run. The tests
    # it runs launch the kernels on awkward shapes; gradcheck and the CPU emulation are left out.
    # PyTorch's caching allocator off: with it, tensors lie inside larger segments, and a write
    # past a tensor's end that stays inside its segment is invisible to memcheck.
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout "$LIMIT" compute-sanitizer --tool memcheck --error-exitcode 99 "${PYTEST[@]}" 12_lltm_cuda/tests -q -x \
        -k "(reference or rows or contiguous or bias_of) and not OnTheCpu" >"$LOG/sanitizer.txt" 2>&1 \
        || { echo "compute-sanitizer: exit status $?" >>"$LOG/sanitizer.txt"; status=1; }
else
    echo "compute-sanitizer not installed: memcheck not run" >"$LOG/sanitizer.txt"
fi
wait $tests || status=1
tail -25 "$LOG/tests.txt"
tail -8 "$LOG/sanitizer.txt"
say "tests done"

say "benchmark"
timeout "$LIMIT" "$PY" 12_lltm_cuda/benchmark.py 2>&1 | tee "$LOG/benchmark.txt" || status=1
say "done; logs in $LOG (exit status $status)"
exit $status
