// Stage 17: the fused LLTM cell with its three GEMMs on LIBXSMM's JIT kernels (CPU).
//
// What this stage teaches: where the time goes once the element-wise work is fused. Stage 11's
// passes are a few per cent of a step; its GEMMs (ATen, MKL's generic path on AMD) and the calls
// around them are the rest. Here every GEMM is a few LIBXSMM kernel calls per thread, and
// X = [old_h, input] is never built as 11's cat builds it:
//
//   forward:  gates = [old_h, input] W^T + b       LIBXSMM, 64-deep blocks; A: X, a transposed copy
//             one pass over the rows: sigmoid, sigmoid, elu, new_cell, new_h   (sections 3, 4)
//   backward: one pass over the rows: every element-wise derivative -> d_gates  (sections 3, 5)
//             d_weights = d_gates^T [old_h, input]  LIBXSMM, 64-row panels of old_h^T and input^T,
//                                                   d_gates' columns copied once per thread;
//                                                   d_bias = sum of d_gates' rows, by the same threads
//             d_X = d_gates W                        LIBXSMM
//
//   forward(input, weights, bias, old_h, old_cell) -> [new_h, new_cell, gates]
//   cell(input, weights, bias, old_h, old_cell) -> [new_h, new_cell]   (one autograd node, section 6)
//   nothing_cell(input, weights, bias, old_h, old_cell) -> [new_h, new_cell]  (computes nothing: a floor)
//   forward_pass(gates, old_cell) -> [new_h, new_cell]     (the fused pass alone, to time it)
//   backward(grad_h, grad_cell, new_cell, gates, input, old_h, weights, need_d_X, need_d_weights)
//     -> [d_old_h, d_input, d_weights, d_bias (1, 3S), d_old_cell]
//   simd_path() -> str, set_simd_path(str)                (which float32 copy runs, section 3b)
//   block_sizes() -> (depth, rows), set_block_sizes(depth, rows)   (the GEMMs' blocks, section 3c)
//
// What changed since stage 11: section 3c (new) puts the GEMMs on LIBXSMM 1.17's kernels, which
// stage 06 introduced for the linear layer, but without its loop nest: at these sizes (a batch
// of 16 to 64 rows) each thread computes a slice of the output's columns, a few kernel calls
// over blocks of the inner dimension or of rows, and X's transposed copy (AVX2 tiles in float32).
// The forward and backward call them instead of at::addmm and mm, and d_bias is summed with
// d_weights instead of by at::sum; the copies and d_gates live in scratch memory each thread keeps
// between calls; section 3b's switch also picks X's transpose; section 6 adds nothing_cell, a node
// that computes nothing (the benchmark's floor for a C++ node). Everything else is 11's.
// Build: pip install --no-build-isolation ./17_lltm_xsmm   (or JIT: eml.lltm_xsmm.jit.build())
// LIBXSMM 1.17 first: sudo apt-get install -y libxsmm-dev (`make` at the root does it).

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <libxsmm.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>  // the AVX2 transpose of X (section 3c); compiled for AVX2 in its function only
#endif

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

// The stage's name, the first word of every error message: the one line that names the stage.
static const char* const kStage = "lltm_xsmm";

// ---- 1. The checks: every input error is a clear message naming the value ----

static void check_inputs(const at::Tensor& input, const at::Tensor& weights, const at::Tensor& bias,
                         const at::Tensor& old_h, const at::Tensor& old_cell) {
  const std::pair<const char*, const at::Tensor*> tensors[] = {
      {"input", &input}, {"weights", &weights}, {"bias", &bias}, {"old_h", &old_h}, {"old_cell", &old_cell}};
  for (const auto& [name, tensor] : tensors) {
    TORCH_CHECK(tensor->scalar_type() == at::kFloat || tensor->scalar_type() == at::kDouble,
                kStage, ": ", name, " must be float32 or float64, got ", tensor->scalar_type());
  }
  for (const auto& [name, tensor] : tensors) {
    TORCH_CHECK(tensor->scalar_type() == input.scalar_type(),
                kStage, ": ", name, " is ", tensor->scalar_type(), " but input is ", input.scalar_type());
    // Unlike stage 10, not device-generic: the fused passes read the data pointers on the host.
    TORCH_CHECK(tensor->device().is_cpu(), kStage, ": ", name, " must be a CPU tensor, got device ", tensor->device());
  }
  TORCH_CHECK(input.dim() == 2, kStage, ": input must be 2-D (batch, features), got shape ", input.sizes());
  TORCH_CHECK(weights.dim() == 2 && weights.size(0) % 3 == 0,
              kStage, ": weights must be 2-D (3 * state, state + features), got shape ", weights.sizes());
  const int64_t batch = input.size(0), features = input.size(1), state = weights.size(0) / 3;
  for (const auto& [name, tensor] : {std::pair{"old_h", &old_h}, std::pair{"old_cell", &old_cell}}) {
    TORCH_CHECK(tensor->dim() == 2, kStage, ": ", name, " must be 2-D (batch, state), got shape ", tensor->sizes());
    TORCH_CHECK(tensor->size(0) == batch,
                kStage, ": ", name, " has batch size ", tensor->size(0), " but input has ", batch);
    TORCH_CHECK(tensor->size(1) == state, kStage, ": ", name, " must have shape [", batch, ", ", state,
                "] (weights have 3 * ", state, " rows), got ", tensor->sizes());
  }
  TORCH_CHECK(weights.size(1) == state + features, kStage, ": input has ", features,
              " features, so weights must have shape [", 3 * state, ", ", state + features, "], got ", weights.sizes());
  TORCH_CHECK((bias.dim() == 1 && bias.size(0) == 3 * state) ||
                  (bias.dim() == 2 && bias.size(0) == 1 && bias.size(1) == 3 * state),
              kStage, ": bias must have shape (", 3 * state, ") or (1, ", 3 * state, "), got ", bias.sizes());
}

// ---- 2. The activations of one element, written so that the compiler can vectorise them ----

