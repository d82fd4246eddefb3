// Stage 06 of "From PyTorch to Machine Code": the linear layer on LIBXSMM's JIT-generated kernels.
//
// What this stage teaches: how a fast matrix product is put together. A TPP (tensor processing
// primitive) is a small kernel for one fixed job, here the GEMM block
//
//     C (m x n)  =  A (m x k) . B (k x n)   (+ C)       m, n <= 128, k <= 1024 here
//
// that LIBXSMM writes as machine code at run time (JIT) for those exact sizes, the leading
// dimensions, and the CPU it runs on (AVX-512 here): the C block stays in vector registers, A
// and B stream from the L1/L2 caches, and nothing is decided per element. Our job is the loop
// nest around the kernels (BlockedGemm): cut each of the layer's three products into tiles,
// reduce every tile in k steps, spread the tiles over the threads, and prepare everything that
// can be prepared once (the kernels, the plans, the packed weight) in a LinearState.
//
//   forward:   y           = x W^T + b          (N, in) x (in, out)  -> (N, out)
//   backward:  grad_input  = grad_output W      (N, out) x (out, in) -> (N, in)
//              grad_weight = grad_output^T x    (out, N) x (N, in)   -> (out, in)
//              grad_bias   = sum_N grad_output                        -> (out)
//
// What changed since stage 05: the loops over elements are gone; every product is a loop over
// tiles, each tile a few calls of a JIT kernel. A LinearState object, made once per layer (a
// pybind11 class), holds the kernels, one plan per batch size and the packed weight; forward
// and backward take it as an argument. W is packed into panels for the forward, once per
// weight version. The loop_order argument is gone. check_inputs is stage 05's, renamed.
// Build and test (LIBXSMM first: `sudo apt-get install -y libxsmm-dev`, or `make` at the root):
//   pip install --no-build-isolation .   then   pytest tests
//
// ---- The views trick: every product computed transposed, so no TRANS_A is ever needed ----
//
// LIBXSMM's kernels are column-major: element (i, j) of A lives at a[i + j * lda]. A row-major
// PyTorch matrix R (r x c) is, in the same memory, the column-major matrix R^T (c x r). So each
// product is computed on the transposed views, and the operands are read where they lie:
//
//   product      row-major (PyTorch)   column-major (LIBXSMM)      A                  B
//   forward      y  = x W^T            y^T  = W   . x^T            W, packed (below)  x as stored
//   grad_input   gx = gy W             gx^T = W^T . gy^T           W as stored        gy as stored
//   grad_weight  gw = gy^T x           gw^T = x^T . gy             x as stored        gy, TRANS_B
//
// Only the forward's A is not where it should be: the kernel wants W (out x in) column-major,
// memory holds W^T. LIBXSMM 1.17 has no TRANS_A (it returns NULL for it), so W is transposed
// once into panels, the packed weight, and reused while W is unchanged (the pack cache below).
// grad_weight's TRANS_B is supported: the kernel reads gy^T straight from gy. Its reduction runs
// over the batch N (the kernel's k), so no two threads ever add into the same tile.
//
// ---- The loop nest (BlockedGemm::run) --------------------------------------------------
//
//               n: bn-wide blocks (N: the batch for forward and grad_input)
//             +--------+--------+--------+----+
//   m:        | (0, 0) | (0, 1) | (0, 2) |    |   C tile (mb, nb), bm x bn: one thread owns it,
//   bm-high   +--------+--------+--------+----+     for kb in 0 .. nK-1:                (k steps)
//   blocks    | (1, 0) | (1, 1) |  ...   |    |       C(mb, nb) (+)= A(mb, kb) . B(kb, nb)
//             +--------+--------+--------+----+     the first step with beta = 0 (C = A B), the
//             |  tail row: the last block is  |     others beta = 1 (C += A B); with a bias the
//             +--- smaller, and so its kernel +     tile is pre-filled with b and every step adds
//                                 ^ tail column
//
//   at::parallel_for over the nM * nN tiles: each thread takes a contiguous range of tiles,
//   in row-block order or column-block order (n_outer), and runs the k loop of each.
//
// A tile's kernel depends on whether its row block, column block and k step are full or the
// smaller last one (the tail), and on beta: 2 x 2 x 2 x 2 = at most 16 kernels per product,
// dispatched once and looked up by index in the loop (BlockedGemm::kernels).
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <libxsmm.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

// The GEMM calls below are LIBXSMM 1.17's (libxsmm_smmdispatch and friends); LIBXSMM 2.x
// replaced them with another API. Fail at compile time, with the reason, on any other version.
#if LIBXSMM_VERSION_MAJOR != 1 || LIBXSMM_VERSION_MINOR < 17
#error "linear_tpp needs LIBXSMM 1.17 (Debian: sudo apt-get install -y libxsmm-dev)"
#endif

