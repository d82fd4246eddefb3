// Stage 06: the layer's three products on raw pointers, each a BlockedGemm plan run over packed
// operands, and the bias gradient. FunctionCpp.cpp calls them once its checks have passed: nothing
// here checks a size. Read after linear_state.h (the plans and the pack cache these use).
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
// once into panels, the packed weight, and reused while W is unchanged (the pack cache, linear_state.h).
// The backward's A operands (W^T, x^T) could be read where they lie, but their columns would be
// `in` floats apart, a multiple of 4 KB: each k step's columns would fight over a few L1 sets.
// So they are copied into contiguous panels too (pack_column_panels, one memcpy per row). The B
// operands and the C tiles have the same problem, so each thread packs its B blocks and
// accumulates its C tile in buffers of its own (blocked_gemm.h; 06's README: the training step);
// grad_weight's gy is transposed block by block on the way, and grad_bias summed in that pass.
// grad_weight's reduction runs over the batch N (the kernel's k), so no two threads ever add
// into the same tile.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>

#include "linear_state.h"

namespace tpp {

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
    // the block (depth rows x columns, row-major, ld i_ld_src) transposed: the slab, column-major
    // (depth x columns, ld bk)
    transpose_to_panel<T>(l_block, l_slab, i_ld_src, /*ld_panel=*/i_gemm.bk, /*rows=*/l_depth, 0, l_columns);
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

// The backward's A operands, packed like the forward's W (06's README, "The training step"):
// column block mb (columns mb*bm ..) of a row-major (rows x cols) matrix, copied into
// panel mb, (rows x bm) contiguous: the column-major (bm x rows) A operand with lda = bm. Read
// in place instead, A's columns lie `cols` elements apart, a multiple of 4 KB for the usual
// sizes: every column of a k step falls into the same few L1 sets, and they evict each other.
template <typename T>
const T* pack_column_panels(Product i_product, const T* i_src, idx i_rows, idx i_cols, idx i_bm) {
  const idx l_panels = (i_cols + i_bm - 1) / i_bm;
  T* l_p = static_cast<T*>(pack_scratch(i_product, l_panels * i_bm * i_rows * sizeof(T)));
  at::parallel_for(/*begin=*/0, /*end=*/i_rows, /*grain_size=*/64, [&](idx i_first, idx i_last) {
    for (idx l_mb = 0; l_mb < l_panels; l_mb++) {
      // the tail panel's rows hold fewer than bm values; the rest stays unwritten, never read
      const idx l_width = std::min(i_bm, i_cols - l_mb * i_bm);
      for (idx l_r = i_first; l_r < i_last; l_r++) {
        std::memcpy(l_p + l_mb * i_bm * i_rows + l_r * i_bm, i_src + l_r * i_cols + l_mb * i_bm, l_width * sizeof(T));
      }
    }
  });
  return l_p;
}

// gx (N, in) = gy (N, out) W (out, in): gx^T = W^T . gy^T; W^T packed into panels, gy per thread.
template <typename T>
void grad_input_tpp(LinearState& io_state, const T* i_gy, const T* i_w, T* o_gx, idx N, idx i_in, idx i_out) {
  const auto l_plan = io_state.plan<T>(kGradInput, N);
  const BlockedGemm<T>& l_gemm = *l_plan;
  const idx bm = l_gemm.bm, bk = l_gemm.bk;
  if (N == 0 || i_in == 0) return;
  const T* l_a = pack_column_panels(kGradInput, i_w, /*rows=*/i_out, /*cols=*/i_in, bm);  // W^T, (in x out) in panels
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
// Returns false when it could not (an empty batch: no k steps; or in or out == 0); the caller then sums.
template <typename T>
bool grad_weight_tpp(LinearState& io_state, const T* i_gy, const T* i_x, T* o_gw, T* o_gb, idx N, idx i_in, idx i_out) {
  const auto l_plan = io_state.plan<T>(kGradWeight, N);
  const BlockedGemm<T>& l_gemm = *l_plan;
  const idx bm = l_gemm.bm, bk = l_gemm.bk;
  if (i_in == 0 || i_out == 0) return false;
  const T* l_a = pack_column_panels(kGradWeight, i_x, /*rows=*/N, /*cols=*/i_in, bm);  // x^T, (in x N) in panels
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
// GCC exports the clones' resolver whatever -fvisibility says, so column_sums has internal linkage
// (an anonymous namespace; this header is included by FunctionCpp.cpp alone).
namespace {
template <typename T>
__attribute__((target_clones("avx512f", "avx2", "default")))
void column_sums(const T* __restrict i_gy, T* __restrict o_gb, idx N, idx i_out, idx i_first, idx i_last) {
  std::fill(o_gb + i_first, o_gb + i_last, T(0));
  for (idx l_n = 0; l_n < N; l_n++) {
    const T* l_row = i_gy + l_n * i_out;
    for (idx l_o = i_first; l_o < i_last; l_o++) o_gb[l_o] += l_row[l_o];
  }
}
}  // namespace

template <typename T>
void grad_bias_tpp(const T* i_gy, T* o_gb, idx N, idx i_out) {
  at::parallel_for(/*begin=*/0, /*end=*/i_out, /*grain_size=*/256,
                   [&](idx i_first, idx i_last) { column_sums<T>(i_gy, o_gb, N, i_out, i_first, i_last); });
}

}  // namespace tpp