// std::exp is a call into libm: a loop that calls it stays scalar. In float32 the cell uses
// this exp instead, plain arithmetic that gcc turns into SIMD code (SSE2, 4 floats at a time,
// on any x86-64): e^x = 2^n e^r with n = round(x / ln 2) and |r| <= ln(2) / 2, e^r by a degree-7
// polynomial (Cephes' expf coefficients), 2^n by writing n into the exponent bits.
// Relative error below 1e-7 on [-87, 88]; x is clamped to that range (e^-87 ~ 1.6e-38).
// The compiler needs -fno-trapping-math to turn the clamps and selects into SIMD min/max and masked selects.
static inline float exp_simd(float x) {
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round(x / ln 2): 1.5 * 2^23 trick
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;               // x - n ln 2, ln 2 in two parts
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;  // 2^n
  return p * __builtin_bit_cast(float, bits);
}

// float64 keeps libm's exact functions: the tests hold it to 1e-10.
static inline double exp_simd(double x) { return std::exp(x); }

// sigmoid(z) = 1 / (1 + e^-z)
template <typename scalar_t>
static inline scalar_t sigmoid(scalar_t z) {
  return scalar_t(1) / (scalar_t(1) + exp_simd(-z));
}

// elu(z) = z if z > 0 else alpha (e^z - 1), alpha = 1; both sides computed, then one select
template <typename scalar_t>
static inline scalar_t elu(scalar_t z) {
  const scalar_t negative = exp_simd(z < scalar_t(0) ? z : scalar_t(0)) - scalar_t(1);
  return z > scalar_t(0) ? z : negative;
}

// tanh(u) = 1 - 2 / (e^{2u} + 1) in float32 (absolute error ~1e-7 near 0); libm's in float64
static inline float tanh_simd(float u) { return 1.0f - 2.0f / (exp_simd(2.0f * u) + 1.0f); }
static inline double tanh_simd(double u) { return std::tanh(u); }

// A chunk of at least ~4096 elements per thread: below that, waking a thread costs more than
// the microseconds of exp and tanh it would take over (1 to 9 ns per element, by CPU and copy: stage 11's README).
static int64_t grain_rows(int64_t state) { return std::max<int64_t>(1, 4096 / std::max<int64_t>(state, 1)); }

// ---- 3. One row of the forward and of the backward: the fused element-wise passes ----

// gates = [input | output | candidate] (3S pre-activations) -> new_cell, new_h (S each)
template <typename scalar_t>
static void forward_row(const scalar_t* __restrict__ g, const scalar_t* __restrict__ c, scalar_t* __restrict__ h_row,
                        scalar_t* __restrict__ c_row, int64_t state) {
  for (int64_t j = 0; j < state; ++j) {
    const scalar_t input_gate = sigmoid(g[j]);
    const scalar_t output_gate = sigmoid(g[state + j]);
    const scalar_t candidate_cell = elu(g[2 * state + j]);
    const scalar_t cell = c[j] + candidate_cell * input_gate;
    c_row[j] = cell;
    h_row[j] = tanh_simd(cell) * output_gate;
  }
}

// gates, grad_h, grad_cell, new_cell -> d_gates (3S), d_old_cell (S); the activations are
// recomputed from the saved pre-activation gates instead of saved by the forward
template <typename scalar_t>
static void backward_row(const scalar_t* __restrict__ g, const scalar_t* __restrict__ gh,
                         const scalar_t* __restrict__ gc, const scalar_t* __restrict__ c, scalar_t* __restrict__ dg,
                         scalar_t* __restrict__ dc, int64_t state) {
  for (int64_t j = 0; j < state; ++j) {
    const scalar_t input_gate = sigmoid(g[j]);
    const scalar_t output_gate = sigmoid(g[state + j]);
    const scalar_t z = g[2 * state + j];
    const scalar_t candidate_cell = elu(z);
    const scalar_t d_elu = z > scalar_t(0) ? scalar_t(1) : candidate_cell + scalar_t(1);  // elu'(z) = e^z = elu(z) + 1 for z <= 0
    const scalar_t tanh_cell = tanh_simd(c[j]);
    // new_h = tanh(new_cell) * output_gate; tanh'(z) = 1 - tanh^2(z)
    const scalar_t d_new_cell = gh[j] * output_gate * (scalar_t(1) - tanh_cell * tanh_cell) + gc[j];
    dc[j] = d_new_cell;  // new_cell = old_cell + ...: d_old_cell = d_new_cell
    // sigmoid'(z) = sigmoid(z) (1 - sigmoid(z))
    dg[j] = d_new_cell * candidate_cell * input_gate * (scalar_t(1) - input_gate);
    dg[state + j] = gh[j] * tanh_cell * output_gate * (scalar_t(1) - output_gate);
    dg[2 * state + j] = d_new_cell * input_gate * d_elu;
  }
}

// ---- 3b. The row loops, compiled twice: for any x86-64 CPU and for AVX2 + FMA ----

// -O3 alone compiles for every x86-64 CPU: SSE2, 4 floats per instruction, no fused
// multiply-add. The same loops compiled a second time for AVX2 + FMA (8 floats, a*b+c in one
// instruction) run the float32 passes ~3-3.8x faster per element on Zen 3 (stage 11's README: measured).
// `flatten` inlines the row function (and its exp) into each copy, so each copy's code is
// generated for its own target; the CPU is asked once, when the module loads, which copy to run.
template <typename scalar_t>
static void forward_rows(const scalar_t* g, const scalar_t* c, scalar_t* h, scalar_t* c_out, int64_t state,
                         int64_t begin, int64_t end) {
  for (int64_t row = begin; row < end; ++row) {
    forward_row(g + row * 3 * state, c + row * state, h + row * state, c_out + row * state, state);
  }
}

