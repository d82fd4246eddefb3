// Stage 12: stage 11's two fused passes as CUDA kernels, one for the forward pass and one for
// the backward pass. Compiled by nvcc; the GEMMs, the input checks and the Python binding are in
// lltm_cuda.cpp (compiled by the host compiler), which calls the two host functions at the end of
// this file.
//
// What this stage teaches: fusion on a GPU. Stage 10 runs the cell's element-wise maths as ATen
// calls: sigmoid, sigmoid, elu, mul, add, tanh, mul, ... each one a kernel launch on a GPU that
// reads its inputs from GPU memory and writes its result back. Here ONE kernel reads the gates
// and old_cell once and writes new_h and new_cell once; the backward's element-wise part is ONE
// kernel as well. The two matrix products stay on cuBLAS (through at::addmm / at::mm in
// lltm_cuda.cpp): nothing written here would beat cuBLAS at a GEMM.
//
// What changed since stage 11 (the fused CPU passes, lltm.cpp sections 2, 3 and 3b): the loop over
// (row, column) that 11 runs with at::parallel_for becomes a grid of GPU threads, one thread per
// (row, column) element; each thread does what one iteration of 11's forward_row / backward_row
// does, with the same choice of what to keep: the forward saves nothing but the pre-activation
// gates (which the GEMM writes anyway), and the backward kernel recomputes the three activations
// from them. Per element the forward kernel reads 4 values and writes 2, the backward kernel
// reads 6 (grad_h, grad_cell, new_cell, the three gates) and writes 4 (d_old_cell, d_gates).
//
// ---- The grid and the block ----
// The element-wise work is a (batch B) x (state S) matrix of independent elements.
//   block = (32, 8): 32 threads along the state (x), 8 rows of the batch (y): 256 threads.
//           The 32 threads of a warp share threadIdx.y and take 32 consecutive columns of one
//           row, so each load or store of a warp covers 32 consecutive values of one tensor
//           (coalesced): 128 contiguous bytes in float32, served as four 32-byte sectors when
//           the row starts on a 32-byte boundary and five when it does not (S not a multiple
//           of 8); 256 bytes in float64. No byte is fetched that some thread does not use,
//           except at the two ends of a row.
//   grid  = (ceil(S / 32), min(ceil(B / 8), 65535)) blocks.
//           grid.y is capped at 65535 (the hardware's limit for y); each thread loops over
//           its rows with a stride of the whole grid's height, so any batch size works.
// S and B are rarely multiples of 32 and 8: the last block in x holds threads past the last
// column, and the last block in y threads past the last row. Both are guarded below
// (`column < state_size`, `row < batch_size`): without the guard those threads would write past
// the end of the outputs. tests/test_stage.py runs this file on the CPU with canary bytes around
// every buffer and sizes that are not multiples of the block, and shows that a kernel with
// either guard removed damages them.
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

// elu(z) = z for z > 0, alpha (e^z - 1) otherwise. A branch, not fmaxf(0, z) + fminf(0, ...):
// those are float-only and would truncate a double. expm1 keeps e^z - 1 accurate for small z (no cancellation).
template <typename scalar_t>
__device__ __forceinline__ scalar_t elu(scalar_t z, scalar_t alpha = scalar_t(1)) {
  return z > scalar_t(0) ? z : alpha * expm1(z);
}

template <typename scalar_t, int N>
using Accessor = at::PackedTensorAccessor32<scalar_t, N, at::RestrictPtrTraits>;

// ---- 2. The forward kernel: stage 11's forward_row, one thread per (row, column) ----
// gates (B, 3, S): X W^T + b from cuBLAS, not yet activated -> new_cell, new_h (B, S).
template <typename scalar_t>
__global__ void lltm_cuda_forward_kernel(
    const Accessor<scalar_t, 3> gates,
    const Accessor<scalar_t, 2> old_cell,
    Accessor<scalar_t, 2> new_h,
    Accessor<scalar_t, 2> new_cell) {
  const int batch_size = gates.size(0);
  const int state_size = gates.size(2);
  const int column = blockIdx.x * blockDim.x + threadIdx.x;
  // The bounds guard, both dimensions: the last block in x (and in y) sticks out past S (and B).
  for (int row = blockIdx.y * blockDim.y + threadIdx.y; row < batch_size; row += gridDim.y * blockDim.y) {
    if (column < state_size) {
      const scalar_t input_gate = sigmoid(gates[row][0][column]);
      const scalar_t output_gate = sigmoid(gates[row][1][column]);
      const scalar_t candidate_cell = elu(gates[row][2][column]);
      const scalar_t cell = old_cell[row][column] + candidate_cell * input_gate;
      new_cell[row][column] = cell;
      new_h[row][column] = tanh(cell) * output_gate;
    }
  }
}

