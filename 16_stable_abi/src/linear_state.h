// Stage 16: the state and its caches. Everything prepared once and reused on every
// call: the JIT kernels and one plan (a BlockedGemm) per product and batch size.
// What changed since stage 08: no pack cache. 08 never used it (it packs the weight on every
// call: its README, "State without pybind11"), and the stable ABI could not key it anyway: it
// has no weak reference to a tensor and no version counter. packed_weight packs for one call.
#pragma once

#include <torch/csrc/stable/ops.h>  // torch::stable::parallel_for

#include <atomic>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "blocked_gemm.h"

namespace tpp {

// ---- 3. The state: kernels, plans ------------------------------------

// The blocking of the three products (bm, bn, bk) and their tile order, per instruction set:
// AVX2 and AVX-512 kernels keep register blocks of different sizes (16 or 32 vector registers),
// so the best tile differs. Chosen by timing candidate blockings with `06_tpp/benchmark.py --blockings`
// (06's README: the training step): on AVX2 (Zen 3) 64 x 128 tiles in 64-deep k steps, whose 16 KB
// A block stays in L1, 6-10 points of the probe per product above 128-deep steps; on AVX-512
// (Zen 5) 128 x 64 tiles in 256-deep k steps, 4-8 points above 64 x 64 x 128 tiles.
struct Config {
  Blocking blocking[3] = {/*forward=*/{64, 128, 64}, /*grad_input=*/{64, 128, 64}, /*grad_weight=*/{64, 128, 64}};
  bool n_outer[3] = {true, true, true};  // column blocks outermost: a thread packs each B block once
};

inline Config default_config() {
  libxsmm_init();
  Config l_config;
  if (libxsmm_get_target_archid() >= LIBXSMM_X86_AVX512) {
    for (Blocking& l_b : l_config.blocking) l_b = {128, 64, 256};
  }
  return l_config;
}

// Scratch memory for the packs that serve one call alone: W in the forward (every call here), W^T
// in grad_input, x^T in grad_weight. Each is several MB on large layers. Made with torch::stable::empty on
// every call, each would be fresh memory whenever glibc has handed the last one back to the system
// (it does, for big blocks freed at the top of the heap), and the first write to each 4 KB page of
// fresh memory is a page fault, paid again on every call (06's README: the training step, step 6).
// So each calling thread keeps one buffer per product, grown to the largest pack it has made, and
// packs into it again on the next call. No other call can be reading it: a call runs to its end on
// the thread that made it (parallel_for's workers only help it). The buffers live as long as the
// thread, as oneDNN's per-thread scratchpad and MKL's buffers do: a thread that once packed a
// large layer keeps that much memory.
inline void* pack_scratch(int i_product, size_t i_bytes) {
  struct Buffer {
    void* data = nullptr;
    size_t bytes = 0;
    ~Buffer() { std::free(data); }
  };
  thread_local Buffer t_buffers[3];
  Buffer& l_buffer = t_buffers[i_product];
  if (l_buffer.bytes < i_bytes) {
    std::free(l_buffer.data);
    const size_t l_bytes = (i_bytes + 63) / 64 * 64;  // aligned_alloc wants a multiple of the alignment
    l_buffer.data = std::aligned_alloc(64, l_bytes);
    l_buffer.bytes = l_buffer.data != nullptr ? l_bytes : 0;
    TPP_CHECK(l_buffer.data != nullptr, kStage, ": the ", kProductNames[i_product], " pack: out of memory for ",
              l_bytes, " bytes");
  }
  return l_buffer.data;
}

// The stage's one transpose: rows 0 .. i_rows-1 of a row-major matrix (ld i_ld_src), columns
// [i_c0, i_c1), into a column-major panel (ld i_ld_panel). It packs the forward's W into panels
// and, in products.h, grad_weight's blocks of gy into B slabs. In 8 x 8 blocks: the block's 8
// source rows and 8 destination columns stay in L1 while they are read and written, and a full
// block's fixed trip counts let the compiler unroll and vectorise it; at in = 4096 it halves what
// LIBXSMM's libxsmm_otrans added to the forward (06's README: the training step, step 7).
// target_clones compiles it for AVX-512, AVX2 and the baseline and picks one when the module loads
// (as column_sums in products.h); internal linkage, because GCC exports the resolver.
namespace {
template <typename T>
__attribute__((target_clones("avx512f", "avx2", "default")))
void transpose_to_panel(const T* __restrict i_src, T* __restrict o_panel, idx i_ld_src, idx i_ld_panel, idx i_rows,
                        idx i_c0, idx i_c1) {
  constexpr idx kBlock = 8;
  for (idx l_r0 = 0; l_r0 < i_rows; l_r0 += kBlock) {
    const idx l_r1 = std::min(i_rows, l_r0 + kBlock);
    for (idx l_c0 = i_c0; l_c0 < i_c1; l_c0 += kBlock) {
      const idx l_c1 = std::min(i_c1, l_c0 + kBlock);
      if (l_r1 - l_r0 == kBlock && l_c1 - l_c0 == kBlock) {
        for (idx l_c = 0; l_c < kBlock; l_c++) {
          for (idx l_r = 0; l_r < kBlock; l_r++) {
            o_panel[(l_c0 + l_c) * i_ld_panel + l_r0 + l_r] = i_src[(l_r0 + l_r) * i_ld_src + l_c0 + l_c];
          }
        }
      } else {  // the edges
        for (idx l_c = l_c0; l_c < l_c1; l_c++) {
          for (idx l_r = l_r0; l_r < l_r1; l_r++) o_panel[l_c * i_ld_panel + l_r] = i_src[l_r * i_ld_src + l_c];
        }
      }
    }
  }
}
}  // namespace

// Each dtype's plan table holds at most this many plans, one per (product, batch size): 85 batch
// sizes when all three products run. Beyond, the plans are dropped and rebuilt on demand (cheap:
// their kernels stay in the state's kernel table).
constexpr size_t kMaxPlans = 256;

inline std::atomic<int64_t> g_live_states{0};  // LinearStates alive now (tests watch it)

// Everything prepared once. In 16, as in 08: one per (in, out) pair, made by state_for (FunctionCpp.cpp)
// at the first call with those sizes and kept for the process (in 06: one per layer, pybind11's).
//
//   kernel table  every kernel asked of LIBXSMM for these sizes, by KernelShape, per dtype. The
//                 constructor fills in what does not depend on the batch size N (below); the
//                 rest is dispatched at the first call that needs it, then found here.
//   plans         per (product, batch size N, dtype): a BlockedGemm, its loop bounds and its
//                 16-slot kernel table. Building one is a few lookups in the kernel table.
//
// What the constructor can dispatch: it knows in and out, not N. The forward and grad_input
// run over the batch as their n dimension, so every full bn-wide column block uses kernels
// fixed by (in, out): the constructor dispatches those, for float32 (the default dtype), by
// building both plans for N = one full column block. The last, partial column block of an N
// that is not a multiple of bn, all of grad_weight (which reduces over the batch: its k is N)
// and float64 (once a call uses it) are dispatched lazily and kept here.
//
// JIT code belongs to LIBXSMM for the whole process and is shared by every layer that asks for
// the same kernel. In 16, as in 08, a state lives as long as the process (state_for never destroys one).
class LinearState {
 public:
  LinearState(int64_t i_in_features, int64_t i_out_features)
      : m_in(i_in_features), m_out(i_out_features) {
    TPP_CHECK(m_in >= 0 && m_out >= 0, kStage, ": expected in_features >= 0 and out_features >= 0, got ", m_in,
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
  // Each block is (bm, bn, bk); bk = 0: the whole K in one step. Drops the plans.
  void set_config(const std::vector<int64_t>& i_forward, const std::vector<int64_t>& i_grad_input,
                  const std::vector<int64_t>& i_grad_weight, const std::vector<bool>& i_n_outer) {
    const std::vector<int64_t>* l_blocks[] = {&i_forward, &i_grad_input, &i_grad_weight};
    Config l_config;
    for (int l_p = 0; l_p < 3; l_p++) {
      const auto& l_b = *l_blocks[l_p];
      TPP_CHECK(l_b.size() == 3 && l_b[0] >= 1 && l_b[1] >= 1 && l_b[2] >= 0, kStage, ": expected the ",
                  kProductNames[l_p], " blocking as (bm >= 1, bn >= 1, bk >= 0), got ", shape_text(l_b));
      l_config.blocking[l_p] = {l_b[0], l_b[1], l_b[2]};
    }
    TPP_CHECK(i_n_outer.size() == 3, kStage, ": expected n_outer as 3 flags (forward, grad_input, grad_weight), got ",
                i_n_outer.size());
    for (int l_p = 0; l_p < 3; l_p++) l_config.n_outer[l_p] = i_n_outer[l_p];
    {
      std::lock_guard<std::mutex> l_lock(m_mutex);
      m_config = l_config;
      std::get<0>(m_types).plans.clear();
      std::get<1>(m_types).plans.clear();
    }
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
        // dimension is the panel height, the clamped bm. B: x, packed per thread; C: y.
        const idx l_panel = std::clamp<idx>(l_b.bm, 1, std::max<idx>(1, m_out));
        l_plan = std::make_shared<BlockedGemm<T>>(m_out, N, m_in, l_b, l_n_outer, /*lda=*/l_panel, l_kernel);
        break;
      }
      case kGradInput: {
        // gx^T (in x N) = W^T (in x out) . gy^T (out x N). A: W^T packed into panels of bm rows
        // (column blocks of W), ld the panel height. B: gy, packed per thread; C: gx.
        const idx l_panel = std::clamp<idx>(l_b.bm, 1, std::max<idx>(1, m_in));
        l_plan = std::make_shared<BlockedGemm<T>>(m_in, N, m_out, l_b, l_n_outer, /*lda=*/l_panel, l_kernel);
        break;
      }
      case kGradWeight: {
        // gw^T (in x out) = x^T (in x N) . gy (N x out). A: x^T packed into panels of bm rows
        // (column blocks of x), ld the panel height. B: gy, transposed block by block into the
        // thread's buffer; C: gw. The batch N is the reduction.
        const idx l_panel = std::clamp<idx>(l_b.bm, 1, std::max<idx>(1, m_in));
        l_plan = std::make_shared<BlockedGemm<T>>(m_in, m_out, N, l_b, l_n_outer, /*lda=*/l_panel, l_kernel);
        break;
      }
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
  //   ...                                  a transpose of each bm-row slice (transpose_to_panel)
  //
  // Packed for this call alone, into the thread's scratch buffer (no pack cache in this stage:
  // above). Parallel over (panel, 256 columns) pieces, so that a layer with few panels still
  // keeps every thread busy. The rows of a tail panel past `out` stay unwritten: the tail kernel
  // reads only the panel's first rows.
  template <typename T>
  const T* packed_weight(const T* i_w, idx i_bm) const {
    const idx l_panels = (m_out + i_bm - 1) / i_bm;
    T* l_p = static_cast<T*>(pack_scratch(kForward, l_panels * i_bm * m_in * sizeof(T)));
    constexpr idx kColumns = 256;
    const idx l_pieces = (m_in + kColumns - 1) / kColumns;
    torch::stable::parallel_for(/*begin=*/0, /*end=*/l_panels * l_pieces, /*grain_size=*/1, [&](idx i_first, idx i_last) {
      for (idx l_task = i_first; l_task < i_last; l_task++) {
        const idx l_mb = l_task / l_pieces, l_c0 = (l_task % l_pieces) * kColumns;
        const idx l_rows = std::min(i_bm, m_out - l_mb * i_bm), l_c1 = std::min(m_in, l_c0 + kColumns);
        // Rows mb*bm.. of W, transposed: panel mb, (rows x in) column-major, ld = bm.
        transpose_to_panel<T>(i_w + l_mb * i_bm * m_in, l_p + l_mb * i_bm * m_in, /*ld_src=*/m_in, /*ld_panel=*/i_bm,
                              l_rows, l_c0, l_c1);
      }
    });
    return l_p;
  }

  int64_t kernel_count() const {
    std::lock_guard<std::mutex> l_lock(m_mutex);
    return std::get<0>(m_types).kernels.size() + std::get<1>(m_types).kernels.size();
  }
  int64_t plan_count() const {
    std::lock_guard<std::mutex> l_lock(m_mutex);
    return std::get<0>(m_types).plans.size() + std::get<1>(m_types).plans.size();
  }
 private:
  // The kernel table and plans of one element type.
  template <typename T>
  struct PerType {
    std::map<decltype(std::declval<KernelShape>().key()), typename Xsmm<T>::Fn> kernels;
    std::map<std::pair<int, idx>, std::shared_ptr<const BlockedGemm<T>>> plans;
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
  Config m_config = default_config();
  std::tuple<PerType<float>, PerType<double>> m_types;
};

}  // namespace tpp