template <typename scalar_t>
static void backward_rows(const scalar_t* g, const scalar_t* gh, const scalar_t* gc, const scalar_t* c, scalar_t* dg,
                          scalar_t* dc, int64_t state, int64_t begin, int64_t end) {
  for (int64_t row = begin; row < end; ++row) {
    backward_row(g + row * 3 * state, gh + row * state, gc + row * state, c + row * state, dg + row * 3 * state,
                 dc + row * state, state);
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2,fma"), flatten)) static void forward_rows_avx2(const float* g, const float* c, float* h,
                                                                           float* c_out, int64_t state, int64_t begin,
                                                                           int64_t end) {
  forward_rows<float>(g, c, h, c_out, state, begin, end);
}
__attribute__((target("avx2,fma"), flatten)) static void backward_rows_avx2(const float* g, const float* gh,
                                                                            const float* gc, const float* c, float* dg,
                                                                            float* dc, int64_t state, int64_t begin,
                                                                            int64_t end) {
  backward_rows<float>(g, gh, gc, c, dg, dc, state, begin, end);
}
static bool cpu_has_avx2_fma() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}
#else
static bool cpu_has_avx2_fma() { return false; }
#endif

// Which copy runs the float32 passes: "avx2+fma" where the CPU has them, else "sse2"; the
// tests switch to "sse2" to check that both copies compute the same cell. The same switch picks
// the transpose that copies X in float32 (section 3c: AVX2 tiles, or LIBXSMM's libxsmm_otrans). Atomic: the worker
// threads of at::parallel_for read it while Python may set it from another thread.
static std::atomic<bool> use_avx2{cpu_has_avx2_fma()};

static std::string simd_path() { return use_avx2.load() ? "avx2+fma" : "sse2"; }

static void set_simd_path(const std::string& path) {
  TORCH_CHECK(path == "sse2" || path == "avx2+fma", kStage, ": simd path must be 'sse2' or 'avx2+fma', got '", path, "'");
  TORCH_CHECK(path == "sse2" || cpu_has_avx2_fma(), kStage, ": this CPU has no AVX2 + FMA: the 'avx2+fma' path cannot run");
  use_avx2.store(path == "avx2+fma");
}

template <typename scalar_t>
static void run_forward_rows(const scalar_t* g, const scalar_t* c, scalar_t* h, scalar_t* c_out, int64_t state,
                             int64_t begin, int64_t end) {
#if defined(__x86_64__) && defined(__GNUC__)
  if constexpr (std::is_same_v<scalar_t, float>) {
    if (use_avx2.load(std::memory_order_relaxed)) return forward_rows_avx2(g, c, h, c_out, state, begin, end);
  }
#endif
  forward_rows(g, c, h, c_out, state, begin, end);  // float64 (libm's exp) and CPUs without AVX2
}

template <typename scalar_t>
static void run_backward_rows(const scalar_t* g, const scalar_t* gh, const scalar_t* gc, const scalar_t* c,
                              scalar_t* dg, scalar_t* dc, int64_t state, int64_t begin, int64_t end) {
#if defined(__x86_64__) && defined(__GNUC__)
  if constexpr (std::is_same_v<scalar_t, float>) {
    if (use_avx2.load(std::memory_order_relaxed)) return backward_rows_avx2(g, gh, gc, c, dg, dc, state, begin, end);
  }
#endif
  backward_rows(g, gh, gc, c, dg, dc, state, begin, end);
}

// ---- 3c. The GEMMs on LIBXSMM's kernels, without 11's cat ----
//
// LIBXSMM's kernels are column-major: element (i, j) of an m x n matrix lives at [i + j * ld],
// so a row-major PyTorch matrix R (r x c) is, in the same memory, the column-major R^T (c x r).
// Each product is written so that its big operands are read where they lie (LIBXSMM 1.17 has no
// transposed A; a transposed B it has), and copied only where a copy pays (README):
//
//   forward    gates (B x 3S) = X W^T        C = gates, column-major (B x 3S): A = X column-major,
//                                            a transposed copy of old_h and input side by side (the
//                                            copy 11's cat made anyway); B = W^T = W's memory;
//                                            C transposed into the row-major gates, + b
//   d_weights  (3S x K) = d_gates^T X        C = d_weights^T (K x 3S) = d_weights' memory; A = X^T
//                                            = old_h^T, then input^T (the memory of each), in
//                                            panels (below); B = d_gates (B x 3S) column-major:
//                                            each thread's columns of it copied into that order
//                                            (without blocks: d_gates' memory, TRANS_B)
//   d_X        (B x K) = d_gates W           C = d_X^T (K x B) = d_X's memory; A = W^T = W's memory;
//                                            B = d_gates^T = d_gates' memory
//
// At these sizes (B = 16 to 64 rows) each thread takes a slice of the output's columns (rows of
// d_X^T) and computes it with a few kernel calls: the forward and d_X over blocks of their inner
// dimension, d_weights over blocks of rows, each copied into a small panel first (the two block
// sizes below say why). No tiles of C, no packed W, no loop nest of stage 06's kind (it needs one
// for matrices of thousands of rows). LIBXSMM keeps every kernel it generated in its registry, so
// the dispatch of a known shape is a lookup.

// Per element type, the kernel's function-pointer type and LIBXSMM 1.17's dispatch for it:
// C (m x n) = A (m x k) op(B) + beta C, alpha = 1, beta = 0 (write C) or 1 (add to C).
template <typename scalar_t>
struct Xsmm;
template <>
struct Xsmm<float> {
  using Fn = libxsmm_smmfunction;
  static Fn dispatch(libxsmm_blasint m, libxsmm_blasint n, libxsmm_blasint k, libxsmm_blasint lda,
                     libxsmm_blasint ldb, libxsmm_blasint ldc, float beta, int flags) {
    const float alpha = 1.0f;
    const int prefetch = LIBXSMM_GEMM_PREFETCH_NONE;
    return libxsmm_smmdispatch(m, n, k, &lda, &ldb, &ldc, &alpha, &beta, &flags, &prefetch);
  }
};
template <>
struct Xsmm<double> {
  using Fn = libxsmm_dmmfunction;
  static Fn dispatch(libxsmm_blasint m, libxsmm_blasint n, libxsmm_blasint k, libxsmm_blasint lda,
                     libxsmm_blasint ldb, libxsmm_blasint ldc, double beta, int flags) {
    const double alpha = 1.0;
    const int prefetch = LIBXSMM_GEMM_PREFETCH_NONE;
    return libxsmm_dmmdispatch(m, n, k, &lda, &ldb, &ldc, &alpha, &beta, &flags, &prefetch);
  }
};

