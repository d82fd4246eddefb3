#!/usr/bin/env bash
# Compile stage 12's two sources WITHOUT a GPU and without a CUDA build of torch: a check that
# they build, for machines that have nvcc but only torch's CPU wheel (its headers include
# ATen's and c10's CUDA headers; it lacks the CUDA libraries, so nothing is linked against torch
# and nothing runs). Takes under a minute on 2 cores (36 s on a Zen 5).
#
#     12_lltm_cuda/compile_check.sh            (PYTHON=..., ARCH=90 by default: H100/H200)
#
# It compiles lltm_cuda_kernel.cu with nvcc and lltm_cuda.cpp with the host compiler, using
# torch's C++20 standard, links the two objects into one shared object, and fails if a function
# lltm_cuda.cpp declares is not defined by the .cu file (an undefined `lltm` symbol).
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python}
ARCH=${ARCH:-90}
NVCC=${NVCC:-nvcc}
command -v "$NVCC" >/dev/null || { echo "compile_check.sh: no nvcc on PATH (set NVCC=...)"; exit 1; }
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
read -r TORCH_INCLUDE PY_INCLUDE < <("$PY" -c "import sysconfig, torch.utils.cpp_extension as c; print(c.include_paths()[0], sysconfig.get_paths()['include'])")
# cuda_runtime.h: under $CUDA_HOME, or next to a real nvcc binary, or /usr/local/cuda.
NVCC_HOME=$(dirname "$(dirname "$(readlink -f "$(command -v "$NVCC")")")")
CUDA_INCLUDE=""
for home in ${CUDA_HOME:-} "$NVCC_HOME" /usr/local/cuda; do
    [ -f "$home/include/cuda_runtime.h" ] && { CUDA_INCLUDE=$home/include; break; }
done
[ -n "$CUDA_INCLUDE" ] || { echo "compile_check.sh: cuda_runtime.h not found (set CUDA_HOME)"; exit 1; }
FLAGS=(-I"$TORCH_INCLUDE" -I"$TORCH_INCLUDE/torch/csrc/api/include" -std=c++20 -O2)
# torch's CPU wheel ships c10/cuda without the header CMake generates for a CUDA build.
[ -f "$TORCH_INCLUDE/c10/cuda/impl/cuda_cmake_macros.h" ] || FLAGS+=(-DC10_CUDA_NO_CMAKE_CONFIGURE_FILE)
echo "nvcc: $("$NVCC" --version | tail -1); torch headers: $TORCH_INCLUDE; sm_$ARCH"
"$NVCC" -c src/lltm_cuda_kernel.cu -o "$WORK/kernel.o" "${FLAGS[@]}" -Xcompiler -fPIC \
    -gencode "arch=compute_$ARCH,code=sm_$ARCH" --expt-relaxed-constexpr -w \
    -D__CUDA_NO_HALF_OPERATORS__ -D__CUDA_NO_HALF_CONVERSIONS__ -D__CUDA_NO_BFLOAT16_CONVERSIONS__ -D__CUDA_NO_HALF2_OPERATORS__
echo "compiled src/lltm_cuda_kernel.cu"
"${CXX:-c++}" -c src/lltm_cuda.cpp -o "$WORK/host.o" "${FLAGS[@]}" -fPIC -w -I"$CUDA_INCLUDE" -I"$PY_INCLUDE" \
    -DTORCH_EXTENSION_NAME=_C -DTORCH_API_INCLUDE_EXTENSION_H
echo "compiled src/lltm_cuda.cpp"
"${CXX:-c++}" -shared "$WORK/kernel.o" "$WORK/host.o" -o "$WORK/check.so"
missing=$(nm -C -u "$WORK/check.so" | grep -i lltm || true)
[ -z "$missing" ] || { echo "undefined LLTM symbols (declared in lltm_cuda.cpp, not defined in the .cu):"; echo "$missing"; exit 1; }
echo "ok: both sources compile and the host declarations match the kernels' definitions"
