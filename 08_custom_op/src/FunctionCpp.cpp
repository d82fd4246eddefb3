// Stage 08 of "From PyTorch to Machine Code": stage 06's linear layer as registered PyTorch
// operators (eml::linear and its backward ops, bindings.cpp), so that torch.compile, torch.export,
// vmap and autocast see it, and one abi3 wheel serves every Python >= 3.10.
//
// What stage 06 taught, and this file still does: how a fast matrix product is put together from TPPs (tensor
// processing primitives): small kernels for one fixed job, here the GEMM block
//
//     C (m x n)  (+)=  A (m x k) . B (k x n)        64 x 128 x 128 by default on AVX2
//
// that LIBXSMM writes as machine code at run time (JIT) for those exact sizes and the CPU it
// runs on. Where the data lives while a kernel runs, for the 64 x 128 tiles of AVX2 (64 x 64
// on AVX-512):
//   - registers: the kernel holds a small block of C (a few columns of up to 64 rows) in vector
//     registers while it runs over k, loading a column of A and broadcasting elements of B.
//     A whole 64 x 128 float32 tile cannot stay there: it is 32 KB, and all the vector registers
//     together hold 2 KB (32 x 64 B, AVX-512) or 512 B (16 x 32 B, AVX2);
//   - L1 (32-48 KB per core): the thread's C tile and the A and B columns in use;
//   - L2 (512 KB-1 MB per core): the thread's chunk of packed B (at most 256 KB) and the A
//     block, re-read from there for every register block of C.
// Our job is the loop nest around the kernels: cut each of the layer's three products into
// tiles, reduce every tile in k steps, spread the tiles over the threads, and prepare once
// everything that can be prepared once (the kernels, the plans, the packed weight).
//
//   forward:   y           = x W^T + b          (N, in) x (in, out)  -> (N, out)
//   backward:  grad_input  = grad_output W      (N, out) x (out, in) -> (N, in)
//              grad_weight = grad_output^T x    (out, N) x (N, in)   -> (out, in)
//              grad_bias   = sum_N grad_output                        -> (out)
//
// The files, in reading order (each opens with what it holds):
//   kernel.h         1. one JIT kernel: asking LIBXSMM for it, the NULL check
//   blocked_gemm.h   2. the loop nest around the kernels (BlockedGemm)
//   linear_state.h   3. the state and caches: kernels, plans, packed weight
//   FunctionCpp.h    the functions the operators run (declarations)
//   FunctionCpp.cpp  4. input checks and the process-wide states, 5. the three products on raw
//                    pointers, 6. forward and backward (bfloat16 too), 7. tools (this file)
//   bindings.cpp     the operator schemas and registrations (TORCH_LIBRARY), and the empty
//                    Python module whose import runs them
//
// What changed since stage 06: no pybind11 and no LinearState argument. forward and backward take
// tensors and flags only, as an operator schema demands; the state of each (in, out) pair lives
// in a process-wide table (state_for, section 4); the weight is packed on every call (no pack
// cache: README, "State without pybind11"). bfloat16 is accepted and runs on the float32 kernels
// (section 6). Messages start with "linear_op:".
// Build and test (LIBXSMM first: `sudo apt-get install -y libxsmm-dev`, or `make` at the root):
//   pip install --no-build-isolation .   then   pytest tests
//
// ---- The views trick: every product computed transposed, so no TRANS_A is ever needed ----
//
// LIBXSMM's kernels are column-major: element (i, j) of A lives at a[i + j * lda]. A row-major
// PyTorch matrix R (r x c) is, in the same memory, the column-major matrix R^T (c x r). So each
// product is computed on the transposed views, the operands addressed where they lie, then copied:
//
//   product      row-major (PyTorch)   column-major (LIBXSMM)      A, packed once     B, packed per thread
//   forward      y  = x W^T            y^T  = W   . x^T            W (below)          rows of x
//   grad_input   gx = gy W             gx^T = W^T . gy^T           W^T                rows of gy
//   grad_weight  gw = gy^T x           gw^T = x^T . gy             x^T                blocks of gy, transposed
//
// The forward's A is not where it should be: the kernel wants W (out x in) column-major,
// memory holds W^T. LIBXSMM 1.17 has no TRANS_A (it returns NULL for it), so W is transposed
// into panels, the packed weight, on every call in this stage (06 reused it while W was unchanged).
// The backward's A operands (W^T, x^T) could be read where they lie, but their columns would be
// `in` floats apart, a multiple of 4 KB: each k step's columns would fight over a few L1 sets.
// So they are copied into contiguous panels too (pack_column_panels, one memcpy per row). The B
// operands and the C tiles have the same problem, so each thread packs its B blocks and
// accumulates its C tile in buffers of its own (blocked_gemm.h; 06's README: the training step);
// grad_weight's gy is transposed block by block on the way, and grad_bias summed in that pass.
// grad_weight's reduction runs over the batch N (the kernel's k), so no two threads ever add
// into the same tile.
//
// ---- The loop nest (BlockedGemm::run) --------------------------------------------------
//
//               n: bn-wide blocks (N: the batch for forward and grad_input)
//             +--------+--------+--------+----+
//   m:        | (0, 0) | (0, 1) | (0, 2) |    |   C tile (mb, nb), bm x bn: one thread owns it.
//   bm-high   +--------+--------+--------+----+   A run: a thread's tiles of one column block nb.
//   blocks    | (1, 0) | (1, 1) |  ...   |    |   for each chunk of k steps (<= 256 KB of B):
//             +--------+--------+--------+----+     pack B(chunk, nb) into the thread's buffer
//             |  tail row: the last block is  |     for each tile of the run:
//             +--- smaller, and so its kernel +       tile  = A(mb, kb0) . B(kb0, nb)   beta = 0
//                                 ^ tail column       tile += A(mb, kb) . B(kb, nb)     beta = 1
//                                                     C(mb, nb) = tile + bias (first chunk)
//                                                           or += tile (later chunks)
//
//   at::parallel_for over the nM * nN tiles: each thread takes a contiguous range of tiles,
//   in column-block order (n_outer, the default: long runs) or row-block order.
//
// A tile's kernel depends on whether its row block, column block and k step are full or the
// smaller last one (the tail), and on beta: 2 x 2 x 2 x 2 = at most 16 kernels per product,
// dispatched once and looked up by index in the loop (BlockedGemm::kernels).
#include <ATen/Parallel.h>