// One kernel, NULL-checked: a NULL kernel would crash when called, so it becomes an error that
// names the request. The callers never ask for an m or n of 0 (an empty batch is handled before);
// a state of 0 makes d_X's k 0, a product LIBXSMM 1.17 returns a kernel for (tested).
template <typename scalar_t>
static typename Xsmm<scalar_t>::Fn xsmm_kernel(int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldc,
                                               bool trans_b, bool accumulate = false) {
  for (const int64_t value : {m, n, k, lda, ldb, ldc}) {  // libxsmm_blasint is a 32-bit int in Debian's build
    TORCH_CHECK(value <= INT_MAX, kStage, ": a GEMM size of ", value, " does not fit LIBXSMM's 32-bit integers");
  }
  const int flags = (accumulate ? 0 : LIBXSMM_GEMM_FLAG_BETA_0) | (trans_b ? LIBXSMM_GEMM_FLAG_TRANS_B : 0);
  const auto kernel = Xsmm<scalar_t>::dispatch(m, n, k, lda, ldb, ldc, accumulate ? 1 : 0, flags);
  TORCH_CHECK(kernel != nullptr, kStage, ": LIBXSMM ", LIBXSMM_CONFIG_VERSION, " returned no kernel for C(", m, " x ",
              n, ") = ", accumulate ? "C + " : "", "A(", m, " x ", k, ") ", trans_b ? "B^T" : "B", " with lda=", lda,
              " ldb=", ldb, " ldc=", ldc);
  return kernel;
}

// Two block sizes, each the answer to one slowdown of a single kernel per thread, measured by
// breakdown.py (its "one kernel per thread" rows; README):
// - depth_block: a kernel runs its whole k for each few columns of C, so it reads the rows of A
//   it works on once per few columns. With k = 1152 (the benchmark's forward) that block of A
//   is larger than L1 and comes from L2 every time; cut into k blocks of 64, it stays in L1.
// - row_block: d_weights reads A = input's memory, whose columns (the input's rows) lie
//   F floats apart: 4 KiB for F = 1024. Addresses 4 KiB apart share an L1 set, so a kernel
//   walking such columns evicts its own data. A block of 64 rows of A, copied into a contiguous
//   panel, is read without that conflict. With these blocks each thread also copies its columns
//   of d_gates once, so that B is read as stored (no TRANS_B), the faster of the two on AVX2.
// 0 means no blocks: one kernel over the whole dimension, on the operands where they lie.
// Settable (set_block_sizes) so that breakdown.py can time both and the tests can use odd sizes.
static std::atomic<int64_t> depth_block{64}, row_block{64};

static std::pair<int64_t, int64_t> block_sizes() { return {depth_block.load(), row_block.load()}; }

static void set_block_sizes(int64_t depth, int64_t rows) {
  TORCH_CHECK(depth >= 0 && rows >= 0, kStage, ": block sizes must be >= 0 (0: no blocks), got depth ", depth,
              " and rows ", rows);
  depth_block.store(depth);
  row_block.store(rows);
}

// C (m x n) = A (m x k) B (k x n), column-major, over k in blocks of depth_block: the first
// block writes C, the others add to it. At least one kernel runs, so a k of 0 still writes C
// (zeros).
template <typename scalar_t>
static void product_in_depth_blocks(const scalar_t* a, const scalar_t* b, scalar_t* c, int64_t m, int64_t n, int64_t k,
                                    int64_t lda, int64_t ldb, int64_t ldc) {
  const int64_t block = depth_block.load();  // once: Python may set it from another thread
  const int64_t step = block > 0 ? block : k;
  int64_t first = 0;
  do {
    const int64_t depth = std::min(step, k - first);
    const auto kernel = xsmm_kernel<scalar_t>(m, n, depth, lda, ldb, ldc, /*trans_b=*/false, /*accumulate=*/first > 0);
    kernel(a + first * lda, b + first, c);  // A's columns first.., B's rows first..
    first += depth;
  } while (first < k);
}

// LIBXSMM 1.17's AVX kernels return with the upper halves of the YMM registers in use: they end
// without `vzeroupper`. Code compiled for SSE that then runs on the same thread can pay for that
// state on every instruction until an AVX function clears it; libm's double exp and tanh (through
// its expm1) in the fused pass did (measured, Zen 3: the float64 forward at B, F, S = 32, 4, 32 took 585 us
// instead of 50-60, its time in libm; README). So each thread clears it after its kernels.
static void clear_upper_vector_state() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool has_avx = __builtin_cpu_supports("avx");
  if (has_avx) __asm__ volatile("vzeroupper");
#endif
}

// Cuts [0, n) into one slice per thread and runs body(first, last) on each, in parallel; a
// product of fewer than ~256 K multiply-adds (work) stays on the calling thread, where waking a
// second one would cost more than it takes over (the T = 100 sequence of notebook 17: 110 K).
// Every body runs LIBXSMM kernels: each thread clears the vector state after its slice.
template <typename Body>
static void split_among_threads(int64_t n, int64_t work, const Body& body) {
  if (work < (int64_t(1) << 18) || at::get_num_threads() == 1 || at::in_parallel_region()) {
    if (n > 0) body(int64_t(0), n);
    clear_upper_vector_state();
    return;
  }
  const int64_t slices = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), n));
  const int64_t width = (n + slices - 1) / slices;
  at::parallel_for(0, slices, /*grain_size=*/1, [&](int64_t first_slice, int64_t end_slice) {
    for (int64_t slice = first_slice; slice < end_slice; ++slice) {
      const int64_t first = slice * width, last = std::min(n, first + width);
      if (first < last) body(first, last);
    }
    clear_upper_vector_state();
  });
}

// The copies above and below go into scratch memory that each thread keeps from call to call
// (thread_local), grown when a larger shape asks for more and never freed before the thread ends:
// a step allocates only the tensors it returns or saves. An allocation and its free cost a few
// microseconds on a step of ~100 (README: the node's fixed costs); the buffers hold at most a few
// hundred KiB at the benchmark's sizes (X's columns at (64, 1024, 128): 288 KiB). One buffer per
// use (Use), so that no two live copies share one; a thread only ever runs one LLTM call at a time.
enum class Use { x_columns, gates_columns, d_gates, d_gates_columns, panel };

