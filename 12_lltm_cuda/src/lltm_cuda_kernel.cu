// Stage 12: the LLTM's element-wise work as two CUDA kernels, one for the forward pass and one
// for the backward pass. Compiled by nvcc; the GEMMs, the input checks and the Python binding
// are in lltm_cuda.cpp (compiled by the host compiler), which calls the two host functions at
// the end of this file.
//
// What this stage teaches: fusion on a GPU. Stage 10 runs the cell's element-wise maths as
// ATen calls: sigmoid, sigmoid, elu, mul, add, tanh, mul, ... each one a kernel launch that
// reads its inputs from GPU memory and writes its result back. Here ONE kernel reads the gates
// and old_cell once and writes new_h, new_cell and the three activations once; the backward's
// element-wise part is ONE kernel as well. The two matrix products stay on cuBLAS (through
// at::addmm / at::mm in lltm_cuda.cpp): nothing written here would beat cuBLAS at a GEMM.
//
// What changed since stage 11 (the fused CPU pass): the loop over (row, column) that 11 runs
// with at::parallel_for becomes a grid of GPU threads, one thread per (row, column) element.
//
// ---- The grid and the block ----
// The element-wise work is a (batch B) x (state S) matrix of independent elements.
//   block = (32, 8): 32 threads along the state (x), 8 rows of the batch (y): 256 threads.
//           The 32 threads of a warp share threadIdx.y and take 32 consecutive columns of one
//           row, so each warp reads and writes 32 consecutive values of every tensor: one
//           128-byte transaction per tensor in float32 (coalesced).
//   grid  = (ceil(S / 32), min(ceil(B / 8), 65535)) blocks.
//           grid.y is capped at 65535 (the hardware's limit for y); each thread loops over
//           its rows with a stride of the whole grid's height, so any batch size works.
// S and B are rarely multiples of 32 and 8: the last block in x holds threads past the last
// column, and the last block in y threads past the last row. Both are guarded below
// (`column < state_size`, `row < batch_size`): without the guard those threads would write past
// the end of the outputs. (One of the seed texts guards with a condition that is always true;
// tests/test_stage.py runs state sizes 1, 31, 33, 127, ... to catch exactly that.)
//
// ---- Accessors ----
// Kernels take at::PackedTensorAccessor32<scalar_t, N, at::RestrictPtrTraits>: the data
// pointer, sizes and strides passed by value (a tensor itself cannot be passed to a kernel), with
// 32-bit index arithmetic (cheaper on a GPU than 64-bit; packed_accessor32() refuses a tensor of
// more than 2^31 - 1 elements with a clear error) and __restrict__ pointers (no aliasing between
// inputs and outputs, so the compiler may keep values in registers). gates[n][g][c] reads gate
// g of element (n, c) of the (B, 3, S) view of the (B, 3S) GEMM output.
//
// ---- Types, streams and errors ----
// AT_DISPATCH_FLOATING_TYPES instantiates each kernel for float and double. The maths helpers
// are templates on scalar_t: a float-only function such as fmaxf would silently round a double to
// float. Every launch goes on at::cuda::getCurrentCUDAStream() (the stream PyTorch is using now,
// e.g. inside `with torch.cuda.stream(s)` or a CUDA graph capture), never on the legacy default
// stream, and is followed by C10_CUDA_KERNEL_LAUNCH_CHECK(), which turns a failed launch into a
// Python RuntimeError instead of a silent no-op.
//
// Build and run: see ../README.md (pip install --no-build-isolation ./12_lltm_cuda on a machine
// with a GPU and a CUDA build of torch; tests: pytest 12_lltm_cuda/tests).

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAStream.h>     // at::cuda::getCurrentCUDAStream (c10::cuda, seen from at::)
#include <c10/cuda/CUDAException.h>  // C10_CUDA_KERNEL_LAUNCH_CHECK

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