#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "FunctionCpp.h"

namespace linear_op {

// Sections 4 and 5 are internal to this file: the anonymous namespace keeps their names out of
// the symbols the module exports.
namespace {

// ---- 4. Input checks, shapes ----------------------------------------------------------

// The stage's one place for input validation; forward and backward call it before anything
// else, the state included. TORCH_CHECK raises a Python RuntimeError whose message names the
// problem and the offending value. An absent tensor (std::nullopt) is not checked: the bias
// when there is none, grad_output in the forward, and in the backward the input or the weight
// when no requested gradient needs it (grad_input needs the weight, grad_weight the input).
void check_inputs(const std::optional<torch::Tensor>& i_input,
                  const std::optional<torch::Tensor>& i_weight,
                  const std::optional<torch::Tensor>& i_bias,
                  const std::optional<torch::Tensor>& i_grad_output = std::nullopt,
                  bool i_need_grad_input = false,
                  bool i_need_grad_weights = false) {
  TORCH_CHECK(i_weight || !i_need_grad_input, "linear_op: grad_input needs the weight, got None");
  TORCH_CHECK(i_input || !i_need_grad_weights, "linear_op: grad_weight needs the input, got None");

  // Device and dtype: CPU tensors, Float or Double (the two types LIBXSMM's GEMMs are built
  // for here) or BFloat16 (computed on the float32 kernels: section 6), all of the first one's
  // dtype (the weight's).
  const std::pair<const char*, const std::optional<torch::Tensor>*> l_tensors[] = {
      {"weight", &i_weight}, {"input", &i_input}, {"bias", &i_bias}, {"grad_output", &i_grad_output}};
  const char* l_dtype_from = nullptr;
  torch::ScalarType l_dtype = torch::kFloat;
  for (const auto& [l_name, l_tensor] : l_tensors) {
    if (!l_tensor->has_value()) continue;
    const torch::Tensor& l_t = l_tensor->value();
    TORCH_CHECK(l_t.device().is_cpu(), "linear_op: expected the ", l_name, " on the CPU, got device ", l_t.device());
    TORCH_CHECK(l_t.scalar_type() == torch::kFloat || l_t.scalar_type() == torch::kDouble ||
                    l_t.scalar_type() == torch::kBFloat16,
                "linear_op: expected a Float, Double or BFloat16 ", l_name, " dtype, got ", l_t.scalar_type());
    if (l_dtype_from == nullptr) {
      l_dtype_from = l_name;
      l_dtype = l_t.scalar_type();
    }
    TORCH_CHECK(l_t.scalar_type() == l_dtype, "linear_op: expected the ", l_name, " dtype ", l_dtype,
                " (the ", l_dtype_from, "'s), got ", l_t.scalar_type());
  }

  // Ranks: weight (out_features, in_features), input and grad_output (*, features).
  if (i_weight) {
    TORCH_CHECK(i_weight->dim() == 2, "linear_op: expected a 2-d weight (out_features, in_features), got ",
                i_weight->dim(), " dimension(s): ", i_weight->sizes());
  }
  if (i_input) {
    TORCH_CHECK(i_input->dim() >= 1, "linear_op: expected an input with at least 1 dimension (*, in_features), got a 0-d tensor");
  }
  if (i_grad_output) {
    TORCH_CHECK(i_grad_output->dim() >= 1, "linear_op: expected a grad_output with at least 1 dimension (*, out_features), got a 0-d tensor");
  }

  // Sizes: the feature counts agree with the weight, the batch dimensions with each other.
  // The kernels trust these sizes: a wrong one here would be a read out of bounds there.
  if (i_input && i_weight) {
    TORCH_CHECK(i_input->size(-1) == i_weight->size(1), "linear_op: expected ", i_weight->size(1),
                " input features in the last dimension (the weight's in_features), got ", i_input->size(-1),
                " (input shape ", i_input->sizes(), ")");
  }
  if (i_bias && i_weight) {
    TORCH_CHECK(i_bias->dim() == 1 && i_bias->size(0) == i_weight->size(0), "linear_op: expected a bias of shape [",
                i_weight->size(0), "] (the weight's out_features), got shape ", i_bias->sizes());
  }
  if (i_grad_output && i_weight) {
    TORCH_CHECK(i_grad_output->size(-1) == i_weight->size(0), "linear_op: expected ", i_weight->size(0),
                " output features in grad_output's last dimension (the weight's out_features), got ",
                i_grad_output->size(-1), " (grad_output shape ", i_grad_output->sizes(), ")");
  }
  if (i_grad_output && i_input) {
    const auto l_batch = i_input->sizes().slice(/*start=*/0, /*length=*/i_input->dim() - 1);
    const auto l_batch_grad = i_grad_output->sizes().slice(/*start=*/0, /*length=*/i_grad_output->dim() - 1);
    TORCH_CHECK(l_batch == l_batch_grad, "linear_op: expected grad_output's leading dimensions ", l_batch,
                " (the input's), got ", l_batch_grad, " (grad_output shape ", i_grad_output->sizes(), ")");
  }
}

}  // namespace

// New in 08: the state of every (in_features, out_features) pair, process-wide. A registered
// operator takes tensors and scalars only, so no Layer can hand it a LinearState (06's pybind11
// object). The first call with a pair makes its state (its kernels and plans); every later call,
// from any layer, thread, compiled graph or exported program, finds it here. A state holds
// kernels and plans only (the weight is packed per call): one per pair, never freed, a few KB
// each. Called after check_inputs: the sizes are valid by then.
LinearState& state_for(int64_t i_in_features, int64_t i_out_features) {
  static std::mutex s_mutex;
  static std::map<std::pair<int64_t, int64_t>, std::unique_ptr<LinearState>> s_states;
  std::lock_guard<std::mutex> l_lock(s_mutex);
  auto& l_state = s_states[{i_in_features, i_out_features}];
  if (!l_state) l_state = std::make_unique<LinearState>(i_in_features, i_out_features);
  return *l_state;
}

namespace {

// (*, features) -> (N, features), N the product of the leading sizes (1 for a 1-d tensor).
// A view where the strides allow it, else a copy; flatten handles 0-size dimensions too.
torch::Tensor flatten_to_2d(const torch::Tensor& i_tensor) {
  return i_tensor.dim() == 1 ? i_tensor.unsqueeze(/*dim=*/0) : i_tensor.flatten(/*start_dim=*/0, /*end_dim=*/-2);
}

// (N, features) -> (*, features): the leading sizes of i_like, the last size of i_tensor_2d.
torch::Tensor unflatten_like(const torch::Tensor& i_tensor_2d, const torch::Tensor& i_like) {
  std::vector<int64_t> l_sizes = i_like.sizes().vec();
  l_sizes.back() = i_tensor_2d.size(/*dim=*/1);
  return i_tensor_2d.reshape(l_sizes);
}

// ---- 5. The three products and the bias gradient, on raw pointers ------------------

// B packing. Each thread copies a chunk of k steps kb0 .. kb1-1 of one column block of B
// (columns nb*bn ..) into its buffer: step kb is the column-major (bk x bn) slab at
// buffer + (kb-kb0)*bk*bn, ldb = bk, so the kernel reads it contiguously however far apart the
// columns lie in memory.

// B's column j is a row of a row-major matrix (the forward's x, grad_input's gy: B = x^T, gy^T):
// each slab column is a memcpy of a piece of that row.
template <typename T>
void pack_b_rows(const BlockedGemm<T>& i_gemm, const T* i_src, idx i_ld_src, idx i_nb, idx i_kb0, idx i_kb1,
                 T* o_buffer) {
  const idx l_columns = i_gemm.columns(i_nb);
  for (idx l_kb = i_kb0; l_kb < i_kb1; l_kb++) {
    T* l_slab = o_buffer + (l_kb - i_kb0) * i_gemm.bk * i_gemm.bn;
    const idx l_depth = i_gemm.depth(l_kb);
    for (idx l_j = 0; l_j < l_columns; l_j++) {
      std::memcpy(l_slab + l_j * i_gemm.bk, i_src + (i_nb * i_gemm.bn + l_j) * i_ld_src + l_kb * i_gemm.bk,
                  l_depth * sizeof(T));
    }
  }
}

// B's k runs down the rows of a row-major matrix (grad_weight's gy: B = gy, N x out): each slab
// is a transposed (bk x bn) block of it. With o_column_sums, the same pass adds each column of
// the block into o_column_sums[j] (grad_bias, fused: gy is read once for both; zeroed by the
// first chunk, kb0 = 0).
template <typename T>
void pack_b_transposed(const BlockedGemm<T>& i_gemm, const T* i_src, idx i_ld_src, idx i_nb, idx i_kb0, idx i_kb1,
                       T* o_buffer, T* o_column_sums) {
  const idx l_columns = i_gemm.columns(i_nb);
  if (o_column_sums != nullptr && i_kb0 == 0) std::fill_n(o_column_sums, l_columns, T(0));
  for (idx l_kb = i_kb0; l_kb < i_kb1; l_kb++) {
    T* l_slab = o_buffer + (l_kb - i_kb0) * i_gemm.bk * i_gemm.bn;
    const idx l_depth = i_gemm.depth(l_kb);
    const T* l_block = i_src + l_kb * i_gemm.bk * i_ld_src + i_nb * i_gemm.bn;  // rows kb*bk.., columns nb*bn..
    // the block (depth rows x columns, row-major, ld i_ld_src) is the column-major (columns x
    // depth) matrix; its transpose (depth x columns, ld bk) is the slab
    libxsmm_otrans(l_slab, l_block, sizeof(T), /*m=*/l_columns, /*n=*/l_depth, /*ldi=*/i_ld_src, /*ldo=*/i_gemm.bk);
    if (o_column_sums != nullptr) {
      for (idx l_j = 0; l_j < l_columns; l_j++) {
        const T* l_column = l_slab + l_j * i_gemm.bk;  // contiguous now
        T l_sum = 0;
        for (idx l_k = 0; l_k < l_depth; l_k++) l_sum += l_column[l_k];
        o_column_sums[l_j] += l_sum;
      }
    }
  }
}

// Stores a tile (rows x columns, ld bm) into a column-major C (ld i_ldc), adding i_bias[row] to
// every column when a bias is given (the forward's, fused into the store); with i_add, adds the
// tile to what the earlier chunks of k steps stored there.
template <typename T>
void store_tile(const BlockedGemm<T>& i_gemm, idx i_mb, idx i_nb, const T* i_tile, bool i_add, T* o_c, idx i_ldc,
                const T* i_bias) {
  const idx l_rows = i_gemm.rows(i_mb), l_columns = i_gemm.columns(i_nb);
  T* l_c = o_c + i_nb * i_gemm.bn * i_ldc + i_mb * i_gemm.bm;
  const T* l_bias = i_bias ? i_bias + i_mb * i_gemm.bm : nullptr;
  for (idx l_j = 0; l_j < l_columns; l_j++) {
    const T* l_from = i_tile + l_j * i_gemm.bm;
    T* l_to = l_c + l_j * i_ldc;
    if (i_add) {
      for (idx l_i = 0; l_i < l_rows; l_i++) l_to[l_i] += l_from[l_i];
    } else if (l_bias == nullptr) {
      std::memcpy(l_to, l_from, l_rows * sizeof(T));
    } else {
      for (idx l_i = 0; l_i < l_rows; l_i++) l_to[l_i] = l_from[l_i] + l_bias[l_i];
    }
  }
}

// y (N, out) = x (N, in) W^T + b. All pointers row-major and contiguous.
template <typename T>
void forward_tpp(LinearState& io_state, const at::Tensor& i_weight, const at::Tensor& i_weight_contiguous,
                 const T* i_x, const T* i_b, T* o_y, idx N, idx i_in, idx i_out, bool i_cache_weight) {
  if (N == 0 || i_out == 0) return;
  const auto l_plan = io_state.plan<T>(kForward, N);
  const BlockedGemm<T>& l_gemm = *l_plan;
  const idx bm = l_gemm.bm, bk = l_gemm.bk;
  at::Tensor l_packed;  // no K, nothing to pack: the tiles are the bias, or zeros
  if (i_in > 0) l_packed = io_state.packed_weight(i_weight, i_weight_contiguous, bm, i_cache_weight);
  const T* l_panels = i_in > 0 ? l_packed.const_data_ptr<T>() : nullptr;
  l_gemm.run(
      // A block (mb, kb): panel mb, from row kb*bk of its column-major (bm x in) layout
      [&](idx mb, idx kb) { return l_panels + mb * bm * i_in + kb * bk * bm; },
      // B = x^T: column j of x^T is row j of x
      [&](idx, idx nb, idx kb0, idx kb1, T* o_buffer) { pack_b_rows(l_gemm, i_x, /*ld_src=*/i_in, nb, kb0, kb1, o_buffer); },
      // C = y^T: column j of y^T is row j of y; the bias added to every column on the way
      [&](idx mb, idx nb, const T* tile, bool add) { store_tile(l_gemm, mb, nb, tile, add, o_y, /*ldc=*/i_out, i_b); });
}

// The backward's A operands, packed like the forward's W (see "The training step" in the
// README): column block mb (columns mb*bm ..) of a row-major (rows x cols) matrix, copied into
// panel mb, (rows x bm) contiguous: the column-major (bm x rows) A operand with lda = bm. Read
// in place instead, A's columns lie `cols` elements apart, a multiple of 4 KB for the usual
// sizes: every column of a k step falls into the same few L1 sets, and they evict each other.
template <typename T>
at::Tensor pack_column_panels(const T* i_src, idx i_rows, idx i_cols, idx i_bm) {
  const idx l_panels = (i_cols + i_bm - 1) / i_bm;
  at::Tensor l_packed = at::empty({l_panels * i_bm * i_rows}, at::TensorOptions().dtype(c10::CppTypeToScalarType<T>::value));
  T* l_p = l_packed.mutable_data_ptr<T>();
  at::parallel_for(/*begin=*/0, /*end=*/i_rows, /*grain_size=*/64, [&](idx i_first, idx i_last) {
    for (idx l_mb = 0; l_mb < l_panels; l_mb++) {
      // the tail panel's rows hold fewer than bm values; the rest stays unwritten, never read
      const idx l_width = std::min(i_bm, i_cols - l_mb * i_bm);
      for (idx l_r = i_first; l_r < i_last; l_r++) {
        std::memcpy(l_p + l_mb * i_bm * i_rows + l_r * i_bm, i_src + l_r * i_cols + l_mb * i_bm, l_width * sizeof(T));
      }
    }
  });
  return l_packed;
}

// gx (N, in) = gy (N, out) W (out, in): gx^T = W^T . gy^T; W^T packed into panels, gy per thread.
template <typename T>
void grad_input_tpp(LinearState& io_state, const T* i_gy, const T* i_w, T* o_gx, idx N, idx i_in, idx i_out) {
  const auto l_plan = io_state.plan<T>(kGradInput, N);
  const BlockedGemm<T>& l_gemm = *l_plan;
  const idx bm = l_gemm.bm, bk = l_gemm.bk;
  if (N == 0 || i_in == 0) return;
  const at::Tensor l_panels = pack_column_panels(i_w, /*rows=*/i_out, /*cols=*/i_in, bm);  // W^T, (in x out) in panels
  const T* l_a = l_panels.const_data_ptr<T>();
  l_gemm.run([&](idx mb, idx kb) { return l_a + mb * bm * i_out + kb * bk * bm; },  // panel mb, k step kb
             [&](idx, idx nb, idx kb0, idx kb1, T* o_buffer) {  // B = gy^T: column j is row j of gy
               pack_b_rows(l_gemm, i_gy, /*ld_src=*/i_out, nb, kb0, kb1, o_buffer);
             },
             [&](idx mb, idx nb, const T* tile, bool add) {
               store_tile(l_gemm, mb, nb, tile, add, o_gx, /*ldc=*/i_in, (const T*)nullptr);
             });
}

// gw (out, in) = gy^T (out, N) x (N, in): gw^T = x^T . gy; x^T packed into panels, gy transposed
// per thread, block by block. With o_gb, grad_bias (the column sums of gy) comes out of the same
// pass over gy: the packs of column block nb for the run of tiles from row block 0 sum it, once.
// Returns false when it could not (no tiles: in == 0 or an empty batch); the caller then sums.
template <typename T>
bool grad_weight_tpp(LinearState& io_state, const T* i_gy, const T* i_x, T* o_gw, T* o_gb, idx N, idx i_in, idx i_out) {
  const auto l_plan = io_state.plan<T>(kGradWeight, N);
  const BlockedGemm<T>& l_gemm = *l_plan;
  const idx bm = l_gemm.bm, bk = l_gemm.bk;
  if (i_in == 0 || i_out == 0) return false;
  const at::Tensor l_panels = pack_column_panels(i_x, /*rows=*/N, /*cols=*/i_in, bm);  // x^T, (in x N) in panels
  const T* l_a = l_panels.const_data_ptr<T>();
  l_gemm.run([&](idx mb, idx kb) { return l_a + mb * bm * N + kb * bk * bm; },  // panel mb, k step kb
             [&](idx mb, idx nb, idx kb0, idx kb1, T* o_buffer) {
               T* l_sums = (o_gb != nullptr && mb == 0) ? o_gb + nb * l_gemm.bn : nullptr;
               pack_b_transposed(l_gemm, i_gy, /*ld_src=*/i_out, nb, kb0, kb1, o_buffer, l_sums);
             },
             [&](idx mb, idx nb, const T* tile, bool add) {
               store_tile(l_gemm, mb, nb, tile, add, o_gw, /*ldc=*/i_in, (const T*)nullptr);
             });
  return N > 0;
}

// gb[o] = sum_n gy[n][o] for o in [first, last). Not a GEMM: plain C++, innermost loop contiguous.
// target_clones makes GCC compile it for AVX-512, AVX2 and the baseline, and pick one when the
// module loads: vector code without building the whole file for one CPU (no -march=native).
template <typename T>
__attribute__((target_clones("avx512f", "avx2", "default")))
void column_sums(const T* __restrict i_gy, T* __restrict o_gb, idx N, idx i_out, idx i_first, idx i_last) {
  std::fill(o_gb + i_first, o_gb + i_last, T(0));
  for (idx l_n = 0; l_n < N; l_n++) {
    const T* l_row = i_gy + l_n * i_out;
    for (idx l_o = i_first; l_o < i_last; l_o++) o_gb[l_o] += l_row[l_o];
  }
}

template <typename T>
void grad_bias_tpp(const T* i_gy, T* o_gb, idx N, idx i_out) {
  at::parallel_for(/*begin=*/0, /*end=*/i_out, /*grain_size=*/256,
                   [&](idx i_first, idx i_last) { column_sums<T>(i_gy, o_gb, N, i_out, i_first, i_last); });
}

// BFloat16 operands, as float32 (exact: every bfloat16 is a float32). The kernels below then
// accumulate in float32 and the caller rounds each result to bfloat16 once.
std::optional<torch::Tensor> to_float(const std::optional<torch::Tensor>& i_tensor) {
  if (!i_tensor) return std::nullopt;
  return i_tensor->to(torch::kFloat);
}

}  // namespace

// ---- 6. The functions the operators run (bindings.cpp registers them) ------------------
//
// bfloat16: LIBXSMM 1.17 generates bfloat16 GEMMs only for AVX-512 CPUs, native with AVX512-BF16
// and emulated (slower than its float32 kernels) without, and only with the A operand in VNNI
// pairs (stage 07). This stage runs everywhere instead: bfloat16 operands are
// widened to float32, the float32 kernels run, and each result is rounded to bfloat16 once
// (grad_bias is summed in float32 too). A VNNI path would slot in at the two `kBFloat16` tests
// below; README, "bfloat16", says what it would buy.

// y = x W^T + b for x of shape (*, in); without a bias, y = x W^T. The state comes from the
// process-wide table (state_for); the weight is packed for this call.
torch::Tensor forward(torch::Tensor i_input, torch::Tensor i_weight, std::optional<torch::Tensor> i_bias) {
  check_inputs(i_input, i_weight, i_bias);  // first: the state is only touched with valid inputs
  if (i_input.scalar_type() == torch::kBFloat16) {  // the fallback (above): float32 kernels, one rounding
    return forward(i_input.to(torch::kFloat), i_weight.to(torch::kFloat), to_float(i_bias)).to(torch::kBFloat16);
  }
  LinearState& l_state = state_for(i_weight.size(1), i_weight.size(0));
  const bool l_cache_weight = false;  // packed per call: README, "State without pybind11"
  // Row-major data, each in a named local: a data pointer into a temporary would dangle.
  // contiguous() returns the tensor itself when it is already contiguous, else a copy.
  const torch::Tensor l_input = flatten_to_2d(i_input).contiguous();             // (N, in)
  const torch::Tensor l_weight = i_weight.contiguous();                          // (out, in)
  const torch::Tensor l_bias = i_bias ? i_bias->contiguous() : torch::Tensor();  // (out), or undefined
  const int64_t l_n = l_input.size(0), l_in = l_weight.size(1), l_out = l_weight.size(0);
  torch::Tensor l_output = torch::empty({l_n, l_out}, l_input.options());  // every element is written

  // scalar_t is float for a Float input, double for a Double one.
  AT_DISPATCH_FLOATING_TYPES(l_input.scalar_type(), "linear_op::forward", [&] {
    // The pack cache keys on the weight as the caller holds it (i_weight), not on a copy.
    forward_tpp<scalar_t>(l_state, i_weight, l_weight, l_input.const_data_ptr<scalar_t>(),
                          l_bias.defined() ? l_bias.const_data_ptr<scalar_t>() : nullptr,
                          l_output.mutable_data_ptr<scalar_t>(), l_n, l_in, l_out, l_cache_weight);
  });
  return unflatten_like(l_output, i_input);  // (*, out)
}

torch::Tensor forward(torch::Tensor i_input, torch::Tensor i_weight) {
  return forward(i_input, i_weight, /*i_bias=*/std::nullopt);
}

// The gradients of y = x W^T + b: {grad_input, grad_weight, grad_bias}, each computed only
// when asked for; one that is not comes back undefined, which Python receives as None.
std::vector<torch::Tensor> backward(torch::Tensor i_grad_output,
                                    std::optional<torch::Tensor> i_input,
                                    std::optional<torch::Tensor> i_weights,
                                    bool i_need_grad_input,
                                    bool i_need_grad_weights,
                                    bool i_need_grad_bias) {
  check_inputs(i_input, i_weights, /*i_bias=*/std::nullopt, i_grad_output, i_need_grad_input, i_need_grad_weights);
  if (i_grad_output.scalar_type() == torch::kBFloat16) {  // the fallback (section 6): float32 kernels, one rounding
    std::vector<torch::Tensor> l_grads = backward(i_grad_output.to(torch::kFloat), to_float(i_input),
                                                  to_float(i_weights), i_need_grad_input, i_need_grad_weights,
                                                  i_need_grad_bias);
    for (auto& l_grad : l_grads) {
      if (l_grad.defined()) l_grad = l_grad.to(torch::kBFloat16);
    }
    return l_grads;
  }
  const torch::Tensor l_grad_output = flatten_to_2d(i_grad_output).contiguous();  // (N, out)
  const int64_t l_n = l_grad_output.size(0), l_out = l_grad_output.size(1);
  // in_features from whichever of weight and input is there (grad_bias alone needs neither).
  const int64_t l_in = i_weights ? i_weights->size(1) : i_input ? i_input->size(-1) : 0;
  LinearState* l_state = nullptr;  // grad_bias alone needs no kernel, so no state
  if (i_need_grad_input || i_need_grad_weights) l_state = &state_for(l_in, l_out);
  torch::Tensor l_grad_input, l_grad_weights, l_grad_bias;  // undefined until computed

  AT_DISPATCH_FLOATING_TYPES(l_grad_output.scalar_type(), "linear_op::backward", [&] {
    const scalar_t* l_gy = l_grad_output.const_data_ptr<scalar_t>();
    if (i_need_grad_input) {
      // grad_input = grad_output W: (N, out) x (out, in) -> (N, in), then (*, in)
      const torch::Tensor l_weights = i_weights->contiguous();  // (out, in)
      torch::Tensor l_gx = torch::empty({l_n, l_in}, l_grad_output.options());
      grad_input_tpp<scalar_t>(*l_state, l_gy, l_weights.const_data_ptr<scalar_t>(), l_gx.mutable_data_ptr<scalar_t>(),
                               l_n, l_in, l_out);
      l_grad_input = unflatten_like(l_gx, i_grad_output);
    }
    if (i_need_grad_bias) l_grad_bias = torch::empty({l_out}, l_grad_output.options());
    scalar_t* l_gb = i_need_grad_bias ? l_grad_bias.mutable_data_ptr<scalar_t>() : nullptr;
    bool l_bias_done = false;
    if (i_need_grad_weights) {
      // grad_weight = grad_output^T x: (out, N) x (N, in) -> (out, in); grad_bias in the same pass
      const torch::Tensor l_input = flatten_to_2d(*i_input).contiguous();  // (N, in)
      l_grad_weights = torch::empty({l_out, l_in}, l_grad_output.options());
      l_bias_done = grad_weight_tpp<scalar_t>(*l_state, l_gy, l_input.const_data_ptr<scalar_t>(),
                                              l_grad_weights.mutable_data_ptr<scalar_t>(), l_gb, l_n, l_in, l_out);
    }
    if (i_need_grad_bias && !l_bias_done) {
      // grad_bias = sum over the N rows of grad_output -> (out), when grad_weight did not sum it
      grad_bias_tpp<scalar_t>(l_gy, l_gb, l_n, l_out);
    }
  });
  return {l_grad_input, l_grad_weights, l_grad_bias};
}

std::vector<torch::Tensor> backward(torch::Tensor i_grad_output, torch::Tensor i_input, torch::Tensor i_weights) {
  std::vector<torch::Tensor> l_grads = backward(i_grad_output, i_input, i_weights, /*i_need_grad_input=*/true,
                                                /*i_need_grad_weights=*/true, /*i_need_grad_bias=*/false);
  return {l_grads[0], l_grads[1]};  // {grad_input, grad_weight}
}

// ---- 7. Tools: a dispatch probe, the peak probe ------------------------------------

// Dispatches one kernel, C(m x n) (+)= A(m x k) op(B) with tight leading dimensions, through the
// same checked path as the layer; returns True, or raises naming the request (a NULL kernel).
bool dispatch_check(int64_t i_m, int64_t i_n, int64_t i_k, int i_flags, at::ScalarType i_dtype) {
  libxsmm_init();
  TORCH_CHECK(i_dtype == at::kFloat || i_dtype == at::kDouble, "linear_op: expected dtype Float or Double, got ", i_dtype);
  const bool l_trans_a = i_flags & LIBXSMM_GEMM_FLAG_TRANS_A, l_trans_b = i_flags & LIBXSMM_GEMM_FLAG_TRANS_B;
  const KernelShape l_shape{i_m, i_n, i_k, /*lda=*/l_trans_a ? i_k : i_m, /*ldb=*/l_trans_b ? i_n : i_k, /*ldc=*/i_m, i_flags};
  if (i_dtype == at::kFloat) dispatch_kernel<float>(l_shape);
  else dispatch_kernel<double>(l_shape);
  return true;
}

// The machine's practical float32 peak: every thread (at::get_num_threads(), which is
// torch.get_num_threads()) runs one m x n x k kernel over its own small buffers (48 KB at
// 64 x 64 x 64: A in L1, B and C in L1/L2) for i_seconds; returns the GFLOP/s of all threads
// together. No loop nest, no traffic beyond the core's caches: a practical peak, which deeper
// kernels can match or pass slightly.
double peak_gflops(int64_t i_m, int64_t i_n, int64_t i_k, double i_seconds) {
  libxsmm_init();
  const auto l_kernel = dispatch_kernel<float>(KernelShape{i_m, i_n, i_k, i_m, i_k, i_m, /*flags=*/0});
  const int l_threads = at::get_num_threads();
  std::vector<double> l_gflops(l_threads, 0.0);
  at::parallel_for(/*begin=*/0, /*end=*/l_threads, /*grain_size=*/1, [&](idx i_first, idx i_last) {
    for (idx l_t = i_first; l_t < i_last; l_t++) {
      std::vector<float> l_a(i_m * i_k, 0.5f), l_b(i_k * i_n, 0.25f), l_c(i_m * i_n, 0.0f);
      using Clock = std::chrono::steady_clock;
      const auto l_start = Clock::now();
      int64_t l_calls = 0;
      double l_elapsed = 0;
      do {  // the clock read every 256 calls costs nothing against 256 kernels
        for (int l_i = 0; l_i < 256; l_i++) l_kernel(l_a.data(), l_b.data(), l_c.data());
        l_calls += 256;
        l_elapsed = std::chrono::duration<double>(Clock::now() - l_start).count();
      } while (l_elapsed < i_seconds);
      l_gflops[l_t] = 2.0 * i_m * i_n * i_k * l_calls / l_elapsed * 1e-9;
    }
  });
  double l_total = 0;
  for (double l_g : l_gflops) l_total += l_g;
  return l_total;
}

}  // namespace linear_op