template <typename scalar_t, Use use>
static scalar_t* scratch(int64_t elements) {
  thread_local std::vector<scalar_t> buffer;
  if (static_cast<int64_t>(buffer.size()) < elements) buffer = std::vector<scalar_t>(elements);  // no copy of the old
  return buffer.data();
}

// X's transposed copy, one part (old_h or input) at a time: out (column-major, ld_out) = in^T, where in
// is rows x cols row-major (ld_in): out[j * ld_out + i] = in[i * ld_in + j]. LIBXSMM 1.17's
// libxsmm_otrans does this for any element size; in float32 on AVX2 this 8 x 8 tile transpose
// replaces it, and at (64, 1024, 128) on Zen 3 the whole forward ran 11-59 us faster with it
// (README: the copies around the kernels). Each tile is 8 loads of 8 floats, 24 shuffles and 8
// stores; the ragged edges go element by element. The other copies (the GEMM's result back into
// row-major gates, d_gates' columns) keep libxsmm_otrans: for their shapes it was as fast.
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2"))) static void transpose_tile_8x8(float* out, const float* in, int64_t ld_in,
                                                               int64_t ld_out) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(in + i * ld_in);
  for (int i = 0; i < 8; i += 2) {  // pairs of rows interleaved: t = (r0[0] r1[0] r0[1] r1[1] | ...)
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {  // then pairs of pairs: four rows' element j side by side, per 128-bit lane
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int j = 0; j < 4; ++j) {  // the low lanes hold columns 0-3, the high lanes 4-7: join rows 0-3 and 4-7
    _mm256_storeu_ps(out + j * ld_out, _mm256_permute2f128_ps(r[j], r[j + 4], 0x20));
    _mm256_storeu_ps(out + (j + 4) * ld_out, _mm256_permute2f128_ps(r[j], r[j + 4], 0x31));
  }
}

__attribute__((target("avx2"))) static void transpose_avx2(float* out, const float* in, int64_t rows, int64_t cols,
                                                           int64_t ld_in, int64_t ld_out) {
  int64_t i = 0;
  for (; i + 8 <= rows; i += 8) {
    int64_t j = 0;
    for (; j + 8 <= cols; j += 8) transpose_tile_8x8(out + j * ld_out + i, in + i * ld_in + j, ld_in, ld_out);
    for (; j < cols; ++j) {
      for (int64_t row = i; row < i + 8; ++row) out[j * ld_out + row] = in[row * ld_in + j];
    }
  }
  for (; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) out[j * ld_out + i] = in[i * ld_in + j];
  }
}
#endif

template <typename scalar_t>
static void transpose_into_columns(scalar_t* out, const scalar_t* in, int64_t rows, int64_t cols, int64_t ld_in,
                                   int64_t ld_out) {
#if defined(__x86_64__) && defined(__GNUC__)
  if constexpr (std::is_same_v<scalar_t, float>) {
    if (use_avx2.load(std::memory_order_relaxed)) return transpose_avx2(out, in, rows, cols, ld_in, ld_out);
  }
#endif
  // float64, CPUs without AVX2, and the "sse2" path: LIBXSMM's (m, n: the input's columns and rows)
  libxsmm_otrans(out, in, static_cast<unsigned int>(sizeof(scalar_t)), /*m=*/cols, /*n=*/rows, /*ldi=*/ld_in, /*ldo=*/ld_out);
}

// gates (B, 3S) = [old_h, input] W^T + b. All operands contiguous; batch >= 1; state may be 0 (no columns).
template <typename scalar_t>
static void gates_product(const scalar_t* input, const scalar_t* old_h, const scalar_t* weights, const scalar_t* bias,
                       scalar_t* gates, int64_t batch, int64_t features, int64_t state) {
  const int64_t k = state + features, columns = 3 * state;
  const auto size = static_cast<unsigned int>(sizeof(scalar_t));
  // the two column-major matrices: X (B x K) and the GEMM's result (B x 3S), in the calling
  // thread's scratch; the threads below share them, each its own columns
  scalar_t* const x_columns = scratch<scalar_t, Use::x_columns>(k * batch);
  scalar_t* const gates_columns = scratch<scalar_t, Use::gates_columns>(columns * batch);
  // X, column-major (B x K): column j is feature j of every row. old_h's memory is the
  // column-major (S x B) old_h^T: its transpose fills columns 0..S-1, input's the rest. Every
  // thread's product reads all of X, so X is complete before they start. The copy is cut among
  // the threads too, by columns, when X has more than ~32 K elements, into at most one piece per
  // ~32 K: at (64, 1024, 128) on 2 threads each copies half of X (the forward before and after:
  // README); at (16, 32, 128) the calling thread copies it all.
  at::parallel_for(0, k, std::max<int64_t>(1, (int64_t(1) << 15) / batch), [&](int64_t first, int64_t last) {
    if (first < state) {  // columns first..min(last, S) from old_h
      transpose_into_columns(x_columns + first * batch, old_h + first, /*rows=*/batch,
                             /*cols=*/std::min(last, state) - first, /*ld_in=*/state, /*ld_out=*/batch);
    }
    if (last > state) {  // columns max(first, S)..last from input
      const int64_t from = std::max(first, state);
      transpose_into_columns(x_columns + from * batch, input + (from - state), /*rows=*/batch, /*cols=*/last - from,
                             /*ld_in=*/features, /*ld_out=*/batch);
    }
    clear_upper_vector_state();
  });
  split_among_threads(columns, batch * columns * k, [&](int64_t first, int64_t last) {
    // gates[:, first:last] column-major (B x n) = X (B x K) . W^T[:, first:last] (K x n)
    product_in_depth_blocks(x_columns, weights + first * k, gates_columns + first * batch, /*m=*/batch,
                            /*n=*/last - first, k, /*lda=*/batch, /*ldb=*/k, /*ldc=*/batch);
    // back to row-major, the bias added on the way
    libxsmm_otrans(gates + first, gates_columns + first * batch, size, /*m=*/batch, /*n=*/last - first,
                   /*ldi=*/batch, /*ldo=*/columns);
    for (int64_t row = 0; row < batch; ++row) {
      for (int64_t j = first; j < last; ++j) gates[row * columns + j] += bias[j];
    }
  });
}