// Everything up to the bound functions is internal to this module: the anonymous namespace
// keeps these names out of the symbols _C exports.
namespace {

using idx = int64_t;

// ---- 1. One JIT kernel --------------------------------------------------------------

// The description of one kernel: C(m x n) (+)= A(m x k) . op(B), leading dimensions, flags.
// It is the key under which a LinearState keeps the kernel's function pointer.
struct KernelShape {
  idx m, n, k, lda, ldb, ldc;
  int flags;  // LIBXSMM_GEMM_FLAG_*: TRANS_B, BETA_0 (C = A B instead of C += A B)
  auto key() const { return std::make_tuple(m, n, k, lda, ldb, ldc, flags); }
};

// LIBXSMM's flags by name, for error messages: "TRANS_A|BETA_0".
std::string flag_names(int i_flags) {
  const std::pair<int, const char*> l_names[] = {
      {LIBXSMM_GEMM_FLAG_TRANS_A, "TRANS_A"}, {LIBXSMM_GEMM_FLAG_TRANS_B, "TRANS_B"}, {LIBXSMM_GEMM_FLAG_BETA_0, "BETA_0"}};
  std::string l_text;
  int l_rest = i_flags;
  for (const auto& [l_bit, l_name] : l_names) {
    if (i_flags & l_bit) {
      l_text += (l_text.empty() ? "" : "|") + std::string(l_name);
      l_rest &= ~l_bit;
    }
  }
  if (l_rest) l_text += (l_text.empty() ? "" : "|") + std::to_string(l_rest);
  return l_text.empty() ? "none" : l_text;
}

// Per element type: the kernel's function-pointer type and LIBXSMM's dispatch for it.
// alpha is always 1; beta is 0 with the BETA_0 flag, else 1 (the only values 1.17 supports).
template <typename T>
struct Xsmm;
template <>
struct Xsmm<float> {
  using Fn = libxsmm_smmfunction;  // void (*)(const float* a, const float* b, float* c, ...)
  static constexpr const char* kName = "float32";
  static Fn dispatch(libxsmm_blasint m, libxsmm_blasint n, libxsmm_blasint k, libxsmm_blasint lda,
                     libxsmm_blasint ldb, libxsmm_blasint ldc, int flags) {
    const float l_alpha = 1.0f, l_beta = (flags & LIBXSMM_GEMM_FLAG_BETA_0) ? 0.0f : 1.0f;
    const int l_prefetch = LIBXSMM_GEMM_PREFETCH_NONE;
    return libxsmm_smmdispatch(m, n, k, &lda, &ldb, &ldc, &l_alpha, &l_beta, &flags, &l_prefetch);
  }
};
template <>
struct Xsmm<double> {
  using Fn = libxsmm_dmmfunction;
  static constexpr const char* kName = "float64";
  static Fn dispatch(libxsmm_blasint m, libxsmm_blasint n, libxsmm_blasint k, libxsmm_blasint lda,
                     libxsmm_blasint ldb, libxsmm_blasint ldc, int flags) {
    const double l_alpha = 1.0, l_beta = (flags & LIBXSMM_GEMM_FLAG_BETA_0) ? 0.0 : 1.0;
    const int l_prefetch = LIBXSMM_GEMM_PREFETCH_NONE;
    return libxsmm_dmmdispatch(m, n, k, &lda, &ldb, &ldc, &l_alpha, &l_beta, &flags, &l_prefetch);
  }
};

// Asks LIBXSMM for one kernel. LIBXSMM generates it on the first request and returns the same
// code from its registry afterwards; the code lives as long as the process. A NULL pointer
// means "no kernel for this request" and would crash when called: it becomes a Python
// RuntimeError that names the request.
template <typename T>
typename Xsmm<T>::Fn dispatch_kernel(const KernelShape& i_shape) {
  const idx l_values[] = {i_shape.m, i_shape.n, i_shape.k, i_shape.lda, i_shape.ldb, i_shape.ldc};
  for (idx l_value : l_values) {  // libxsmm_blasint is a 32-bit int in Debian's build
    TORCH_CHECK(l_value <= INT_MAX, "linear_tpp: a GEMM size or leading dimension of ", l_value,
                " does not fit LIBXSMM's 32-bit integers");
  }
  auto l_kernel = Xsmm<T>::dispatch(i_shape.m, i_shape.n, i_shape.k, i_shape.lda, i_shape.ldb, i_shape.ldc,
                                    i_shape.flags);
  TORCH_CHECK(l_kernel != nullptr, "linear_tpp: LIBXSMM ", LIBXSMM_CONFIG_VERSION, " returned no kernel (NULL) for the ",
              Xsmm<T>::kName, " GEMM C(m x n) = A(m x k) B(k x n) with m=", i_shape.m, " n=", i_shape.n, " k=", i_shape.k,
              " lda=", i_shape.lda, " ldb=", i_shape.ldb, " ldc=", i_shape.ldc, " flags=", i_shape.flags, " (",
              flag_names(i_shape.flags), "); LIBXSMM 1.17 generates none for TRANS_A, for alpha other than 1, for beta "
              "other than 0 or 1, or for a size of 0");
  return l_kernel;
}

// ---- 2. A blocked GEMM: the loop nest around the kernels ---------------------------

// The three products of the layer, as indices into the state's tables.
enum Product : int { kForward = 0, kGradInput = 1, kGradWeight = 2 };
const char* const kProductNames[] = {"forward", "grad_input", "grad_weight"};

// The block sizes of one product: C tiles of bm x bn, the reduction in steps of bk
// (bk = 0: automatic, the whole K in one step up to K = 1024, beyond that 256-deep steps).
struct Blocking {
  idx bm, bn, bk;
};

// C (M x N) (+)= A (M x K) . op(B), column-major, cut into bm x bn tiles reduced in bk steps.
template <typename T>
struct BlockedGemm {
  using Fn = typename Xsmm<T>::Fn;
  idx M = 0, N = 0, K = 0;     // the whole product
  idx bm = 1, bn = 1, bk = 1;  // block sizes, clamped to the matrix
  idx nM = 0, nN = 0, nK = 0;  // block counts; the last block of each may be a smaller tail
  idx ldc = 0;                 // leading dimension of C
  bool n_outer = false;        // tile order: column blocks outermost (true) or row blocks (false)
  Fn kernels[2][2][2][2] = {};  // [last row block is a tail][column tail][k tail][beta = 0]

  // i_kernel(KernelShape) returns the kernel for one tile variant (the state's cached lookup).
  // i_may_prefill: run() may be asked to pre-fill tiles (the forward's bias), so the k step 0
  // also needs beta = 1 kernels.
  template <typename GetKernel>
  BlockedGemm(idx i_M, idx i_N, idx i_K, Blocking i_blocking, bool i_n_outer, idx i_lda, idx i_ldb, idx i_ldc,
              int i_flags, bool i_may_prefill, GetKernel&& i_kernel)
      : M(i_M), N(i_N), K(i_K), ldc(i_ldc), n_outer(i_n_outer) {
    bm = std::clamp<idx>(i_blocking.bm, 1, std::max<idx>(1, M));
    bn = std::clamp<idx>(i_blocking.bn, 1, std::max<idx>(1, N));
    const idx l_bk = i_blocking.bk > 0 ? i_blocking.bk : (K <= 1024 ? K : 256);
    bk = std::clamp<idx>(l_bk, 1, std::max<idx>(1, K));
    nM = (M + bm - 1) / bm;
    nN = (N + bn - 1) / bn;
    nK = (K + bk - 1) / bk;
    if (M == 0 || N == 0 || K == 0) return;  // nothing to multiply: no kernel (see run)

    const idx l_size_m[2] = {bm, M - (nM - 1) * bm};  // [full, tail]; the tail may be full-sized
    const idx l_size_n[2] = {bn, N - (nN - 1) * bn};
    const idx l_size_k[2] = {bk, K - (nK - 1) * bk};
    const bool l_need_beta_1 = nK > 1 || i_may_prefill;  // C += A B: later k steps, pre-filled tiles
    for (int l_tm = 0; l_tm < 2; l_tm++) {
      for (int l_tn = 0; l_tn < 2; l_tn++) {
        for (int l_tk = 0; l_tk < 2; l_tk++) {
          for (int l_beta0 = 0; l_beta0 < 2; l_beta0++) {
            // A tail of full size is no variant of its own: its slot gets the full kernel.
            const int l_m = l_tm && l_size_m[1] != bm, l_n = l_tn && l_size_n[1] != bn, l_k = l_tk && l_size_k[1] != bk;
            if (!l_beta0 && !l_need_beta_1) continue;  // never called: leave the slot empty
            kernels[l_tm][l_tn][l_tk][l_beta0] =
                i_kernel(KernelShape{l_size_m[l_m], l_size_n[l_n], l_size_k[l_k], i_lda, i_ldb, i_ldc,
                                     i_flags | (l_beta0 ? LIBXSMM_GEMM_FLAG_BETA_0 : 0)});
          }
        }
      }
    }
  }