namespace {

// ---- 1. The element-wise maths, one template per function (float and double alike) ----

// sigmoid(z) = 1 / (1 + e^-z)
template <typename scalar_t>
__device__ __forceinline__ scalar_t sigmoid(scalar_t z) {
  return scalar_t(1) / (scalar_t(1) + exp(-z));  // scalar_t(1), not 1.0: no float -> double promotion
}

// sigmoid'(z) = sigmoid(z) (1 - sigmoid(z)), from the saved s = sigmoid(z): no exp needed
template <typename scalar_t>
__device__ __forceinline__ scalar_t d_sigmoid_from_output(scalar_t s) {
  return (scalar_t(1) - s) * s;
}

// tanh'(z) = 1 - tanh^2(z), from t = tanh(z)
template <typename scalar_t>
__device__ __forceinline__ scalar_t d_tanh_from_output(scalar_t t) {
  return scalar_t(1) - t * t;
}

// elu(z) = z for z > 0, alpha (e^z - 1) otherwise. A branch, not fmaxf(0, z) + fminf(0, ...):
// those are float-only and would truncate a double. expm1 keeps e^z - 1 exact for small z.
template <typename scalar_t>
__device__ __forceinline__ scalar_t elu(scalar_t z, scalar_t alpha = scalar_t(1)) {
  return z > scalar_t(0) ? z : alpha * expm1(z);
}

// elu'(z) = 1 for z > 0, alpha e^z = elu(z) + alpha otherwise, from the saved e = elu(z):
// e > 0 exactly when z > 0 (elu keeps the sign), so no exp is needed here either.
template <typename scalar_t>
__device__ __forceinline__ scalar_t d_elu_from_output(scalar_t e, scalar_t alpha = scalar_t(1)) {
  return e > scalar_t(0) ? scalar_t(1) : e + alpha;
}

template <typename scalar_t, int N>
using Accessor = at::PackedTensorAccessor32<scalar_t, N, at::RestrictPtrTraits>;

// ---- 2. The forward kernel: every element-wise step of the cell in one pass ----
// gates (B, 3, S): X W^T + b from cuBLAS, not yet activated. One thread per (row, column).
template <typename scalar_t>
__global__ void lltm_cuda_forward_kernel(
    const Accessor<scalar_t, 3> gates,
    const Accessor<scalar_t, 2> old_cell,
    Accessor<scalar_t, 2> new_h,
    Accessor<scalar_t, 2> new_cell,
    Accessor<scalar_t, 2> input_gate,
    Accessor<scalar_t, 2> output_gate,
    Accessor<scalar_t, 2> candidate_cell) {
  const int batch_size = gates.size(0);
  const int state_size = gates.size(2);
  const int column = blockIdx.x * blockDim.x + threadIdx.x;
  // The bounds guard, both dimensions: the last block in x (and in y) sticks out past S (and B).
  for (int row = blockIdx.y * blockDim.y + threadIdx.y; row < batch_size; row += gridDim.y * blockDim.y) {
    if (column < state_size) {
      const scalar_t i = sigmoid(gates[row][0][column]);
      const scalar_t o = sigmoid(gates[row][1][column]);
      const scalar_t candidate = elu(gates[row][2][column]);
      const scalar_t cell = old_cell[row][column] + candidate * i;
      input_gate[row][column] = i;
      output_gate[row][column] = o;
      candidate_cell[row][column] = candidate;
      new_cell[row][column] = cell;
      new_h[row][column] = tanh(cell) * o;
    }
  }
}

// ---- 3. The backward kernel: every element-wise part of the gradient in one pass ----
// Writes d_old_cell (B, S) and d_gates (B, 3, S), the gradient with respect to the gates before
// their activations; lltm_cuda.cpp turns d_gates into the weight, bias and X gradients by GEMMs.
// All derivatives come from the activations saved by the forward (input_gate, output_gate,
// candidate_cell): the kernel reads 6 tensors, not 9, and calls one transcendental (tanh).
template <typename scalar_t>
__global__ void lltm_cuda_backward_kernel(
    const Accessor<scalar_t, 2> grad_h,
    const Accessor<scalar_t, 2> grad_cell,
    const Accessor<scalar_t, 2> new_cell,
    const Accessor<scalar_t, 2> input_gate,
    const Accessor<scalar_t, 2> output_gate,
    const Accessor<scalar_t, 2> candidate_cell,
    Accessor<scalar_t, 2> d_old_cell,
    Accessor<scalar_t, 3> d_gates) {
  const int batch_size = d_gates.size(0);
  const int state_size = d_gates.size(2);
  const int column = blockIdx.x * blockDim.x + threadIdx.x;
  for (int row = blockIdx.y * blockDim.y + threadIdx.y; row < batch_size; row += gridDim.y * blockDim.y) {
    if (column < state_size) {
      const scalar_t i = input_gate[row][column];
      const scalar_t o = output_gate[row][column];
      const scalar_t candidate = candidate_cell[row][column];
      const scalar_t tanh_cell = tanh(new_cell[row][column]);
      const scalar_t gh = grad_h[row][column];
      // new_h = tanh(new_cell) * o  and  new_cell = old_cell + candidate * i
      const scalar_t d_output_gate = tanh_cell * gh;
      const scalar_t d_new_cell = d_tanh_from_output(tanh_cell) * o * gh + grad_cell[row][column];
      d_old_cell[row][column] = d_new_cell;
      d_gates[row][0][column] = candidate * d_new_cell * d_sigmoid_from_output(i);  // input gate
      d_gates[row][1][column] = d_output_gate * d_sigmoid_from_output(o);           // output gate
      d_gates[row][2][column] = i * d_new_cell * d_elu_from_output(candidate);      // candidate
    }
  }
}

// ---- 4. The launch shape: grid and block for a B x S element-wise pass ----
constexpr int kBlockColumns = 32;  // one warp along the state: coalesced rows
constexpr int kBlockRows = 8;      // 8 batch rows per block: 256 threads
constexpr int kMaxGridRows = 65535;  // the hardware's limit for gridDim.y

struct LaunchShape {
  dim3 grid;
  dim3 block;
};

LaunchShape launch_shape(int64_t batch_size, int64_t state_size) {
  const int64_t grid_columns = (state_size + kBlockColumns - 1) / kBlockColumns;
  const int64_t grid_rows = std::min<int64_t>((batch_size + kBlockRows - 1) / kBlockRows, kMaxGridRows);
  TORCH_CHECK(grid_columns <= 2147483647, "lltm_cuda: state size ", state_size, " is too large for one grid");
  return {dim3(static_cast<unsigned>(grid_columns), static_cast<unsigned>(grid_rows)), dim3(kBlockColumns, kBlockRows)};
}

}  // namespace