// d_weights (3S, K) = d_gates^T [old_h, input]: its columns 0..S-1 from old_h, the rest from input.
// d_bias (3S) = the sum of d_gates' rows, on the way: each thread sums the columns of d_gates it
// reads for its rows of d_weights (no reduction among threads, no separate pass).
template <typename scalar_t>
static void d_weights_product(const scalar_t* d_gates, const scalar_t* input, const scalar_t* old_h, scalar_t* d_weights,
                           scalar_t* d_bias, int64_t batch, int64_t features, int64_t state) {
  const int64_t k = state + features, rows = 3 * state;
  split_among_threads(rows, rows * k * batch, [&](int64_t first, int64_t last) {
    std::fill(d_bias + first, d_bias + last, scalar_t(0));
    for (int64_t row = 0; row < batch; ++row) {
      for (int64_t j = first; j < last; ++j) d_bias[j] += d_gates[row * rows + j];
    }
    // d_weights^T[:, first:last] column-major (K x n) = X^T (K x B) . d_gates[:, first:last] (B x n);
    // X^T's rows from old_h^T (S), then from input^T (F), row_block at a time, each block copied
    // into a contiguous panel first. d_gates[:, first:last], column-major, is d_gates' memory read
    // transposed; with blocks it is copied once into that orientation (B x n, ld = B): LIBXSMM 1.17's
    // AVX2 kernels run slower on a transposed B than on a plain one (README: the copies around the
    // kernels).
    const int64_t step = row_block.load(), n = last - first;
    scalar_t* const panel = scratch<scalar_t, Use::panel>(step * batch);  // this thread's
    scalar_t* const d_gates_columns = scratch<scalar_t, Use::d_gates_columns>(step > 0 ? batch * n : 0);
    if (step > 0) {
      libxsmm_otrans(d_gates_columns, d_gates + first, static_cast<unsigned int>(sizeof(scalar_t)), /*m=*/n,
                     /*n=*/batch, /*ldi=*/rows, /*ldo=*/batch);
    }
    const std::pair<const scalar_t*, int64_t> parts[] = {{old_h, state}, {input, features}};
    int64_t row_of_x_t = 0;  // where the part's rows start among X^T's K
    for (const auto& [source, width] : parts) {  // source: row-major (B x width) = column-major (width x B)
      if (step == 0 && width > 0) {  // no blocks: one kernel on the part and d_gates where they lie
        const auto kernel = xsmm_kernel<scalar_t>(width, n, batch, /*lda=*/width, /*ldb=*/rows, /*ldc=*/k,
                                                  /*trans_b=*/true);
        kernel(source, d_gates + first, d_weights + first * k + row_of_x_t);
      }
      for (int64_t block = 0; step > 0 && block < width; block += step) {
        const int64_t height = std::min(step, width - block);
        for (int64_t row = 0; row < batch; ++row) {  // panel: column-major (height x B), ld = height
          std::copy_n(source + row * width + block, height, panel + row * height);
        }
        const auto kernel = xsmm_kernel<scalar_t>(height, n, batch, /*lda=*/height, /*ldb=*/batch, /*ldc=*/k,
                                                  /*trans_b=*/false);
        kernel(panel, d_gates_columns, d_weights + first * k + row_of_x_t + block);
      }
      row_of_x_t += width;
    }
  });
}

// d_X (B, K) = d_gates W, as d_X^T (K x B) = W^T (K x 3S) . d_gates^T (3S x B), split by rows of d_X^T.
template <typename scalar_t>
static void d_x_product(const scalar_t* d_gates, const scalar_t* weights, scalar_t* d_x, int64_t batch, int64_t features,
                     int64_t state) {
  const int64_t k = state + features, inner = 3 * state;
  split_among_threads(k, k * batch * inner, [&](int64_t first, int64_t last) {
    product_in_depth_blocks(weights + first, d_gates, d_x + first, /*m=*/last - first, /*n=*/batch, /*k=*/inner,
                            /*lda=*/k, /*ldb=*/inner, /*ldc=*/k);
  });
}

// ---- 4. Forward: the GEMM, then the fused pass over the rows ----

// The fused pass alone: gates (B, 3S) from the GEMM and old_cell (B, S) -> new_h, new_cell.
// Bound as _C.forward_pass too, so that the notebook can time the pass without the GEMM.
std::vector<at::Tensor> forward_pass(const at::Tensor& gates, const at::Tensor& old_cell) {
  TORCH_CHECK(old_cell.dim() == 2 && gates.dim() == 2 && gates.is_contiguous() && gates.size(0) == old_cell.size(0) &&
                  gates.size(1) == 3 * old_cell.size(1),
              kStage, ": gates must be a contiguous (B, 3S) tensor for old_cell (B, S), got gates ", gates.sizes(),
              " and old_cell ", old_cell.sizes());
  TORCH_CHECK(gates.scalar_type() == old_cell.scalar_type() && gates.device().is_cpu() && old_cell.device().is_cpu(),
              kStage, ": gates and old_cell must be CPU tensors of one dtype, got ", gates.scalar_type(), " on ",
              gates.device(), " and ", old_cell.scalar_type(), " on ", old_cell.device());
  const int64_t batch = old_cell.size(0), state = old_cell.size(1);
  const auto old_cell_c = old_cell.contiguous();  // a named local: its data_ptr stays valid
  auto new_h = at::empty({batch, state}, old_cell.options());
  auto new_cell = at::empty({batch, state}, old_cell.options());

  AT_DISPATCH_FLOATING_TYPES(gates.scalar_type(), "lltm_forward", [&] {
    const scalar_t* __restrict__ g_all = gates.data_ptr<scalar_t>();
    const scalar_t* __restrict__ c_all = old_cell_c.data_ptr<scalar_t>();
    scalar_t* __restrict__ h_out = new_h.data_ptr<scalar_t>();
    scalar_t* __restrict__ c_out = new_cell.data_ptr<scalar_t>();
    at::parallel_for(0, batch, grain_rows(state), [&](int64_t begin, int64_t end) {
      run_forward_rows(g_all, c_all, h_out, c_out, state, begin, end);
    });
  });
  return {new_h, new_cell};
}