  idx rows(idx i_mb) const { return std::min(bm, M - i_mb * bm); }     // rows of row block mb
  idx columns(idx i_nb) const { return std::min(bn, N - i_nb * bn); }  // columns of column block nb

  // Runs every tile. The callables give block pointers: a(mb, kb) and b(kb, nb) the operand
  // blocks of k step kb, c(mb, nb) the tile; prefill(mb, nb) may fill the tile first and returns
  // true if it did (then every k step accumulates, beta = 1).
  template <typename BlockA, typename BlockB, typename BlockC, typename Prefill>
  void run(BlockA&& a, BlockB&& b, BlockC&& c, Prefill&& prefill) const {
    if (M == 0 || N == 0) return;
    at::parallel_for(/*begin=*/0, /*end=*/nM * nN, /*grain_size=*/1, [&](idx i_first, idx i_last) {
      for (idx l_tile = i_first; l_tile < i_last; l_tile++) {
        const idx l_mb = n_outer ? l_tile % nM : l_tile / nN;
        const idx l_nb = n_outer ? l_tile / nM : l_tile % nN;
        const bool l_prefilled = prefill(l_mb, l_nb);
        T* l_c = c(l_mb, l_nb);
        if (K == 0) {  // an empty sum: C = 0, unless prefill wrote the bias
          if (!l_prefilled) {
            for (idx l_j = 0; l_j < columns(l_nb); l_j++) std::fill_n(l_c + l_j * ldc, rows(l_mb), T(0));
          }
          continue;
        }
        const int l_tm = l_mb == nM - 1, l_tn = l_nb == nN - 1;  // last blocks: the tail slots
        for (idx l_kb = 0; l_kb < nK; l_kb++) {
          const int l_beta0 = !l_prefilled && l_kb == 0;  // C = A B, then C += A B
          kernels[l_tm][l_tn][l_kb == nK - 1][l_beta0](a(l_mb, l_kb), b(l_kb, l_nb), l_c);
        }
      }
    });
  }
};

// ---- 3. The state: kernels, plans, packed weight ------------------------------------

// The blocking of the three products, chosen by timing candidate blockings per product on the
// tour's shapes (a 2-core Zen machine; README's exercise repeats this for one product): 64-wide
// tiles; a whole-K kernel while A's bm x K panel stays in L2 (K <= 1024), beyond that 256-deep
// steps; grad_input prefers 256-deep steps even at K = 1024, and column-block order.
struct Config {
  Blocking blocking[3] = {/*forward=*/{64, 64, 0}, /*grad_input=*/{64, 64, 256}, /*grad_weight=*/{64, 128, 0}};
  bool n_outer[3] = {false, true, true};
};

// A plan caps at this many batch sizes per dtype; beyond, the plans are dropped and rebuilt on
// demand (cheap: their kernels stay in the state's kernel table).
constexpr size_t kMaxPlans = 256;

std::atomic<int64_t> g_live_states{0};  // LinearStates alive now (tests watch it)

// Everything a layer prepares once. Made by the Python Layer in its constructor, owned by the
// Python object (pybind11), passed to every forward and backward, freed with the layer.
//
//   kernel table  every kernel this layer asked LIBXSMM for, by KernelShape, per dtype. The
//                 constructor fills in what does not depend on the batch size N (below); the
//                 rest is dispatched at the first call that needs it, then found here.
//   plans         per (product, batch size N, dtype): a BlockedGemm, its loop bounds and its
//                 16-slot kernel table. Building one is a few lookups in the kernel table.
//   packed weight W packed into panels for the forward, with the key of the W it came from.
//
// What the constructor can dispatch: it knows in and out, not N. The forward and grad_input
// run over the batch as their n dimension, so every full bn-wide column block uses kernels
// fixed by (in, out): the constructor dispatches those, for float32 (the default dtype), by
// building both plans for N = one full column block. The last, partial column block of an N
// that is not a multiple of bn, all of grad_weight (which reduces over the batch: its k is N)
// and float64 (once the layer is used with it) are dispatched lazily and kept here.
//
// JIT code belongs to LIBXSMM for the whole process and is shared by every layer that asks for
// the same kernel; the destructor frees what the state allocated: plans and packed weight.
class LinearState {
 public:
  LinearState(int64_t i_in_features, int64_t i_out_features)
      : m_in(i_in_features), m_out(i_out_features) {
    TORCH_CHECK(m_in >= 0 && m_out >= 0, "linear_tpp: expected in_features >= 0 and out_features >= 0, got ", m_in,
                " and ", m_out);
    libxsmm_init();  // idempotent; sets LIBXSMM up for this CPU on the first call
    dispatch_batch_independent<float>();
    g_live_states++;
  }
  ~LinearState() { g_live_states--; }
  LinearState(const LinearState&) = delete;
  LinearState& operator=(const LinearState&) = delete;

  int64_t in_features() const { return m_in; }
  int64_t out_features() const { return m_out; }

  // Replaces the blocking (tests force tiny blocks so that every tail kernel runs).
  // Each block is (bm, bn, bk); bk = 0 is automatic. Drops the plans and the packed weight.
  void set_config(const std::vector<int64_t>& i_forward, const std::vector<int64_t>& i_grad_input,
                  const std::vector<int64_t>& i_grad_weight, const std::vector<bool>& i_n_outer) {
    const std::vector<int64_t>* l_blocks[] = {&i_forward, &i_grad_input, &i_grad_weight};
    Config l_config;
    for (int l_p = 0; l_p < 3; l_p++) {
      const auto& l_b = *l_blocks[l_p];
      TORCH_CHECK(l_b.size() == 3 && l_b[0] >= 1 && l_b[1] >= 1 && l_b[2] >= 0, "linear_tpp: expected the ",
                  kProductNames[l_p], " blocking as (bm >= 1, bn >= 1, bk >= 0), got ", c10::IntArrayRef(l_b));
      l_config.blocking[l_p] = {l_b[0], l_b[1], l_b[2]};
    }
    TORCH_CHECK(i_n_outer.size() == 3, "linear_tpp: expected n_outer as 3 flags (forward, grad_input, grad_weight), got ",
                i_n_outer.size());
    for (int l_p = 0; l_p < 3; l_p++) l_config.n_outer[l_p] = i_n_outer[l_p];
    {
      std::lock_guard<std::mutex> l_lock(m_mutex);
      m_config = l_config;
      std::get<0>(m_types).plans.clear();
      std::get<1>(m_types).plans.clear();
    }
    invalidate();
    dispatch_batch_independent<float>();
  }