// ---- 5. The host functions lltm_cuda.cpp calls (inputs already checked there) ----

// gate_weights (B, 3S) = X W^T + b, old_cell (B, S), both contiguous, same CUDA device and dtype.
// Returns new_h, new_cell, input_gate, output_gate, candidate_cell, each (B, S).
std::vector<at::Tensor> lltm_cuda_forward_elementwise(const at::Tensor& gate_weights, const at::Tensor& old_cell) {
  const int64_t batch_size = old_cell.size(0);
  const int64_t state_size = old_cell.size(1);
  const at::Tensor gates = gate_weights.view({batch_size, 3, state_size});
  at::Tensor new_h = at::empty_like(old_cell);
  at::Tensor new_cell = at::empty_like(old_cell);
  at::Tensor input_gate = at::empty_like(old_cell);
  at::Tensor output_gate = at::empty_like(old_cell);
  at::Tensor candidate_cell = at::empty_like(old_cell);
  if (batch_size > 0 && state_size > 0) {  // a grid with 0 blocks is an invalid launch
    const LaunchShape shape = launch_shape(batch_size, state_size);
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    AT_DISPATCH_FLOATING_TYPES(gates.scalar_type(), "lltm_cuda_forward", ([&] {
      lltm_cuda_forward_kernel<scalar_t><<<shape.grid, shape.block, 0, stream>>>(
          gates.packed_accessor32<scalar_t, 3, at::RestrictPtrTraits>(),
          old_cell.packed_accessor32<scalar_t, 2, at::RestrictPtrTraits>(),
          new_h.packed_accessor32<scalar_t, 2, at::RestrictPtrTraits>(),
          new_cell.packed_accessor32<scalar_t, 2, at::RestrictPtrTraits>(),
          input_gate.packed_accessor32<scalar_t, 2, at::RestrictPtrTraits>(),
          output_gate.packed_accessor32<scalar_t, 2, at::RestrictPtrTraits>(),
          candidate_cell.packed_accessor32<scalar_t, 2, at::RestrictPtrTraits>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }));
  }
  return {new_h, new_cell, input_gate, output_gate, candidate_cell};
}

// grad_h, grad_cell and the saved new_cell, input_gate, output_gate, candidate_cell, each (B, S),
// contiguous, same CUDA device and dtype. Returns d_old_cell (B, S) and d_gates (B, 3S).
std::vector<at::Tensor> lltm_cuda_backward_elementwise(
    const at::Tensor& grad_h,
    const at::Tensor& grad_cell,
    const at::Tensor& new_cell,
    const at::Tensor& input_gate,
    const at::Tensor& output_gate,
    const at::Tensor& candidate_cell) {
  const int64_t batch_size = new_cell.size(0);
  const int64_t state_size = new_cell.size(1);
  at::Tensor d_old_cell = at::empty_like(new_cell);
  at::Tensor d_gates = at::empty({batch_size, 3, state_size}, new_cell.options());
  if (batch_size > 0 && state_size > 0) {
    const LaunchShape shape = launch_shape(batch_size, state_size);
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    AT_DISPATCH_FLOATING_TYPES(new_cell.scalar_type(), "lltm_cuda_backward", ([&] {
      lltm_cuda_backward_kernel<scalar_t><<<shape.grid, shape.block, 0, stream>>>(
          grad_h.packed_accessor32<scalar_t, 2, at::RestrictPtrTraits>(),
          grad_cell.packed_accessor32<scalar_t, 2, at::RestrictPtrTraits>(),
          new_cell.packed_accessor32<scalar_t, 2, at::RestrictPtrTraits>(),
          input_gate.packed_accessor32<scalar_t, 2, at::RestrictPtrTraits>(),
          output_gate.packed_accessor32<scalar_t, 2, at::RestrictPtrTraits>(),
          candidate_cell.packed_accessor32<scalar_t, 2, at::RestrictPtrTraits>(),
          d_old_cell.packed_accessor32<scalar_t, 2, at::RestrictPtrTraits>(),
          d_gates.packed_accessor32<scalar_t, 3, at::RestrictPtrTraits>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }));
  }
  return {d_old_cell, d_gates.view({batch_size, 3 * state_size})};
}