std::vector<at::Tensor> lltm_forward(const at::Tensor& input, const at::Tensor& weights, const at::Tensor& bias,
                                     const at::Tensor& old_h, const at::Tensor& old_cell) {
  check_inputs(input, weights, bias, old_h, old_cell);
  const int64_t batch = input.size(0), features = input.size(1), state = old_h.size(1);
  // Named locals: contiguous() returns the tensor itself, or a copy that must outlive the kernels.
  const auto input_c = input.contiguous(), old_h_c = old_h.contiguous(), weights_c = weights.contiguous();
  const auto bias_c = bias.contiguous();  // (3S) or (1, 3S): the same 3S numbers in memory either way
  auto gates = at::empty({batch, 3 * state}, input.options());  // (B, 3S), contiguous
  if (batch > 0) {
    AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "lltm_gates", [&] {
      gates_product<scalar_t>(input_c.data_ptr<scalar_t>(), old_h_c.data_ptr<scalar_t>(), weights_c.data_ptr<scalar_t>(),
                           bias_c.data_ptr<scalar_t>(), gates.data_ptr<scalar_t>(), batch, features, state);
    });
  }
  auto new_h_and_cell = forward_pass(gates, old_cell);
  return {new_h_and_cell[0], new_h_and_cell[1], gates};
}

// ---- 5. Backward: the fused pass for d_gates, then the GEMMs ----

std::vector<at::Tensor> lltm_backward(const at::Tensor& grad_h, const at::Tensor& grad_cell,
                                      const at::Tensor& new_cell, const at::Tensor& gates, const at::Tensor& input,
                                      const at::Tensor& old_h, const at::Tensor& weights, bool need_d_X,
                                      bool need_d_weights) {
  TORCH_CHECK(grad_h.sizes() == new_cell.sizes() && grad_cell.sizes() == new_cell.sizes(),
              kStage, ": grad_h and grad_cell must have new_cell's shape ", new_cell.sizes(), ", got ",
              grad_h.sizes(), " and ", grad_cell.sizes());
  TORCH_CHECK(gates.is_contiguous() && gates.size(0) == new_cell.size(0) && gates.size(1) == 3 * new_cell.size(1),
              kStage, ": gates must be the contiguous (B, 3S) tensor forward returned, got ", gates.sizes());
  const int64_t batch = new_cell.size(0), state = new_cell.size(1);
  const auto grad_h_c = grad_h.contiguous(), grad_cell_c = grad_cell.contiguous(), new_cell_c = new_cell.contiguous();
  auto d_old_cell = at::empty({batch, state}, gates.options());
  // d_gates (B, 3S) is consumed here, by the GEMMs: it lives in scratch memory (section 3c)
  at::Tensor d_gates;

  AT_DISPATCH_FLOATING_TYPES(gates.scalar_type(), "lltm_backward", [&] {
    d_gates = at::from_blob(scratch<scalar_t, Use::d_gates>(batch * 3 * state), {batch, 3 * state}, gates.options());
    const scalar_t* __restrict__ g_all = gates.data_ptr<scalar_t>();
    const scalar_t* __restrict__ gh_all = grad_h_c.data_ptr<scalar_t>();
    const scalar_t* __restrict__ gc_all = grad_cell_c.data_ptr<scalar_t>();
    const scalar_t* __restrict__ c_all = new_cell_c.data_ptr<scalar_t>();
    scalar_t* __restrict__ dg_all = d_gates.data_ptr<scalar_t>();
    scalar_t* __restrict__ dc_all = d_old_cell.data_ptr<scalar_t>();
    at::parallel_for(0, batch, grain_rows(state), [&](int64_t begin, int64_t end) {
      run_backward_rows(g_all, gh_all, gc_all, c_all, dg_all, dc_all, state, begin, end);
    });
  });

  at::Tensor d_weights, d_bias, d_old_h, d_input;  // d_bias (1, 3S)
  const int64_t features = input.size(1);
  if (need_d_weights && batch > 0) {  // (3S, S + F), and d_bias with it
    d_weights = at::empty({3 * state, state + features}, gates.options());
    d_bias = at::empty({1, 3 * state}, gates.options());
    const auto input_c = input.contiguous(), old_h_c = old_h.contiguous();
    AT_DISPATCH_FLOATING_TYPES(gates.scalar_type(), "lltm_d_weights", [&] {
      d_weights_product<scalar_t>(d_gates.data_ptr<scalar_t>(), input_c.data_ptr<scalar_t>(), old_h_c.data_ptr<scalar_t>(),
                               d_weights.data_ptr<scalar_t>(), d_bias.data_ptr<scalar_t>(), batch, features, state);
    });
  } else {  // an empty batch sums nothing: zeros
    if (need_d_weights) d_weights = at::zeros({3 * state, state + features}, gates.options());
    d_bias = d_gates.sum(/*dim=*/0, /*keepdim=*/true);
  }
  if (need_d_X) {
    auto d_X = at::empty({batch, state + features}, gates.options());
    if (batch > 0) {
      const auto weights_c = weights.contiguous();
      AT_DISPATCH_FLOATING_TYPES(gates.scalar_type(), "lltm_d_x", [&] {
        d_x_product<scalar_t>(d_gates.data_ptr<scalar_t>(), weights_c.data_ptr<scalar_t>(), d_X.data_ptr<scalar_t>(), batch,
                           features, state);
      });
    }
    d_old_h = d_X.slice(/*dim=*/1, 0, state);  // X = [old_h, input]: old_h's S columns,
    d_input = d_X.slice(/*dim=*/1, state);     // then the input's F (F != S in general)
  }
  return {d_old_h, d_input, d_weights, d_bias, d_old_cell};
}