  // (forward, grad_input, grad_weight) blockings and the n_outer flags, as set_config takes them.
  std::tuple<std::vector<int64_t>, std::vector<int64_t>, std::vector<int64_t>, std::vector<bool>> config() const {
    std::lock_guard<std::mutex> l_lock(m_mutex);
    auto l_block = [&](int l_p) {
      const Blocking& l_b = m_config.blocking[l_p];
      return std::vector<int64_t>{l_b.bm, l_b.bn, l_b.bk};
    };
    return {l_block(kForward), l_block(kGradInput), l_block(kGradWeight),
            {m_config.n_outer[0], m_config.n_outer[1], m_config.n_outer[2]}};
  }

  // The plan of one product for a batch of N rows, in element type T: built on first use.
  template <typename T>
  std::shared_ptr<const BlockedGemm<T>> plan(Product i_product, idx N) {
    std::lock_guard<std::mutex> l_lock(m_mutex);
    auto& l_plans = std::get<PerType<T>>(m_types).plans;
    const auto l_key = std::make_pair(int(i_product), N);
    auto l_found = l_plans.find(l_key);
    if (l_found != l_plans.end()) return l_found->second;
    if (l_plans.size() >= kMaxPlans) l_plans.clear();
    auto l_kernel = [&](const KernelShape& i_shape) { return kernel<T>(i_shape); };
    const Blocking& l_b = m_config.blocking[i_product];
    const bool l_n_outer = m_config.n_outer[i_product];
    std::shared_ptr<const BlockedGemm<T>> l_plan;
    switch (i_product) {
      case kForward: {
        // y^T (out x N) = Wp (out x in) . x^T (in x N). A: the packed panels, whose leading
        // dimension is the panel height, the clamped bm; B: x, ld in; C: y, ld out.
        const idx l_panel = std::clamp<idx>(l_b.bm, 1, std::max<idx>(1, m_out));
        l_plan = std::make_shared<BlockedGemm<T>>(m_out, N, m_in, l_b, l_n_outer, /*lda=*/l_panel, /*ldb=*/m_in,
                                                  /*ldc=*/m_out, /*flags=*/0, /*may_prefill=*/true, l_kernel);
        break;
      }
      case kGradInput:
        // gx^T (in x N) = W^T (in x out) . gy^T (out x N). A: W, ld in; B: gy, ld out; C: gx, ld in.
        l_plan = std::make_shared<BlockedGemm<T>>(m_in, N, m_out, l_b, l_n_outer, /*lda=*/m_in, /*ldb=*/m_out,
                                                  /*ldc=*/m_in, /*flags=*/0, /*may_prefill=*/false, l_kernel);
        break;
      case kGradWeight:
        // gw^T (in x out) = x^T (in x N) . gy (N x out). A: x, ld in; B: gy^T as stored (out x N,
        // ld out), read transposed by TRANS_B; C: gw, ld in. The batch N is the reduction.
        l_plan = std::make_shared<BlockedGemm<T>>(m_in, m_out, N, l_b, l_n_outer, /*lda=*/m_in, /*ldb=*/m_out,
                                                  /*ldc=*/m_in, LIBXSMM_GEMM_FLAG_TRANS_B, /*may_prefill=*/false,
                                                  l_kernel);
        break;
    }
    l_plans.emplace(l_key, l_plan);
    return l_plan;
  }

  // The forward's A operand: W (out, in) packed into panels of bm rows, panel p holding rows
  // p*bm .. p*bm+bm-1 column-major with leading dimension bm, so the kernel's A block of k step
  // kb is the contiguous bm x bk slab at panel + kb*bk*bm:
  //
  //   W (row-major, out x in)            packed: panel 0 | panel 1 | ...    (each bm x in,
  //   row 0    [w00 w01 w02 ...]           w00 w10 .. w(bm-1)0  w01 w11 ..    column-major)
  //   row 1    [w10 w11 w12 ...]   -->
  //   ...                                  a transpose of each bm-row slice (libxsmm_otrans)
  //
  // i_cache: the caller says no gradient is recorded for W in this call (inference, or a frozen
  // weight). Then the pack of an earlier call is reused if W is still the same tensor, unchanged:
  // the same live TensorImpl (held by a weak reference, so that a new tensor that happens to get
  // the freed memory of the old one is not taken for it), the same data pointer, sizes and
  // strides, and the same version counter, which every in-place write through PyTorch bumps
  // (optimizer.step(), w.mul_() under no_grad, load_state_dict's copy_). Writes that bypass
  // the counter (w.data, a numpy view of w) are not seen: call invalidate() after them.
  // Without i_cache (training: W changes every step anyway; gradcheck writes W through .data),
  // W is packed for this call alone and any cached pack is dropped.
  at::Tensor packed_weight(const at::Tensor& i_weight, const at::Tensor& i_weight_contiguous, idx i_bm, bool i_cache) {
    const bool l_cacheable = i_cache && !i_weight.is_inference();  // inference tensors have no version counter
    {
      std::lock_guard<std::mutex> l_lock(m_pack_mutex);
      if (l_cacheable && m_pack.panels.defined() && m_pack.owner.lock().get() == i_weight.unsafeGetTensorImpl() &&
          m_pack.data == i_weight.const_data_ptr() && m_pack.version == i_weight._version() && m_pack.bm == i_bm &&
          m_pack.dtype == i_weight.scalar_type() && i_weight.sizes().equals(m_pack.sizes) &&
          i_weight.strides().equals(m_pack.strides)) {
        return m_pack.panels;
      }
      if (!l_cacheable) m_pack = PackedWeight();  // drop the cached copy: it is about to be stale
    }
    // A fresh tensor each time: a concurrent call still reading the previous pack keeps it alive.
    const idx l_panels = (m_out + i_bm - 1) / i_bm;
    at::Tensor l_packed = at::empty({l_panels * i_bm * m_in}, i_weight_contiguous.options());
    const auto l_size = static_cast<unsigned int>(i_weight_contiguous.element_size());
    const char* l_w = static_cast<const char*>(i_weight_contiguous.const_data_ptr());
    char* l_p = static_cast<char*>(l_packed.mutable_data_ptr());
    at::parallel_for(/*begin=*/0, /*end=*/l_panels, /*grain_size=*/1, [&](idx i_first, idx i_last) {
      for (idx l_mb = i_first; l_mb < i_last; l_mb++) {
        // Rows mb*bm.. of W are the column-major (in x rows) matrix at row mb*bm, ld = in; its
        // transpose (rows x in, ld = bm) is panel mb. The rows of a tail panel past `out` stay
        // unwritten: the tail kernel reads only the panel's first rows.
        const idx l_rows = std::min(i_bm, m_out - l_mb * i_bm);
        libxsmm_otrans(l_p + l_mb * i_bm * m_in * l_size, l_w + l_mb * i_bm * m_in * l_size, l_size,
                       /*m=*/m_in, /*n=*/l_rows, /*ldi=*/m_in, /*ldo=*/i_bm);
      }
    });
    std::lock_guard<std::mutex> l_lock(m_pack_mutex);
    m_packs++;
    if (l_cacheable) {
      m_pack.panels = l_packed;
      m_pack.owner = i_weight.getIntrusivePtr();  // a weak reference: the cache does not keep W alive
      m_pack.data = i_weight.const_data_ptr();
      m_pack.version = i_weight._version();
      m_pack.bm = i_bm;
      m_pack.dtype = i_weight.scalar_type();
      m_pack.sizes = i_weight.sizes().vec();
      m_pack.strides = i_weight.strides().vec();
    }
    return l_packed;
  }