// ---- 3. The backward kernel: stage 11's backward_row, one thread per (row, column) ----
// gates, grad_h, grad_cell, new_cell -> d_old_cell (B, S) and d_gates (B, 3, S), the gradient
// with respect to the gates before their activations; lltm_cuda.cpp turns d_gates into the
// weight, bias and X gradients by GEMMs. The activations are recomputed from the saved
// pre-activation gates instead of saved by the forward: two exp, one expm1 and one tanh per
// element, against three more (B, S) tensors written, kept and read back.
template <typename scalar_t>
__global__ void lltm_cuda_backward_kernel(
    const Accessor<scalar_t, 2> grad_h,
    const Accessor<scalar_t, 2> grad_cell,
    const Accessor<scalar_t, 2> new_cell,
    const Accessor<scalar_t, 3> gates,
    Accessor<scalar_t, 2> d_old_cell,
    Accessor<scalar_t, 3> d_gates) {
  const int batch_size = d_gates.size(0);
  const int state_size = d_gates.size(2);
  const int column = blockIdx.x * blockDim.x + threadIdx.x;
  for (int row = blockIdx.y * blockDim.y + threadIdx.y; row < batch_size; row += gridDim.y * blockDim.y) {
    if (column < state_size) {
      const scalar_t input_gate = sigmoid(gates[row][0][column]);
      const scalar_t output_gate = sigmoid(gates[row][1][column]);
      const scalar_t z = gates[row][2][column];
      const scalar_t candidate_cell = elu(z);
      const scalar_t d_elu = z > scalar_t(0) ? scalar_t(1) : candidate_cell + scalar_t(1);  // elu'(z) = e^z = elu(z) + 1 for z <= 0
      const scalar_t tanh_cell = tanh(new_cell[row][column]);
      const scalar_t gh = grad_h[row][column];
      // new_h = tanh(new_cell) * output_gate; tanh'(u) = 1 - tanh^2(u)
      const scalar_t d_new_cell = gh * output_gate * (scalar_t(1) - tanh_cell * tanh_cell) + grad_cell[row][column];
      d_old_cell[row][column] = d_new_cell;  // new_cell = old_cell + ...: d_old_cell = d_new_cell
      // sigmoid'(z) = sigmoid(z) (1 - sigmoid(z))
      d_gates[row][0][column] = d_new_cell * candidate_cell * input_gate * (scalar_t(1) - input_gate);
      d_gates[row][1][column] = gh * tanh_cell * output_gate * (scalar_t(1) - output_gate);
      d_gates[row][2][column] = d_new_cell * input_gate * d_elu;
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

// gates (B, 3S) = X W^T + b, old_cell (B, S), both contiguous, same CUDA device and dtype.
// Returns new_h, new_cell, each (B, S).
std::vector<at::Tensor> lltm_cuda_forward_elementwise(const at::Tensor& gates, const at::Tensor& old_cell) {
  const int64_t batch_size = old_cell.size(0);
  const int64_t state_size = old_cell.size(1);
  const at::Tensor gates_3d = gates.view({batch_size, 3, state_size});
  at::Tensor new_h = at::empty_like(old_cell);
  at::Tensor new_cell = at::empty_like(old_cell);
  if (batch_size > 0 && state_size > 0) {  // a grid with 0 blocks is an invalid launch
    const LaunchShape shape = launch_shape(batch_size, state_size);
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    AT_DISPATCH_FLOATING_TYPES(gates.scalar_type(), "lltm_cuda_forward", ([&] {
      lltm_cuda_forward_kernel<scalar_t><<<shape.grid, shape.block, 0, stream>>>(
          gates_3d.packed_accessor32<scalar_t, 3, at::RestrictPtrTraits>(),
          old_cell.packed_accessor32<scalar_t, 2, at::RestrictPtrTraits>(),
          new_h.packed_accessor32<scalar_t, 2, at::RestrictPtrTraits>(),
          new_cell.packed_accessor32<scalar_t, 2, at::RestrictPtrTraits>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }));
  }
  return {new_h, new_cell};
}

// grad_h, grad_cell and the saved new_cell, each (B, S), and the saved gates (B, 3S), contiguous,
// same CUDA device and dtype. Returns d_old_cell (B, S) and d_gates (B, 3S).
std::vector<at::Tensor> lltm_cuda_backward_elementwise(
    const at::Tensor& grad_h,
    const at::Tensor& grad_cell,
    const at::Tensor& new_cell,
    const at::Tensor& gates) {
  const int64_t batch_size = new_cell.size(0);
  const int64_t state_size = new_cell.size(1);
  const at::Tensor gates_3d = gates.view({batch_size, 3, state_size});
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
          gates_3d.packed_accessor32<scalar_t, 3, at::RestrictPtrTraits>(),
          d_old_cell.packed_accessor32<scalar_t, 2, at::RestrictPtrTraits>(),
          d_gates.packed_accessor32<scalar_t, 3, at::RestrictPtrTraits>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }));
  }
  return {d_old_cell, d_gates.view({batch_size, 3 * state_size})};
}