// ---- 6. The whole cell as one autograd node, in C++ ----
//
// lltm.py's LLTMFunction does the same in Python: at (16, 32, 128) it adds about 10 us per step (Zen 5)
// over this node (README: where the time goes). A torch::autograd::Function is the same recipe in
// C++: the module makes one call per step (_C.cell), and autograd's engine calls
// backward() without entering Python at all.

// What a second backward would reach: the gradients of a once-differentiable backward are made
// to require grad through this node, which refuses (as Python's @once_differentiable does).
struct OnceDifferentiable : public torch::autograd::Function<OnceDifferentiable> {
  // A TensorList, not a std::vector: Function::apply counts the tensors of a TensorList as inputs.
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext*, at::TensorList grads) {
    torch::autograd::variable_list aliases;
    for (const auto& grad : grads) {  // aliases: an output must not be an input itself
      aliases.push_back(grad.defined() ? grad.view_as(grad) : at::Tensor());
    }
    return aliases;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*, torch::autograd::variable_list) {
    TORCH_CHECK(false, kStage, ": trying to differentiate twice the LLTM's backward, which is once_differentiable");
  }
};

struct LLTMCell : public torch::autograd::Function<LLTMCell> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input,
                                                const at::Tensor& weights, const at::Tensor& bias,
                                                const at::Tensor& old_h, const at::Tensor& old_cell) {
    auto outputs = lltm_forward(input, weights, bias, old_h, old_cell);  // {new_h, new_cell, gates}
    ctx->save_for_backward({outputs[1], outputs[2], input, old_h, weights});  // as LLTMFunction saves
    ctx->saved_data["bias_sizes"] = bias.sizes().vec();  // d_bias goes back in the bias's own shape
    return {outputs[0], outputs[1]};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const bool need_d_X = ctx->needs_input_grad(0) || ctx->needs_input_grad(3), need_d_weights = ctx->needs_input_grad(1);
    // grads[i] is zeros when its output was unused (materialize_grads, the default).
    auto d = lltm_backward(grads[0].contiguous(), grads[1].contiguous(), saved[0], saved[1], saved[2], saved[3],
                           saved[4], need_d_X, need_d_weights);  // {d_old_h, d_input, d_weights, d_bias, d_old_cell}
    torch::autograd::variable_list result = {
        ctx->needs_input_grad(0) ? d[1] : at::Tensor(), ctx->needs_input_grad(1) ? d[2] : at::Tensor(),
        ctx->needs_input_grad(2) ? d[3].reshape(ctx->saved_data["bias_sizes"].toIntVector()) : at::Tensor(),
        ctx->needs_input_grad(3) ? d[0] : at::Tensor(), ctx->needs_input_grad(4) ? d[4] : at::Tensor()};
    if (!torch::GradMode::is_enabled()) return result;  // the usual case: create_graph=False
    // create_graph=True: the fused passes are invisible to autograd, so a second backward through
    // these gradients would silently miss terms. Route them through OnceDifferentiable instead.
    for (auto& grad : result) {
      if (grad.defined()) grad = grad.detach().requires_grad_();
    }
    return OnceDifferentiable::apply(at::TensorList(result));
  }
};

// (new_h, new_cell), differentiable: what LLTM.forward calls.
std::vector<at::Tensor> lltm_cell(const at::Tensor& input, const at::Tensor& weights, const at::Tensor& bias,
                                  const at::Tensor& old_h, const at::Tensor& old_cell) {
  return LLTMCell::apply(input, weights, bias, old_h, old_cell);
}

// Not an LLTM: a node with the cell's inputs and outputs that computes nothing (its outputs and
// the parameters' gradients allocated, never written), the C++ twin of _NothingComputed, the
// Python node in the LLTM benchmark's FloorCell. Timed in the benchmark's loop (python -m
// eml.common.lltm_bench --floor), it is what a step costs around the arithmetic of a cell whose
// node is C++, as LLTMCell is: the module call, Function::apply, autograd's engine, the gradients
// handed to the parameters.
struct NothingComputed : public torch::autograd::Function<NothingComputed> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor&,
                                                const at::Tensor& weights, const at::Tensor& bias,
                                                const at::Tensor& old_h, const at::Tensor& old_cell) {
    ctx->saved_data["weights_sizes"] = weights.sizes().vec();
    ctx->saved_data["bias_sizes"] = bias.sizes().vec();
    return {at::empty_like(old_h), at::empty_like(old_cell)};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto options = grads[0].options();
    return {at::Tensor(), at::empty(ctx->saved_data["weights_sizes"].toIntVector(), options),
            at::empty(ctx->saved_data["bias_sizes"].toIntVector(), options), at::Tensor(), at::Tensor()};
  }
};

std::vector<at::Tensor> nothing_cell(const at::Tensor& input, const at::Tensor& weights, const at::Tensor& bias,
                                     const at::Tensor& old_h, const at::Tensor& old_cell) {
  return NothingComputed::apply(input, weights, bias, old_h, old_cell);
}

// ---- 7. The binding ----

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("cell", &lltm_cell, "the LLTM cell as one autograd node: (new_h, new_cell), backward in C++");
  m.def("nothing_cell", &nothing_cell, "not an LLTM: a C++ autograd node that computes nothing (the benchmark's floor)");
  m.def("forward", &lltm_forward, "LLTM forward (the GEMM on LIBXSMM, one fused element-wise pass)");
  m.def("backward", &lltm_backward, "LLTM backward (one fused element-wise pass, then the GEMMs on LIBXSMM)");
  m.def("forward_pass", &forward_pass, "the forward's fused pass alone: (gates, old_cell) -> [new_h, new_cell]");
  m.def("simd_path", &simd_path, "which compiled copy runs the float32 passes and X's copy: 'avx2+fma' or 'sse2'");
  m.def("set_simd_path", &set_simd_path, "choose the copy ('sse2' or 'avx2+fma'; tests compare the two)");
  m.def("block_sizes", &block_sizes, "(depth, rows): the GEMMs' block sizes of section 3c; 0 is no blocks");
  m.def("set_block_sizes", &set_block_sizes, "set them (breakdown.py times one kernel per thread, the tests odd sizes)",
        py::arg("depth"), py::arg("rows"));
}