  // Forgets the packed weight (after writing W behind its version counter).
  void invalidate() {
    std::lock_guard<std::mutex> l_lock(m_pack_mutex);
    m_pack = PackedWeight();
  }

  int64_t kernel_count() const {
    std::lock_guard<std::mutex> l_lock(m_mutex);
    return std::get<0>(m_types).kernels.size() + std::get<1>(m_types).kernels.size();
  }
  int64_t plan_count() const {
    std::lock_guard<std::mutex> l_lock(m_mutex);
    return std::get<0>(m_types).plans.size() + std::get<1>(m_types).plans.size();
  }
  int64_t pack_count() const {
    std::lock_guard<std::mutex> l_lock(m_pack_mutex);
    return m_packs;
  }
  int64_t packed_bytes() const {
    std::lock_guard<std::mutex> l_lock(m_pack_mutex);
    return m_pack.panels.defined() ? m_pack.panels.nbytes() : 0;
  }

 private:
  // The kernel table and plans of one element type.
  template <typename T>
  struct PerType {
    std::map<decltype(std::declval<KernelShape>().key()), typename Xsmm<T>::Fn> kernels;
    std::map<std::pair<int, idx>, std::shared_ptr<const BlockedGemm<T>>> plans;
  };

  // What the packed weight was made from (the pack cache's key), and the panels.
  struct PackedWeight {
    at::Tensor panels;  // undefined: nothing cached
    c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> owner{
        c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>()};
    const void* data = nullptr;
    int64_t version = -1;
    idx bm = 0;
    at::ScalarType dtype = at::kFloat;
    std::vector<int64_t> sizes, strides;
  };

  // The kernel for one shape: from the table, else dispatched (NULL-checked) and kept.
  // Called with m_mutex held.
  template <typename T>
  typename Xsmm<T>::Fn kernel(const KernelShape& i_shape) {
    auto& l_kernels = std::get<PerType<T>>(m_types).kernels;
    auto l_found = l_kernels.find(i_shape.key());
    if (l_found != l_kernels.end()) return l_found->second;
    auto l_kernel = dispatch_kernel<T>(i_shape);
    l_kernels.emplace(i_shape.key(), l_kernel);
    return l_kernel;
  }

  // The kernels of every full column block of the forward and grad_input: their plans for a
  // batch of exactly one column block (bn rows) need nothing else.
  template <typename T>
  void dispatch_batch_independent() {
    for (Product l_product : {kForward, kGradInput}) {
      idx l_bn;
      {
        std::lock_guard<std::mutex> l_lock(m_mutex);
        l_bn = m_config.blocking[l_product].bn;
      }
      plan<T>(l_product, l_bn);
    }
  }

  const int64_t m_in, m_out;
  mutable std::mutex m_mutex;  // guards m_config, m_types
  Config m_config;
  std::tuple<PerType<float>, PerType<double>> m_types;
  mutable std::mutex m_pack_mutex;  // guards m_pack, m_packs
  PackedWeight m_pack;
  int64_t m_packs = 0;  // packs made so far (tests and the curious watch it)
};

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
  TORCH_CHECK(i_weight || !i_need_grad_input, "linear_tpp: grad_input needs the weight, got None");
  TORCH_CHECK(i_input || !i_need_grad_weights, "linear_tpp: grad_weight needs the input, got None");

  // Device and dtype: CPU tensors, Float or Double (the two types LIBXSMM's GEMMs are built
  // for here), all of the first one's dtype (the weight's).
  const std::pair<const char*, const std::optional<torch::Tensor>*> l_tensors[] = {
      {"weight", &i_weight}, {"input", &i_input}, {"bias", &i_bias}, {"grad_output", &i_grad_output}};
  const char* l_dtype_from = nullptr;
  torch::ScalarType l_dtype = torch::kFloat;
  for (const auto& [l_name, l_tensor] : l_tensors) {
    if (!l_tensor->has_value()) continue;
    const torch::Tensor& l_t = l_tensor->value();
    TORCH_CHECK(l_t.device().is_cpu(), "linear_tpp: expected the ", l_name, " on the CPU, got device ", l_t.device());
    TORCH_CHECK(l_t.scalar_type() == torch::kFloat || l_t.scalar_type() == torch::kDouble,
                "linear_tpp: expected a Float or Double ", l_name, " dtype, got ", l_t.scalar_type());
    if (l_dtype_from == nullptr) {
      l_dtype_from = l_name;
      l_dtype = l_t.scalar_type();
    }
    TORCH_CHECK(l_t.scalar_type() == l_dtype, "linear_tpp: expected the ", l_name, " dtype ", l_dtype,
                " (the ", l_dtype_from, "'s), got ", l_t.scalar_type());
  }

  // Ranks: weight (out_features, in_features), input and grad_output (*, features).
  if (i_weight) {
    TORCH_CHECK(i_weight->dim() == 2, "linear_tpp: expected a 2-d weight (out_features, in_features), got ",
                i_weight->dim(), " dimension(s): ", i_weight->sizes());
  }
  if (i_input) {
    TORCH_CHECK(i_input->dim() >= 1, "linear_tpp: expected an input with at least 1 dimension (*, in_features), got a 0-d tensor");
  }
  if (i_grad_output) {
    TORCH_CHECK(i_grad_output->dim() >= 1, "linear_tpp: expected a grad_output with at least 1 dimension (*, out_features), got a 0-d tensor");
  }

  // Sizes: the feature counts agree with the weight, the batch dimensions with each other.
  // The kernels trust these sizes: a wrong one here would be a read out of bounds there.
  if (i_input && i_weight) {
    TORCH_CHECK(i_input->size(-1) == i_weight->size(1), "linear_tpp: expected ", i_weight->size(1),
                " input features in the last dimension (the weight's in_features), got ", i_input->size(-1),
                " (input shape ", i_input->sizes(), ")");
  }
  if (i_bias && i_weight) {
    TORCH_CHECK(i_bias->dim() == 1 && i_bias->size(0) == i_weight->size(0), "linear_tpp: expected a bias of shape [",
                i_weight->size(0), "] (the weight's out_features), got shape ", i_bias->sizes());
  }
  if (i_grad_output && i_weight) {
    TORCH_CHECK(i_grad_output->size(-1) == i_weight->size(0), "linear_tpp: expected ", i_weight->size(0),
                " output features in grad_output's last dimension (the weight's out_features), got ",
                i_grad_output->size(-1), " (grad_output shape ", i_grad_output->sizes(), ")");
  }
  if (i_grad_output && i_input) {
    const auto l_batch = i_input->sizes().slice(/*start=*/0, /*length=*/i_input->dim() - 1);
    const auto l_batch_grad = i_grad_output->sizes().slice(/*start=*/0, /*length=*/i_grad_output->dim() - 1);
    TORCH_CHECK(l_batch == l_batch_grad, "linear_tpp: expected grad_output's leading dimensions ", l_batch,
                " (the input's), got ", l_batch_grad, " (grad_output shape ", i_grad_output->sizes(), ")");
  }
}

// The caller's state, checked against the layer's sizes, or (state None) a temporary one for
// this call, made in o_temporary. Called after check_inputs: the sizes are valid by then.
LinearState& state_for(LinearState* i_state, int64_t i_in_features, int64_t i_out_features,
                       std::optional<LinearState>& o_temporary) {
  if (i_state == nullptr) return o_temporary.emplace(i_in_features, i_out_features);
  TORCH_CHECK(i_state->in_features() == i_in_features && i_state->out_features() == i_out_features,
              "linear_tpp: the LinearState was made for in_features=", i_state->in_features(), " and out_features=",
              i_state->out_features(), ", got a weight with in_features=", i_in_features, " and out_features=",
              i_out_features);
  return *i_state;
}

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

// y (N, out) = x (N, in) W^T + b. All pointers row-major and contiguous.
template <typename T>
void forward_tpp(LinearState& io_state, const at::Tensor& i_weight, const at::Tensor& i_weight_contiguous,
                 const T* i_x, const T* i_b, T* o_y, idx N, idx i_in, idx i_out, bool i_cache_weight) {
  if (N == 0 || i_out == 0) return;
  const auto l_plan = io_state.plan<T>(kForward, N);
  const BlockedGemm<T>& l_gemm = *l_plan;
  const idx bm = l_gemm.bm, bn = l_gemm.bn, bk = l_gemm.bk;
  at::Tensor l_packed;  // no K, nothing to pack: the tiles are the bias, or zeros
  if (i_in > 0) l_packed = io_state.packed_weight(i_weight, i_weight_contiguous, bm, i_cache_weight);
  const T* l_panels = i_in > 0 ? l_packed.const_data_ptr<T>() : nullptr;
  l_gemm.run(
      // A block (mb, kb): panel mb, from row kb*bk of its column-major (bm x in) layout
      [&](idx mb, idx kb) { return l_panels + mb * bm * i_in + kb * bk * bm; },
      // B block (kb, nb): x^T rows kb*bk.., columns nb*bn..; column j of x^T is row j of x
      [&](idx kb, idx nb) { return i_x + nb * bn * i_in + kb * bk; },
      // C tile (mb, nb): y^T rows mb*bm.., columns nb*bn..; column j of y^T is row j of y
      [&](idx mb, idx nb) { return o_y + nb * bn * i_out + mb * bm; },
      // the bias, fused: each column of the tile starts as b[mb*bm ..], the kernels add A B
      [&](idx mb, idx nb) {
        if (i_b == nullptr) return false;
        for (idx l_j = 0; l_j < l_gemm.columns(nb); l_j++) {
          std::memcpy(o_y + (nb * bn + l_j) * i_out + mb * bm, i_b + mb * bm, l_gemm.rows(mb) * sizeof(T));
        }
        return true;
      });
}

// gx (N, in) = gy (N, out) W (out, in): gx^T = W^T . gy^T, both operands as stored.
template <typename T>
void grad_input_tpp(LinearState& io_state, const T* i_gy, const T* i_w, T* o_gx, idx N, idx i_in, idx i_out) {
  const auto l_plan = io_state.plan<T>(kGradInput, N);
  const BlockedGemm<T>& l_gemm = *l_plan;
  const idx bm = l_gemm.bm, bn = l_gemm.bn, bk = l_gemm.bk;
  l_gemm.run([&](idx mb, idx kb) { return i_w + kb * bk * i_in + mb * bm; },   // W^T: column o is row o of W
             [&](idx kb, idx nb) { return i_gy + nb * bn * i_out + kb * bk; },  // gy^T: column n is row n of gy
             [&](idx mb, idx nb) { return o_gx + nb * bn * i_in + mb * bm; },
             [](idx, idx) { return false; });
}

// gw (out, in) = gy^T (out, N) x (N, in): gw^T = x^T . gy, gy read transposed (TRANS_B).
template <typename T>
void grad_weight_tpp(LinearState& io_state, const T* i_gy, const T* i_x, T* o_gw, idx N, idx i_in, idx i_out) {
  const auto l_plan = io_state.plan<T>(kGradWeight, N);
  const BlockedGemm<T>& l_gemm = *l_plan;
  const idx bm = l_gemm.bm, bn = l_gemm.bn, bk = l_gemm.bk;
  l_gemm.run([&](idx mb, idx kb) { return i_x + kb * bk * i_in + mb * bm; },     // x^T: column n is row n of x
             [&](idx kb, idx nb) { return i_gy + kb * bk * i_out + nb * bn; },  // gy, stored as gy^T (out x N)
             [&](idx mb, idx nb) { return o_gw + nb * bn * i_in + mb * bm; },
             [](idx, idx) { return false; });
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

}  // namespace

// ---- 6. The bound functions -----------------------------------------------------------

// The course's two declarations, verbatim: no bias, both gradients, a temporary state.
torch::Tensor forward(torch::Tensor i_input, torch::Tensor i_weight);
std::vector<torch::Tensor> backward(torch::Tensor i_grad_output, torch::Tensor i_input, torch::Tensor i_weights);

// y = x W^T + b for x of shape (*, in); without a bias, y = x W^T. i_state: the layer's state
// (None: a temporary one). i_cache_weight: may reuse and keep the packed W (see packed_weight).
torch::Tensor forward(torch::Tensor i_input, torch::Tensor i_weight, std::optional<torch::Tensor> i_bias,
                      LinearState* i_state, bool i_cache_weight) {
  check_inputs(i_input, i_weight, i_bias);  // first: the state is only touched with valid inputs
  std::optional<LinearState> l_temporary;
  LinearState& l_state = state_for(i_state, i_weight.size(1), i_weight.size(0), l_temporary);
  // Row-major data, each in a named local: a data pointer into a temporary would dangle.
  // contiguous() returns the tensor itself when it is already contiguous, else a copy.
  const torch::Tensor l_input = flatten_to_2d(i_input).contiguous();             // (N, in)
  const torch::Tensor l_weight = i_weight.contiguous();                          // (out, in)
  const torch::Tensor l_bias = i_bias ? i_bias->contiguous() : torch::Tensor();  // (out), or undefined
  const int64_t l_n = l_input.size(0), l_in = l_weight.size(1), l_out = l_weight.size(0);
  torch::Tensor l_output = torch::empty({l_n, l_out}, l_input.options());  // every element is written

  // scalar_t is float for a Float input, double for a Double one.
  AT_DISPATCH_FLOATING_TYPES(l_input.scalar_type(), "linear_tpp::forward", [&] {
    // The pack cache keys on the weight as the caller holds it (i_weight), not on a copy.
    forward_tpp<scalar_t>(l_state, i_weight, l_weight, l_input.const_data_ptr<scalar_t>(),
                          l_bias.defined() ? l_bias.const_data_ptr<scalar_t>() : nullptr,
                          l_output.mutable_data_ptr<scalar_t>(), l_n, l_in, l_out, i_cache_weight);
  });
  return unflatten_like(l_output, i_input);  // (*, out)
}

torch::Tensor forward(torch::Tensor i_input, torch::Tensor i_weight) {
  return forward(i_input, i_weight, /*i_bias=*/std::nullopt, /*i_state=*/nullptr, /*i_cache_weight=*/false);
}

// The gradients of y = x W^T + b: {grad_input, grad_weight, grad_bias}, each computed only
// when asked for; one that is not comes back undefined, which Python receives as None.
std::vector<torch::Tensor> backward(torch::Tensor i_grad_output,
                                    std::optional<torch::Tensor> i_input,
                                    std::optional<torch::Tensor> i_weights,
                                    bool i_need_grad_input,
                                    bool i_need_grad_weights,
                                    bool i_need_grad_bias,
                                    LinearState* i_state) {
  check_inputs(i_input, i_weights, /*i_bias=*/std::nullopt, i_grad_output, i_need_grad_input, i_need_grad_weights);
  const torch::Tensor l_grad_output = flatten_to_2d(i_grad_output).contiguous();  // (N, out)
  const int64_t l_n = l_grad_output.size(0), l_out = l_grad_output.size(1);
  // in_features from whichever of weight and input is there (grad_bias alone needs neither).
  const int64_t l_in = i_weights ? i_weights->size(1) : i_input ? i_input->size(-1) : 0;
  std::optional<LinearState> l_temporary;
  LinearState* l_state = nullptr;  // grad_bias alone needs no kernel, so no state
  if (i_need_grad_input || i_need_grad_weights) l_state = &state_for(i_state, l_in, l_out, l_temporary);
  torch::Tensor l_grad_input, l_grad_weights, l_grad_bias;  // undefined until computed

  AT_DISPATCH_FLOATING_TYPES(l_grad_output.scalar_type(), "linear_tpp::backward", [&] {
    const scalar_t* l_gy = l_grad_output.const_data_ptr<scalar_t>();
    if (i_need_grad_input) {
      // grad_input = grad_output W: (N, out) x (out, in) -> (N, in), then (*, in)
      const torch::Tensor l_weights = i_weights->contiguous();  // (out, in)
      torch::Tensor l_gx = torch::empty({l_n, l_in}, l_grad_output.options());
      grad_input_tpp<scalar_t>(*l_state, l_gy, l_weights.const_data_ptr<scalar_t>(), l_gx.mutable_data_ptr<scalar_t>(),
                               l_n, l_in, l_out);
      l_grad_input = unflatten_like(l_gx, i_grad_output);
    }
    if (i_need_grad_weights) {
      // grad_weight = grad_output^T x: (out, N) x (N, in) -> (out, in)
      const torch::Tensor l_input = flatten_to_2d(*i_input).contiguous();  // (N, in)
      l_grad_weights = torch::empty({l_out, l_in}, l_grad_output.options());
      grad_weight_tpp<scalar_t>(*l_state, l_gy, l_input.const_data_ptr<scalar_t>(),
                                l_grad_weights.mutable_data_ptr<scalar_t>(), l_n, l_in, l_out);
    }
    if (i_need_grad_bias) {
      // grad_bias = sum over the N rows of grad_output -> (out)
      l_grad_bias = torch::empty({l_out}, l_grad_output.options());
      grad_bias_tpp<scalar_t>(l_gy, l_grad_bias.mutable_data_ptr<scalar_t>(), l_n, l_out);
    }
  });
  return {l_grad_input, l_grad_weights, l_grad_bias};
}

std::vector<torch::Tensor> backward(torch::Tensor i_grad_output, torch::Tensor i_input, torch::Tensor i_weights) {
  std::vector<torch::Tensor> l_grads = backward(i_grad_output, i_input, i_weights, /*i_need_grad_input=*/true,
                                                /*i_need_grad_weights=*/true, /*i_need_grad_bias=*/false,
                                                /*i_state=*/nullptr);
  return {l_grads[0], l_grads[1]};  // {grad_input, grad_weight}
}

// ---- 7. Tools: a dispatch probe, the peak probe ------------------------------------

// Dispatches one kernel, C(m x n) (+)= A(m x k) op(B) with tight leading dimensions, through the
// same checked path as the layer; returns True, or raises naming the request (a NULL kernel).
bool dispatch_check(int64_t i_m, int64_t i_n, int64_t i_k, int i_flags, at::ScalarType i_dtype) {
  libxsmm_init();
  TORCH_CHECK(i_dtype == at::kFloat || i_dtype == at::kDouble, "linear_tpp: expected dtype Float or Double, got ", i_dtype);
  const bool l_trans_a = i_flags & LIBXSMM_GEMM_FLAG_TRANS_A, l_trans_b = i_flags & LIBXSMM_GEMM_FLAG_TRANS_B;
  const KernelShape l_shape{i_m, i_n, i_k, /*lda=*/l_trans_a ? i_k : i_m, /*ldb=*/l_trans_b ? i_n : i_k, /*ldc=*/i_m, i_flags};
  if (i_dtype == at::kFloat) dispatch_kernel<float>(l_shape);
  else dispatch_kernel<double>(l_shape);
  return true;
}

// The machine's practical float32 peak: every thread (at::get_num_threads(), which is
// torch.get_num_threads()) runs one m x n x k kernel over its own buffers, all in L1, for
// i_seconds; returns the GFLOP/s of all threads together. No memory traffic, no loop nest:
// the best a GEMM on this machine can hope for.
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

// TORCH_EXTENSION_NAME is set by torch.utils.cpp_extension to the module's name ("_C").
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Stage 06: the linear layer's forward and backward on LIBXSMM's JIT-generated GEMM kernels";

  // The layer's state. pybind11 owns the C++ object: it lives as long as a Python reference
  // (the Layer's self.state, an autograd ctx) and is deleted with the last one.
  py::class_<LinearState>(m, "LinearState",
                          "JIT kernels, per-batch plans and the packed weight of one linear layer")
      .def(py::init<int64_t, int64_t>(), py::arg("in_features"), py::arg("out_features"))
      .def_property_readonly("in_features", &LinearState::in_features)
      .def_property_readonly("out_features", &LinearState::out_features)
      .def("set_config", &LinearState::set_config,
           "Blocking (bm, bn, bk) of forward, grad_input and grad_weight (bk 0: automatic) and their tile orders",
           py::arg("forward"), py::arg("grad_input"), py::arg("grad_weight"), py::arg("n_outer"))
      .def_property_readonly("config", &LinearState::config, "(forward, grad_input, grad_weight, n_outer)")
      .def("invalidate", &LinearState::invalidate, "Forget the packed weight (after writing W through .data)")
      .def_property_readonly("kernels", &LinearState::kernel_count, "JIT kernels in this state's table")
      .def_property_readonly("plans", &LinearState::plan_count, "plans made: one per product, batch size, dtype")
      .def_property_readonly("packs", &LinearState::pack_count, "times the weight was packed")
      .def_property_readonly("packed_bytes", &LinearState::packed_bytes, "bytes of the cached packed weight")
      .def("__repr__",
           [](const LinearState& i_state) {
             return "LinearState(in_features=" + std::to_string(i_state.in_features()) +
                    ", out_features=" + std::to_string(i_state.out_features()) +
                    ", kernels=" + std::to_string(i_state.kernel_count()) + ")";
           })
      // copy.deepcopy(layer) and torch.save(layer) pickle the state: sizes and blocking travel,
      // kernels and packed weight are made again.
      .def(py::pickle([](const LinearState& i_state) {
                        return py::make_tuple(i_state.in_features(), i_state.out_features(), i_state.config());
                      },
                      [](py::tuple i_saved) {
                        auto l_state = std::make_unique<LinearState>(i_saved[0].cast<int64_t>(), i_saved[1].cast<int64_t>());
                        auto [l_forward, l_grad_input, l_grad_weight, l_n_outer] = i_saved[2].cast<
                            std::tuple<std::vector<int64_t>, std::vector<int64_t>, std::vector<int64_t>, std::vector<bool>>>();
                        l_state->set_config(l_forward, l_grad_input, l_grad_weight, l_n_outer);
                        return l_state;
                      }));

  m.def("forward", py::overload_cast<torch::Tensor, torch::Tensor>(&forward),
        "The course's forward: y = x W^T for x of shape (*, in)", py::arg("input"), py::arg("weight"));
  m.def("backward", py::overload_cast<torch::Tensor, torch::Tensor, torch::Tensor>(&backward),
        "The course's backward: [grad_input, grad_weight] of y = x W^T",
        py::arg("grad_output"), py::arg("input"), py::arg("weights"));
  m.def("forward", py::overload_cast<torch::Tensor, torch::Tensor, std::optional<torch::Tensor>, LinearState*, bool>(&forward),
        "y = x W^T + b; bias=None leaves b out; state=None uses a temporary state; cache_weight: "
        "reuse and keep the packed weight while the weight is unchanged (no gradient recorded for it)",
        py::arg("input"), py::arg("weight"), py::arg("bias"), py::arg("state") = static_cast<LinearState*>(nullptr),
        py::arg("cache_weight") = false);
  m.def("backward",
        py::overload_cast<torch::Tensor, std::optional<torch::Tensor>, std::optional<torch::Tensor>, bool, bool, bool,
                          LinearState*>(&backward),
        "[grad_input, grad_weight, grad_bias] of y = x W^T + b, None for each one not asked for; "
        "input and weights may be None where no requested gradient needs them",
        py::arg("grad_output"), py::arg("input"), py::arg("weights"), py::arg("need_grad_input"),
        py::arg("need_grad_weights"), py::arg("need_grad_bias"), py::arg("state") = static_cast<LinearState*>(nullptr));

  m.def("dispatch_check", &dispatch_check,
        "Dispatch one LIBXSMM kernel (tight leading dimensions); True, or a RuntimeError naming the request",
        py::arg("m"), py::arg("n"), py::arg("k"), py::arg("flags") = 0, py::arg("dtype") = at::kFloat);
  m.def("peak_gflops", &peak_gflops, "float32 GFLOP/s of an in-cache m x n x k kernel loop on every thread",
        py::arg("m") = 64, py::arg("n") = 64, py::arg("k") = 64, py::arg("seconds") = 0.1);
  m.def("target_arch", [] { libxsmm_init(); return std::string(libxsmm_get_target_arch()); },
        "the instruction set LIBXSMM generates code for on this CPU");
  m.def("live_states", [] { return g_live_states.load(); }, "LinearState objects alive now");
  m.attr("LIBXSMM_VERSION") = LIBXSMM_CONFIG_VERSION;
  m.attr("FLAG_TRANS_A") = int(LIBXSMM_GEMM_FLAG_TRANS_A);
  m.attr("FLAG_TRANS_B") = int(LIBXSMM_GEMM_FLAG_TRANS_B);
  m.attr("FLAG_BETA_0") = int(LIBXSMM_GEMM_FLAG_BETA_0);
}
